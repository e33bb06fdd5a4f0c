"""``specdec::verify_shard`` / ``verify_shard_finish``: the local stages of vocabulary-parallel
verify and sample (csrc/core/shard_math.h). Users call :mod:`specdec_ext.distributed`, which
runs the stages and the collectives between them; this module holds the ops' fake kernels and
the layout rule their output widths follow."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from .registry import host_args
from ._fake_checks import FLOATS, INDEX, check_devices, check_dim, check_dtype, check_filters, check_row_values

__all__ = ["RACE_TILE", "shard_steps"]

#: tokens per race tile (core/verify_math.h kRaceTile): shard bounds that are multiples of it give
#: the single-device tokens bit for bit
RACE_TILE = 128


def _cover_level(p: int, end: int) -> int:
    level = 0
    while ((p >> level) & 1) == 0 and p + (2 << level) <= end:
        level += 1
    return level


def _cover_size(a: int, b: int) -> int:
    n, p = 0, a
    while p < b:
        p += 1 << _cover_level(p, b)
        n += 1
    return n


def _part_count(s: int, e: int) -> int:
    return 0 if e <= s else (e - 1) // RACE_TILE - s // RACE_TILE + 1


def shard_steps(shard_bounds: Sequence[int], top_k: bool = False, top_p: bool = False,
                min_p: bool = False, cuda: bool = False) -> List[Tuple[str, int, torch.dtype]]:
    """The steps of verify_shard for the vocabulary split ``shard_bounds`` (int[P+1]) and the
    filters given (csrc/core/shard_math.h ShardPlan): (kind, output width, dtype) of each, in
    order. Every step's output is [B, K+1, width]:

    - max    2 float64 (max, first argmax); CUDA kernels: 3 (and a flag: a finite |logit| >= 2^127)
    - top_k  256 int64 counts, one step per radix pass (4)
    - top_p  256 counts + 256 fixed-point masses, int64 (4 passes)
    - min_p  1 int64 (the order key of the shard's min-p bound)
    - sums   the largest tile-sum cover of a shard (core/tile_sum.h) + 2, float64; CUDA
             kernels: 2 values per cover node, (max, sum) pairs
    - races  7 float64

    cuda: the CUDA kernels' layout (CUDA tensors, or the SIMT emulation of those kernels).
    """
    first, covers = 0, []
    for s, e in zip(shard_bounds[:-1], shard_bounds[1:]):
        n = _part_count(s, e)
        covers.append(_cover_size(first, first + n))
        first += n
    steps = [("max", 3 if cuda else 2, torch.float64)]
    steps += [("top_k", 256, torch.int64)] * (4 if top_k else 0)
    steps += [("top_p", 512, torch.int64)] * (4 if top_p else 0)
    steps += [("min_p", 1, torch.int64)] * (1 if min_p else 0)
    return steps + [("sums", (2 if cuda else 1) * max(covers) + 2, torch.float64), ("races", 7, torch.float64)]


def _check_shard_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p, min_p,
                      num_drafts):
    check_devices(target_logits, "target_logits",
                  dict(draft_token_ids=draft_token_ids, draft_probs=draft_probs, temperature=temperature, seed=seed,
                       offset=offset, top_k=top_k, top_p=top_p, min_p=min_p, num_drafts=num_drafts),
                  host_ok=host_args("verify_shard"))
    check_filters(top_k, top_p, min_p)
    check_dim(target_logits, "target_logits", 3, "[B, K+1, V_r]")
    check_dim(draft_token_ids, "draft_token_ids", 2, "[B, K]")
    check_dim(draft_probs, "draft_probs", 3, "[B, K, V_r]")
    check_dim(num_drafts, "num_drafts", 1, "[B]")
    check_dtype(target_logits, "target_logits", FLOATS)
    check_dtype(draft_probs, "draft_probs", FLOATS)
    check_dtype(draft_token_ids, "draft_token_ids", INDEX)
    check_dtype(num_drafts, "num_drafts", INDEX)
    check_row_values(temperature, seed, offset)


@torch.library.register_fake("specdec::verify_shard")
def _verify_shard_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p, min_p,
                       num_drafts, coupled, shard_bounds, rank, stage, gathered):
    _check_shard_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p, min_p,
                      num_drafts)
    steps = shard_steps(shard_bounds, top_k is not None, top_p is not None, min_p is not None,
                        cuda=target_logits.device.type == "cuda")
    if not 0 <= stage <= len(steps):
        raise ValueError(f"stage must be in [0, {len(steps)}] (verify_shard_finish runs the last one), got {stage}")
    if stage == 0:
        return torch.empty((1,), dtype=torch.int64)  # the number of steps (on the CPU)
    _, width, dtype = steps[stage - 1]
    B, K1 = target_logits.shape[0], target_logits.shape[1]
    return target_logits.new_empty((B, K1, width), dtype=dtype)


@torch.library.register_fake("specdec::verify_shard_finish")
def _verify_shard_finish_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p,
                              min_p, num_drafts, coupled, shard_bounds, rank, gathered):
    _check_shard_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p, min_p,
                      num_drafts)
    B, K1 = target_logits.shape[0], target_logits.shape[1]
    return (target_logits.new_empty((B, K1), dtype=torch.int64), target_logits.new_empty((B,), dtype=torch.int64),
            target_logits.new_empty((B,), dtype=torch.bool))
