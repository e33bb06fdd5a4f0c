"""kv_compact_ / paged_kv_compact_ (csrc/op_schemas.h) in plain Python for the tests
(test_kv_compact.py, test_kv_compact_gpu.py, test_fuzz_ops.py): every source pattern the
rules allow, which rows the rules refuse, and the caches after the op.

The semantics: for each row b and j < count[b], position lengths[b] + j receives what
position lengths[b] + src_index[b, j] held BEFORE the call. The references read every
source from the original cache, so they state that directly (no order of moves involved).
"""
from __future__ import annotations

import itertools
from typing import List, Optional, Sequence

import torch

#: the integer dtype of the same size as each cache dtype (bit-exact references)
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def patterns(P: int, N: int) -> List[tuple]:
    """Every src_index row the rules allow with count <= P and sources in [0, N): the strictly
    increasing tuples of [0, N) of length 0..P (src[j] >= j follows from them)."""
    return [c for k in range(P + 1) for c in itertools.combinations(range(N), k)]


def random_bits(shape, dtype, gen) -> torch.Tensor:
    """A ``dtype`` tensor of random bit patterns (NaN payloads, infinities and denormals
    included): only a bit-exact copy reproduces it."""
    info = torch.iinfo(BITS[dtype])
    return torch.randint(info.min, info.max + 1, tuple(shape), generator=gen, dtype=torch.int64).to(
        BITS[dtype]).view(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same size (NaN-safe bitwise comparison)."""
    return t.view(BITS[t.dtype]) if t.dtype in BITS else t


def row_error(n: int, c: int, src_row: Sequence[int], P: int, capacity: int, table_row: Optional[Sequence[int]] = None,
              block_size: int = 1, num_blocks: int = 0) -> Optional[str]:
    """The argument a row's request breaks ("lengths", "count", "src_index", "block_tables"),
    None when it is valid. Paged rows (table_row given) also need the table entry of every
    position they move from or to (j with src != j) in [0, num_blocks)."""
    if n < 0 or n > capacity:
        return "lengths"
    if c < 0 or c > P:
        return "count"
    prev = -1
    for j in range(c):
        s = src_row[j]
        if s <= prev:
            return "src_index"
        if n + s >= capacity:
            return "src_index"  # the message names lengths[b] + src_index[b, j]
        prev = s
        if table_row is not None and s != j:
            for p in (n + j, n + s):
                if not 0 <= table_row[p // block_size] < num_blocks:
                    return "block_tables"
    return None


def moves(n: int, c: int, src_row: Sequence[int]):
    """(destination, source) positions of a valid row, in order of j."""
    return [(n + j, n + int(src_row[j])) for j in range(c)]


def ref_compact(cache: torch.Tensor, lengths, src, count, ok=None) -> torch.Tensor:
    """A contiguous cache [B, H, M, D] after kv_compact_ (a new tensor); rows with ok[b]
    False are left unchanged."""
    out = cache.clone()
    for b in range(cache.shape[0]):
        if ok is not None and not ok[b]:
            continue
        for dst, s in moves(int(lengths[b]), int(count[b]), src[b].tolist()):
            out[b, :, dst] = cache[b, :, s]
    return out


def ref_paged_compact(cache: torch.Tensor, tables, lengths, src, count, ok=None) -> torch.Tensor:
    """A paged cache [NB, BS, H, D] after paged_kv_compact_ (a new tensor)."""
    out = cache.clone()
    BS = cache.shape[1]
    tables = tables.tolist()
    for b in range(len(tables)):
        if ok is not None and not ok[b]:
            continue
        for dst, s in moves(int(lengths[b]), int(count[b]), src[b].tolist()):
            if s != dst:  # a position moved onto itself is not touched (its table entry is not read)
                out[tables[b][dst // BS], dst % BS] = cache[tables[b][s // BS], s % BS]
    return out


def ref_in_place(cache: torch.Tensor, lengths, src, count, reverse: bool) -> torch.Tensor:
    """The moves done one by one in place, j upwards (the kernels' order) or downwards: the
    test that shows the patterns can tell the two apart."""
    out = cache.clone()
    for b in range(cache.shape[0]):
        steps = moves(int(lengths[b]), int(count[b]), src[b].tolist())
        for dst, s in (reversed(steps) if reverse else steps):
            out[b, :, dst] = out[b, :, s]
    return out
