"""The package's error policy, in one place.

- An argument error (wrong type, shape, dtype, device or value) is a ``TypeError`` (wrong
  type or dtype) or a ``ValueError`` (anything else), from every entry point: the Python
  wrappers and the raw ``torch.ops.specdec.*`` ops alike. Nothing is written when an op
  refuses its arguments.
- A capacity error (a cache or block pool too small for a request) is a
  :class:`CacheFullError` or an :class:`OutOfBlocksError`; nothing was changed.
- A device-side sticky flag (set by a CUDA kernel that skipped a bad row without a host
  sync) raises :class:`DeviceFlagError` when checked (``KVCache.check``).
- A model that produced unusable logits (NaN / +inf) during generation raises
  :class:`ModelOutputError`, naming the model and the step.

Every class here derives from :class:`SpecDecError`, itself a ``RuntimeError``.
"""
from __future__ import annotations

__all__ = ["CacheFullError", "DeviceFlagError", "ModelOutputError", "OutOfBlocksError", "SpecDecError"]


class SpecDecError(RuntimeError):
    """Base class of the package's own (non-argument) errors."""


class CacheFullError(SpecDecError):
    """A KV cache has no room for the tokens of a request; nothing was changed."""


class OutOfBlocksError(SpecDecError):
    """Not enough free blocks (or block-table entries) for a request; nothing was changed."""


class DeviceFlagError(SpecDecError):
    """A CUDA kernel flagged (and skipped) a bad row; raised when the flags are checked."""


class ModelOutputError(SpecDecError):
    """A model produced unusable logits (NaN / +inf, or all -inf) while generating."""
