"""Contiguous KV cache for speculative decoding: the ``kv_append_`` / ``kv_rollback_`` ops
and :class:`KVCache`, which owns every layer's keys and values.

Layout (per layer, the one SDPA reads): ``[B, H, max_len, D]``. A step of speculative
decoding appends S = K+1 tokens per row to every layer, advances the lengths, then rolls
each row back to the tokens it keeps (``num_accepted + 1``) -- all without a host sync.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from .attention_mask import spec_attention_mask

__all__ = ["KVCache", "kv_append_", "kv_rollback_"]


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

        - CPU: the op raises ``RuntimeError`` before writing anything (flags untouched);
        - CUDA: nothing is written for that row, the other rows are written, and
          ``overflow[b]`` is set to True (never cleared by the op), so one check after many
          steps (``overflow.any().item()``) finds it with no sync per step. Without
          ``overflow`` such a row is skipped silently.
    """
    torch.ops.specdec.kv_append_(key_cache, value_cache, new_k, new_v, lengths, overflow)


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

        - CPU: the op raises ``RuntimeError`` before writing anything (flags untouched);
        - CUDA: that row's length is left unchanged, the other rows are rolled back, and
          ``invalid[b]`` is set to True (never cleared by the op).
    """
    if not isinstance(num_kept, torch.Tensor):
        num_kept = torch.full(lengths.shape, int(num_kept), dtype=torch.int64, device=lengths.device)
    torch.ops.specdec.kv_rollback_(lengths, int(num_appended), num_kept, invalid)


class KVCache:
    """Contiguous KV cache of every layer of a model, with device lengths and a host mirror.

    Tensors (all on ``device``)::

        key_cache, value_cache  [num_layers, B, H, max_len, D] dtype, zero-initialised
                                (unwritten slots stay finite, so masked attention never sees NaN)
        lengths                 [B] lengths_dtype (int64 default, or int32 for attention
                                kernels that take int32 sequence lengths): tokens per row
        errors                  [B] bool: sticky flags of the device kernels (CUDA only:
                                an overflowing append or an invalid rollback of that row)

    A decoding step::

        for layer in range(num_layers):
            k_all, v_all = cache.append(layer, k, v)       # k, v [B, H, S, D]; writes at lengths
            ... attention over k_all / v_all [B, H, kv_len, D] with cache.attention_mask(S)
        cache.advance(S)                                   # lengths += S
        cache.rollback(S, num_accepted + 1)                # keep the accepted prefix, no sync

    Capacity is checked on the host before anything is written: an append / advance that
    would take a row past ``max_len`` raises ``ValueError`` and changes nothing. The host
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
        for name, value, low in (("num_layers", num_layers, 1), ("batch_size", batch_size, 1),
                                 ("num_kv_heads", num_kv_heads, 1), ("head_dim", head_dim, 1),
                                 ("max_len", max_len, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype}")
        if lengths_dtype not in (torch.int32, torch.int64):
            raise ValueError(f"lengths_dtype must be torch.int32 or torch.int64, got {lengths_dtype}")
        self.num_layers, self.batch_size = num_layers, batch_size
        self.num_kv_heads, self.head_dim, self.max_len = num_kv_heads, head_dim, max_len
        self.dtype, self.device = dtype, torch.device(device)
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self.key_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.value_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.device = self.key_cache.device  # with its index ("cuda" -> "cuda:0")
        self.lengths = torch.zeros(batch_size, dtype=lengths_dtype, device=self.device)
        self.errors = torch.zeros(batch_size, dtype=torch.bool, device=self.device)
        self._host = torch.zeros(batch_size, dtype=torch.int64)  # exact, or an upper bound
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
            kv_len = int(self._host.max()) if self.batch_size else 0
        if not 0 <= kv_len <= self.max_len:
            raise ValueError(f"kv_len must be in [0, max_len={self.max_len}], got {kv_len}")
        return self.key_cache[layer, :, :, :kv_len], self.value_cache[layer, :, :, :kv_len]

    def host_lengths(self) -> torch.Tensor:
        """Exact lengths on the host, int64 [B] (may wait for a pending device rollback)."""
        self._resolve(block=True)
        return self._host.clone()

    def attention_mask(self, q_len: int, dtype: Optional[torch.dtype] = None,
                       kv_len: Optional[int] = None) -> torch.Tensor:
        """Additive mask [B, 1, q_len, kv_len] for the q_len tokens being appended at ``lengths``
        (see :func:`spec_attention_mask`); kv_len defaults to max host length + q_len."""
        if kv_len is None:
            kv_len = (int(self._host.max()) if self.batch_size else 0) + q_len
        return spec_attention_mask(self.lengths, q_len, kv_len, dtype or self.dtype)

    # ---- writes ------------------------------------------------------------------
    def append(self, layer: int, new_k: torch.Tensor, new_v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write ``new_k`` / ``new_v`` [B, H, S, D] at each row's current length in ``layer``.

        Lengths are not advanced (every layer writes at the same positions; call
        :meth:`advance` once per step). Returns the views [B, H, max_length + S, D] that
        attention reads. Raises ``ValueError`` (nothing written) when a row would overflow.
        """
        self._check_layer(layer)
        if new_k.dim() != 4:
            raise ValueError(f"new_k must be [B, H, S, D], got shape {tuple(new_k.shape)}")
        S = new_k.shape[2]
        self._check_capacity(S, "append")
        torch.ops.specdec.kv_append_(self.key_cache[layer], self.value_cache[layer], new_k, new_v,
                                     self.lengths, self.errors)
        return self.view(layer, int(self._host.max()) + S if self.batch_size else 0)

    def advance(self, num_tokens: int) -> None:
        """lengths += num_tokens (after every layer appended them). Refused past max_len."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        self._check_capacity(num_tokens, "advance")
        self.lengths.add_(num_tokens)
        self._host.add_(num_tokens)
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
        if isinstance(num_appended, bool) or not isinstance(num_appended, int) or num_appended < 0:
            raise ValueError(f"num_appended must be an int >= 0, got {num_appended!r}")
        if not isinstance(num_kept, torch.Tensor):
            if isinstance(num_kept, int):
                num_kept = [num_kept] * self.batch_size
            num_kept = torch.tensor(list(num_kept), dtype=torch.int64)
        if num_kept.shape != (self.batch_size,):
            raise ValueError(f"num_kept must have shape [B] = [{self.batch_size}], got {tuple(num_kept.shape)}")
        if num_kept.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"num_kept must be int32 or int64, got {num_kept.dtype}")
        if num_kept.device.type == "cpu":
            self._resolve(block=True)
            kept = num_kept.to(torch.int64)
            bad = (kept < 0) | (kept > num_appended)
            if bool(bad.any()):
                rows = bad.nonzero().flatten().tolist()
                raise ValueError(f"num_kept must be in [0, num_appended={num_appended}] (no rolling forward); "
                                 f"rows {rows} have {kept[bad].tolist()}; nothing changed")
            new = self._host - (num_appended - kept)
            if bool((new < 0).any()):
                rows = (new < 0).nonzero().flatten().tolist()
                raise ValueError(f"rollback would make the length of rows {rows} negative "
                                 f"(lengths {self._host[new < 0].tolist()}, dropping "
                                 f"{(num_appended - kept)[new < 0].tolist()}); nothing changed")
            if self.device.type == "cuda":  # pinned + non_blocking: no host sync
                kept_dev = kept.pin_memory().to(self.device, non_blocking=True)
            else:
                kept_dev = kept.to(self.device)
            torch.ops.specdec.kv_rollback_(self.lengths, num_appended, kept_dev, self.errors)
            self._host.copy_(new)
            return
        if num_kept.device != self.device:
            raise ValueError(f"num_kept is on {num_kept.device} but the cache is on {self.device}")
        torch.ops.specdec.kv_rollback_(self.lengths, num_appended, num_kept, self.errors)
        # The host mirror stays an upper bound; fetch the exact lengths without blocking.
        snapshot = torch.empty(self.batch_size, dtype=self.lengths.dtype, pin_memory=True)
        snapshot.copy_(self.lengths, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))  # the copy's stream, on the cache's device
        self._pending = [snapshot, event, 0]

    def reset(self, rows: Optional[Sequence[int]] = None) -> None:
        """Empty the given rows (default all), e.g. when a new request takes a batch slot.
        Their stale keys / values stay (finite) until overwritten; their error flags clear."""
        self._resolve(block=True)
        idx = list(range(self.batch_size)) if rows is None else list(rows)
        for r in idx:
            if not 0 <= r < self.batch_size:
                raise ValueError(f"row {r} out of range [0, {self.batch_size})")
        if not idx:
            return
        index = torch.tensor(idx, dtype=torch.int64)
        self._host[index] = 0
        dev_index = index.to(self.device)
        self.lengths.index_fill_(0, dev_index, 0)
        self.errors.index_fill_(0, dev_index, False)

    def check(self) -> None:
        """Raise ``RuntimeError`` if a device kernel flagged a row (one sync)."""
        if bool(self.errors.any()):
            rows = self.errors.nonzero().flatten().tolist()
            raise RuntimeError(f"KVCache: rows {rows} had an overflowing append or an invalid rollback "
                               "(skipped by the kernel)")

    # ---- internals ---------------------------------------------------------------
    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")

    def _resolve(self, block: bool) -> None:
        if self._pending is None:
            return
        snapshot, event, added = self._pending
        if not block and not event.query():
            return
        event.synchronize()
        self._host.copy_(snapshot.to(torch.int64) + added)
        self._pending = None

    def _check_capacity(self, S: int, what: str) -> None:
        self._resolve(block=False)
        if bool((self._host + S > self.max_len).any()) and self._pending is not None:
            self._resolve(block=True)
        over = self._host + S > self.max_len
        if bool(over.any()):
            rows = over.nonzero().flatten().tolist()
            raise ValueError(f"KVCache.{what}: rows {rows} hold {self._host[over].tolist()} tokens; "
                             f"{S} more would exceed max_len={self.max_len} (refused; nothing changed)")
