"""The contiguous KV-cache ops ``specdec::kv_append_``, ``specdec::kv_rollback_`` and
``specdec::kv_compact_``: Python wrappers and their fake kernels for torch.compile."""
from __future__ import annotations

from typing import Optional, Union

import torch

from .._validate import check_int
from ._fake_checks import INDEX, check_cache_pair, check_cache_write, check_devices, check_dim, check_dtype

__all__ = ["kv_append_", "kv_compact_", "kv_rollback_"]

#: the op namespace the wrappers call (specdec_ext.testing.simt rebinds it to the SIMT emulation)
_OPS = torch.ops.specdec


def kv_append_(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    new_k: torch.Tensor,
    new_v: torch.Tensor,
    lengths: torch.Tensor,
    *,
    overflow: Optional[torch.Tensor] = None,
) -> None:
    """Write each row's S new keys / values at positions ``lengths[b] .. lengths[b]+S-1``.

    One kernel launch for the batch (keys and values together). ``lengths`` is NOT advanced.

    Parameters
    ----------
    key_cache, value_cache : Tensor [B, H, max_len, D] float32 | float16 | bfloat16
        Written in place. Any strides with a contiguous head dim (a per-layer slice of a
        bigger tensor is fine).
    new_k, new_v : Tensor [B, H, S, D], the cache's dtype and device
        Any strides (e.g. ``k.view(B, S, H, D).transpose(1, 2)``). Never converted: a dtype
        mismatch is an error (cast with ``new_k.to(key_cache.dtype)``).
    lengths : Tensor [B] int32 | int64 on the cache's device
        Tokens already in each row.
    overflow : Tensor [B] bool on the cache's device, optional
        Sticky overflow flags. A row with ``lengths[b] < 0`` or ``lengths[b] + S > max_len``
        would write out of bounds:

        - CPU: the op raises ``ValueError`` before writing anything (flags untouched);
        - CUDA: nothing is written for that row, the other rows are written, and
          ``overflow[b]`` is set to True (never cleared by the op), so one check after many
          steps (``overflow.any().item()``) finds it with no sync per step. Without
          ``overflow`` such a row is skipped silently.
    """
    _OPS.kv_append_(key_cache, value_cache, new_k, new_v, lengths, overflow)


def kv_rollback_(
    lengths: torch.Tensor,
    num_appended: int,
    num_kept: Union[torch.Tensor, int],
    *,
    invalid: Optional[torch.Tensor] = None,
) -> None:
    """``lengths[b] -= num_appended - num_kept[b]`` in place, on the device (no host sync).

    Parameters
    ----------
    lengths : Tensor [B] int32 | int64
        Lengths after the append of ``num_appended`` tokens.
    num_appended : int >= 0
        Tokens appended per row this step (S = K+1).
    num_kept : Tensor [B] int32 | int64 on lengths' device, or int
        Tokens of this step each row keeps, in [0, num_appended] (e.g. ``num_accepted + 1``).
    invalid : Tensor [B] bool on lengths' device, optional
        Sticky error flags. A row with num_kept outside [0, num_appended] (rolling forward)
        or whose length would become negative is invalid:

        - CPU: the op raises ``ValueError`` before writing anything (flags untouched);
        - CUDA: that row's length is left unchanged, the other rows are rolled back, and
          ``invalid[b]`` is set to True (never cleared by the op).
    """
    num_appended = check_int("num_appended", num_appended, 0, 2**63 - 1)
    if not isinstance(num_kept, torch.Tensor):
        num_kept = torch.full(lengths.shape, check_int("num_kept", num_kept, -(2**63), 2**63 - 1),
                              dtype=torch.int64, device=lengths.device)
    _OPS.kv_rollback_(lengths, num_appended, num_kept, invalid)


def kv_compact_(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    lengths: torch.Tensor,
    src_index: torch.Tensor,
    count: torch.Tensor,
    *,
    invalid: Optional[torch.Tensor] = None,
) -> None:
    """Move each row's kept tokens into place: for ``j < count[b]``, position
    ``lengths[b] + j`` receives what position ``lengths[b] + src_index[b, j]`` held before
    the call (every head, the whole head dim, keys and values).

    One kernel launch for the batch, no host sync; ``lengths`` is NOT changed (advance it by
    ``count`` afterwards). Sources and destinations may overlap (``src_index[b] = [0, 2, 3]``
    moves 2 -> 1 and 3 -> 2). After tree verification: ``src_index`` = the accepted path (the
    root 0 first, then the accepted nodes), ``count = num_accepted + 1``, ``lengths`` = each
    row's length before the tree's nodes were appended at ``lengths[b] ..``.

    Parameters
    ----------
    key_cache, value_cache : Tensor [B, H, max_len, D] float32 | float16 | bfloat16
        Written in place. Any strides with a contiguous head dim; they must not share memory.
    lengths : Tensor [B] int32 | int64 on the cache's device
        Where each row's moved block starts, in [0, max_len].
    src_index : Tensor [B, P] int64 | int32 on the cache's device (any strides)
        ``src_index[b, :count[b]]`` strictly increasing from >= 0 (so ``src_index[b, j] >= j``)
        with ``lengths[b] + src_index[b, j] < max_len``; entries past ``count[b]`` are not read.
    count : Tensor [B] int32 | int64 on the cache's device
        Positions kept per row, in [0, P].
    invalid : Tensor [B] bool on the cache's device, optional
        Sticky error flags. A row breaking the rules above is invalid:

        - CPU: the op raises ``ValueError`` naming the argument before writing anything
          (flags untouched);
        - CUDA: nothing is written to that row, the other rows are compacted, and
          ``invalid[b]`` is set to True (never cleared by the op). Without ``invalid``
          such a row is skipped silently.
    """
    _OPS.kv_compact_(key_cache, value_cache, lengths, src_index, count, invalid)


# ---- fake (meta) kernels ----

@torch.library.register_fake("specdec::kv_append_")
def _kv_append_fake(key_cache, value_cache, new_k, new_v, lengths, overflow=None):
    check_devices(key_cache, "key_cache", dict(value_cache=value_cache, new_k=new_k, new_v=new_v, lengths=lengths,
                                               overflow=overflow))
    check_cache_write(key_cache, value_cache, new_k, new_v, "[B, H, max_len, D]", "[B, H, S, D]")
    check_dim(lengths, "lengths", 1, "[B]")
    check_dtype(lengths, "lengths", INDEX)
    check_dtype(overflow, "overflow", (torch.bool,))
    return None


@torch.library.register_fake("specdec::kv_rollback_")
def _kv_rollback_fake(lengths, num_appended, num_kept, invalid=None):
    check_devices(lengths, "lengths", dict(num_kept=num_kept, invalid=invalid))
    check_dim(lengths, "lengths", 1, "[B]")
    check_dtype(lengths, "lengths", INDEX)
    check_dtype(num_kept, "num_kept", INDEX)
    check_dtype(invalid, "invalid", (torch.bool,))
    if num_appended < 0:
        raise ValueError(f"num_appended must be >= 0, got {num_appended}")
    return None


def _check_compact_rows(key_cache, lengths, src_index, count, invalid):
    """The per-row arguments of kv_compact_ / paged_kv_compact_ (devices checked by the caller)."""
    check_dim(lengths, "lengths", 1, "[B]")
    check_dtype(lengths, "lengths", INDEX)
    check_dim(src_index, "src_index", 2, "[B, P]")
    check_dtype(src_index, "src_index", INDEX)
    check_dim(count, "count", 1, "[B]")
    check_dtype(count, "count", INDEX)
    check_dtype(invalid, "invalid", (torch.bool,))


@torch.library.register_fake("specdec::kv_compact_")
def _kv_compact_fake(key_cache, value_cache, lengths, src_index, count, invalid=None):
    check_devices(key_cache, "key_cache", dict(value_cache=value_cache, lengths=lengths, src_index=src_index,
                                               count=count, invalid=invalid))
    check_cache_pair(key_cache, value_cache, 4, "[B, H, max_len, D]")
    _check_compact_rows(key_cache, lengths, src_index, count, invalid)
    return None
