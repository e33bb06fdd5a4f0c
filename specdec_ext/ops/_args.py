"""Python-side argument conversion of the ops: plain Python values -> the tensors the
schemas take. Tensors pass through unchanged (the C++ argument checks judge them)."""
from __future__ import annotations

from typing import Union

import torch

from .._validate import FILTER_DTYPES, check_filter, check_int, check_temperature

__all__ = ["bool_arg", "filter_args", "float_arg", "int64_arg", "mode_arg", "seed_arg", "temperature_arg",
           "verify_mode_arg", "VERIFY_MODES"]

_SEED_HIGH = 2**62

Temperature = Union[int, float, torch.Tensor]
IntOrTensor = Union[int, torch.Tensor]
FloatOrTensor = Union[float, torch.Tensor]

# the value of each filter that keeps every token
_FILTER_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
#: verify's modes (the ratio test, coupled to sample's stream, block verification)
VERIFY_MODES = ("exact", "coupled", "block")


def temperature_arg(temperature: Temperature) -> torch.Tensor:
    """float -> float32 [] tensor (checked by the one temperature rule); a tensor as is."""
    if isinstance(temperature, torch.Tensor):
        return temperature
    return torch.tensor(check_temperature(temperature), dtype=torch.float32)


def int64_arg(value: IntOrTensor, name: str) -> torch.Tensor:
    """int -> int64 [] tensor (values in [2^63, 2^64) wrap to their two's complement, so any
    64-bit pattern is a valid seed / offset); a tensor as is."""
    if isinstance(value, torch.Tensor):
        return value
    value = check_int(name, value, -(2**63), 2**64 - 1)
    if value >= 2**63:
        value -= 2**64
    return torch.tensor(value, dtype=torch.int64)


def seed_arg(seed) -> torch.Tensor:
    """:func:`int64_arg`, with None drawn from torch's default CPU generator (so
    ``torch.manual_seed`` makes runs repeatable, and no device sync happens)."""
    if seed is None:
        return torch.randint(0, _SEED_HIGH, (), dtype=torch.int64)
    return int64_arg(seed, "seed")


def float_arg(t):
    """Logits / probabilities as the kernels read them: float32 | float16 | bfloat16 as is,
    float64 (e.g. a reference model run in double precision) converted to float32. Anything
    else goes to the op unchanged, whose checks name it."""
    return t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t


def filter_args(top_k, top_p, min_p):
    """(top_k, top_p, min_p) as the schemas take them: None or the "off" value -> None (no
    filter pass at all), a Python number -> a checked 0-dim tensor, a tensor ([] or [B]) as
    is (the C++ checks judge its dtype, shape and, on the CPU, its values)."""
    out = []
    for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if value is None or isinstance(value, torch.Tensor):
            out.append(value)
            continue
        value = check_filter(name, value)
        if name == "top_k" and value >= 2**63:  # k >= V keeps every token: an int64-overflowing k is off
            value = 0
        out.append(None if value == _FILTER_OFF[name] else torch.tensor(value, dtype=FILTER_DTYPES[name]))
    return out


def bool_arg(value, name: str) -> bool:
    """A flag argument (``probs_input``): a Python bool (or numpy bool), else ``TypeError``
    naming it (a tensor or a string would otherwise be truthy without meaning so)."""
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def verify_mode_arg(mode, name: str = "mode", allowed=VERIFY_MODES) -> str:
    """verify's ``mode`` (``name``: the argument the error names), one of ``allowed``;
    anything else raises ``ValueError``."""
    if not isinstance(mode, str) or mode not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {mode!r}")
    return mode


def mode_arg(mode, name: str = "mode") -> bool:
    """``mode`` where only "exact" (-> False) and "coupled" (-> True) are offered."""
    return verify_mode_arg(mode, name, ("exact", "coupled")) == "coupled"
