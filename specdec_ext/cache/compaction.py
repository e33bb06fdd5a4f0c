"""Compaction of a step's KV entries (tree speculation): the entries of the accepted path
move to the front of the step's slots, so that a plain rollback then keeps them.

Semantics (one rule for both caches): with ``base[b]`` = row b's length before the step,
for every j < count[b], slot ``base[b] + j`` receives what slot ``base[b] + src_index[b, j]``
held before the call; lengths do not change. ``src_index[b, :count[b]]`` is strictly
increasing (the ops' rule; a root-to-node path of a BFS-numbered tree is).

The caches call the ops ``specdec_ext.kv_compact_`` / ``specdec_ext.paged_kv_compact_``
(one layer per call) where the build has them, else the plain PyTorch fallbacks below: a
gather of every source entry, then a write, so a source that is also a destination is
read before it is overwritten.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

__all__ = ["compact_op", "compact_rows", "gather_compact_", "paged_gather_compact_"]


def compact_op(name: str) -> Optional[Callable[..., None]]:
    """``specdec_ext.<name>`` when the build has that op, else None (the fallback runs)."""
    import specdec_ext  # at call time: the package imports this module

    return getattr(specdec_ext, name, None)


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


def _moves(base: torch.Tensor, src_index: torch.Tensor, count: torch.Tensor,
           num_appended: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(source, destination) positions int64 [B, M'] (M' = min(M, num_appended)). Columns
    j >= count[b] copy a slot onto itself, and unchecked sources are clamped into the step's
    entries, so every write stays within the row's own slots."""
    M = min(src_index.shape[1], num_appended)
    j = torch.arange(M, device=base.device, dtype=torch.int64).view(1, M)
    keep = j < count.view(-1, 1)
    rel = torch.where(keep, src_index[:, :M].clamp(0, num_appended - 1), j)
    return base.view(-1, 1) + rel, base.view(-1, 1) + j


def gather_compact_(key_cache: torch.Tensor, value_cache: torch.Tensor, base: torch.Tensor,
                    src_index: torch.Tensor, count: torch.Tensor, num_appended: int) -> None:
    """The fallback of ``kv_compact_`` over every layer at once.

    key_cache, value_cache : Tensor [L, B, H, max_len, D] (written in place)
    base      : Tensor [B] int64, each row's length before the step
    src_index : Tensor [B, M] int64;  count : Tensor [B] int64 (see the module docstring)
    """
    src, dst = _moves(base, src_index, count, num_appended)
    L, B, H, T, D = key_cache.shape
    M = src.shape[1]

    def index(pos: torch.Tensor) -> torch.Tensor:  # [B, M] -> [L, B, H, M, D] (a view)
        return pos.clamp(0, T - 1).view(1, B, 1, M, 1).expand(L, B, H, M, D)

    for cache in (key_cache, value_cache):
        cache.scatter_(3, index(dst), cache.gather(3, index(src)))


def paged_gather_compact_(key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                          base: torch.Tensor, src_index: torch.Tensor, count: torch.Tensor,
                          num_appended: int) -> None:
    """The fallback of ``paged_kv_compact_`` over every layer at once.

    key_cache, value_cache : Tensor [L, num_blocks, block_size, H, D] (written in place)
    block_tables : Tensor [B, W] int32 | int64, -1 padded;  base, src_index, count as in
    :func:`gather_compact_`.
    """
    src, dst = _moves(base, src_index, count, num_appended)
    L, NB, bs, H, D = key_cache.shape
    tables = block_tables.to(torch.int64)

    def slots(pos: torch.Tensor) -> torch.Tensor:  # [B, M] positions -> [B * M] flat slots
        block = tables.gather(1, (pos // bs).clamp(0, tables.shape[1] - 1))
        return (block * bs + pos % bs).clamp(0, NB * bs - 1).flatten()

    s, d = slots(src), slots(dst)
    for cache in (key_cache, value_cache):
        flat = cache.view(L, NB * bs, H, D)
        flat.index_copy_(1, d, flat.index_select(1, s))
