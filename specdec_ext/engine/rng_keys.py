"""Which Philox key every random draw of a generate() call uses, in one place.

The ops key their randomness by (seed, offset, position, token) and keep ``sample`` and
``verify`` on separate streams (csrc/core/rng.h), so two calls collide only if they are the
same op with the same seed and offset (coupled ``verify`` excepted: it reuses ``sample``'s
stream on purpose, see below).

Seeds. ``generate(seed=)`` takes

- an int: passed to the ops as is; they mix the row index into the key, so row b's
  stream is (seed, b). Rows differ, but a row's numbers depend on its index in the batch;
- an int64 tensor [B] of per-row seeds: row b's stream is (seed[b]) alone (the ops do not
  mix the row index in), so a request's numbers do not depend on the batch it runs in;
- None: an int drawn from torch's default CPU generator.

Offsets, ``verify_mode="exact"`` (Leviathan's ratio test):

- draft sample i (0 <= i < K) of step s: ``s * (k_max + 1) + i`` on the sample stream;
- verify of step s: ``s`` on the verify stream.

Every (step, i) pair gets its own offset because K <= k_max, so no number is reused within
a run, and the same seed and K decisions reproduce the same text. A different K or draft
gives a different (equally exact) text.

Offsets, tree speculation (``SpeculativeEngine(tree=...)``, exact mode; N = the full tree's
nodes): the run's keys are ``StepKeys(k_max = N - 1)``, so the draw of tree node n >= 1 at
step s uses draft offset ``s * N + n - 1`` (one offset per node: siblings drawn i.i.d. from
the same law get independent numbers, with an int seed or per-row seeds alike), and
verify_tree uses offset ``s``.

Offsets, ``verify_mode="coupled"`` (keyed by token position, not by step): let P_b be the
absolute position in row b's sequence (prompt tokens first, counted without padding) of
the next token the row emits.

- draft sample i of a step: offset ``P_b + i`` on the sample stream (the draft's guess for
  position P_b + i);
- verify: offset ``P_b`` ([B] tensor), ``mode="coupled"``: the target's token at position
  P_b + i is ``sample(target_logits[b, i], seed=row b's seed, offset=P_b + i)``, and a draft
  is accepted iff it equals it.

So the token at position P of row b is always the target's sample keyed by (row b's seed,
P): the text equals target-only sampling (K = 0) with the same seed, whatever K, the draft,
adaptive K or (with per-row seeds) the batch makeup. The draft shares the target's noise at
each position, so it draws the same token whenever its law is close to the target's.

Plain decoding (``k=0``: no drafts at all) uses the coupled keys in BOTH modes: its token at
position P of row b is ``sample(logits, seed=row b's seed, offset=P)``. So "target-only
sampling with this seed" is one text: that of ``SpeculativeEngine(target, None, k=0)`` in
either mode, of coupled mode at any K, and of a plain loop calling :func:`specdec_ext.sample`
with ``offset`` = the position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

__all__ = ["StepKeys"]

Offset = Union[int, torch.Tensor]


@dataclass(frozen=True)
class StepKeys:
    """Offsets of one run whose steps draft at most ``k_max`` tokens.

    ``positions`` (coupled mode): int64 [B] tensor on the device, P_b of each row (the
    absolute position of its next emitted token); exact mode ignores it.
    """

    k_max: int
    coupled: bool = False
    block: bool = False  # verify_mode="block": exact mode's offsets, block verification

    def draft(self, step: int, i: int, positions: Optional[torch.Tensor] = None) -> Offset:
        """Offset of the i-th draft sample of ``step``: an int, or int64 [B] (coupled)."""
        return positions + i if self.coupled else step * (self.k_max + 1) + i

    def verify(self, step: int, positions: Optional[torch.Tensor] = None) -> Offset:
        """Offset of the verify call of ``step``: an int, or int64 [B] (coupled)."""
        return positions if self.coupled else step

    @property
    def mode(self) -> str:
        """verify's ``mode`` argument."""
        return "coupled" if self.coupled else "block" if self.block else "exact"
