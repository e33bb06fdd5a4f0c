"""Contiguous KV cache for speculative decoding: :class:`KVCache` owns every layer's keys
and values and drives the ``kv_append_`` / ``kv_rollback_`` ops (:mod:`specdec_ext.ops.kv`).

Layout (per layer, the one SDPA reads): ``[B, H, max_len, D]``. A step of speculative
decoding appends S = K+1 tokens per row to every layer, advances the lengths, then rolls
each row back to the tokens it keeps (``num_accepted + 1``) -- all without a host sync. A
tree step appends the tree's N nodes, moves the accepted path to the front of them
(:meth:`KVCache.compact`), then rolls back.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from ..errors import CacheFullError, DeviceFlagError
from .._validate import check_int
from ..ops.kv import kv_append_, kv_compact_, kv_rollback_
from .attention_mask import spec_attention_mask
from .compaction import check_num_appended, compact_rows

__all__ = ["KVCache"]


class KVCache:
    """Contiguous KV cache of every layer of a model, with device lengths and a host mirror.

    Tensors (all on ``device``)::

        key_cache, value_cache  [num_layers, B, H, max_len, D] dtype, zero-initialised
                                (unwritten slots stay finite, so masked attention never sees NaN)
        lengths                 [B] lengths_dtype (int64 default, or int32 for attention
                                kernels that take int32 sequence lengths): tokens per row
        errors                  [B] bool: sticky flags of the device kernels (CUDA only:
                                an overflowing append, an invalid rollback or an invalid
                                compaction of that row)

    A decoding step::

        for layer in range(num_layers):
            k_all, v_all = cache.append(layer, k, v)       # k, v [B, H, S, D]; writes at lengths
            ... attention over k_all / v_all [B, H, kv_len, D] with cache.attention_mask(S)
        cache.advance(S)                                   # lengths += S
        cache.rollback(S, num_accepted + 1)                # keep the accepted prefix, no sync

    Capacity is checked on the host before anything is written: an append / advance that
    would take a row past ``max_len`` raises :class:`~specdec_ext.errors.CacheFullError` and
    changes nothing. The host
    mirror is exact after an append / advance / rollback with host ``num_kept``; after a
    rollback with a device ``num_kept`` it is an upper bound (lengths only shrink) refreshed
    without blocking when the device copy has landed, and synchronously only when the upper
    bound alone would refuse an append.
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float16,
        device: Union[str, torch.device] = "cpu",
        lengths_dtype: torch.dtype = torch.int64,
    ) -> None:
        for name, value in (("num_layers", num_layers), ("batch_size", batch_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("max_len", max_len)):
            check_int(name, value, 1)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype}")
        if lengths_dtype not in (torch.int32, torch.int64):
            raise TypeError(f"lengths_dtype must be torch.int32 or torch.int64, got {lengths_dtype}")
        self.num_layers, self.batch_size = num_layers, batch_size
        self.num_kv_heads, self.head_dim, self.max_len = num_kv_heads, head_dim, max_len
        self.dtype, self.device = dtype, torch.device(device)
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self.key_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.value_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.device = self.key_cache.device  # with its index ("cuda" -> "cuda:0")
        self.lengths = torch.zeros(batch_size, dtype=lengths_dtype, device=self.device)
        self.errors = torch.zeros(batch_size, dtype=torch.bool, device=self.device)
        # exact, or an upper bound; plain ints: the per-step host checks are Python, not tensor ops
        self._host: List[int] = [0] * batch_size
        self._pending = None  # (pinned snapshot of lengths, event, host additions since)

    # ---- views -------------------------------------------------------------------
    def layer(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (keys, values) [B, H, max_len, D] of one layer's cache."""
        self._check_layer(layer)
        return self.key_cache[layer], self.value_cache[layer]

    def view(self, layer: int, kv_len: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (keys, values) [B, H, kv_len, D] for attention (default: max host length)."""
        self._check_layer(layer)
        if kv_len is None:
            kv_len = max(self._host, default=0)
        check_int("kv_len", kv_len, 0, self.max_len)
        return self.key_cache[layer, :, :, :kv_len], self.value_cache[layer, :, :, :kv_len]

    def host_lengths(self) -> torch.Tensor:
        """Exact lengths on the host, int64 [B] (may wait for a pending device rollback)."""
        self._resolve(block=True)
        return torch.tensor(self._host, dtype=torch.int64)

    def attention_mask(self, q_len: int, dtype: Optional[torch.dtype] = None,
                       kv_len: Optional[int] = None) -> torch.Tensor:
        """Additive mask [B, 1, q_len, kv_len] for the q_len tokens being appended at ``lengths``
        (see :func:`spec_attention_mask`); kv_len defaults to max host length + q_len."""
        if kv_len is None:
            kv_len = max(self._host, default=0) + q_len
        return spec_attention_mask(self.lengths, q_len, kv_len, dtype or self.dtype)

    def begin_step(self, num_tokens: int) -> Tuple[int, bool]:
        """The host checks of :meth:`append`, once for a step whose layers each append
        ``num_tokens`` tokens per row: raises :class:`~specdec_ext.errors.CacheFullError`
        (nothing changes) when a row would pass ``max_len``. Returns ``(kv_len, exact)``:
        the keys attention reads this step (max host length + num_tokens) and whether the
        host lengths are exact (no device rollback pending)."""
        self._check_capacity(check_int("num_tokens", num_tokens, 0), "append")
        return max(self._host, default=0) + num_tokens, self._pending is None

    # ---- writes ------------------------------------------------------------------
    def append(self, layer: int, new_k: torch.Tensor, new_v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write ``new_k`` / ``new_v`` [B, H, S, D] at each row's current length in ``layer``.

        Lengths are not advanced (every layer writes at the same positions; call
        :meth:`advance` once per step). Returns the views [B, H, max_length + S, D] that
        attention reads. Raises when a row would overflow:
        :class:`~specdec_ext.errors.CacheFullError` (nothing written).
        """
        self._check_layer(layer)
        if new_k.dim() != 4:
            raise ValueError(f"new_k must be [B, H, S, D], got shape {tuple(new_k.shape)}")
        S = new_k.shape[2]
        self._check_capacity(S, "append")
        kv_append_(self.key_cache[layer], self.value_cache[layer], new_k, new_v, self.lengths,
                   overflow=self.errors)
        return self.view(layer, max(self._host) + S if self.batch_size else 0)

    def advance(self, num_tokens: int) -> None:
        """lengths += num_tokens (after every layer appended them). Refused past max_len
        (:class:`~specdec_ext.errors.CacheFullError`)."""
        num_tokens = check_int("num_tokens", num_tokens, 0)
        self._check_capacity(num_tokens, "advance")
        self.lengths.add_(num_tokens)
        self._host = [h + num_tokens for h in self._host]
        if self._pending is not None:
            self._pending[2] += num_tokens

    def rollback(self, num_appended: int, num_kept: Union[torch.Tensor, int, Sequence[int]]) -> None:
        """Keep ``num_kept[b]`` of the last ``num_appended`` tokens of each row.

        num_kept: int, list, or int32/int64 [B] tensor (e.g. ``num_accepted + 1``). A host
        value is validated here (``ValueError``, nothing changes, when outside
        [0, num_appended] or below length 0) and the host mirror stays exact. A device tensor
        causes no sync: the kernel skips and flags invalid rows in :attr:`errors` (see
        :meth:`check`), and the host mirror is refreshed asynchronously.
        """
        num_appended = check_int("num_appended", num_appended, 0)
        if not isinstance(num_kept, torch.Tensor):
            if not isinstance(num_kept, (list, tuple)):
                num_kept = [num_kept] * self.batch_size
            num_kept = torch.tensor([check_int("num_kept", k) for k in num_kept], dtype=torch.int64)
        if num_kept.shape != (self.batch_size,):
            raise ValueError(f"num_kept must have shape [B] = [{self.batch_size}], got {tuple(num_kept.shape)}")
        if num_kept.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"num_kept must be int32 or int64, got {num_kept.dtype}")
        if num_kept.device.type == "cpu":
            self._resolve(block=True)
            kept = num_kept.to(torch.int64)
            kept_list = kept.tolist()
            bad = [b for b, k in enumerate(kept_list) if not 0 <= k <= num_appended]
            if bad:
                raise ValueError(f"num_kept must be in [0, num_appended={num_appended}] (no rolling forward); "
                                 f"rows {bad} have {[kept_list[b] for b in bad]}; nothing changed")
            new = [h - (num_appended - k) for h, k in zip(self._host, kept_list)]
            neg = [b for b, n in enumerate(new) if n < 0]
            if neg:
                raise ValueError(f"rollback would make the length of rows {neg} negative "
                                 f"(lengths {[self._host[b] for b in neg]}, dropping "
                                 f"{[num_appended - kept_list[b] for b in neg]}); nothing changed")
            if self.device.type == "cuda":  # pinned + non_blocking: no host sync
                kept_dev = kept.pin_memory().to(self.device, non_blocking=True)
            else:
                kept_dev = kept.to(self.device)
            kv_rollback_(self.lengths, num_appended, kept_dev, invalid=self.errors)
            self._host = new
            return
        if num_kept.device != self.device:
            raise ValueError(f"num_kept is on {num_kept.device} but the cache is on {self.device}")
        kv_rollback_(self.lengths, num_appended, num_kept, invalid=self.errors)
        # The host mirror stays an upper bound; fetch the exact lengths without blocking.
        snapshot = torch.empty(self.batch_size, dtype=self.lengths.dtype, pin_memory=True)
        snapshot.copy_(self.lengths, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))  # the copy's stream, on the cache's device
        self._pending = [snapshot, event, 0]

    def compact(self, num_appended: int, src_index: torch.Tensor, count: torch.Tensor) -> None:
        """Move kept entries of the step to its front: for each row b and j < count[b], entry j
        of the last ``num_appended`` entries receives entry ``src_index[b, j]`` (as it was
        before the call), in every layer. Lengths do not change: follow with
        :meth:`rollback` (e.g. a tree step: ``src_index`` = the accepted path, ``count`` =
        num_accepted + 1, then ``rollback(N, num_kept)``).

        src_index : Tensor [B, M] int64 | int32 on the cache device; ``src_index[b, :count[b]]``
            strictly increasing in [0, num_appended) (a path of a tree in BFS order is); later
            columns are not read (e.g. -1).
        count     : Tensor [B] int64 | int32 on the cache device, each in [0, min(M, num_appended)].
        ``num_appended`` above a row's length is a ``ValueError`` naming the rows and their
        lengths (nothing changes). Host tensors are checked (``ValueError``, nothing changes);
        device tensors are not (no sync): on CUDA the op skips a row that breaks the rules and flags it in
        :attr:`errors` (see :meth:`check`). Runs ``specdec_ext.kv_compact_`` per layer (correct
        when source and destination slots overlap).
        """
        num_appended = check_int("num_appended", num_appended, 0)
        self._resolve(block=False)  # the host mirror: exact, or an upper bound while a device rollback is pending
        check_num_appended("KVCache", range(self.batch_size), list(self._host), num_appended)
        src_index, count = compact_rows(src_index, count, self.batch_size, num_appended, self.device)
        if num_appended == 0 or src_index.shape[1] == 0:
            return
        base = self.lengths.to(torch.int64) - num_appended  # each row's first entry of the step
        for layer in range(self.num_layers):
            kv_compact_(self.key_cache[layer], self.value_cache[layer], base, src_index, count, invalid=self.errors)

    def reset(self, rows: Optional[Sequence[int]] = None) -> None:
        """Empty the given rows (default all), e.g. when a new request takes a batch slot.
        Their stale keys / values stay (finite) until overwritten; their error flags clear."""
        self._resolve(block=True)
        idx = list(range(self.batch_size)) if rows is None else list(rows)
        idx = [check_int("rows[i]", r, 0, self.batch_size - 1) for r in idx]
        if not idx:
            return
        index = torch.tensor(idx, dtype=torch.int64)
        for r in idx:
            self._host[r] = 0
        dev_index = index.to(self.device)
        self.lengths.index_fill_(0, dev_index, 0)
        self.errors.index_fill_(0, dev_index, False)

    def check(self) -> None:
        """Raise :class:`~specdec_ext.errors.DeviceFlagError` if a device kernel flagged a row
        (one sync)."""
        if bool(self.errors.any()):
            rows = self.errors.nonzero().flatten().tolist()
            raise DeviceFlagError(f"KVCache: rows {rows} had an overflowing append, an invalid rollback or an "
                                  "invalid compaction (skipped by the kernel)")

    # ---- internals ---------------------------------------------------------------
    def _check_layer(self, layer: int) -> None:
        check_int("layer", layer, 0, self.num_layers - 1)

    def _resolve(self, block: bool) -> None:
        if self._pending is None:
            return
        snapshot, event, added = self._pending
        if not block and not event.query():
            return
        event.synchronize()
        self._host = [int(n) + added for n in snapshot.tolist()]
        self._pending = None

    def _check_capacity(self, S: int, what: str) -> None:
        self._resolve(block=False)
        if self._pending is not None and max(self._host, default=0) + S > self.max_len:
            self._resolve(block=True)
        rows = [b for b, h in enumerate(self._host) if h + S > self.max_len]
        if rows:
            raise CacheFullError(f"KVCache.{what}: rows {rows} hold {[self._host[b] for b in rows]} tokens; "
                             f"{S} more would exceed max_len={self.max_len} (refused; nothing changed)")
