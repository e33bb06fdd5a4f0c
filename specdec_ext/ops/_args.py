"""Python-side argument conversion of the ops: plain Python values -> the tensors the
schemas take. Tensors pass through unchanged (the C++ argument checks judge them)."""
from __future__ import annotations

from typing import Union

import torch

from .._validate import check_int, check_temperature

__all__ = ["float_arg", "int64_arg", "seed_arg", "temperature_arg"]

_SEED_HIGH = 2**62

Temperature = Union[int, float, torch.Tensor]
IntOrTensor = Union[int, torch.Tensor]


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
