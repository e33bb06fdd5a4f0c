"""Host-only block allocator of the paged KV cache: free list, reference counts and
per-sequence block tables. No tensors here (see :mod:`specdec_ext.cache.paged`).

A sequence owns a list of blocks (its block table) and token position p of it lives in
slot ``table[p // block_size] * block_size + p % block_size``. Blocks are reference
counted so that :meth:`BlockManager.fork` shares a prefix; a shared block is never written
(the last, partially filled block is copied on write) and never freed while another
sequence uses it.
"""
from __future__ import annotations

from typing import Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

from .._validate import check_int
from ..errors import OutOfBlocksError

__all__ = ["Allocation", "BlockManager", "ceil_div"]


class Allocation(NamedTuple):
    """Result of :meth:`BlockManager.allocate`.

    slots  : the cache slots of the new positions len .. len+n_tokens-1, in order
    copies : (src_block, dst_block) pairs to copy in the cache BEFORE writing (copy-on-write
             of a shared, partially filled last block)
    """

    slots: List[int]
    copies: List[Tuple[int, int]]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Host-side block allocator: free list, reference counts and per-sequence block tables.

    Sequences are identified by any hashable id. All bookkeeping is on the host; every
    refused request raises before changing anything.
    """

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: Optional[int] = None) -> None:
        num_blocks = check_int("num_blocks", num_blocks, 1)
        block_size = check_int("block_size", block_size, 1)
        max_blocks_per_seq = check_int("max_blocks_per_seq",
                                       num_blocks if max_blocks_per_seq is None else max_blocks_per_seq, 1)
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
        """Sequences using ``block`` (0 = free)."""
        return self._ref[check_int("block", block, 0, self.num_blocks - 1)]

    def free_blocks(self) -> List[int]:
        return list(self._free)

    def slot(self, seq: Hashable, pos: int) -> int:
        table = self._tables[self._known(seq)]
        check_int("pos", pos, 0, self._lengths[seq] - 1)
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
            while len(table) < ceil_div(length + n, self.block_size):
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
            check_int(f"n_tokens of sequence {seq!r}", n, 0)
            if seq in seen:
                raise ValueError(f"sequence {seq!r} appears twice in one allocation")
            seen.add(seq)
        needed = 0
        ref_delta: Dict[int, int] = {}
        for seq, n in requests:
            table = self._tables.get(seq, [])
            length = self._lengths.get(seq, 0)
            want = ceil_div(length + n, self.block_size)
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
        new_len = check_int(f"new_len (sequence {seq!r} of length {length}; no rolling forward)", new_len, 0,
                            length)
        table = self._tables[seq]
        keep = ceil_div(new_len, self.block_size)
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
            assert len(table) == ceil_div(self._lengths[seq], self.block_size), f"table size of {seq!r}"
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
