"""The host state of one :meth:`SpeculativeEngine.generate` call."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import AbstractSet, List, Optional

import torch

from .adaptive_k import MODEL_SOURCE, AcceptanceEstimator, PerRowK, StepCosts
from .commit import RowCommit
from .inputs import SamplingArgs
from .ngram import NgramIndex
from .outputs import GenerationOutput, PhaseTimes, RowStats
from .rng_keys import StepKeys

__all__ = ["Run"]


@dataclass
class Run:
    """Per-row progress (emitted tokens, the draft's pending tokens, done flags, stats) and
    the run's settings. Rows are independent; the batch steps while any row is active."""

    ids: torch.Tensor                 # [B, T] int64 CPU: input_ids as given
    prompts: List[List[int]]
    max_new_tokens: int
    eos: AbstractSet[int]
    pad: int
    sampling: SamplingArgs            # temperature, filters and seed(s) of every sample / verify call
    greedy: bool                      # every row has temperature 0
    keys: StepKeys
    policy: PerRowK
    costs: StepCosts
    last: torch.Tensor                # [B] int64 on the device: the last committed token
    positions: Optional[torch.Tensor] = None  # [B] int64 on the device (coupled mode): next token's position
    cache_len: int = 0                # positions each model's cache holds per row
    ngram: Optional[List[NgramIndex]] = None  # per-row prompt-lookup index (n-gram / hybrid drafting)
    draft_model: bool = True          # a draft model runs (else ``pending`` is not tracked: nothing reads it)
    head_feats: Optional[torch.Tensor] = None  # [B, H] on the device (drafter 'head'): see _keep_head_features
    head_ok: List[bool] = field(default_factory=list)  # row b has a head feature
    generated: List[List[int]] = field(default_factory=list)
    pending: List[List[int]] = field(default_factory=list)
    active: List[bool] = field(default_factory=list)
    trimmed: List[int] = field(default_factory=list)  # entries dropped from each finished row (see trim_finished)
    stats: List[RowStats] = field(default_factory=list)
    alpha: Optional[AcceptanceEstimator] = None
    sources: List[Optional[str]] = field(default_factory=list)  # each row's draft source this step (choose_ks)
    phase: PhaseTimes = field(default_factory=PhaseTimes)
    step: int = 0
    draft_steps: int = 0

    def __post_init__(self) -> None:
        B = len(self.prompts)
        self.generated = [[] for _ in range(B)]
        self.pending = [[p[-1]] for p in self.prompts]
        self.active = [self.max_new_tokens > 0] * B
        self.trimmed = [0] * B
        self.stats = [RowStats() for _ in range(B)]
        self.alpha = AcceptanceEstimator(B)
        self.sources = [None] * B

    def room(self, b: int) -> int:
        """The most drafts row b's caches can take in one step (K + 1 entries): the target
        holds prompt - 1 + generated entries of a row (less what :meth:`trim_finished` dropped),
        the draft never more."""
        return self.cache_len - len(self.prompts[b]) - len(self.generated[b]) + self.trimmed[b]

    def active_room(self) -> int:
        """:meth:`room` of the tightest active row (finished rows are made to fit instead)."""
        return min((self.room(b) for b in range(len(self.prompts)) if self.active[b]), default=0)

    def trim_finished(self, width: int) -> List[int]:
        """Entries to drop from each row so that every FINISHED row (it still runs in the batch,
        its output is final) can take a step of ``width`` entries: a row at the cache's end
        (e.g. at the model's position limit) would otherwise overflow it. 0 for active rows."""
        counts = [0 if self.active[b] else max(0, width - 1 - self.room(b)) for b in range(len(self.prompts))]
        self.trimmed = [t + c for t, c in zip(self.trimmed, counts)]
        return counts

    def choose_ks(self, sources: Optional[List[Optional[str]]] = None) -> List[int]:
        """Each row's K for this step (0 for a finished row), from :class:`PerRowK`: a row at
        T > 0 (exact mode) its own policy's choice from its own acceptance estimate, a greedy
        / coupled row the step's K (the shared choice, or a larger own-row choice). Every
        choice is capped first so that the row does not draft past its token budget (a
        step emits at most K + 1 tokens) and so that every active row can take the step's
        max K + 1 entries (:meth:`active_room`; finished rows are trimmed to fit,
        :meth:`trim_finished`).

        ``sources`` [B]: where each row's drafts come from this step (see
        :class:`.adaptive_k.AcceptanceEstimator`; None: one estimate per row, and every row
        pays the draft cost): each row's choice reads that source's estimate, and only rows
        of :data:`.adaptive_k.MODEL_SOURCE` pay draft-model steps. :meth:`apply` credits the
        step's outcome to the same sources."""
        B = len(self.prompts)
        self.sources = list(sources) if sources is not None else [None] * B
        room = self.active_room()
        caps = {b: max(0, min(self.max_new_tokens - len(self.generated[b]) - 1, room))
                for b in range(B) if self.active[b]}
        model_rows = None if sources is None else frozenset(b for b in caps if sources[b] == MODEL_SOURCE)
        chosen = self.policy.choose({b: self.alpha.alpha(b, self.sources[b]) for b in caps}, self.costs, caps,
                                    model_rows)
        return [chosen.get(b, 0) for b in range(B)]

    def apply(self, commits: List[Optional[RowCommit]], k: int) -> None:
        """Record the step's commits (rows of None are finished rows); ``k``: the step's K
        (the largest row K), each row's stats count the drafts it tested."""
        for b, c in enumerate(commits):
            if c is None:
                continue
            self.generated[b].extend(c.emitted)
            if self.ngram is not None:
                self.ngram[b].extend(c.emitted)
            if self.draft_model:
                self.pending[b] = c.draft_pending
            self.active[b] = not c.done
            self.stats[b].record(c.tested, c.accepted, len(c.emitted))
            self.alpha.update(b, c.tested, c.accepted, self.sources[b])
        self.step += 1
        self.draft_steps += k

    def last_tokens(self) -> List[int]:
        """Each row's last committed token (the prompt's last one before it emits)."""
        return [g[-1] if g else p[-1] for g, p in zip(self.generated, self.prompts)]

    def next_positions(self) -> List[int]:
        """Each row's absolute position of the next token it emits (its prompt, unpadded,
        plus what it generated): the key of coupled sampling (:mod:`.rng_keys`)."""
        return [len(p) + len(g) for p, g in zip(self.prompts, self.generated)]

    def tokens_done(self) -> int:
        return sum(len(g) for g in self.generated)

    def output(self, t_start: float) -> GenerationOutput:
        B, T = self.ids.shape
        G = max((len(g) for g in self.generated), default=0)
        seq = torch.full((B, T + G), self.pad, dtype=torch.int64)
        seq[:, :T] = self.ids
        for b, g in enumerate(self.generated):
            if g:
                seq[b, T:T + len(g)] = torch.tensor(g, dtype=torch.int64)
        return GenerationOutput(seq, self.generated, self.stats, time.perf_counter() - t_start, self.phase,
                                self.step, self.draft_steps)
