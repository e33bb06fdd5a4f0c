"""Paged KV cache (PagedAttention-style) for speculative decoding.

Per layer the cache is ``[num_blocks, block_size, H, D]``; a sequence owns a list of
blocks (its block table) and token position p of it lives in slot
``table[p // block_size] * block_size + p % block_size``. Blocks are reference counted so
that :meth:`BlockManager.fork` shares a prefix; a shared block is never written (the last,
partially filled block is copied on write) and never freed while another sequence uses it.
"""
from __future__ import annotations

from typing import Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

__all__ = ["Allocation", "BlockManager", "OutOfBlocksError", "PagedKVCache", "paged_kv_append_",
           "paged_kv_gather"]


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

        - CPU: such a slot (or a repeated slot) raises ``RuntimeError`` before anything is
          written (flag untouched);
        - CUDA: that token is skipped, the others are written and ``invalid`` is set True
          (never cleared). Repeated slots are not detected on CUDA (one of the writes wins).
    """
    torch.ops.specdec.paged_kv_append_(key_cache, value_cache, new_k, new_v, slot_mapping, invalid)


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
        keys_out, values_out = out
        if max_len is not None and keys_out.dim() == 4 and keys_out.shape[2] != max_len:
            raise ValueError(f"max_len={max_len} but out has length {keys_out.shape[2]}")
        torch.ops.specdec.paged_kv_gather_into_(key_cache, value_cache, block_tables, lengths, keys_out, values_out)
        return keys_out, values_out
    if max_len is None:
        raise ValueError("max_len is required when out is not given")
    return torch.ops.specdec.paged_kv_gather(key_cache, value_cache, block_tables, lengths, int(max_len))


class OutOfBlocksError(RuntimeError):
    """Not enough free blocks (or table entries) for a request; nothing was changed."""


class Allocation(NamedTuple):
    """Result of :meth:`BlockManager.allocate`.

    slots  : the cache slots of the new positions len .. len+n_tokens-1, in order
    copies : (src_block, dst_block) pairs to copy in the cache BEFORE writing (copy-on-write
             of a shared, partially filled last block)
    """

    slots: List[int]
    copies: List[Tuple[int, int]]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Host-side block allocator: free list, reference counts and per-sequence block tables.

    Sequences are identified by any hashable id. All bookkeeping is on the host; every
    refused request raises before changing anything.
    """

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: Optional[int] = None) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if max_blocks_per_seq is None:
            max_blocks_per_seq = num_blocks
        if isinstance(max_blocks_per_seq, bool) or not isinstance(max_blocks_per_seq, int) or max_blocks_per_seq < 1:
            raise ValueError(f"max_blocks_per_seq must be an int >= 1, got {max_blocks_per_seq!r}")
        self.num_blocks, self.block_size, self.max_blocks_per_seq = num_blocks, block_size, max_blocks_per_seq
        self._free: List[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._ref: List[int] = [0] * num_blocks
        self._tables: Dict[Hashable, List[int]] = {}
        self._lengths: Dict[Hashable, int] = {}

    # ---- queries -----------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def sequences(self) -> List[Hashable]:
        return list(self._tables)

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._tables

    def length(self, seq: Hashable) -> int:
        return self._lengths[self._known(seq)]

    def block_table(self, seq: Hashable) -> List[int]:
        """A copy of the sequence's block table (host)."""
        return list(self._tables[self._known(seq)])

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def free_blocks(self) -> List[int]:
        return list(self._free)

    def slot(self, seq: Hashable, pos: int) -> int:
        table = self._tables[self._known(seq)]
        if not 0 <= pos < self._lengths[seq]:
            raise ValueError(f"position {pos} out of range [0, {self._lengths[seq]}) of sequence {seq!r}")
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    # ---- changes -----------------------------------------------------------------
    def add(self, seq: Hashable) -> None:
        """Register an empty sequence (allocate() does this for an unknown id)."""
        if seq in self._tables:
            raise ValueError(f"sequence {seq!r} already exists")
        self._tables[seq] = []
        self._lengths[seq] = 0

    def allocate(self, seq: Hashable, n_tokens: int) -> Allocation:
        """Extend ``seq`` (created if unknown) by n_tokens positions and return their slots.

        Takes blocks from the free list as needed, plus one to copy a shared, partially filled
        last block on write. Raises :class:`OutOfBlocksError` (nothing changed) when the free
        list or ``max_blocks_per_seq`` cannot hold the request.
        """
        return self.allocate_many([(seq, n_tokens)])[0]

    def allocate_many(self, requests: Sequence[Tuple[Hashable, int]]) -> List[Allocation]:
        """:meth:`allocate` for several distinct sequences, all or nothing."""
        needed = self.blocks_needed(requests)
        if needed > len(self._free):
            raise OutOfBlocksError(f"out of KV-cache blocks: the request needs {needed} blocks but only "
                                   f"{len(self._free)} of {self.num_blocks} are free; nothing changed")
        out = []
        for seq, n in requests:
            if seq not in self._tables:
                self.add(seq)
            table, length = self._tables[seq], self._lengths[seq]
            copies = []
            if n > 0 and length % self.block_size and self._ref[table[-1]] > 1:
                src = table[-1]
                dst = self._take()
                self._ref[src] -= 1
                table[-1] = dst
                copies.append((src, dst))
            while len(table) < _ceil_div(length + n, self.block_size):
                table.append(self._take())
            bs = self.block_size
            slots = [table[p // bs] * bs + p % bs for p in range(length, length + n)]
            self._lengths[seq] = length + n
            out.append(Allocation(slots, copies))
        return out

    def blocks_needed(self, requests: Sequence[Tuple[Hashable, int]]) -> int:
        """Free blocks :meth:`allocate_many` would take for ``requests`` (new blocks plus
        copy-on-write copies; a block shared by two requesters is copied by the first only).
        Raises ``ValueError`` for malformed requests and :class:`OutOfBlocksError` when a
        sequence would exceed ``max_blocks_per_seq``. Changes nothing."""
        seen = set()
        for seq, n in requests:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"n_tokens must be an int >= 0, got {n!r} for sequence {seq!r}")
            if seq in seen:
                raise ValueError(f"sequence {seq!r} appears twice in one allocation")
            seen.add(seq)
        needed = 0
        ref_delta: Dict[int, int] = {}
        for seq, n in requests:
            table = self._tables.get(seq, [])
            length = self._lengths.get(seq, 0)
            want = _ceil_div(length + n, self.block_size)
            if want > self.max_blocks_per_seq:
                raise OutOfBlocksError(
                    f"sequence {seq!r} would need {want} blocks ({length} + {n} tokens) but "
                    f"max_blocks_per_seq={self.max_blocks_per_seq}; nothing changed")
            needed += want - len(table)
            if n > 0 and length % self.block_size:
                last = table[-1]
                if self._ref[last] + ref_delta.get(last, 0) > 1:
                    needed += 1
                    ref_delta[last] = ref_delta.get(last, 0) - 1
        return needed

    def rollback(self, seq: Hashable, new_len: int) -> None:
        """Shrink ``seq`` to new_len tokens, freeing (dereferencing) every block wholly beyond it."""
        length = self._lengths[self._known(seq)]
        if isinstance(new_len, bool) or not isinstance(new_len, int) or not 0 <= new_len <= length:
            raise ValueError(f"new_len must be an int in [0, {length}] (the length of {seq!r}; "
                             f"no rolling forward), got {new_len!r}")
        table = self._tables[seq]
        keep = _ceil_div(new_len, self.block_size)
        for block in table[keep:]:
            self._release(block)
        del table[keep:]
        self._lengths[seq] = new_len

    def fork(self, seq: Hashable, new_seq: Optional[Hashable] = None) -> Hashable:
        """A new sequence with the same tokens, sharing every block of ``seq`` (no copy).

        new_seq defaults to the smallest unused int >= 0. Returns its id.
        """
        self._known(seq)
        if new_seq is None:
            new_seq = 0
            while new_seq in self._tables:
                new_seq += 1
        elif new_seq in self._tables:
            raise ValueError(f"sequence {new_seq!r} already exists")
        table = list(self._tables[seq])
        for block in table:
            self._ref[block] += 1
        self._tables[new_seq] = table
        self._lengths[new_seq] = self._lengths[seq]
        return new_seq

    def free(self, seq: Hashable) -> None:
        """Drop ``seq``; its blocks return to the free list when no other sequence uses them."""
        for block in self._tables[self._known(seq)]:
            self._release(block)
        del self._tables[seq]
        del self._lengths[seq]

    def check_invariants(self) -> None:
        """Raise AssertionError if reference counts, tables and the free list disagree."""
        count = [0] * self.num_blocks
        for seq, table in self._tables.items():
            assert len(table) == _ceil_div(self._lengths[seq], self.block_size), f"table size of {seq!r}"
            for block in table:
                count[block] += 1
        assert count == self._ref, "reference counts differ from table occurrences"
        assert len(set(self._free)) == len(self._free), "a block is on the free list twice"
        assert sorted(self._free) == [b for b in range(self.num_blocks) if count[b] == 0], "free list"

    # ---- internals ---------------------------------------------------------------
    def _known(self, seq: Hashable) -> Hashable:
        if seq not in self._tables:
            raise KeyError(f"unknown sequence {seq!r}")
        return seq

    def _take(self) -> int:
        block = self._free.pop()
        self._ref[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            self._free.append(block)


class PagedKVCache:
    """Paged KV cache of every layer plus its :class:`BlockManager`.

    Tensors (on ``device``)::

        key_cache, value_cache [num_layers, num_blocks, block_size, H, D] dtype (zero-initialised)
        errors                 [] bool: sticky flag of the CUDA append kernel (invalid slot)

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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype}")
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
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        return self.key_cache[layer], self.value_cache[layer]

    def length(self, seq: Hashable) -> int:
        return self.manager.length(seq)

    def allocate(self, seqs: Sequence[Hashable], n_tokens: Union[int, Sequence[int]]) -> torch.Tensor:
        """Reserve n_tokens new positions for each sequence (all or nothing; copy-on-write of
        shared blocks is applied to every layer here). Returns the slot mapping, int64 [T] on
        the device, sequences in order."""
        seqs = list(seqs)
        counts = [n_tokens] * len(seqs) if isinstance(n_tokens, int) else list(n_tokens)
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
        torch.ops.specdec.paged_kv_append_(k_cache, v_cache, new_k, new_v, slot_mapping, self.errors)

    def block_tables(self, seqs: Sequence[Hashable], width: Optional[int] = None) -> torch.Tensor:
        """Device block tables int32 [B, width] (default max_blocks_per_seq), padded with -1."""
        width = self.manager.max_blocks_per_seq if width is None else width
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
        width = max(1, _ceil_div(max_len, self.block_size))
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
        kept = num_kept.tolist() if isinstance(num_kept, torch.Tensor) else list(num_kept)
        if len(kept) != len(seqs):
            raise ValueError(f"num_kept has {len(kept)} entries for {len(seqs)} sequences")
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

    def fork(self, seq: Hashable, new_seq: Optional[Hashable] = None) -> Hashable:
        return self.manager.fork(seq, new_seq)

    def free(self, seq: Hashable) -> None:
        self.manager.free(seq)

    def check(self) -> None:
        """Raise ``RuntimeError`` if the CUDA append kernel met an invalid slot (one sync)."""
        if bool(self.errors):
            raise RuntimeError("PagedKVCache: an append met a slot out of range (skipped by the kernel)")
