"""Attention masks for the q_len tokens a speculative step appends to a KV cache.

Pure PyTorch, built on the device of ``past_lens`` with no host sync.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .._validate import check_int

__all__ = ["spec_attention_mask", "spec_attention_mask_bool"]

PastLens = Union[torch.Tensor, Sequence[int], int]


def _past_tensor(past_lens: PastLens, device) -> torch.Tensor:
    if isinstance(past_lens, torch.Tensor):
        if past_lens.dim() != 1:
            raise ValueError(f"past_lens must be a [B] tensor, got shape {tuple(past_lens.shape)}")
        if past_lens.dtype.is_floating_point or past_lens.dtype.is_complex or past_lens.dtype == torch.bool:
            raise TypeError(f"past_lens must be an integer tensor, got {past_lens.dtype}")
        if device is not None and torch.device(device) != past_lens.device:
            if "meta" in (past_lens.device.type, torch.device(device).type):
                raise ValueError(f"past_lens is on {past_lens.device} but device={device}: a meta tensor cannot "
                                 "move to or from another device")
            past_lens = past_lens.to(device)
        return past_lens.to(torch.int64)
    if not isinstance(past_lens, (list, tuple)):
        past_lens = [past_lens]
    return torch.tensor([check_int(f"past_lens[{i}]", n) for i, n in enumerate(past_lens)], dtype=torch.int64,
                        device=device)


def spec_attention_mask_bool(
    past_lens: PastLens, q_len: int, kv_len: int, *, device: Optional[Union[str, torch.device]] = None
) -> torch.Tensor:
    """Boolean mask [B, 1, q_len, kv_len], True = may attend.

    Query i of row b sits at absolute position ``past_lens[b] + i`` and may attend key j iff
    ``j <= past_lens[b] + i`` (its cached prefix, the earlier new tokens and itself); keys
    past a row's own tokens (padding of a ragged batch) are never visible.

    Parameters
    ----------
    past_lens : Tensor [B] int32 | int64 (any device: the mask is built there), list of
        ints, or int (B = 1). Tokens in the cache before this step.
    q_len : int >= 0, new tokens per row (K+1 when verifying K drafts).
    kv_len : int >= 0, keys attention reads (the cache view), normally
        ``max(past_lens) + q_len``. With host past_lens a row needing more
        (``past_lens[b] + q_len > kv_len``) is a ``ValueError``; with a device tensor this
        is not checked (no sync).
    device : where to build the mask when past_lens is not a tensor.

    Fully masked rows: only a query with ``past_lens[b] + i < 0`` (a negative past length,
    e.g. an unused batch slot) would see no key. Such a row is made fully VISIBLE instead, so
    SDPA returns a finite (meaningless) output rather than NaN; ignore it. For a finite
    additive fill this is also what exact arithmetic gives (softmax is shift-invariant).

    With equal ``past_lens >= 0`` and ``kv_len = past + q_len`` this equals
    ``torch.nn.attention.bias.causal_lower_right(q_len, kv_len)`` materialised.
    """
    q_len, kv_len = check_int("q_len", q_len, 0), check_int("kv_len", kv_len, 0)
    past = _past_tensor(past_lens, device)
    if past.device.type == "cpu" and past.numel() and int(past.max()) + q_len > kv_len:
        raise ValueError(f"kv_len={kv_len} is too short: a row with past length {int(past.max())} and "
                         f"q_len={q_len} needs {int(past.max()) + q_len} keys")
    B = past.shape[0]
    pos = past.view(B, 1, 1, 1) + torch.arange(q_len, device=past.device, dtype=torch.int64).view(1, 1, q_len, 1)
    j = torch.arange(kv_len, device=past.device, dtype=torch.int64).view(1, 1, 1, kv_len)
    return (j <= pos) | (pos < 0)


def spec_attention_mask(
    past_lens: PastLens,
    q_len: int,
    kv_len: int,
    dtype: torch.dtype = torch.float32,
    *,
    device: Optional[Union[str, torch.device]] = None,
) -> torch.Tensor:
    """Additive float mask [B, 1, q_len, kv_len] of ``dtype`` for SDPA's ``attn_mask``.

    0 where :func:`spec_attention_mask_bool` is True, else ``torch.finfo(dtype).min`` (the
    most negative finite value: unlike -1e9 it is representable in float16, and unlike -inf
    it cannot make a softmax row NaN). Fully masked query rows are made visible (see
    :func:`spec_attention_mask_bool`), so no row of the mask is all-min and SDPA cannot
    produce NaN even when ``score + min`` rounds to -inf in half precision.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    allowed = spec_attention_mask_bool(past_lens, q_len, kv_len, device=device)
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, neg)
