"""Which Philox key every random draw of a generate() call uses, in one place.

The ops key their randomness by (seed, offset, position, token) and keep ``sample`` and
``verify`` on separate streams (csrc/core/rng.h), so two calls collide only if they are the
same op with the same seed and offset. One run uses a single seed (per-row streams come
from the row index, mixed in by the ops) and these offsets:

- draft sample i (0 <= i < K) of step s: ``s * (k_max + 1) + i`` on the sample stream;
- verify of step s: ``s`` on the verify stream.

Every (step, i) pair gets its own offset because K <= k_max, so no number is ever reused
within a run, and the same seed and K decisions reproduce the same text.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepKeys"]


@dataclass(frozen=True)
class StepKeys:
    """Offsets of one run whose steps draft at most ``k_max`` tokens."""

    k_max: int

    def draft(self, step: int, i: int) -> int:
        """Offset of the i-th draft sample of ``step``."""
        return step * (self.k_max + 1) + i

    def verify(self, step: int) -> int:
        """Offset of the verify call of ``step``."""
        return step
