"""Argument rules shared by every Python entry point (one rule, one error type each).

- :func:`check_int`: a Python int (or a numpy integer), never a bool, a float or a tensor;
  ``TypeError`` for the wrong type, ``ValueError`` outside the allowed range.
- :func:`check_temperature`: the ONE temperature rule, identical to the kernels'
  (``valid_temperature`` in csrc/core/verify_math.h): 0 (greedy), or positive and finite
  with a finite inverse in float32 (so 1e-39, whose inverse overflows, is refused, and so
  is a positive value that float32 rounds to 0).
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Optional

import torch

__all__ = ["FILTER_DTYPES", "check_filter", "check_int", "check_temperature", "valid_temperature", "valid_temperatures"]

_F32_MAX = float(torch.finfo(torch.float32).max)


def check_int(name: str, value, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """``value`` as an int, checked to lie in [low, high] (either bound optional)."""
    if isinstance(value, (bool, float, complex, torch.Tensor)):  # a tensor would hide a device sync
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if (low is not None and out < low) or (high is not None and out > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {out}")
    return out


def valid_temperature(t: float) -> bool:
    """The kernels' rule on one value: 0, or > 0, finite, with 1/T finite in float32."""
    t32 = float(torch.tensor(t, dtype=torch.float32))  # the value the kernels see
    if t32 == 0.0:
        return t == 0.0  # a positive T that float32 rounds to 0 would silently turn greedy
    return 0.0 < t32 <= _F32_MAX and 1.0 / t32 <= _F32_MAX


def valid_temperatures(t: torch.Tensor) -> torch.Tensor:
    """Elementwise :func:`valid_temperature` of a float tensor (bool tensor, same device)."""
    t32 = t.to(torch.float32)
    inv = torch.reciprocal(t32)
    return ((t32 == 0) & (t == 0)) | ((t32 > 0) & torch.isfinite(t32) & torch.isfinite(inv))


def check_temperature(value, name: str = "temperature") -> float:
    """A Python number checked by :func:`valid_temperature` (``TypeError`` for a non-number,
    ``ValueError`` for an unusable value)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float (0 = greedy) or a tensor, got {type(value).__name__} {value!r}")
    value = float(value)
    if not valid_temperature(value):
        why = "its inverse overflows float32" if value > 0 and math.isfinite(value) else "it must be >= 0 and finite"
        raise ValueError(f"{name} must be 0 (greedy) or a positive finite float with a finite inverse in "
                         f"float32; got {value!r} ({why})")
    return value


#: the sampling filters in Hugging Face's warper order, each with the dtype the kernels read
FILTER_DTYPES = {"top_k": torch.int64, "top_p": torch.float32, "min_p": torch.float32}

# name -> (python type, check on the float32 / int64 value, what the error says)
_FILTERS = {
    "top_k": (int, lambda v: v >= 0, "an int >= 0 (0 = off)"),
    "top_p": (float, lambda v: 0.0 < v <= 1.0, "a float in (0, 1] (1 = off)"),
    "min_p": (float, lambda v: 0.0 <= v < 1.0, "a float in [0, 1) (0 = off)"),
}


def check_filter(name: str, value):
    """A Python top_k (int) / top_p / min_p (float) checked by the kernels' rule; returns the
    value as the kernels see it (top_p / min_p rounded to float32). ``TypeError`` for the
    wrong type, ``ValueError`` outside the range."""
    kind, ok, what = _FILTERS[name]
    if kind is int:
        value = check_int(name, value)
    else:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be {what} or a tensor [B], got {type(value).__name__} {value!r}")
        value = float(torch.tensor(float(value), dtype=torch.float32))
    if not ok(value):
        raise ValueError(f"{name} must be {what} or a tensor [B], got {value!r}")
    return value
