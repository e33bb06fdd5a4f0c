"""Paged KV cache (PagedAttention-style) for speculative decoding: the device tensors of
every layer plus a host-only :class:`~specdec_ext.cache.block_manager.BlockManager`.

Per layer the cache is ``[num_blocks, block_size, H, D]``; see the block manager for how a
sequence's positions map to slots.
"""
from __future__ import annotations

from typing import Hashable, Optional, Sequence, Tuple, Union

import torch

from .._validate import check_int
from ..errors import DeviceFlagError
from ..ops.paged_kv import paged_kv_append_, paged_kv_compact_, paged_kv_gather
from .block_manager import BlockManager, ceil_div
from .compaction import check_num_appended, compact_rows

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Paged KV cache of every layer plus its :class:`BlockManager`.

    Tensors (on ``device``)::

        key_cache, value_cache [num_layers, num_blocks, block_size, H, D] dtype (zero-initialised)
        errors                 [] bool: sticky flag of the CUDA append / compact kernels (invalid slot or row)

    A decoding step over sequences ``seqs`` with S new tokens each::

        slots = cache.allocate(seqs, S)                 # device int64 [len(seqs) * S]
        for layer in range(num_layers):
            cache.append(layer, k, v, slots)            # k, v [T, H, D], T = len(seqs) * S
            keys, values = cache.gather(layer, seqs)    # [B, H, L, D] for SDPA
        cache.rollback_many(seqs, S, num_accepted + 1)  # one host read of num_accepted
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float16,
        device: Union[str, torch.device] = "cpu",
        max_blocks_per_seq: Optional[int] = None,
    ) -> None:
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            check_int(name, value, 1)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype}")
        self.manager = BlockManager(num_blocks, block_size, max_blocks_per_seq)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.block_size, self.num_blocks = block_size, num_blocks
        self.dtype, self.device = dtype, torch.device(device)
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.key_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.value_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.device = self.key_cache.device  # with its index ("cuda" -> "cuda:0")
        self.errors = torch.zeros((), dtype=torch.bool, device=self.device)

    def layer(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (keys, values) [num_blocks, block_size, H, D] of one layer."""
        check_int("layer", layer, 0, self.num_layers - 1)
        return self.key_cache[layer], self.value_cache[layer]

    def length(self, seq: Hashable) -> int:
        return self.manager.length(seq)

    def allocate(self, seqs: Sequence[Hashable], n_tokens: Union[int, Sequence[int]]) -> torch.Tensor:
        """Reserve n_tokens new positions for each sequence (all or nothing; copy-on-write of
        shared blocks is applied to every layer here). Returns the slot mapping, int64 [T] on
        the device, sequences in order."""
        seqs = list(seqs)
        counts = list(n_tokens) if isinstance(n_tokens, (list, tuple)) else [n_tokens] * len(seqs)
        if len(counts) != len(seqs):
            raise ValueError(f"n_tokens has {len(counts)} entries for {len(seqs)} sequences")
        allocs = self.manager.allocate_many(list(zip(seqs, counts)))
        copies = [c for a in allocs for c in a.copies]
        if copies:
            src = torch.tensor([s for s, _ in copies], dtype=torch.int64, device=self.device)
            dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=self.device)
            self.key_cache.index_copy_(1, dst, self.key_cache.index_select(1, src))
            self.value_cache.index_copy_(1, dst, self.value_cache.index_select(1, src))
        slots = [s for a in allocs for s in a.slots]
        return torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True)

    def append(self, layer: int, new_k: torch.Tensor, new_v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write new_k / new_v [T, H, D] to the slots from :meth:`allocate` (-1 = padding)."""
        k_cache, v_cache = self.layer(layer)
        paged_kv_append_(k_cache, v_cache, new_k, new_v, slot_mapping, invalid=self.errors)

    def block_tables(self, seqs: Sequence[Hashable], width: Optional[int] = None) -> torch.Tensor:
        """Device block tables int32 [B, width] (default max_blocks_per_seq), padded with -1."""
        width = self.manager.max_blocks_per_seq if width is None else check_int("width", width, 0)
        rows = []
        for seq in seqs:
            table = self.manager.block_table(seq)
            if len(table) > width:
                raise ValueError(f"sequence {seq!r} has {len(table)} blocks; width {width} is too small")
            rows.append(table + [-1] * (width - len(table)))
        out = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), width)
        return out.to(self.device, non_blocking=True)

    def lengths(self, seqs: Sequence[Hashable]) -> torch.Tensor:
        """Device lengths int64 [B]."""
        return torch.tensor([self.manager.length(s) for s in seqs], dtype=torch.int64).to(self.device)

    def gather(self, layer: int, seqs: Sequence[Hashable], max_len: Optional[int] = None, *,
               out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Dense (keys, values) [B, H, max_len, D] of the sequences (zero past each length);
        max_len defaults to the longest sequence (or out's length); ``out`` as in
        :func:`paged_kv_gather`."""
        seqs = list(seqs)
        lens = [self.manager.length(s) for s in seqs]
        if max_len is None:
            max_len = out[0].shape[2] if out is not None else max(lens, default=0)
        if any(n > max_len for n in lens):
            raise ValueError(f"max_len={max_len} is shorter than a sequence (lengths {lens})")
        width = max(1, ceil_div(max_len, self.block_size))
        k_cache, v_cache = self.layer(layer)
        return paged_kv_gather(k_cache, v_cache, self.block_tables(seqs, width),
                               torch.tensor(lens, dtype=torch.int64).to(self.device), max_len, out=out)

    def rollback(self, seq: Hashable, new_len: int) -> None:
        self.manager.rollback(seq, new_len)

    def rollback_many(self, seqs: Sequence[Hashable], num_appended: int,
                      num_kept: Union[torch.Tensor, Sequence[int]]) -> None:
        """After a step that appended num_appended tokens to each sequence, keep num_kept[b]
        of them (e.g. ``num_accepted + 1``). A device tensor is read once (one sync: the block
        tables live on the host). All or nothing: any invalid row raises ``ValueError``."""
        seqs = list(seqs)
        num_appended = check_int("num_appended", num_appended, 0)
        kept = num_kept.tolist() if isinstance(num_kept, torch.Tensor) else list(num_kept)
        if len(kept) != len(seqs):
            raise ValueError(f"num_kept has {len(kept)} entries for {len(seqs)} sequences")
        kept = [check_int(f"num_kept[{i}]", k) for i, k in enumerate(kept)]  # all checked before any change
        new_lens = []
        for seq, k in zip(seqs, kept):
            n = self.manager.length(seq)
            if not 0 <= k <= num_appended or n - (num_appended - k) < 0:
                raise ValueError(f"sequence {seq!r} (length {n}): num_kept={k} must be in [0, num_appended="
                                 f"{num_appended}] and leave a length >= 0; nothing changed")
            new_lens.append(n - (num_appended - k))
        if len(set(seqs)) != len(seqs):
            raise ValueError("a sequence appears twice in seqs")
        for seq, n in zip(seqs, new_lens):
            self.manager.rollback(seq, n)

    def compact(self, seqs: Sequence[Hashable], num_appended: int, src_index: torch.Tensor,
                count: torch.Tensor) -> None:
        """Move kept entries of the step to its front, in every layer: for each sequence b
        and j < count[b], entry j of its last ``num_appended`` entries receives entry
        ``src_index[b, j]`` (as it was before the call). Lengths do not change: follow with
        :meth:`rollback_many` (a tree step: ``src_index`` = the accepted path, ``count`` =
        num_accepted + 1).

        src_index : Tensor [B, M] int64 | int32; count : Tensor [B] int64 | int32, as in
        :meth:`KVCache.compact <specdec_ext.cache.contiguous.KVCache.compact>` (host tensors
        checked, device tensors not: the CUDA op skips a bad row and sets :attr:`errors`).
        Runs ``specdec_ext.paged_kv_compact_`` per layer (correct when sources and destinations
        overlap).
        The step's slots were allocated by this step, so no block is shared (copy-on-write
        already happened) and a write never reaches another sequence.
        """
        seqs = list(seqs)
        num_appended = check_int("num_appended", num_appended, 0)
        lens = [self.manager.length(s) for s in seqs]
        check_num_appended("PagedKVCache", seqs, lens, num_appended)
        src_index, count = compact_rows(src_index, count, len(seqs), num_appended, self.device)
        if num_appended == 0 or src_index.shape[1] == 0 or not seqs:
            return
        base = torch.tensor([n - num_appended for n in lens], dtype=torch.int64).to(self.device)
        tables = self.block_tables(seqs)
        invalid = torch.zeros(len(seqs), dtype=torch.bool, device=self.device)
        for layer in range(self.num_layers):
            paged_kv_compact_(self.key_cache[layer], self.value_cache[layer], tables, base, src_index, count,
                              invalid=invalid)
        self.errors |= invalid.any()  # the cache's one sticky flag (no sync)

    def fork(self, seq: Hashable, new_seq: Optional[Hashable] = None) -> Hashable:
        return self.manager.fork(seq, new_seq)

    def free(self, seq: Hashable) -> None:
        self.manager.free(seq)

    def check(self) -> None:
        """Raise :class:`~specdec_ext.errors.DeviceFlagError` if the CUDA append kernel met an
        invalid slot or the compact kernel an invalid row (one sync)."""
        if bool(self.errors):
            raise DeviceFlagError("PagedKVCache: an append met a slot out of range, or a compaction an invalid row "
                                  "(skipped by the kernel)")
