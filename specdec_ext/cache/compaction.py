"""Compaction of a step's KV entries (tree speculation): the entries of the accepted path
move to the front of the step's slots, so that a plain rollback then keeps them.

Semantics (one rule for both caches): with ``base[b]`` = row b's length before the step,
for every j < count[b], slot ``base[b] + j`` receives what slot ``base[b] + src_index[b, j]``
held before the call; lengths do not change. ``src_index[b, :count[b]]`` is strictly
increasing (the ops' rule; a root-to-node path of a BFS-numbered tree is).

The caches call the ops ``specdec_ext.kv_compact_`` / ``specdec_ext.paged_kv_compact_``,
one layer per call; :func:`compact_rows` adds the caches' own rule (sources inside the
step's entries) to the ops' checks.
"""
from __future__ import annotations

from typing import Tuple

import torch

__all__ = ["check_num_appended", "compact_rows"]


def check_num_appended(cache: str, rows, lengths, num_appended: int) -> None:
    """``compact``'s rule on ``num_appended``: at most each row's length (``rows``: the row
    indices or sequence ids, ``lengths``: their lengths), else ``ValueError`` naming them."""
    short = [(r, n) for r, n in zip(rows, lengths) if n < num_appended]
    if short:
        raise ValueError(f"{cache}.compact: num_appended={num_appended} is more than rows {[r for r, _ in short]!r} "
                         f"hold (lengths {[n for _, n in short]}); nothing changed")


def compact_rows(src_index: torch.Tensor, count: torch.Tensor, batch_size: int, num_appended: int,
                 device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Check src_index [B, M] and count [B] (integer tensors; values too when on the CPU:
    ``ValueError``, nothing changes) and return them as int64 on ``device``."""
    for name, t, dim in (("src_index", src_index, 2), ("count", count, 1)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32 or int64 tensor, got "
                            f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dim() != dim or t.shape[0] != batch_size:
            want = "[B, M]" if dim == 2 else "[B]"
            raise ValueError(f"{name} must be {want} with B = {batch_size}, got shape {tuple(t.shape)}")
    M = src_index.shape[1]
    if count.device.type == "cpu":
        cnt = count.to(torch.int64)
        bad = (cnt < 0) | (cnt > min(M, num_appended))
        if bool(bad.any()):
            raise ValueError(f"count must be in [0, min(M={M}, num_appended={num_appended})], got "
                             f"{cnt[bad].tolist()} at rows {bad.nonzero().flatten().tolist()}; nothing changed")
        if src_index.device.type == "cpu" and M:
            used = torch.arange(M).view(1, M) < cnt.view(-1, 1)
            src = src_index.to(torch.int64)
            prev = torch.cat([torch.full((src.shape[0], 1), -1, dtype=torch.int64), src[:, :-1]], dim=1)
            bad = used & ((src <= prev) | (src >= num_appended))
            if bool(bad.any()):
                b, j = bad.nonzero()[0].tolist()
                raise ValueError(f"src_index[{b}, :count] must be strictly increasing in [0, num_appended="
                                 f"{num_appended}); src_index[{b}, {j}] = {int(src[b, j])}; nothing changed")
    return src_index.to(device, torch.int64), count.to(device, torch.int64)
