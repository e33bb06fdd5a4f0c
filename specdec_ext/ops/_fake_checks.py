"""What the fake (meta) kernels check before they return output shapes: devices, dtypes
and ranks, with the package's error policy (``ValueError`` / ``TypeError`` naming the
argument). Sizes and values are checked by the real kernels (csrc/sampling_args.cpp,
csrc/kv_args.h, on the shared rules of csrc/args/common.h).

Devices: an eager call that mixes devices (say a meta tensor among CPU ones) is refused by
the dispatcher's device check in csrc/ops.cpp before any kernel runs. Under torch.compile
only the fake kernel runs, so it applies the same rule (data tensors on one device;
temperature, seed and offset may also be on the CPU).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import torch

__all__ = ["FLOATS", "INDEX", "check_cache_pair", "check_cache_write", "check_devices", "check_dim",
           "check_dtype", "check_filters", "check_row_values", "check_token_logprobs"]

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INDEX = (torch.int32, torch.int64)


def check_devices(data: torch.Tensor, data_name: str, others: Dict[str, Optional[torch.Tensor]],
                  host_ok: Iterable[str] = ()) -> None:
    """Every tensor in ``others`` is on ``data``'s device; those named in ``host_ok`` (seed,
    offset, temperature) may also be CPU tensors."""
    host_ok = set(host_ok)
    for name, t in others.items():
        if t is None or t.device == data.device or (name in host_ok and t.device.type == "cpu"):
            continue
        raise ValueError(f"{name} is on {t.device} but {data_name} is on {data.device}: all tensors must be on "
                         "one device")


def check_dtype(t: Optional[torch.Tensor], name: str, allowed) -> None:
    if t is not None and t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must be {names}, got {t.dtype}")


def check_dim(t: Optional[torch.Tensor], name: str, dims: int, layout: str) -> None:
    if t is not None and t.dim() != dims:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")


def check_cache_pair(key_cache, value_cache, dims, layout):
    check_dim(key_cache, "key_cache", dims, layout)
    check_dim(value_cache, "value_cache", dims, layout)
    check_dtype(key_cache, "key_cache", FLOATS)
    check_dtype(value_cache, "value_cache", (key_cache.dtype,))


def check_cache_write(key_cache, value_cache, new_k, new_v, cache_layout: str, new_layout: str) -> None:
    """A cache pair being written with new keys / values of the cache's dtype."""
    check_cache_pair(key_cache, value_cache, 4, cache_layout)
    dims = new_layout.count(",") + 1
    for name, t in (("new_k", new_k), ("new_v", new_v)):
        check_dim(t, name, dims, new_layout)
        check_dtype(t, name, (key_cache.dtype,))


def check_row_values(temperature, seed, offset):
    """The per-row values every sampling op takes (temperature, seed, offset)."""
    check_dtype(temperature, "temperature", FLOATS + (torch.float64,))
    check_dtype(seed, "seed", INDEX)
    check_dtype(offset, "offset", INDEX)


def check_token_logprobs(token_logprobs, shape, text):
    """verify / sample's optional token_logprobs output (float32, `shape`, contiguous)."""
    if token_logprobs is None:
        return
    check_dtype(token_logprobs, "token_logprobs", (torch.float32,))
    if tuple(token_logprobs.shape) != tuple(shape):
        raise ValueError(f"token_logprobs must be {text} = {list(shape)}, got shape {tuple(token_logprobs.shape)}")
    if not token_logprobs.is_contiguous():
        raise ValueError(f"token_logprobs must be contiguous, got strides {token_logprobs.stride()}")


def check_filters(top_k, top_p, min_p):
    """top_k (int), top_p / min_p (float): each None, a number tensor [] or a per-row [B]."""
    for name, t, allowed in (("top_k", top_k, INDEX), ("top_p", top_p, FLOATS + (torch.float64,)),
                             ("min_p", min_p, FLOATS + (torch.float64,))):
        check_dtype(t, name, allowed)
        if t is not None and t.dim() > 1:
            raise ValueError(f"{name} must be a number or a tensor of shape [B], got shape {tuple(t.shape)}")
