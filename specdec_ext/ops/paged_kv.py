"""The paged KV-cache ops ``specdec::paged_kv_append_``, ``specdec::paged_kv_gather`` /
``specdec::paged_kv_gather_into_`` and ``specdec::paged_kv_compact_``: Python wrappers and
their fake kernels."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._validate import check_int
from ._fake_checks import INDEX, check_cache_pair, check_cache_write, check_devices, check_dim, check_dtype
from .kv import _check_compact_rows

__all__ = ["paged_kv_append_", "paged_kv_compact_", "paged_kv_gather"]

#: the op namespace the wrappers call (specdec_ext.testing.simt rebinds it to the SIMT emulation)
_OPS = torch.ops.specdec


def paged_kv_append_(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    invalid: Optional[torch.Tensor] = None,
) -> None:
    """Write token t's key / value to slot ``slot_mapping[t]`` of the paged cache, in one launch.

    Parameters
    ----------
    key_cache, value_cache : Tensor [num_blocks, block_size, H, D] float32 | float16 | bfloat16
        Written in place (contiguous head dim; other strides free).
    new_k, new_v : Tensor [T, H, D], the cache's dtype and device (never converted).
    slot_mapping : Tensor [T] int64 (int32 accepted) on the cache's device
        ``block * block_size + offset``; -1 = padding (skipped). Valid slots must be distinct.
    invalid : Tensor [] bool (one element) on the cache's device, optional
        Sticky flag for a slot outside [0, num_blocks * block_size) that is not -1:

        - CPU: such a slot (or a repeated slot) raises ``ValueError`` before anything is
          written (flag untouched);
        - CUDA: that token is skipped, the others are written and ``invalid`` is set True
          (never cleared). Repeated slots are not detected on CUDA (one of the writes wins).
    """
    _OPS.paged_kv_append_(key_cache, value_cache, new_k, new_v, slot_mapping, invalid)


def paged_kv_gather(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    max_len: Optional[int] = None,
    *,
    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Copy each row's first ``lengths[b]`` tokens out of the paged cache, for dense attention.

    Parameters
    ----------
    key_cache, value_cache : Tensor [num_blocks, block_size, H, D]
    block_tables : Tensor [B, max_blocks_per_seq] int32 (int64 accepted); entries past a
        row's last used block are not read (any value, e.g. -1).
    lengths : Tensor [B] int32 | int64
    max_len : int, the gathered length L (e.g. max(lengths)); taken from ``out`` when given
    out : (keys_out, values_out), optional
        Caller-owned [B, H, L, D] buffers of the cache's dtype (head dim contiguous, other
        strides free) written in place and returned (``specdec::paged_kv_gather_into_``):
        no allocation per step, so the buffers can be reused and captured in a CUDA graph.

    Returns
    -------
    (keys, values) : Tensor [B, H, L, D] (contiguous unless ``out``), the cache's dtype; zero at positions
    ``>= lengths[b]``. On CPU a length outside [0, min(max_len, max_blocks_per_seq *
    block_size)] or a used table entry outside [0, num_blocks) raises; on CUDA (no sync) the
    length is clamped into that range and positions whose table entry is out of range are
    zero.
    """
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"out must be a pair (keys_out, values_out) of tensors, got {type(out).__name__}")
        keys_out, values_out = out
        if max_len is not None and keys_out.dim() == 4 and keys_out.shape[2] != check_int("max_len", max_len, 0):
            raise ValueError(f"max_len={max_len} but out has length {keys_out.shape[2]}")
        _OPS.paged_kv_gather_into_(key_cache, value_cache, block_tables, lengths, keys_out, values_out)
        return keys_out, values_out
    if max_len is None:
        raise ValueError("max_len is required when out is not given")
    return _OPS.paged_kv_gather(key_cache, value_cache, block_tables, lengths,
                                             check_int("max_len", max_len, 0))


def paged_kv_compact_(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    src_index: torch.Tensor,
    count: torch.Tensor,
    *,
    invalid: Optional[torch.Tensor] = None,
) -> None:
    """:func:`specdec_ext.kv_compact_` on a paged cache: for ``j < count[b]``, position
    ``lengths[b] + j`` of row b receives what position ``lengths[b] + src_index[b, j]`` held
    before the call, position p living at slot ``block_tables[b, p // block_size] *
    block_size + p % block_size``.

    One kernel launch, no host sync; ``lengths`` is NOT changed. Overlapping sources and
    destinations are fine (see kv_compact_).

    Parameters
    ----------
    key_cache, value_cache : Tensor [num_blocks, block_size, H, D] float32 | float16 | bfloat16
        Written in place (contiguous head dim; other strides free; no shared memory).
    block_tables : Tensor [B, max_blocks_per_seq] int32 | int64 on the cache's device
        Only the entries of positions a row moves from or to are read; they must be in
        [0, num_blocks).
    lengths : Tensor [B] int32 | int64, in [0, max_blocks_per_seq * block_size]
    src_index : Tensor [B, P] int64 | int32 (any strides)
        ``src_index[b, :count[b]]`` strictly increasing from >= 0 with ``lengths[b] +
        src_index[b, j] < max_blocks_per_seq * block_size``; entries past ``count[b]`` are
        not read.
    count : Tensor [B] int32 | int64, in [0, P]
    invalid : Tensor [B] bool on the cache's device, optional
        Sticky error flags for rows breaking these rules (also a used table entry outside
        [0, num_blocks)):

        - CPU: ``ValueError`` naming the argument before anything is written (flags untouched);
        - CUDA: nothing is written to that row, the others are compacted, ``invalid[b]`` is set
          True (never cleared); without ``invalid`` the row is skipped silently.

        No slot may be written for one (row, position) and used by another (blocks shared
        after a fork must hold only positions below ``lengths[b]``): the CPU raises
        ``ValueError``, CUDA does not detect it (the result is undefined).
    """
    _OPS.paged_kv_compact_(key_cache, value_cache, block_tables, lengths, src_index, count, invalid)


# ---- fake (meta) kernels ----

@torch.library.register_fake("specdec::paged_kv_append_")
def _paged_kv_append_fake(key_cache, value_cache, new_k, new_v, slot_mapping, invalid=None):
    check_devices(key_cache, "key_cache", dict(value_cache=value_cache, new_k=new_k, new_v=new_v,
                                               slot_mapping=slot_mapping, invalid=invalid))
    check_cache_write(key_cache, value_cache, new_k, new_v, "[num_blocks, block_size, H, D]", "[T, H, D]")
    check_dim(slot_mapping, "slot_mapping", 1, "[T]")
    check_dtype(slot_mapping, "slot_mapping", INDEX)
    check_dtype(invalid, "invalid", (torch.bool,))
    return None


def _check_gather_inputs(key_cache, value_cache, block_tables, lengths, outs):
    check_devices(key_cache, "key_cache", dict(value_cache=value_cache, block_tables=block_tables, lengths=lengths,
                                               **outs))
    check_cache_pair(key_cache, value_cache, 4, "[num_blocks, block_size, H, D]")
    check_dim(block_tables, "block_tables", 2, "[B, max_blocks_per_seq]")
    check_dtype(block_tables, "block_tables", INDEX)
    check_dim(lengths, "lengths", 1, "[B]")
    check_dtype(lengths, "lengths", INDEX)
    for name, t in outs.items():
        check_dim(t, name, 4, "[B, H, max_len, D]")
        check_dtype(t, name, (key_cache.dtype,))


@torch.library.register_fake("specdec::paged_kv_gather")
def _paged_kv_gather_fake(key_cache, value_cache, block_tables, lengths, max_len):
    _check_gather_inputs(key_cache, value_cache, block_tables, lengths, {})
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    B, H, D = block_tables.shape[0], key_cache.shape[2], key_cache.shape[3]
    keys = key_cache.new_empty((B, H, max_len, D))
    values = value_cache.new_empty((B, H, max_len, D))
    return keys, values


@torch.library.register_fake("specdec::paged_kv_gather_into_")
def _paged_kv_gather_into_fake(key_cache, value_cache, block_tables, lengths, keys_out, values_out):
    _check_gather_inputs(key_cache, value_cache, block_tables, lengths, dict(keys_out=keys_out, values_out=values_out))
    return None


@torch.library.register_fake("specdec::paged_kv_compact_")
def _paged_kv_compact_fake(key_cache, value_cache, block_tables, lengths, src_index, count, invalid=None):
    check_devices(key_cache, "key_cache", dict(value_cache=value_cache, block_tables=block_tables, lengths=lengths,
                                               src_index=src_index, count=count, invalid=invalid))
    check_cache_pair(key_cache, value_cache, 4, "[num_blocks, block_size, H, D]")
    check_dim(block_tables, "block_tables", 2, "[B, max_blocks_per_seq]")
    check_dtype(block_tables, "block_tables", INDEX)
    _check_compact_rows(key_cache, lengths, src_index, count, invalid)
    return None
