"""Speculative decoding in your own loop: ``specdec_ext.sample`` + ``specdec_ext.verify`` on
any Hugging Face causal LM pair (a draft and a target that share a vocabulary).

    python examples/hf_custom_loop.py                          # the bundled pair, loaded by transformers
    python examples/hf_custom_loop.py --temperature 0.8 --seed 3 --k 4
    python examples/hf_custom_loop.py --target DIR --draft DIR --prompt "..."
    python examples/hf_custom_loop.py --check                  # greedy: compare with target.generate

This is the loop :class:`specdec_ext.SpeculativeEngine` runs for you (batched, adaptive K,
device-side caches and rollback); here it is written out for one sequence on transformers'
own ``DynamicCache`` so that every step is visible. One step:

1. draft:    K forwards of the draft, each picking one token with ``specdec_ext.sample``,
             which also writes the draft's distribution q (``probs_out``) that verify needs;
2. score:    ONE forward of the target over [last token, d1..dK] -> logits [1, K+1, V];
3. verify:   ``specdec_ext.verify`` accepts a prefix d1..dn of the drafts and samples the
             correction token (or, when all K pass, the bonus token): n + 1 tokens whose law
             is exactly the target's (at temperature 0: the target's greedy tokens);
4. rollback: both caches hold keys / values of drafts that were rejected: crop them.

Needs transformers: pip install 'specdec_ext[hf]'.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

import specdec_ext


@dataclass
class LoopStats:
    """What the loop did: steps (target forwards), drafts proposed, drafts accepted."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


# --------------------------------------------------------------------------- the model side
def _cache_kwarg(model) -> str:
    """The forward's cache argument: ``cache`` in newer transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_cache(model):
    """An empty DynamicCache for ``model`` (older transformers take no config)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


@torch.no_grad()
def forward(model, cache, tokens: Sequence[int]) -> torch.Tensor:
    """Feed ``tokens`` after what ``cache`` holds (the cache grows by len(tokens)).

    Returns logits [1, len(tokens), V] as float32 (the ops take fp32 / fp16 / bf16 logits;
    a float64 model's are converted)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(tokens)], dtype=torch.int64, device=device)
    logits = model(ids, use_cache=True, **{_cache_kwarg(model): cache}).logits
    return logits if logits.dtype in (torch.float32, torch.float16, torch.bfloat16) else logits.float()


def crop(cache, length: int) -> None:
    """Roll ``cache`` back to its first ``length`` tokens (no-op when it holds no more).
    A negative argument to DynamicCache.crop removes that many tokens in every transformers
    version; older ones read a non-negative argument as the length to keep, newer refuse it."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


# --------------------------------------------------------------------------- the loop
def speculative_generate(target, draft, prompt_ids: Sequence[int], max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0, seed: int = 0,
                         eos_token_id: Optional[int] = None) -> Tuple[List[int], LoopStats]:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` with a draft proposing
    up to ``k`` tokens per step. Returns (the new tokens, LoopStats).

    Invariant between steps: ``seq`` is the prompt plus everything emitted; the target's
    cache holds all of ``seq`` but its last token (which the next step feeds), the draft's
    cache a prefix of ``seq`` (it is one token further behind after a step that accepted
    every draft, because d_K was sampled but never fed to the draft)."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: the first step needs a last token to feed")
    seq, stats = list(prompt_ids), LoopStats()
    target_cache, draft_cache = new_cache(target), new_cache(draft)
    if len(seq) > 1:  # prefill all but the last prompt token
        forward(target, target_cache, seq[:-1])
        forward(draft, draft_cache, seq[:-1])
    new: List[int] = []
    while len(new) < max_new_tokens:
        # A step emits at most K + 1 tokens: draft no more than the budget leaves room for.
        # K = 0 is plain decoding: verify then samples one token from the target.
        K = min(k, max_new_tokens - len(new) - 1)
        draft_ids, draft_probs = draft_step(draft, draft_cache, seq, K, temperature, seed, stats.steps, k)
        # Score: one target forward over [last, d1..dK]; position i predicts the token after it.
        target_logits = forward(target, target_cache, seq[target_cache.get_seq_length():] + draft_ids[0].tolist())
        res = specdec_ext.verify(target_logits, draft_ids, draft_probs, temperature, seed=seed,
                                 offset=stats.steps)  # verify keys its draws on its own stream: see rng_offsets
        if not bool(res.valid[0]):
            raise RuntimeError("verify marked the row invalid (NaN / inf logits or a bad draft probability)")
        n = int(res.num_accepted[0])
        emitted = res.tokens[0, : n + 1].tolist()  # d1..dn, then the correction / bonus token
        # Roll back: the target cached seq + d1..dK, the draft seq + d1..d(K-1) (or less).
        # Keep seq + d1..dn; the new last token (emitted[-1]) is fed by the next step.
        crop(target_cache, len(seq) + n)
        crop(draft_cache, len(seq) + n)
        stats.steps, stats.drafted, stats.accepted = stats.steps + 1, stats.drafted + K, stats.accepted + n
        for token in emitted[: max_new_tokens - len(new)]:
            seq.append(token)
            new.append(token)
            if token == eos_token_id:
                return new, stats
    return new, stats


def rng_offsets(step: int, i: int, k_max: int) -> int:
    """Offset of the i-th draft sample of ``step`` (0-based), for runs drafting <= k_max per step.

    The ops draw their random numbers from (seed, offset, ...) keys: two calls with the same
    seed and offset reuse the same numbers. A stride of k_max + 1 per step gives each of a
    step's K <= k_max draft samples an offset no other sample of the run uses, so no draw
    is correlated with another (the README's ``step * 64 + i`` is the same with a stride
    of 64: any stride above the largest K works). verify draws on a stream of its own
    (csrc/core/rng.h keeps the two ops apart), so ``offset=step`` is enough for it. The
    engine's full layout, coupled mode included: specdec_ext/engine/rng_keys.py."""
    return step * (k_max + 1) + i


def draft_step(draft, cache, seq: List[int], K: int, temperature: float, seed: int, step: int,
               k_max: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """K draft tokens after ``seq``: (draft_ids [1, K] int64, draft_probs [1, K, V] float32),
    draft_probs[0, i] being the law d_(i+1) was sampled from (what verify's ratio test needs).
    The first forward feeds what the draft's cache lacks of ``seq`` (its last token, and d_K
    of a previous step whose drafts were all accepted); each next one the token just drawn."""
    V = draft.config.vocab_size
    device = next(draft.parameters()).device
    draft_ids = torch.empty(1, K, dtype=torch.int64, device=device)
    draft_probs = torch.empty(1, K, V, dtype=torch.float32, device=device)
    feed = seq[cache.get_seq_length():]
    for i in range(K):
        logits = forward(draft, cache, feed)[:, -1]  # [1, V]: the next-token logits
        draft_ids[:, i] = specdec_ext.sample(logits, temperature, seed=seed, offset=rng_offsets(step, i, k_max),
                                             probs_out=draft_probs[:, i])
        feed = [int(draft_ids[0, i])]
    return draft_ids, draft_probs


# --------------------------------------------------------------------------- command line
def load_pair(target_dir: Optional[str], draft_dir: Optional[str], dtype: torch.dtype, device: str):
    """(target, draft) transformers models: the given checkpoint directories, else the
    pair bundled with specdec_ext (Llama architecture, Hugging Face format)."""
    from transformers import AutoModelForCausalLM

    if target_dir is None:
        from specdec_ext import bundled

        target_dir, draft_dir = bundled.pair_dir("target"), bundled.pair_dir("draft")
    return tuple(AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device).eval()
                 for d in (target_dir, draft_dir))


def load_tokenizer(target_dir: Optional[str]):
    """The target's tokenizer.json (the bundled pair's by default), or None when absent."""
    from tokenizers import Tokenizer

    from specdec_ext import bundled

    path = os.path.join(target_dir or bundled.pair_dir("target"), "tokenizer.json")
    return Tokenizer.from_file(path) if os.path.exists(path) else None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target checkpoint directory (default: the bundled pair)")
    ap.add_argument("--draft", help="draft checkpoint directory (with --target)")
    ap.add_argument("--prompt", default="def fibonacci(n):", help="prompt text (default: %(default)r)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="default: %(default)s")
    ap.add_argument("--k", type=int, default=4, help="drafts per step (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"],
                    help="default: %(default)s")
    ap.add_argument("--device", default="cpu", help="default: %(default)s")
    ap.add_argument("--check", action="store_true",
                    help="greedy only: also run target.generate(do_sample=False) and compare token for token")
    args = ap.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        ap.error("give both --target and --draft, or neither (the bundled pair)")
    if args.max_new_tokens < 1 or args.k < 0 or args.temperature < 0:
        ap.error("--max-new-tokens must be >= 1, --k >= 0 and --temperature >= 0")
    if args.check and args.temperature != 0:
        ap.error("--check compares with greedy generate: use --temperature 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("error: this example needs transformers: pip install 'specdec_ext[hf]'", file=sys.stderr)
        return 2
    target, draft = load_pair(args.target, args.draft, getattr(torch, args.dtype), args.device)
    tok = load_tokenizer(args.target)
    if tok is None:
        print("error: no tokenizer.json in the target directory", file=sys.stderr)
        return 2
    prompt_ids = tok.encode(args.prompt).ids
    eos = target.config.eos_token_id if isinstance(target.config.eos_token_id, int) else None
    new, stats = speculative_generate(target, draft, prompt_ids, args.max_new_tokens, k=args.k,
                                      temperature=args.temperature, seed=args.seed, eos_token_id=eos)
    print(args.prompt + tok.decode(new))
    print(f"{len(new)} tokens in {stats.steps} target forwards; {stats.accepted} of {stats.drafted} drafts "
          f"accepted ({stats.acceptance_rate:.0%})")
    if args.check:
        ids = torch.tensor([prompt_ids], device=args.device)
        ref = target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos,
                              pad_token_id=eos if eos is not None else 0)[0, len(prompt_ids):].tolist()
        same = ref == new
        print(f"check: {'equal to' if same else 'DIFFERENT from'} target.generate (greedy), {len(ref)} tokens")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
