"""python -m specdec_ext.generate: speculative decoding from the command line.

    python -m specdec_ext.generate --prompt "def fibonacci(n):"          # the bundled pair
    python -m specdec_ext.generate --target DIR --draft DIR --drafter model --prompt-ids 1 2 3 [--k 5] [--fixed-k]

With no --target / --draft the pair shipped with the package is used (offline) and a
text --prompt is tokenized with its tokenizer; DIR is any Hugging Face Llama checkpoint
directory (config.json + *.safetensors), loaded by the package's reference model (or by
transformers with --hf). Generation stops at the model's end-of-text token (the bundled
pair's <|endoftext|>, or config.json's eos_token_id; --eos-id overrides, --ignore-eos
disables). Prints the continuation (text when a tokenizer is known, else ids) and a
summary line: acceptance rate, tokens per step, tokens/s and the speedup over
target-only decoding of the same prompt: after a warm-up, --rounds speculative and
target-only runs are timed interleaved and the median speedup is printed with its
min-max (skip the target-only runs with --no-baseline: one timed run). With --drafter
head (the default with the bundled pair: prompt-lookup drafts where the text has a match, the
target's draft head elsewhere, branching at its first draft into --head-branches chains scored
as one tree; --draft-head DIR gives one for --target DIR, and makes head the default there too),
ngram (the default with --target DIR and no --draft-head, and with --hf, --compile or
--datastore) or suffix no draft model is used.
--prompt-file FILE runs its prompts (one per line, or JSON lines {"prompt": ...}) one after
another in ONE engine, so --drafter suffix drafts from the earlier prompts' outputs too;
the summary then covers the whole run (each round a fresh engine over every prompt).
--top-k / --top-p / --min-p filter the sampling law (Hugging Face's warper order; ignored
when greedy); --coupled keys every token by (seed, position) so the text equals target-only
sampling with the same --seed, whatever K or the drafter. --metrics-port serves Prometheus
metrics while it runs.

Arguments are checked before any model is loaded, and a prompt too long for the
model(s) before any is run; a bad one is a one-line error (exit code 2).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from . import _cli
from ._cli import OneLineParser, int_in, temperature
from ._validate import check_filter
from .bench.timing import busy_reason, machine_load
from .engine import Datastore, SpecDecMetrics, SpeculativeEngine, SuffixConfig
from .engine.engine import HEAD_BRANCHES
from .errors import CacheFullError, OutOfBlocksError

PROG = "python -m specdec_ext.generate"
DEFAULT_ROUNDS = 3
#: --k when not given. The CLI decodes one request at a time (B = 1), where drafts taken from
#: the text are free and a 17-token target pass costs about 1.4 one-token passes on a 2-core
#: CPU: K = 16 measured 2.31x vs 2.18x (K = 5) on bench e2e's 8 prompts and 3.11x vs 2.58x on
#: benchmarks/prompts/repetitive.jsonl (suffix), 2026-12-04 (benchmarks/RESULTS.md (e)).
#: A draft model pays one forward per draft: K = 5. (The engine's own default stays 5: in a
#: batch of 8 the wide pass costs more than it gains, 0.62x vs 0.88x.)
DEFAULT_K_TEXT = 16
DEFAULT_K_MODEL = 5

EPILOG = """\
the summary line:
  acceptance   share of the drafted tokens that the target accepted
  alpha        estimated probability that the target accepts one draft token (Leviathan et al.'s
               alpha): accepted / (accepted + rejected); drafts after a rejection are never
               tested, so alpha >= acceptance. Speculation pays off when alpha is high.
  tokens/step  tokens emitted per target forward (the accepted drafts + 1)
  tokens/s     median over the timed rounds
  speedup      median over --rounds rounds of speculative tokens/s / target-only tokens/s, the
               two runs of a round timed back to back after a warm-up, then (min-max over N rounds)
  load         the 1-minute load average and the core count; when the load exceeds the cores,
               other work competed for the CPU and a warning says the timings are unreliable
"""


def load_model(path: str, device: str, dtype: torch.dtype, hf: bool):
    """A checkpoint directory -> a model the engine accepts."""
    if hf:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype).to(device).eval()
    from .models.llama import LlamaModel

    return LlamaModel.from_pretrained(path, dtype=dtype, device=device)


def _filter(name: str, parse):
    """argparse type of one sampling filter, checked by the ops' rule (check_filter)."""
    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if parse is int else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            return check_filter(name, value)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e).replace(" or a tensor [B]", "")) from None
    return check


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring and epilog as written, and each option's default in its help
    (unless the help already says it, or there is none: None / a flag)."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if unset or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__, epilog=EPILOG, formatter_class=_HelpFormatter)
    ap.add_argument("--target", help="target checkpoint directory (default: the bundled pair)")
    ap.add_argument("--draft", help="draft checkpoint directory (default: the bundled pair's draft; "
                                    "needed with --target when the drafter is model or hybrid)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (bundled pair's tokenizer, or DIR/tokenizer.json)")
    src.add_argument("--prompt-ids", type=int_in(0), nargs="+", help="prompt token ids")
    src.add_argument("--prompt-file", metavar="FILE",
                     help="prompts, one per line (blank lines skipped) or JSON lines {\"prompt\": \"...\"} (for "
                          "prompts with newlines), run one after another in one engine; speedup of the whole run")
    ap.add_argument("--max-new-tokens", type=int_in(1), default=128, help="tokens to generate at most")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the target-only runs: one timed speculative run, no speedup figure")
    ap.add_argument("--rounds", type=int_in(1), default=None,
                    help=f"timed rounds, each one speculative and one target-only run, interleaved; the "
                         f"summary gives the median speedup and its spread (default: {DEFAULT_ROUNDS})")
    ap.add_argument("--k", type=int_in(0), default=None,
                    help=f"drafts per step (the maximum when adapting); default {DEFAULT_K_TEXT} for --drafter head / "
                         f"ngram / hybrid / suffix chains (drafts from the text or the head cost no model step), "
                         f"{DEFAULT_K_MODEL} otherwise")
    ap.add_argument("--adaptive", nargs="?", const="cost", default=None, choices=["cost", "threshold", "budget"],
                    help="adapt K in [0, k] by the expected speedup from alpha and the measured step costs "
                         "(default: cost, per row), by 'threshold' (the simple rule), or by 'budget' (one "
                         "batch-wide plan of every row's K, engine/budget.py); not with --fixed-k")
    ap.add_argument("--fixed-k", action="store_true", help="always draft exactly --k tokens (no adaptation)")
    ap.add_argument("--drafter", choices=["model", "ngram", "hybrid", "suffix", "head"], default=None,
                    help="where drafts come from: head (n-gram where a match exists, the target's draft head "
                         "elsewhere; the default with the bundled pair, measured fastest there, and with "
                         "--draft-head), the draft model (with --tree), prompt lookup (n-gram) in the prompt and "
                         "output (the default with --target DIR and no --draft-head, and with --hf, --compile or "
                         "--datastore), hybrid (n-gram where a match exists and the model elsewhere), or suffix (a "
                         "suffix index of the prompt and output and of the engine's earlier outputs, e.g. the "
                         "earlier prompts of a prompt file)")
    ap.add_argument("--draft-head", metavar="DIR", default=None,
                    help="--drafter head: the head's directory (DraftHead.save_pretrained; default: the bundled "
                         "target's head, so needed with --target DIR)")
    ap.add_argument("--head-branches", type=int_in(1), default=None, metavar="N",
                    help="--drafter head: where the head drafts, branch at its first draft into its N most "
                         "likely tokens, each followed greedily, scored as one tree (default "
                         f"{HEAD_BRANCHES}; 1: a chain)")
    ap.add_argument("--suffix-tree", action="store_true",
                    help="--drafter suffix proposes trees (scored in one target pass, verified by verify_tree) "
                         "instead of chains")
    ap.add_argument("--tree", type=int_in(1), nargs="+", default=None, metavar="B",
                    help="tree speculation with this branching per depth, e.g. --tree 4 2 2 (1 + 4 + 8 + 16 "
                         "nodes scored in one target pass; needs the draft model; --k does not apply)")
    ap.add_argument("--tree-mode", choices=["sampled", "topk"], default="sampled",
                    help="a tree node's children: i.i.d. draws from the draft's law, or its top tokens")
    ap.add_argument("--max-ngram", type=int_in(1), default=3, help="longest suffix n-gram matched")
    ap.add_argument("--datastore", metavar="PATH", default=None,
                    help="retrieval drafting (--drafter ngram / hybrid): where the prompt and output have no match "
                         "of 2+ tokens, draft from this corpus: a text file, a directory of .py/.txt/.md files "
                         "(encoded with the target's tokenizer), or token ids (.u16 / .i32, "
                         "scripts/build_datastore.py)")
    ap.add_argument("--temperature", type=temperature, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=_filter("top_k", int), default=None, help="keep the k most likely tokens (0 = off)")
    ap.add_argument("--top-p", type=_filter("top_p", float), default=None, help="nucleus sampling, in (0, 1] (1 = off)")
    ap.add_argument("--min-p", type=_filter("min_p", float), default=None,
                    help="keep tokens with p >= min_p * max p, in [0, 1) (0 = off)")
    ap.add_argument("--coupled", action="store_true",
                    help="coupled verification: the text equals target-only sampling with the same --seed")
    ap.add_argument("--verify", choices=["token", "block"], default=None,
                    help="exact verification of the drafts token by token or as a block (the same law, never "
                         "fewer accepted drafts in expectation; gains with the draft model's sampled drafts only, "
                         "the same as token for n-gram drafts); default: block for chains, token for trees; "
                         "block not with --coupled or --tree")
    ap.add_argument("--seed", type=_cli.seed, default=0,
                    help="sampling seed, any 64-bit pattern in [-2^63, 2^64 - 1] (the same seed gives the same text)")
    ap.add_argument("--eos-id", type=int_in(0), default=None, help="end-of-text id (default: the model's)")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-text")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda when a GPU is visible, else cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the models' dtype")
    ap.add_argument("--hf", action="store_true",
                    help="load with transformers instead of the reference model (pip install 'specdec_ext[hf]')")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the decode steps of both models (reference model, with its weights frozen "
                         "into the graphs, or --hf on the batched HF path; the first steps compile for seconds)")
    ap.add_argument("--metrics-port", type=_cli.port, default=None,
                    help="serve /metrics on this port (1-65535; 0: a free port the system picks) while running; "
                         "the address is printed to stderr")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (stderr)")
    return ap


def _model_dir(args, which: str) -> str:
    """The checkpoint directory of the 'target' or 'draft' (the bundled pair's by default)."""
    from . import bundled

    return getattr(args, which) or bundled.pair_dir(which)


def _config(args, which: str) -> dict:
    with open(os.path.join(_model_dir(args, which), "config.json")) as f:
        return json.load(f)


def _target_config(args) -> dict:
    return _config(args, "target")


def _uses_draft_model(args) -> bool:
    """The n-gram, suffix and head drafters need no draft model: none is loaded."""
    return args.drafter not in ("ngram", "suffix", "head")


def _check_drafter(ap: argparse.ArgumentParser, args) -> None:
    """--drafter defaults to head for the bundled pair on the reference model (eager, no
    --datastore) or with --draft-head, to ngram otherwise, and to model with --tree (which
    drafts with the model only)."""
    if args.suffix_tree and args.drafter != "suffix":
        ap.error("--suffix-tree shapes the suffix drafter's proposals: add --drafter suffix")
    if args.suffix_tree and args.verify == "block":
        ap.error("--suffix-tree verifies token by token (verify_tree) only: drop --verify block")
    if args.suffix_tree and args.coupled:
        ap.error("--suffix-tree verifies in exact mode only: drop --coupled")
    if args.tree is not None:
        if args.drafter not in (None, "model"):
            ap.error(f"--tree drafts its tree with the draft model: drop --drafter {args.drafter}")
        if args.coupled:
            ap.error("--tree verifies in exact mode only: drop --coupled")
        if args.verify == "block":
            ap.error("--tree verifies token by token only: drop --verify block")
    if args.draft_head is not None and args.drafter not in (None, "head"):
        ap.error(f"--draft-head drafts for --drafter head, not --drafter {args.drafter}")
    # the bundled pair ships a draft head for the reference model's eager steps; --datastore drafts
    # next to prompt lookup
    head_ok = not (args.hf or args.compile or args.datastore is not None)
    default = "head" if (args.target is None or args.draft_head is not None) and head_ok else "ngram"
    args.drafter = "model" if args.tree is not None else args.drafter or default
    if args.head_branches is not None and args.drafter != "head":
        ap.error(f"--head-branches shapes --drafter head's drafts; the drafter here is {args.drafter}")
    if args.head_branches is not None and args.head_branches > 1 and args.coupled:
        ap.error("--head-branches: coupled mode drafts chains (each token keyed by its position): drop one")
    if args.drafter == "head":
        if args.target is not None and args.draft_head is None:
            ap.error("--drafter head with --target DIR needs --draft-head DIR (the bundled head reads the bundled "
                     "target only)")
        if args.hf:
            ap.error("--drafter head reads the target's hidden states, which the reference model keeps: drop --hf "
                     "(or use --drafter ngram)")
        if args.compile:
            ap.error("--drafter head runs the target's steps eager (it keeps their hidden states): drop --compile "
                     "(or use --drafter ngram)")
        if args.draft_head is not None and not os.path.isfile(os.path.join(args.draft_head, "config.json")):
            ap.error(f"--draft-head {args.draft_head}: not a head directory (no config.json there)")
    args.k_default = args.k is None  # a default K shrinks to fit a long prompt (a given one is refused)
    if args.k is None:
        # hybrid: most drafts come from the text; its model rows' K stays short by the cost model
        chains = args.drafter in ("ngram", "hybrid", "head") or (args.drafter == "suffix" and not args.suffix_tree)
        args.k = DEFAULT_K_TEXT if chains else DEFAULT_K_MODEL


def _check_pair(ap: argparse.ArgumentParser, args) -> None:
    """--target / --draft: the bundled pair, or a target with a draft when one is used."""
    if args.draft is not None and args.target is None:
        ap.error("--draft needs --target (without both, the bundled pair is used)")
    if args.target is not None and args.draft is None and _uses_draft_model(args):
        ap.error(f"--drafter {args.drafter} needs --draft DIR (or --drafter ngram / suffix / head, which need no "
                 "draft model)")


def _check_transformers(ap: argparse.ArgumentParser, args) -> None:
    """--hf loads through transformers, an optional dependency (the [hf] extra)."""
    if not args.hf:
        return
    try:
        importlib.import_module("transformers")
    except ImportError as e:
        ap.error(f"--hf needs the transformers package ({e}): pip install 'specdec_ext[hf]' "
                 f"(or pip install transformers)")


def fits_message(prompt_len: int, max_new_tokens: int, capacities) -> Optional[str]:
    """None when a prompt of ``prompt_len`` tokens plus ``max_new_tokens`` fits every model,
    else the one-line reason. capacities: [(name, max positions or None)]. A run needs
    prompt + max_new_tokens - 1 positions (the last emitted token is never fed back)."""
    if max_new_tokens == 0:
        return None
    need = prompt_len + max_new_tokens - 1
    for name, cap in capacities:
        if cap is not None and need > cap:
            fix = (f"use --max-new-tokens {cap - prompt_len + 1} or less" if prompt_len <= cap
                   else f"shorten the prompt to at most {cap} tokens")
            return (f"the prompt is {prompt_len} tokens: with --max-new-tokens {max_new_tokens} the {name} model "
                    f"needs {need} positions but holds {cap}; {fix}")
    return None


def largest_k(cap: int, prompt_len: int) -> int:
    """The largest K whose first pass fits a model holding ``cap`` positions next to the
    prompt: that pass holds prompt_len - 1 entries, then K + 1 (negative: none fits)."""
    return cap - prompt_len


def speculation_fits_message(tree: Optional[List[int]], k: int, prompt_len: int, capacities) -> Optional[str]:
    """None when one target pass of the speculation (K + 1 positions, or every node of the
    tree) fits each model next to the prompt, else the one-line reason with the largest
    --k / --tree that fits (the engine would otherwise cut K or the depth at every step)."""
    for name, cap in capacities:
        if cap is None:
            continue
        room = cap - (prompt_len - 1)  # the first pass: prompt - 1 entries held, then the pass
        if tree is None:
            if k > largest_k(cap, prompt_len):
                return (f"--k {k}: a step scores K + 1 = {k + 1} positions, but the {name} model holds {cap} and the "
                        f"prompt takes {prompt_len}; use --k {max(0, largest_k(cap, prompt_len))} or less")
            continue
        nodes, level, fits = 1, 1, []
        for b in tree:
            if nodes + level * b > room:
                best = (room - nodes) // level
                fits += [best] if best >= 1 else []
                break
            level *= b
            nodes += level
            fits.append(b)
        else:
            continue
        total = sum(math.prod(tree[:i + 1]) for i in range(len(tree))) + 1
        advice = f"use --tree {' '.join(map(str, fits))} or smaller" if fits else "use --k (a chain) instead"
        return (f"--tree {' '.join(map(str, tree))}: one target pass scores its {total} nodes, but the {name} model "
                f"holds {cap} positions and the prompt takes {prompt_len}; {advice}")
    return None


def _config_capacities(args) -> List[Tuple[str, Optional[int]]]:
    """(name, config.json's max_position_embeddings) of each model the run loads."""
    names = ["target"] + (["draft"] if _uses_draft_model(args) else [])
    return [(n, _config(args, n).get("max_position_embeddings")) for n in names]


def _check_device(ap: argparse.ArgumentParser, text: str) -> None:
    """--device: a string torch parses, of a device that exists here and can hold a model."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as e:
        ap.error(f"--device {text}: not a device ({str(e).splitlines()[0]})")
    if device.type == "meta":
        ap.error(f"--device {text}: a meta tensor has no data, so a model cannot run there (use cpu or cuda)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            ap.error(f"--device {text}: no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            ap.error(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif device.type != "cpu":
        ap.error(f"--device {text}: only cpu and cuda are supported")


def _check_checkpoints(ap: argparse.ArgumentParser, args) -> None:
    """--target / --draft DIR: weights present, and (without --hf) a config the reference model implements."""
    from .models.llama import weights_file
    from .models.llama_config import LlamaConfig

    for name in ("target", "draft"):
        d = getattr(args, name)
        if d is None or (name == "draft" and not _uses_draft_model(args)):
            continue
        if weights_file(d) is None:
            ap.error(f"--{name} {d}: no weights there (model.safetensors, model.safetensors.index.json, "
                     "pytorch_model.bin or pytorch_model.bin.index.json)")
        if not args.hf:
            try:
                LlamaConfig.from_dict(_config(args, name))
            except (TypeError, ValueError) as e:
                ap.error(f"--{name} {d}: {e} (the reference model implements Llama; other models need --hf)")


def check_args(ap: argparse.ArgumentParser, args) -> dict:
    """Everything that can be checked before loading a model (``ap.error`` on a problem),
    the prompt's length against the models' capacity included. Returns the target's
    config.json."""
    _check_drafter(ap, args)
    if args.datastore is not None:
        if args.drafter not in ("ngram", "hybrid"):
            ap.error(f"--datastore drafts next to prompt lookup: it needs --drafter ngram or hybrid, "
                     f"not {args.drafter}")
        if not os.path.exists(args.datastore):
            ap.error(f"--datastore {args.datastore}: no such file or directory")
    if args.coupled and args.verify == "block":
        ap.error("--coupled and --verify block are two verification rules: pick one")
    _check_pair(ap, args)
    if args.rounds is not None and args.no_baseline:
        ap.error("--rounds times speculative against target-only runs; --no-baseline skips those (one timed run)")
    for name in ("target", "draft"):
        d = getattr(args, name)
        if d is not None and not os.path.isfile(os.path.join(d, "config.json")):
            ap.error(f"--{name} {d}: not a checkpoint directory (no config.json there)")
    if args.fixed_k and args.adaptive is not None:
        ap.error(f"--fixed-k pins K; --adaptive {args.adaptive} adapts it: drop one")
    _check_transformers(ap, args)
    _check_device(ap, args.device)
    _check_checkpoints(ap, args)
    cfg = _target_config(args)
    V = int(cfg.get("vocab_size", 0))
    if args.prompt_ids is not None and V and max(args.prompt_ids) >= V:
        ap.error(f"--prompt-ids: id {max(args.prompt_ids)} is outside the vocabulary [0, {V})")
    if args.eos_id is not None and V and args.eos_id >= V:
        ap.error(f"--eos-id {args.eos_id} is outside the vocabulary [0, {V})")
    if (args.prompt is not None or args.prompt_file is not None) and not os.path.exists(_tokenizer_path(args)):
        flag = "--prompt" if args.prompt is not None else "--prompt-file"
        ap.error(f"{flag} needs a tokenizer: {_tokenizer_path(args)} not found (use --prompt-ids)")
    if args.prompt is not None and not args.prompt:
        ap.error("--prompt is empty")
    if args.prompt_file is not None:
        try:
            args.prompts = read_prompt_file(args.prompt_file)
        except ValueError as e:
            ap.error(f"--prompt-file {e}")
    encoded = encode_prompts(args)[1]
    for i, ids in enumerate(encoded):
        if not ids:
            ap.error("--prompt encodes to no tokens" if args.prompt_file is None else
                     f"--prompt-file {args.prompt_file}: prompt {i + 1} encodes to no tokens")
    prompt_ids = max(encoded, key=len)
    if args.k_default and args.tree is None:  # a default K shrinks to what speculation_fits_message accepts
        fits = [largest_k(cap, len(prompt_ids)) for _, cap in _config_capacities(args) if cap is not None]
        args.k = max(0, min([args.k] + fits))
    problem = fits_message(len(prompt_ids), args.max_new_tokens, _config_capacities(args)) or \
        speculation_fits_message(args.tree, args.k, len(prompt_ids), _config_capacities(args))
    if problem:
        ap.error(problem)
    if args.metrics_port is not None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", args.metrics_port))
        except OSError as e:
            ap.error(f"--metrics-port {args.metrics_port}: cannot listen there ({e.strerror})")
    return cfg


def _tokenizer_path(args) -> str:
    return os.path.join(_model_dir(args, "target"), "tokenizer.json")


def read_prompt_file(path: str) -> List[str]:
    """The prompts of a --prompt-file: one per line (blank lines skipped), a line that starts
    with '{' being a JSON object with a string "prompt". ValueError naming the file (and
    line) when it cannot be read, holds no prompt, or has a bad JSON line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
                raise ValueError(f'{path} line {n}: a JSON line needs a non-empty string "prompt"') from None
            prompts.append(obj["prompt"])
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"{path}: no prompt in it (one per line, or JSON lines {{\"prompt\": ...}})")
    return prompts


def _tokenizer(args):
    """The target's tokenizer.json (``tokenizers.Tokenizer``), loaded once and kept on args;
    the caller has checked that the file exists."""
    if getattr(args, "tokenizer", None) is None:
        from tokenizers import Tokenizer

        args.tokenizer = Tokenizer.from_file(_tokenizer_path(args))
    return args.tokenizer


def encode_prompts(args):
    """(tokenizer or None, [prompt token ids, ..]): --prompt / --prompt-file's prompts through
    the target's tokenizer.json, or --prompt-ids as given (one prompt)."""
    if args.prompt is None and args.prompt_file is None:
        return None, [list(args.prompt_ids)]
    tok = _tokenizer(args)
    texts = [args.prompt] if args.prompt_file is None else args.prompts
    return tok, [tok.encode(t).ids for t in texts]


def encode_prompt(args):
    """(tokenizer or None, prompt token ids) of a single-prompt run (--prompt / --prompt-ids)."""
    tok, encoded = encode_prompts(args)
    return tok, encoded[0]


def _eos(args, cfg: dict):
    """The end-of-text id(s) generation stops at, or None."""
    if args.ignore_eos:
        return None
    if args.eos_id is not None:
        return args.eos_id
    if args.target is None:
        from . import bundled

        return bundled.eos_token_id()
    return cfg.get("eos_token_id")


def _load(args):
    """(target, draft) models; draft is None when a --target DIR runs without a draft model
    (--drafter ngram)."""
    from . import bundled

    dtype = getattr(torch, args.dtype)
    if args.target is None:
        bundled.verify_checksums()
        return bundled.load_pair(device=args.device, dtype=dtype, implementation="hf" if args.hf else "reference",
                                 check=False)
    target = load_model(args.target, args.device, dtype, args.hf)
    use_draft = args.draft is not None and _uses_draft_model(args)
    return target, load_model(args.draft, args.device, dtype, args.hf) if use_draft else None


def _compiled(model):
    """The model with torch.compile'd decode steps: the reference model itself, with its
    weights frozen into the graphs (they do not change here), or a transformers model on
    its batched SpecModel (the per-row HF path cannot compile)."""
    from .models.llama import LlamaModel

    if isinstance(model, LlamaModel):
        return model.compile_decode(freeze=True)
    if not hasattr(model, "compile_decode"):
        from .models import adapt

        model = adapt(model)
        if not hasattr(model, "compile_decode"):
            raise SystemExit(f"error: --compile needs the batched HF path, which {type(model).__name__} is not")
    return model.compile_decode()


def progress_bar(total: int, enabled: bool):
    """A tqdm bar (stderr) when available and wanted, else a no-op callable."""
    if not enabled:
        return None, lambda done: None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, lambda done: None
    bar = tqdm(total=total, unit="tok", file=sys.stderr, leave=False)

    def update(done: int):
        bar.update(done - bar.n)

    return bar, update


def _sampling(args) -> dict:
    """generate()'s sampling keyword arguments from the flags: temperature, seed, top_k,
    top_p, min_p (the same for the timed run, its warm-ups and the baseline)."""
    return dict(temperature=args.temperature, seed=args.seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)


def _mode(args) -> Optional[str]:
    """The engine's verify_mode from --coupled / --verify (None: the engine's default)."""
    if args.coupled:
        return "coupled"
    return {"block": "block", "token": "exact", None: None}[args.verify]


def _fail(message: str) -> None:
    """A one-line error and exit code 2, as for a bad argument."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _timed(engine, ids, args, eos, progress=None):
    """(output, seconds) of one generation of the request."""
    t0 = time.perf_counter()
    out = engine.generate(ids, args.max_new_tokens, eos_token_id=eos, progress=progress, **_sampling(args))
    return out, time.perf_counter() - t0


def _tok_s(out, seconds: float) -> float:
    return out.stats[0].tokens_generated / seconds if seconds > 0 else 0.0


@dataclass
class Timings:
    """The timed runs: the first speculative output (printed), and per round the seconds
    and tokens/s of the speculative run and (unless --no-baseline) the target-only run."""

    out: object
    spec_s: List[float] = field(default_factory=list)
    spec_tok_s: List[float] = field(default_factory=list)
    base_tok_s: List[float] = field(default_factory=list)

    def speedups(self) -> List[float]:
        """Per-round speculative / target-only tokens/s (empty without a baseline or tokens)."""
        return [s / b for s, b in zip(self.spec_tok_s, self.base_tok_s) if b > 0]


def _warm_up(engine, plain, ids, args) -> None:
    """Untimed first runs: allocations, caches, the cost model's first steps; with --compile
    the whole request, so every step kind compiles outside the timing."""
    engine.generate(ids, args.max_new_tokens if args.compile else min(4, args.max_new_tokens), **_sampling(args))
    if plain is not None:
        plain.generate(ids, min(4, args.max_new_tokens), **_sampling(args))  # compiles its 1-token step


def time_rounds(engine, plain, ids, args, eos, rounds: int, update=lambda done: None) -> Timings:
    """``rounds`` rounds of one speculative and (plain not None) one target-only run each;
    without a baseline one speculative run.

    The two runs of a round are timed back to back and their order alternates (ABBA), so a
    slow spell of a shared machine (another job, frequency changes) weighs on both kinds
    alike instead of on whichever ran second. Round 0 runs the speculative one first.
    Each speculative run starts with an empty global suffix index (drafter 'suffix'): the
    same request run again would otherwise draft from its own earlier output, and the figure
    would be that of a memorised request. ``update(tokens)`` drives a progress bar over all runs."""
    engines = {"spec": engine, "base": plain}
    timings, done = None, 0
    for r in range(rounds if plain is not None else 1):
        for kind in (("spec", "base") if r % 2 == 0 else ("base", "spec")):
            if engines[kind] is None:
                continue
            if getattr(engines[kind], "suffix", None) is not None:
                engines[kind].suffix.clear()
            out, seconds = _timed(engines[kind], ids, args, eos, lambda n, d=done: update(d + n))
            done += args.max_new_tokens
            if kind == "spec":
                timings = timings or Timings(out)
                timings.spec_s.append(seconds)
                timings.spec_tok_s.append(_tok_s(out, seconds))
            else:
                timings.base_tok_s.append(_tok_s(out, seconds))
    return timings


def speed_text(t: Timings, baseline: bool) -> str:
    """The summary's speedup part: '' without a baseline, else
    ' | target-only X tokens/s -> speedup 1.57x (1.44-1.71x over 3 rounds)'."""
    if not baseline:
        return ""
    base = statistics.median(t.base_tok_s)
    ups = t.speedups()
    if not ups:
        return f" | target-only {base:.1f} tokens/s -> speedup n/a (no tokens)"
    spread = f"{min(ups):.2f}-{max(ups):.2f}x over {len(ups)} round{'s' if len(ups) > 1 else ''}"
    return f" | target-only {base:.1f} tokens/s -> speedup {statistics.median(ups):.2f}x ({spread})"


def summary_line(t: Timings, baseline: bool, load: dict) -> str:
    """acceptance | tokens/step | tokens, seconds, tokens/s (medians over the rounds)
    [| target-only tokens/s -> speedup] | load."""
    st = t.out.stats[0]
    load_text = "n/a" if load["load_1min"] is None else f"{load['load_1min']:.2f}"
    return (f"acceptance {st.acceptance_rate:.1%} (alpha {st.alpha:.2f}) | tokens/step {st.tokens_per_step:.2f} | "
            f"{st.tokens_generated} tokens in {statistics.median(t.spec_s):.2f}s = "
            f"{statistics.median(t.spec_tok_s):.1f} tokens/s{speed_text(t, baseline)} | "
            f"load {load_text} on {load['cpu_count']} cores")


def load_datastore(args):
    """The --datastore corpus (a Datastore), or None; text goes through the target's tokenizer.
    Built on the first call and kept on args (every engine of the run shares it)."""
    if args.datastore is None:
        return None
    if getattr(args, "datastore_built", None) is None:
        text = not args.datastore.endswith((".u16", ".i32"))
        tok = _tokenizer(args) if text and os.path.exists(_tokenizer_path(args)) else None
        try:
            args.datastore_built = Datastore.from_path(args.datastore, tok)
        except (OSError, ValueError) as e:
            _fail(f"--datastore {args.datastore}: {e}")
    return args.datastore_built


def _engine(args, target, draft, metrics):
    suffix = SuffixConfig(tree=args.suffix_tree) if args.drafter == "suffix" else None
    return SpeculativeEngine(target, draft if _uses_draft_model(args) else None, k=args.k,
                             adaptive_k=False if args.fixed_k else (args.adaptive or "cost"), metrics=metrics,
                             drafter="auto" if args.drafter == "ngram" else args.drafter, max_ngram=args.max_ngram,
                             verify_mode=_mode(args), tree=args.tree, tree_mode=args.tree_mode, suffix=suffix,
                             datastore=load_datastore(args), draft_head=_draft_head(args, target),
                             head_branches=args.head_branches or HEAD_BRANCHES)


def _draft_head(args, target):
    """--drafter head: the head over ``target`` (--draft-head DIR, else the bundled one), loaded once."""
    if args.drafter != "head":
        return None
    if getattr(args, "draft_head_model", None) is None:
        from . import bundled
        from .models import DraftHead

        try:
            args.draft_head_model = (bundled.load_head(target, check=False) if args.draft_head is None
                                     else DraftHead.from_pretrained(args.draft_head, target))
        except (OSError, KeyError, TypeError, ValueError) as e:
            _fail(f"--draft-head {args.draft_head or bundled.pair_dir('head')}: {e}")
    return args.draft_head_model


def time_file_rounds(make_engine, plain, prompts, args, eos, rounds: int, update=lambda done: None):
    """--prompt-file: ``rounds`` rounds, each a FRESH speculative engine (its global suffix
    index starts empty) running every prompt one after another, and (plain not None) the
    target-only engine over the same prompts; the order alternates between rounds (ABBA).
    Returns (the first round's speculative outputs, Timings of whole runs: seconds and
    tokens/s summed over the prompts)."""
    timings, first, done = Timings(None), None, 0
    for r in range(rounds if plain is not None else 1):
        for kind in (("spec", "base") if r % 2 == 0 else ("base", "spec")):
            if kind == "base" and plain is None:
                continue
            engine = make_engine() if kind == "spec" else plain
            outs, seconds = [], 0.0
            for ids in prompts:
                out, s = _timed(engine, ids, args, eos, lambda n, d=done: update(d + n))
                done += args.max_new_tokens
                outs.append(out)
                seconds += s
            tokens = sum(o.stats[0].tokens_generated for o in outs)
            if kind == "spec":
                first = first or outs
                timings.spec_s.append(seconds)
                timings.spec_tok_s.append(tokens / seconds if seconds > 0 else 0.0)
            else:
                timings.base_tok_s.append(tokens / seconds if seconds > 0 else 0.0)
    return first, timings


def file_summary_line(outs, t: Timings, baseline: bool, load: dict) -> str:
    """The --prompt-file summary: prompts, tokens, acceptance and tokens per target pass over
    the whole run (first round), tokens/s (median) [| target-only -> speedup] | load."""
    stats = [o.stats[0] for o in outs]
    tokens = sum(s.tokens_generated for s in stats)
    steps = sum(o.steps for o in outs)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    load_text = "n/a" if load["load_1min"] is None else f"{load['load_1min']:.2f}"
    return (f"{len(outs)} prompts, one engine: acceptance {accepted / drafted if drafted else 0.0:.1%} | "
            f"tokens/step {tokens / steps if steps else 0.0:.2f} | {tokens} tokens in "
            f"{statistics.median(t.spec_s):.2f}s = {statistics.median(t.spec_tok_s):.1f} tokens/s"
            f"{speed_text(t, baseline)} | load {load_text} on {load['cpu_count']} cores")


def run_file(args, cfg: dict, target, draft, metrics) -> int:
    """--prompt-file: every prompt in one engine per round (see :func:`time_file_rounds`)."""
    tok, encoded = encode_prompts(args)
    eos = _eos(args, cfg)
    try:
        _engine(args, target, draft, metrics)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plain = None if args.no_baseline else SpeculativeEngine(target, None, k=0, adaptive_k=False,
                                                            verify_mode=_mode(args))
    prompts = [torch.tensor([p], dtype=torch.int64) for p in encoded]
    rounds = 1 if plain is None else (args.rounds or DEFAULT_ROUNDS)
    try:
        _warm_up(_engine(args, target, draft, None), plain, prompts[0], args)
        runs = rounds * (1 if plain is None else 2) * len(prompts)
        bar, update = progress_bar(runs * args.max_new_tokens, not args.no_progress and args.max_new_tokens >= 32)
        outs, timings = time_file_rounds(lambda: _engine(args, target, draft, metrics), plain, prompts, args, eos,
                                         rounds, update)
    except (CacheFullError, OutOfBlocksError) as e:
        _fail(str(e))
    if bar is not None:
        bar.close()
    load = machine_load()
    for text, out in zip(args.prompts, outs):
        print(json.dumps({"prompt": text, "completion": tok.decode(out.generated[0])}))
    print(file_summary_line(outs, timings, plain is not None, load))
    if busy_reason(load):
        print(f"warning: {busy_reason(load)}: the timings are unreliable; rerun on an idle machine", file=sys.stderr)
    return 0


def run(args, cfg: dict) -> int:
    tok, prompt_ids = encode_prompt(args)
    eos = _eos(args, cfg)
    target, draft = _load(args)
    if args.compile:
        target, draft = _compiled(target), (_compiled(draft) if draft is not None else None)
    metrics = SpecDecMetrics(engine="cli") if args.metrics_port is not None else None
    server = metrics.serve(args.metrics_port) if metrics else None
    if server is not None:
        print(f"metrics: http://127.0.0.1:{server.server_port}/metrics", file=sys.stderr)
    if args.prompt_file is not None:
        try:
            return run_file(args, cfg, target, draft, metrics)
        finally:
            if server is not None:
                server.shutdown()
    try:
        engine = _engine(args, target, draft, metrics)
    except ValueError as e:  # e.g. a model that cannot take a tree: one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    # the loaded models' own limits (a sliding window, say), before any run: one line, the user's figures
    problem = fits_message(len(prompt_ids), args.max_new_tokens, [(n, m.max_positions) for n, m in engine.models])
    if problem:
        _fail(problem)
    plain = None if args.no_baseline else SpeculativeEngine(target, None, k=0, adaptive_k=False,
                                                            verify_mode=_mode(args))
    ids = torch.tensor([prompt_ids], dtype=torch.int64)
    rounds = 1 if plain is None else (args.rounds or DEFAULT_ROUNDS)
    try:
        _warm_up(engine, plain, ids, args)
        runs = rounds * (1 if plain is None else 2)
        bar, update = progress_bar(runs * args.max_new_tokens, not args.no_progress and args.max_new_tokens >= 32)
        timings = time_rounds(engine, plain, ids, args, eos, rounds, update)
    except (CacheFullError, OutOfBlocksError) as e:
        _fail(str(e))
    if bar is not None:
        bar.close()
    load = machine_load()  # the 1-minute average now covers the timed runs
    out = timings.out
    print(args.prompt + tok.decode(out.generated[0]) if tok is not None else " ".join(map(str, out.generated[0])))
    print(summary_line(timings, plain is not None, load))
    if busy_reason(load):
        print(f"warning: {busy_reason(load)}: the timings are unreliable; rerun on an idle machine", file=sys.stderr)
    if server is not None:
        server.shutdown()
    return 0


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    cfg = check_args(ap, args)
    return run(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
