"""python -m specdec_ext.bench e2e: end-to-end speculative decoding on the bundled pair.

Same prompts, same max_new_tokens, per device (CPU, and CUDA when present); ``--repeats N``
times every row in N interleaved rounds (the order alternates between rounds) and reports
medians, each ratio taken against the baseline of the same round:

* target-only autoregressive decoding with the package's reference model (K = 0)
* the engine with K in {1, 2, 4, 6}, adaptive K (per row) and the batch-wide budget
  (``engine budget``: every row's K from one plan over the step, engine/budget.py), greedy
  (T = 0) and sampling (T = 1)
* the same fixed-K and adaptive rows with block verification (``engine block``, ``engine
  adaptive block``: ``verify_mode="block"``, the engine's default for chains; every other
  engine row verifies token by token, ``verify_mode="exact"``, so that the pairs compare the
  two rules; ``--no-block`` skips them); after each block a
  line per such row compares tokens per target pass and tokens/s with its token-wise row
  (:func:`block_summary`)
* the engine with prompt-lookup (n-gram) drafting, with the hybrid drafter (n-gram
  where a match exists, the draft model elsewhere) and with the head drafter (``engine
  head``: n-gram where a match exists, the bundled target's draft head elsewhere, its drafts
  branching at the first token into a small tree; ``engine head chain``: its chain), adaptive K
* the engine with suffix drafting (``engine suffix``: per-request and global suffix indexes,
  the global one carried across the row's prompts, which run one after another in one
  engine; ``engine suffix tree``: its trees through verify_tree), adaptive K; after each
  block a line per drafter without a model gives its proposal time as a share of the step
  and tokens per target pass / tokens/s against n-gram (:func:`suffix_summary`)
* tree speculation (``--tree``, default 4 2 2: branching per depth; ``--no-tree`` skips):
  ``engine tree`` (children sampled from the draft) and ``engine tree topk`` (the draft's
  top-b), next to a chain of K = the tree's depth (the same draft forwards per step, one
  target pass per step each); after each block a line compares tokens per target pass and
  tokens/s of the trees with that chain
* Hugging Face ``generate(assistant_model=draft)``, ``generate(prompt_lookup_num_tokens=)``
  and plain ``generate`` on the same weights (when transformers is installed; assisted and
  prompt-lookup generation are batch 1 only)
* with ``--compile``: the n-gram engine on the reference model's torch.compile'd decode
  steps (weights frozen into the graphs), next to the eager row; with ``--hf`` too, ``HF-model ... compiled`` rows
  (target-only, K = ``--hf-k``, adaptive, n-gram) on
  :meth:`~specdec_ext.models.hf.HFBatchedSpecModel.compile_decode` forwards, each warmed
  up (compiled) on one prompt before it is timed; their speedup is relative to the eager
  HF-model target-only row
* with ``--hf``: the engine on the same pair loaded through transformers (``HF-model``
  rows: target-only, K = ``--hf-k``, adaptive, n-gram, hybrid on the batched HF path, and K =
  ``--hf-k`` on the per-row compatibility path), next to HF's own rows; their speedup and
  c are relative to the HF-model target-only row. ``--only-hf`` skips the reference-model
  engine rows (the reference target-only row stays: it is every other row's baseline)
* batch 1 and batch 8

Columns: tokens/s; alpha (per-token acceptance, accepted / tested drafts); tokens per
target step; bk% (the engine's own bookkeeping: step time outside the draft, target and
verify phases); speedup over target-only decoding; Leviathan's predicted speedup
(1 - a^(K+1)) / ((1 - a)(K c + 1)) for the measured alpha and cost ratio
c = draft time per draft token / target-only time per token t; r = the row's target phase
time per step / the baseline's (for a fixed-K row: a (K+1)-token target forward over a
1-token one, which Leviathan's formula takes as 1; for a compiled row against the eager
baseline it also holds the compiled/eager difference); pred(r) = (1 - a^(K+1)) /
((1 - a)(K c + 1 + d)), d = the target phase's extra time per step over the baseline's,
in units of t: the prediction with the measured cost of the wider target forward, so
measured speedup / pred(r) is what the engine's own work (verify, bookkeeping) leaves.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional

import torch

from .. import bundled
from .._cli import OneLineParser, int_in, output_path, temperature
from ..engine.adaptive_k import predicted_speedup
from ..engine import SpeculativeEngine, SuffixConfig
from ..engine.engine import HEAD_BRANCHES
from .report import measuring, print_table, progress_bar
from .timing import busiest, machine_load, warn_if_busy, write_rows_json

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):",
    "    for i in range(len(",
    "# Copyright (C) 2001 Python Software Foundation\n",
    "    def __repr__(self):\n        return",
    "try:\n    import",
    "def _check_arg(value, name):\n    if not isinstance(",
]


def _batch(tok, prompts, device):
    """Left-padded ids [B, T] and attention mask."""
    enc = [tok.encode(p).ids for p in prompts]
    T = max(len(e) for e in enc)
    ids = torch.zeros(len(enc), T, dtype=torch.int64)
    mask = torch.zeros(len(enc), T, dtype=torch.int64)
    for b, e in enumerate(enc):
        ids[b, T - len(e):] = torch.tensor(e)
        mask[b, T - len(e):] = 1
    return ids.to(device), mask.to(device)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_engine(target, draft, k, adaptive, temperature, groups, max_new, seed=0, drafter="auto", tree=None,
               tree_mode="sampled", suffix=None, verify_mode="exact", datastore=None, draft_head=None,
               head_branches=HEAD_BRANCHES):
    """groups: list of (ids, mask). Returns aggregate stats over all of them (``tree``: tree
    speculation with that branching; tokens_per_step is then tokens per target pass too;
    ``verify_mode``: "exact" (token-wise) or "block"; ``datastore``: retrieval drafting next to n-gram;
    ``draft_head``, ``head_branches``: the head of drafter "head" and its branching)."""
    eng = SpeculativeEngine(target, draft, k=k, adaptive_k=adaptive, drafter=drafter, tree=tree, tree_mode=tree_mode,
                            suffix=suffix, verify_mode=verify_mode, datastore=datastore, draft_head=draft_head,
                            head_branches=head_branches)
    tokens = steps = accepted = rejections = 0
    draft_s = draft_steps = target_s = other_s = step_s = 0.0
    elapsed = 0.0
    emitted: List[int] = []  # tokens each active row emitted at each step
    for i, (ids, mask) in enumerate(groups):
        t0 = time.perf_counter()
        # a seed per group: a prompt that comes back in a later group (--prompts > 8) is a new draw at T > 0
        out = eng.generate(ids, max_new, temperature=temperature, seed=seed + i, attention_mask=mask)
        elapsed += time.perf_counter() - t0
        tokens += sum(len(g) for g in out.generated)
        steps += out.steps
        accepted += sum(s.accepted for s in out.stats)
        rejections += sum(s.rejections for s in out.stats)
        emitted += [e for s in out.stats for e in s.emitted]
        draft_s += out.phase_s.draft
        draft_steps += out.draft_steps
        target_s += out.phase_s.target
        other_s, step_s = other_s + out.phase_s.other, step_s + out.phase_s.total
    tested = accepted + rejections
    return dict(tokens=tokens, seconds=elapsed, tok_s=tokens / elapsed,
                alpha=accepted / tested if tested else None,
                tokens_per_step=tokens / steps / len(groups[0][0]) if steps else None,
                # the sampling error of tokens per row step (a T > 0 run is one draw of its law)
                tokens_per_step_se=(statistics.stdev(emitted) / len(emitted) ** 0.5 if len(emitted) > 1 else None),
                draft_s_per_token=draft_s / draft_steps if draft_steps else None,
                target_s_per_step=target_s / steps if steps else None,
                bookkeeping=other_s / step_s if step_s else None,
                draft_share=draft_s / step_s if step_s else None)  # n-gram / suffix: the proposal's share


def run_hf(hf_target, hf_draft, temperature, groups, max_new, assisted, prompt_lookup=None):
    tokens, elapsed = 0, 0.0
    kw = dict(do_sample=temperature > 0, max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=0)
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    if prompt_lookup:
        kw.update(prompt_lookup_num_tokens=prompt_lookup)
    for ids, mask in groups:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        out = hf_target.generate(ids, attention_mask=mask, assistant_model=hf_draft if assisted else None, **kw)
        _sync(ids.device.type)
        elapsed += time.perf_counter() - t0
        tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return dict(tokens=tokens, seconds=elapsed, tok_s=tokens / elapsed, alpha=None, tokens_per_step=None,
                draft_s_per_token=None, target_s_per_step=None, bookkeeping=None)


def _head_configs(target, kmax, T, groups, n) -> List["Config"]:
    """The head drafter's rows (its trees, and its chain: ``head_branches=1``), sharing one
    head; each warmed up on one prompt first (the head builds its token table on first use)."""
    head = bundled.load_head(target)
    out = []
    for method, branches in (("engine head", HEAD_BRANCHES), ("engine head chain", 1)):
        kw = dict(drafter="head", draft_head=head, head_branches=branches)
        out.append(Config(method, f"<={kmax}", _engine(target, None, kmax, "cost", T, groups, n, **kw),
                          warm=_engine(target, None, kmax, "cost", T, groups[:1], n, **kw)))
    return out


def _engine(*args, **kwargs) -> Callable[[], Dict[str, Any]]:
    """``run_engine(*args, **kwargs)``, deferred: a :class:`Config`'s run or warm-up."""
    return partial(run_engine, *args, **kwargs)


@dataclasses.dataclass
class Config:
    """One row of the table: ``run()`` times it once (a result dict of :func:`run_engine` /
    :func:`run_hf`); ``warm()``, if any, runs once before the first round (compilation,
    first-call costs); ``base`` names the row whose result in the same round is its baseline."""
    method: str
    k: Any
    run: Callable[[], Dict[str, Any]]
    base: str = "target-only"
    warm: Optional[Callable[[], Any]] = None


def _hf_model_configs(hf_target, hf_draft, hf_compiled, T, groups, args) -> List[Config]:
    """The engine on the transformers-loaded pair (batched path; one per-row row), and with
    ``hf_compiled`` (the compiled target and draft) the compiled rows."""
    from ..models.hf import HFSpecModel

    k, n = args.hf_k, args.max_new_tokens
    base = "HF-model target-only"
    out = [Config(base, 0, _engine(hf_target, hf_draft, 0, False, T, groups, n), base,
                  warm=_engine(hf_target, hf_draft, 2, False, 0.0, groups[:1], 8)),
           Config("HF-model engine", k, _engine(hf_target, hf_draft, k, False, T, groups, n), base),
           Config("HF-model adaptive", f"<={k}", _engine(hf_target, hf_draft, k, "cost", T, groups, n), base),
           Config("HF-model ngram", f"<={k}", _engine(hf_target, None, k, "cost", T, groups, n), base),
           Config("HF-model suffix", f"<={k}", _engine(hf_target, None, k, "cost", T, groups, n, drafter="suffix"),
                  base),
           *([Config("HF-model ngram datastore", f"<={k}", _engine(hf_target, None, k, "cost", T, groups, n,
                                                                   datastore=args.datastore_built), base)]
             if args.datastore_built is not None else []),
           Config("HF-model hybrid", f"<={k}", _engine(hf_target, hf_draft, k, "cost", T, groups, n, drafter="hybrid"),
                  base),
           Config("HF-model per-row", k, _engine(HFSpecModel(hf_target), HFSpecModel(hf_draft), k, False, T, groups, n),
                  base)]
    if hf_compiled is not None:  # the same rows on torch.compile'd forwards; speedups stay relative to the eager base
        ct, cd = hf_compiled
        for method, (kk, adaptive, draft) in (("HF-model target-only compiled", (0, False, cd)),
                                              ("HF-model engine compiled", (k, False, cd)),
                                              ("HF-model adaptive compiled", (k, "cost", cd)),
                                              ("HF-model ngram compiled", (k, "cost", None))):
            out.append(Config(method, kk if not adaptive else f"<={kk}",
                              _engine(ct, draft, kk, adaptive, T, groups, n), base,
                              # compiles every step kind outside the timing
                              warm=_engine(ct, draft, kk, adaptive, T, groups[:1], n)))
    return out


def _tree_label(tree) -> str:
    return "x".join(str(b) for b in tree)


def _tree_configs(target, draft, T, groups, args) -> List[Config]:
    """Tree speculation rows (sampled and top-b children) and, unless ``--k`` has it, the
    chain of K = the tree's depth they are compared with (:func:`tree_summary`)."""
    if not args.tree:
        return []
    n, tree, depth = args.max_new_tokens, tuple(args.tree), len(args.tree)
    out = [] if depth in args.k else [Config("engine", depth, _engine(target, draft, depth, False, T, groups, n))]
    out += [Config(method, _tree_label(tree), _engine(target, draft, depth, False, T, groups, n, tree=tree,
                                                      tree_mode=mode))
            for method, mode in (("engine tree", "sampled"), ("engine tree topk", "topk"))]
    return out


def tree_summary(block_rows, tree) -> List[str]:
    """Lines comparing each tree row of one block with the chain of K = the tree's depth:
    tokens per target pass (the gain of the tree's extra candidates) and tokens/s (what it
    costs: a wider target forward, more draft tokens per forward)."""
    chain = [r for r in block_rows if r["method"] == "engine" and r["k"] == len(tree)]
    lines = []
    for r in block_rows:
        if not r["method"].startswith("engine tree") or not chain or not r.get("tokens_per_step"):
            continue
        c = chain[0]
        lines.append(f"{r['device']:4} {r['batch']:>2} {r['temperature']:>3} {r['method']} {_tree_label(tree)} vs "
                     f"chain K={len(tree)}: {r['tokens_per_step']:.2f} vs {c['tokens_per_step']:.2f} tokens per "
                     f"target pass (tree/chain x{r['tokens_per_step'] / c['tokens_per_step']:.2f}), "
                     f"tokens/s tree/chain x{r['tok_s'] / c['tok_s']:.2f}")
    return lines


def configs(target, draft, compiled, hf_target, hf_draft, hf_compiled, B, T, groups, args) -> List[Config]:
    """Every row of one (device, batch, temperature) block, baseline first. ``compiled``:
    the reference target with compiled steps (``--compile``), ``hf_compiled``: the compiled
    HF target and draft (``--hf --compile``); None otherwise. They are compiled once per
    device, and every block that uses them warms them up on its own run first."""
    n, kmax = args.max_new_tokens, max(args.k)
    out = [Config("target-only", 0, _engine(target, draft, 0, False, T, groups, n))]
    if not args.only_hf:
        out += [Config("engine", k, _engine(target, draft, k, False, T, groups, n)) for k in args.k]
        if args.block:  # the same rows with block verification (block_summary compares them)
            out += [Config("engine block", k, _engine(target, draft, k, False, T, groups, n, verify_mode="block"))
                    for k in args.k]
        out += [Config("engine adaptive", f"<={kmax}", _engine(target, draft, kmax, "cost", T, groups, n)),
                Config("engine budget", f"<={kmax}", _engine(target, draft, kmax, "budget", T, groups, n)),
                *([Config("engine adaptive block", f"<={kmax}", _engine(target, draft, kmax, "cost", T, groups, n,
                                                                        verify_mode="block"))] if args.block else []),
                Config("engine ngram", f"<={kmax}", _engine(target, None, kmax, "cost", T, groups, n)),
                *([Config("engine ngram datastore", f"<={kmax}", _engine(target, None, kmax, "cost", T, groups, n,
                                                                         datastore=args.datastore_built))]
                  if args.datastore_built is not None else []),
                Config("engine hybrid", f"<={kmax}", _engine(target, draft, kmax, "cost", T, groups, n,
                                                             drafter="hybrid")),
                *_head_configs(target, kmax, T, groups, n),
                Config("engine suffix", f"<={kmax}", _engine(target, None, kmax, "cost", T, groups, n,
                                                             drafter="suffix")),
                Config("engine suffix tree", f"<={kmax}", _engine(target, None, kmax, "cost", T, groups, n,
                                                                  drafter="suffix", suffix=SuffixConfig(tree=True)))]
        out += _tree_configs(target, draft, T, groups, args)
        if compiled is not None:  # the n-gram engine on the compiled reference model
            out.append(Config("engine ngram compiled", f"<={kmax}", _engine(compiled, None, kmax, "cost", T, groups, n),
                              # the same run on one prompt: every step kind compiles outside the timing
                              warm=_engine(compiled, None, kmax, "cost", T, groups[:1], n)))
    if hf_target is not None and args.hf:
        out += _hf_model_configs(hf_target, hf_draft, hf_compiled, T, groups, args)
    if hf_target is not None:
        out.append(Config("HF generate", "-", partial(run_hf, hf_target, None, T, groups, n, False)))
        if B == 1:
            out += [Config("HF assisted", "hf", partial(run_hf, hf_target, hf_draft, T, groups, n, True)),
                    Config("HF prompt lookup", "hf",
                           partial(run_hf, hf_target, None, T, groups, n, False, prompt_lookup=kmax))]
    return out


def timed_rounds(cfgs: List[Config], repeats: int, bar) -> List[List[Dict[str, Any]]]:
    """``repeats`` rounds of every config; each config's results, one per round.

    Rounds alternate the order (baseline first, then last), so that a machine slowing down
    or speeding up during a round does not favour the rows timed next to the baseline."""
    for c in cfgs:
        if c.warm is not None:
            c.warm()
    results: List[List[Dict[str, Any]]] = [[] for _ in cfgs]
    for rnd in range(repeats):
        order = range(len(cfgs)) if rnd % 2 == 0 else reversed(range(len(cfgs)))
        for i in order:
            results[i].append(cfgs[i].run())
            bar.update(1)
    return results


def summarize(device, B, T, c: Config, runs, base_runs) -> Dict[str, Any]:
    """One table row from a config's per-round results and its baseline's (same rounds).

    Ratios are taken per round against that round's baseline, then the median over rounds;
    times and tokens/s are medians too. With t = the baseline's seconds per step (its wall
    time per token, B rows), every cost is in units of t: c = draft seconds per draft
    token / t; r = the row's target phase per step / the baseline's (the column); and
    pred(r) charges a step K c + 1 + (target phase per step - baseline's) / t, i.e. a
    plain step plus the measured extra cost of the wider target forward (what the engine
    itself adds, verify and bookkeeping, is left out: measured / pred(r) shows it).
    """
    med = statistics.median

    def per_round(f):
        """Median over rounds of f(row result, baseline result, t), None where undefined."""
        vals = [f(r, b, b["seconds"] / b["tokens"] * B) for r, b in zip(runs, base_runs)]
        return None if any(v is None for v in vals) else med(vals)

    def median_of(key):
        return None if any(r[key] is None for r in runs) else med(r[key] for r in runs)

    def targets(f):  # f over (row's, baseline's target phase per step, t), where both were measured
        return lambda r, b, t: (None if r["target_s_per_step"] is None or b["target_s_per_step"] is None
                                else f(r["target_s_per_step"], b["target_s_per_step"], t))

    c_ratio = per_round(lambda r, b, t: None if r["draft_s_per_token"] is None else r["draft_s_per_token"] / t)
    r_ratio = per_round(targets(lambda row, base, t: row / base))
    step_ratio = per_round(targets(lambda row, base, t: 1.0 + (row - base) / t))
    alpha = median_of("alpha")
    leviathan = alpha is not None and c_ratio is not None and isinstance(c.k, int)
    return dict(device=device, batch=B, temperature=T, method=c.method, k=c.k, rounds=len(runs),
                tokens=runs[0]["tokens"], seconds=median_of("seconds"), tok_s=median_of("tok_s"), alpha=alpha,
                tokens_per_step=median_of("tokens_per_step"),
                tokens_per_step_se=None if any(r.get("tokens_per_step_se") is None for r in runs)
                else med(r["tokens_per_step_se"] for r in runs),
                draft_s_per_token=median_of("draft_s_per_token"),
                target_s_per_step=median_of("target_s_per_step"), bookkeeping=median_of("bookkeeping"),
                draft_share=None if any(r.get("draft_share") is None for r in runs) else med(r["draft_share"] for r in runs),
                speedup=per_round(lambda r, b, t: r["tok_s"] / b["tok_s"]), cost_ratio=c_ratio,
                target_ratio=r_ratio,
                predicted=predicted_speedup(alpha, c.k, c_ratio) if leviathan else None,
                predicted_r=(predicted_speedup(alpha, c.k, c_ratio, step_ratio)
                             if leviathan and step_ratio is not None else None))


def bench_device(device, args, rows, bar, done_block=lambda: None):
    """Every (batch, temperature) block on one device, appended to ``rows``; ``done_block()``
    after each (the CLI saves the JSON there, so a run cut short keeps its finished blocks).
    Prints nothing: main prints the table (:func:`table_lines`) once every block is measured."""
    target, draft = bundled.load_pair(device=device)
    tok = bundled.load_tokenizer()
    try:
        hf_target, hf_draft = bundled.load_pair(device=device, implementation="hf", check=False)
    except ImportError:
        hf_target = hf_draft = None
    # compiled once per device (graphs are then reused across batches and temperatures)
    compiled = (copy.deepcopy(target).compile_decode(freeze=True) if args.compile and not args.only_hf
                else None)
    hf_compiled = None
    if args.compile and args.hf and hf_target is not None:
        from ..models.hf import HFBatchedSpecModel

        hf_compiled = (HFBatchedSpecModel(hf_target).compile_decode(), HFBatchedSpecModel(hf_draft).compile_decode())
    for B in args.batch:
        prompts = (PROMPTS * 8)[: max(B, args.prompts)]
        groups = [_batch(tok, prompts[i:i + B], device) for i in range(0, len(prompts), B)]
        run_engine(target, draft, 2, False, 0.0, groups[:1], 8)  # warm up
        for T in args.temperature:
            cfgs = configs(target, draft, compiled, hf_target, hf_draft, hf_compiled, B, T, groups, args)
            bar.total += len(cfgs) * args.repeats
            results = timed_rounds(cfgs, args.repeats, bar)
            load = machine_load()  # the load the block was timed under (check_targets refuses busy runs)
            by_method = {c.method: runs for c, runs in zip(cfgs, results)}
            for c, runs in zip(cfgs, results):
                rows.append(dict(summarize(device, B, T, c, runs, by_method[c.base]), **load))
            if hf_target is not None and B > 1:
                rows.append(dict(device=device, batch=B, temperature=T, method="HF assisted", k="-",
                                 note="batch 1 only"))
            done_block()


HEADER = (f"{'dev':4} {'B':>2} {'T':>3} {'method':29} {'K':>5} | {'tok/s':>8} {'alpha':>5} {'tok/step':>8} "
          f"{'bk%':>5} | "
          f"{'speedup':>7} {'c':>5} {'predicted':>9} | {'r':>5} {'pred(r)':>8}")
LEGEND = ("base = the block's target-only row (for HF-model rows: HF-model target-only); speedup = tok/s / base "
          "tok/s; c = draft s per draft token / base s per token (t); predicted = Leviathan's speedup for alpha "
          "and c; r = target s per step / base target s per step; pred(r) = predicted with r's extra target time; "
          "bk% = 100 x bookkeeping s / step s; ratios: medians over rounds of per-round ratios")


def format_row(r) -> str:
    """One table line (HEADER's columns) of a row of bench_device; a ``note`` row (no
    measurement, e.g. HF assisted at B > 1) says its note."""
    if "note" in r:
        return f"{r['device']:4} {r['batch']:>2} {r['temperature']:>3} {r['method']:29} {str(r['k']):>5} | ({r['note']})"
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    bk = None if r.get("bookkeeping") is None else 100 * r["bookkeeping"]
    return (f"{r['device']:4} {r['batch']:>2} {r['temperature']:>3} {r['method']:29} {str(r['k']):>5} | "
            f"{r['tok_s']:>8.1f} {f(r['alpha'], '.2f'):>5} {f(r['tokens_per_step'], '.2f'):>8} {f(bk, '.1f'):>5} | "
            f"{r['speedup']:>6.2f}x {f(r['cost_ratio'], '.2f'):>5} {f(r['predicted'], '.2f'):>8}x | "
            f"{f(r.get('target_ratio'), '.2f'):>5} {f(r.get('predicted_r'), '.2f'):>7}x")


def suffix_summary(block_rows) -> List[str]:
    """Lines for the drafters without a model (n-gram, suffix): the proposal's share of the
    step time (the draft phase: the index update and lookup), and tokens per target pass and
    tokens/s against the n-gram row of the block."""
    ngram = [r for r in block_rows if r["method"] == "engine ngram"]
    lines = []
    for r in block_rows:
        if (r["method"] not in ("engine ngram", "engine head", "engine head chain", "engine suffix",
                                "engine suffix tree")
                or r.get("draft_share") is None):
            continue
        line = (f"{r['device']:4} {r['batch']:>2} {r['temperature']:>3} {r['method']}: proposal "
                f"{100 * r['draft_share']:.1f}% of the step time")
        if r["method"] != "engine ngram" and ngram and ngram[0].get("tokens_per_step") and r.get("tokens_per_step"):
            g = ngram[0]
            line += (f"; vs ngram: {r['tokens_per_step']:.2f} vs {g['tokens_per_step']:.2f} tokens per target pass, "
                     f"tokens/s x{r['tok_s'] / g['tok_s']:.2f}")
        lines.append(line)
    return lines


#: the block-verification rows and the token-wise row each is compared with (same K, drafter, policy)
BLOCK_PAIRS = {"engine block": "engine", "engine adaptive block": "engine adaptive"}


def difference_se(a, b) -> Optional[float]:
    """Standard error of a's tokens per target pass minus b's (independent runs: each row's
    ``tokens_per_step_se`` from the spread of its per-step emitted tokens); None when unknown."""
    if a.get("tokens_per_step_se") is None or b.get("tokens_per_step_se") is None:
        return None
    return (a["tokens_per_step_se"] ** 2 + b["tokens_per_step_se"] ** 2) ** 0.5


def block_summary(block_rows) -> List[str]:
    """Lines comparing each block-verification row with the token-wise row of the same K and
    policy in the block: tokens per target pass (what the joint rule gains: never less in
    expectation; the same law with one-hot drafts, so equal at T = 0) and tokens/s (what its
    extra pass over the drafts costs). At T > 0 each row is one draw of its law: the
    difference is given with its standard error (:func:`difference_se`)."""
    lines = []
    for r in block_rows:
        if r["method"] not in BLOCK_PAIRS or not r.get("tokens_per_step"):
            continue
        tw = [c for c in block_rows if c["method"] == BLOCK_PAIRS[r["method"]] and c["k"] == r["k"]
              and c.get("tokens_per_step")]
        if not tw:
            continue
        c = tw[0]
        se = difference_se(r, c) if r["temperature"] > 0 else None  # T = 0: one-hot drafts, the same text
        lines.append(f"{r['device']:4} {r['batch']:>2} {r['temperature']:>3} {r['method']} K={r['k']} vs token-wise: "
                     f"{r['tokens_per_step']:.3f} vs {c['tokens_per_step']:.3f} tokens per target pass "
                     f"(block/token x{r['tokens_per_step'] / c['tokens_per_step']:.3f}"
                     + ("" if se is None else f"; difference {r['tokens_per_step'] - c['tokens_per_step']:+.3f} "
                                              f"+- {se:.3f} s.e.") +
                     f"), tokens/s x{r['tok_s'] / c['tok_s']:.2f}")
    return lines


def table_lines(rows, tree) -> List[str]:
    """The table's row lines, each (device, batch, temperature) block followed by its
    tree-vs-chain lines (:func:`tree_summary`, with ``tree`` the branching or None)."""
    lines: List[str] = []
    blocks = dict.fromkeys((r["device"], r["batch"], r["temperature"]) for r in rows)  # in measured order
    for key in blocks:
        block = [r for r in rows if (r["device"], r["batch"], r["temperature"]) == key]
        lines += [format_row(r) for r in block]
        lines += tree_summary([r for r in block if "note" not in r], tree or ())
        lines += suffix_summary([r for r in block if "note" not in r])
        lines += block_summary([r for r in block if "note" not in r])
    return lines


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (dev, B, T) in sorted({(r["device"], r["batch"], r["temperature"]) for r in rows}):
        eng = sorted((r for r in rows if (r["device"], r["batch"], r["temperature"]) == (dev, B, T)
                      and r["method"] == "engine"), key=lambda r: r["k"])  # the tree's chain row comes last
        if not eng:
            continue
        ks = [r["k"] for r in eng]
        line, = ax.plot(ks, [r["speedup"] for r in eng], "o-", label=f"{dev} B={B} T={T} measured")
        ax.plot(ks, [r["predicted"] or float("nan") for r in eng], "x--", color=line.get_color(),
                label=f"{dev} B={B} T={T} predicted")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xlabel("K (drafts per step)")
    ax.set_ylabel("speedup over target-only")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv):
    ap = OneLineParser(prog="python -m specdec_ext.bench e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    ap.add_argument("--k", type=int_in(1), nargs="+", default=[1, 2, 4, 6])
    ap.add_argument("--batch", type=int_in(1), nargs="+", default=[1, 8])
    ap.add_argument("--temperature", type=temperature, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--max-new-tokens", type=int_in(1), default=96)
    ap.add_argument("--prompts", type=int_in(1), default=4, help="prompts per configuration (batch 1: one call each)")
    ap.add_argument("--repeats", type=int_in(1), default=1,
                    help="rounds of every row, interleaved; ratios are per-round medians (default 1; use 3 or more "
                         "for figures on a shared machine)")
    ap.add_argument("--json", metavar="PATH", type=output_path)
    ap.add_argument("--plot", metavar="PNG", type=output_path,
                    help="speedup vs K, measured and predicted (needs matplotlib)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="add an 'engine ngram compiled' row (the n-gram engine on torch.compile'd decode steps) "
                         "and, with --hf, 'HF-model ... compiled' rows")
    ap.add_argument("--hf", action="store_true",
                    help="add HF-model rows: the engine on the pair loaded through transformers (batched HF path)")
    ap.add_argument("--hf-k", type=int_in(1), default=4, help="K of the fixed-K and per-row HF-model rows (default 4)")
    ap.add_argument("--only-hf", action="store_true", help="with --hf: skip the reference-model engine rows")
    ap.add_argument("--tree", type=int_in(1), nargs="+", default=[4, 2, 2],
                    help="branching per depth of the 'engine tree' rows (default 4 2 2: 29 nodes, depth 3)")
    ap.add_argument("--no-tree", action="store_true", help="skip the tree speculation rows")
    ap.add_argument("--no-block", dest="block", action="store_false",
                    help="skip the block-verification rows ('engine block' at every --k, 'engine adaptive block')")
    ap.add_argument("--datastore", metavar="PATH", default=None,
                    help="add 'engine ngram datastore' rows (and 'HF-model ngram datastore' with --hf): n-gram "
                         "drafting with retrieval from this corpus (a text file, a directory of .py/.txt/.md files "
                         "or .u16 / .i32 token ids; text encoded with the bundled tokenizer)")
    args = ap.parse_args(argv)
    args.datastore_built = None
    if args.datastore is not None and not os.path.exists(args.datastore):
        ap.error(f"--datastore {args.datastore}: no such file or directory")
    if args.datastore is not None:
        from .. import bundled
        from ..engine import Datastore

        try:
            args.datastore_built = Datastore.from_path(args.datastore, bundled.load_tokenizer())
        except (OSError, ValueError) as e:
            ap.error(f"--datastore {args.datastore}: {e}")
    if args.no_tree:
        args.tree = None
    args.hf = args.hf or args.only_hf
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        print("cuda: no GPU: skipped", file=sys.stderr)
        devices.remove("cuda")
    bar = progress_bar(args.no_progress, unit="run")  # its total grows per block
    rows = []

    def save():  # whole or not at all: a run killed while saving keeps the previous file
        if args.json:
            write_rows_json(args.json, rows)

    with measuring():  # weight-loading bars, transformers' and Inductor's notices: held back until here
        for d in devices:
            bench_device(d, args, rows, bar, save)
        bar.close()
        if args.plot:  # before the table too (matplotlib may log, e.g. building its font cache)
            plot(rows, args.plot)
    save()
    warn_if_busy(busiest(rows))  # one line on stderr when a block was timed with more load than cores
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, max_new_tokens {args.max_new_tokens}")
    print_table(HEADER, [LEGEND], table_lines(rows, args.tree))
    return 0
