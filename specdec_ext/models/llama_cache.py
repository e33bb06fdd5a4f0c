"""The two KV caches the reference Llama decoder runs on, behind one small interface.

- :class:`ContiguousLlamaCache` wraps :class:`specdec_ext.KVCache` (``kv_append_`` /
  ``kv_rollback_``): a step never syncs with the host, a rollback with a device
  ``num_kept`` neither.
- :class:`PagedLlamaCache` wraps :class:`specdec_ext.PagedKVCache` (``paged_kv_append_`` /
  ``paged_kv_gather``); its block tables live on the host, so a rollback with a device
  ``num_kept`` reads it once (one sync).

Both store float64 models bit-exactly in a float32 cache of twice the head dim: the cache
ops only move bytes, so viewing each float64 as two float32 words loses nothing.

The model drives a cache like this for S new tokens per row::

    step = cache.begin(S)                         # positions, capacity checks
    for layer ...:
        keys, values = cache.append(layer, k, v, step)   # k, v [B, Hkv, S, D]
        ... SDPA(q, keys, values, attn_mask=step.mask)
    cache.finish(step)                            # lengths += S

For tree speculation ``begin(S, tree)`` takes the :class:`~specdec_ext.cache.TreeNodes` the
step feeds (tree positions and mask instead of the chain's), and ``compact`` moves the
accepted path's entries to the front of the step's before the rollback.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple, Union

import torch

from .._validate import check_int
from ..cache import KVCache, PagedKVCache, TreeNodes, spec_attention_mask
from ..cache.block_manager import ceil_div
from ..errors import CacheFullError, OutOfBlocksError
from ..ops.kv import kv_append_

__all__ = ["ContiguousLlamaCache", "PagedLlamaCache", "LlamaCacheStep"]


def _storage(dtype: torch.dtype, head_dim: int) -> Tuple[torch.dtype, int]:
    """(cache dtype, cache head dim) holding values of ``dtype``: float64 rides as 2 x float32."""
    if dtype == torch.float64:
        return torch.float32, 2 * head_dim
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float32, float64, float16 or bfloat16, got {dtype}")
    return dtype, head_dim


def _to_storage(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # [..., D] float64 -> [..., 2D] float32 (a view: same bytes); other dtypes unchanged.
    return t.view(torch.float32) if dtype == torch.float64 else t


def _from_storage(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.view(torch.float64) if dtype == torch.float64 else t


def _check_rows_fit(row_lengths: Sequence[int], max_len: int) -> None:
    """Raise ``CacheFullError`` if a row would need more than ``max_len`` positions."""
    over = [b for b, n in enumerate(row_lengths) if n > max_len]
    if over:
        raise CacheFullError(f"rows {over} need {[row_lengths[b] for b in over]} positions but the cache "
                             f"holds max_len={max_len}")


#: The most tokens per step whose one-row mask is a view of the cache's mask table
#: (``ContiguousLlamaCache._one_row_mask``; the table holds _TABLE_ROWS x (max_len + _TABLE_ROWS)
#: elements); a longer step (a prefill) builds its mask.
_TABLE_ROWS = 64


@dataclasses.dataclass
class LlamaCacheStep:
    """One forward step of S tokens per row.

    positions : Tensor [B, S] int64 on the cache device, ``lengths[b] + arange(S)`` (a tree
                step: ``lengths[b] - start + depth`` of each node, see :class:`TreeNodes`)
    num_tokens: S
    kv_len    : keys attention reads this step (set by ``begin``)
    mask      : Tensor [B, 1, S, kv_len] additive mask of the model dtype, one for every layer (set with
                kv_len); None when every query sees every key (attention then takes no mask)
    """

    positions: torch.Tensor
    num_tokens: int
    kv_len: Optional[int] = None
    mask: Optional[torch.Tensor] = None
    slots: Optional[torch.Tensor] = None  # paged cache only: [B * S] int64 slot mapping
    past: Optional[Sequence[int]] = None  # paged cache only: host lengths before the step


class ContiguousLlamaCache:
    """A :class:`~specdec_ext.KVCache` for B rows of up to ``max_len`` tokens of one model.

    Tensors: ``lengths`` [B] int64 on ``device``; per layer ``[B, Hkv, max_len, D]`` keys /
    values (float64 models: float32 ``[..., 2D]``, see the module docstring).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch_size: int, max_len: int,
                 dtype: torch.dtype, device: Union[str, torch.device]) -> None:
        store_dtype, store_dim = _storage(dtype, head_dim)
        self.dtype = dtype
        self.kv = KVCache(num_layers, batch_size, num_kv_heads, store_dim, max_len, store_dtype, device)
        self.batch_size, self.max_len, self.device = batch_size, max_len, self.kv.device
        # Per-layer views, built once: the storage-dtype ones kv_append_ writes, and the
        # model-dtype ones attention reads (float64: the same bytes).
        self._store = list(zip(self.kv.key_cache.unbind(0), self.kv.value_cache.unbind(0)))
        self._read = [(_from_storage(k, dtype), _from_storage(v, dtype)) for k, v in self._store]
        self._mask_table: Optional[torch.Tensor] = None  # see _one_row_mask

    @property
    def lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on ``device``: tokens held per row."""
        return self.kv.lengths

    def host_lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on the CPU (may wait for a pending device rollback)."""
        return self.kv.host_lengths()

    def layer_view(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (keys, values) [B, Hkv, max_len, D] of the model dtype of one layer (each
        row valid up to its length)."""
        return self._read[check_int("layer", layer, 0, len(self._read) - 1)]

    def reset(self) -> None:
        """Empty every row (stale keys stay, finite, until overwritten)."""
        self.kv.reset()

    def begin(self, num_tokens: int, tree: Optional[TreeNodes] = None) -> LlamaCacheStep:
        """Check capacity (``CacheFullError``, nothing written, when a row would pass
        ``max_len``) and fix the step's ``kv_len`` and mask once for every layer (``tree``:
        the tree nodes the step feeds, with their positions and mask)."""
        kv = self.kv
        # The host checks of KVCache.append, once per step instead of once per layer. kv_len
        # is fixed for the whole step: the host mirror may be refreshed (shrink) between
        # layers after a device rollback, and every layer must match one mask.
        kv_len, exact = kv.begin_step(num_tokens)
        if tree is not None:
            one_row = (tree.one_row_inputs(kv_len - num_tokens, num_tokens, self.dtype, self.device)
                       if self.batch_size == 1 and exact else None)
            pos, mask = one_row or tree.step_inputs(kv.lengths, num_tokens, kv_len, self.dtype)
            return LlamaCacheStep(positions=pos, num_tokens=num_tokens, kv_len=kv_len, mask=mask)
        pos = kv.lengths.view(-1, 1) + torch.arange(num_tokens, device=self.device, dtype=torch.int64)
        if num_tokens == 1 and self.batch_size == 1 and exact:
            # One token of one row with an exact host length: it sees all kv_len keys (the
            # row's plus itself), so the mask would be all zeros. None skips building it.
            mask = None
        elif self.batch_size == 1 and exact and num_tokens <= _TABLE_ROWS:
            mask = self._one_row_mask(kv_len - num_tokens, num_tokens)
        else:
            mask = spec_attention_mask(kv.lengths, num_tokens, kv_len, self.dtype)
        return LlamaCacheStep(positions=pos, num_tokens=num_tokens, kv_len=kv_len, mask=mask)

    def _one_row_mask(self, past: int, num_tokens: int) -> torch.Tensor:
        """:func:`~specdec_ext.spec_attention_mask` of one row holding ``past`` tokens (an exact
        host length), [1, 1, S, past + S]: a view of one table made once per cache, so a
        verification step builds no mask. ``table[i, c]`` is visible iff ``c <= max_len + i``;
        read from column ``max_len - past``, column j is visible iff ``j <= past + i``."""
        if self._mask_table is None:
            c = torch.arange(self.max_len + _TABLE_ROWS, device=self.device)
            i = torch.arange(_TABLE_ROWS, device=self.device).view(-1, 1)
            visible = c <= self.max_len + i
            self._mask_table = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(
                ~visible, torch.finfo(self.dtype).min)
        kv_len = past + num_tokens
        return self._mask_table[:num_tokens].narrow(1, self.max_len - past, kv_len).view(1, 1, num_tokens, kv_len)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               step: LlamaCacheStep) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, Hkv, S, D] (any strides) at each row's length; return keys / values
        [B, Hkv, kv_len, D] (views of the cache). Capacity was checked by :meth:`begin`."""
        key_store, value_store = self._store[layer]
        kv_append_(key_store, value_store, _to_storage(k, self.dtype), _to_storage(v, self.dtype),
                   self.kv.lengths, overflow=self.kv.errors)
        keys, values = self._read[layer]
        return keys.narrow(2, 0, step.kv_len), values.narrow(2, 0, step.kv_len)

    def finish(self, step: LlamaCacheStep) -> None:
        self.kv.advance(step.num_tokens)

    def reserve(self, row_lengths: Sequence[int]) -> None:
        """Raise ``CacheFullError`` if a row would need more than ``max_len`` positions."""
        _check_rows_fit(row_lengths, self.max_len)

    def rollback(self, num_appended: int, num_kept: Union[torch.Tensor, Sequence[int], int]) -> None:
        """lengths[b] -= num_appended - num_kept[b]. A device ``num_kept`` causes no host sync
        (invalid rows are flagged in ``kv.errors``, see :meth:`KVCache.check`); a host one is
        validated here (``ValueError``, nothing changed)."""
        self.kv.rollback(num_appended, num_kept)

    def compact(self, num_appended: int, src_index: torch.Tensor, count: torch.Tensor) -> None:
        """:meth:`KVCache.compact` (float64 entries move as their float32 words)."""
        self.kv.compact(num_appended, src_index, count)


class PagedLlamaCache:
    """A :class:`~specdec_ext.PagedKVCache` holding one sequence per row (ids 0 .. B-1).

    ``num_blocks`` defaults to enough blocks for every row to reach ``max_len``. Attention
    reads each row's tokens through ``paged_kv_gather`` into dense ``[B, Hkv, kv_len, D]``.
    Lengths live on the host (the block manager); ``lengths`` is their device copy.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch_size: int, max_len: int,
                 dtype: torch.dtype, device: Union[str, torch.device], block_size: int = 16,
                 num_blocks: Optional[int] = None) -> None:
        for name, value in (("batch_size", batch_size), ("max_len", max_len), ("block_size", block_size)):
            check_int(name, value, 1)
        per_seq = -(-max_len // block_size)
        if num_blocks is None:
            num_blocks = batch_size * per_seq
        store_dtype, store_dim = _storage(dtype, head_dim)
        self.dtype = dtype
        self.paged = PagedKVCache(num_layers, num_blocks, block_size, num_kv_heads, store_dim, store_dtype,
                                  device, max_blocks_per_seq=per_seq)
        self.batch_size, self.max_len, self.device = batch_size, max_len, self.paged.device
        self.seqs = list(range(batch_size))
        for seq in self.seqs:
            self.paged.manager.add(seq)
        self._lengths = torch.zeros(batch_size, dtype=torch.int64, device=self.device)

    @property
    def lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on ``device``: tokens held per row."""
        return self._lengths

    def host_lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on the CPU."""
        return torch.tensor([self.paged.length(s) for s in self.seqs], dtype=torch.int64)

    def reset(self) -> None:
        """Empty every row, returning all its blocks to the free list."""
        for seq in self.seqs:
            self.paged.rollback(seq, 0)
        self._sync_lengths()

    def reserve(self, row_lengths: Sequence[int]) -> None:
        """Raise ``OutOfBlocksError`` if the block pool cannot hold every row at
        ``row_lengths[b]`` tokens at once (or a row exceeds ``max_len``)."""
        _check_rows_fit(row_lengths, self.max_len)
        need = sum(ceil_div(n, self.paged.block_size) for n in row_lengths)
        if need > self.paged.num_blocks:
            raise OutOfBlocksError(f"the request needs {need} KV-cache blocks of {self.paged.block_size} tokens "
                                   f"(rows reaching {list(row_lengths)} tokens) but the pool has "
                                   f"{self.paged.num_blocks}")

    def begin(self, num_tokens: int, tree: Optional[TreeNodes] = None) -> LlamaCacheStep:
        """Check capacity, reserve the step's slots and fix its kv_len and mask (``tree``: as
        in :meth:`ContiguousLlamaCache.begin`)."""
        past = [self.paged.length(s) for s in self.seqs]
        over = [b for b, n in enumerate(past) if n + num_tokens > self.max_len]
        if over:
            raise CacheFullError(f"PagedLlamaCache: rows {over} hold {[past[b] for b in over]} tokens; "
                             f"{num_tokens} more would exceed max_len={self.max_len} (refused; nothing changed)")
        kv_len = max(past) + num_tokens
        if tree is not None:  # before allocating: a bad tree changes nothing
            pos, mask = tree.step_inputs(self._lengths, num_tokens, kv_len, self.dtype)
        else:
            pos = self._lengths.view(-1, 1) + torch.arange(num_tokens, device=self.device, dtype=torch.int64)
            mask = spec_attention_mask(self._lengths, num_tokens, kv_len, self.dtype)
        # Reserve the slots now (all rows or none: OutOfBlocksError changes nothing).
        slots = self.paged.allocate(self.seqs, num_tokens)
        return LlamaCacheStep(positions=pos, num_tokens=num_tokens, kv_len=kv_len, mask=mask,
                              slots=slots, past=past)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               step: LlamaCacheStep) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, Hkv, S, D] to the step's slots; return the gathered keys / values
        [B, Hkv, kv_len, D] (zero past each row's length)."""
        B, H, S, D = k.shape
        # Token order of the slot mapping: row-major over (row, new token).
        k_tok = _to_storage(k.transpose(1, 2).reshape(B * S, H, D), self.dtype)
        v_tok = _to_storage(v.transpose(1, 2).reshape(B * S, H, D), self.dtype)
        self.paged.append(layer, k_tok, v_tok, step.slots)
        keys, values = self.paged.gather(layer, self.seqs, step.kv_len)
        return _from_storage(keys, self.dtype), _from_storage(values, self.dtype)

    def finish(self, step: LlamaCacheStep) -> None:
        # The block manager already counts the new tokens (allocate); mirror them on the device.
        self._lengths.add_(step.num_tokens)

    def rollback(self, num_appended: int, num_kept: Union[torch.Tensor, Sequence[int], int]) -> None:
        """lengths[b] -= num_appended - num_kept[b], freeing whole blocks past the new length.
        A device ``num_kept`` is read once (one host sync: block tables live on the host).
        Invalid rows raise ``ValueError`` and nothing changes."""
        if isinstance(num_kept, int) and not isinstance(num_kept, bool):
            num_kept = [num_kept] * self.batch_size
        self.paged.rollback_many(self.seqs, num_appended, num_kept)
        self._sync_lengths()

    def compact(self, num_appended: int, src_index: torch.Tensor, count: torch.Tensor) -> None:
        """:meth:`PagedKVCache.compact` over the rows (float64 entries move as their float32 words)."""
        self.paged.compact(self.seqs, num_appended, src_index, count)

    def _sync_lengths(self) -> None:
        self._lengths.copy_(self.host_lengths())
