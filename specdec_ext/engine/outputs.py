"""What :meth:`SpeculativeEngine.generate` returns: per-row statistics, phase timings and
step counts (kept apart: timings are measurements, counts are facts of the run)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch

__all__ = ["GenerationOutput", "PhaseTimes", "RowStats"]


@dataclass
class RowStats:
    """Per-row statistics of one :meth:`SpeculativeEngine.generate` call."""

    tokens_generated: int = 0
    steps: int = 0          # target steps in which the row was active
    drafted: int = 0        # draft tokens proposed to this row
    accepted: int = 0       # of those, accepted by verify
    rejections: int = 0     # steps that ended with a rejected draft (n < K)
    ks: List[int] = field(default_factory=list, repr=False)       # K of each step
    emitted: List[int] = field(default_factory=list, repr=False)  # tokens emitted at each step

    def record(self, k: int, accepted: int, emitted: int) -> None:
        """Account one step: K drafts, ``accepted`` of them accepted, ``emitted`` tokens kept."""
        self.steps += 1
        self.drafted += k
        self.accepted += accepted
        self.rejections += int(accepted < k)
        self.tokens_generated += emitted
        self.ks.append(k)
        self.emitted.append(emitted)

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability (Leviathan's alpha), estimated from tested
        drafts: accepted / (accepted + rejections); drafts after a rejection are untested."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens_generated / self.steps if self.steps else 0.0


@dataclass
class PhaseTimes:
    """Seconds spent in each phase of the steps, summed over the run (CUDA: event times).
    ``other`` is the engine's own bookkeeping: everything in a step but the three phases
    (the host copy of the step's result, committing rows, rollbacks, choosing K)."""

    draft: float = 0.0
    target: float = 0.0
    verify: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.draft + self.target + self.verify + self.other


@dataclass
class GenerationOutput:
    """``sequences`` [B, T + G] int64 (CPU): the prompt as given, then each row's generated
    ids, padded with ``pad_token_id`` after a row stops (like ``transformers`` generate).
    ``generated``: each row's new ids as a list. ``stats``: a :class:`RowStats` per row.
    ``steps``: target steps run; ``draft_steps``: draft tokens proposed per row, summed over
    steps (sum of K); ``phase_s``: the :class:`PhaseTimes` of those steps."""

    sequences: torch.Tensor
    generated: List[List[int]]
    stats: List[RowStats]
    elapsed_s: float = 0.0
    phase_s: PhaseTimes = field(default_factory=PhaseTimes)
    steps: int = 0
    draft_steps: int = 0
