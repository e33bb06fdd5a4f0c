"""Committing a verified step, as a pure host function on plain lists (no tensors).

For each active row, given verify's result (``num_accepted`` n and the tokens), decide what
the row emits (cut at EOS and at ``max_new_tokens``), whether it is done, and how many of
this step's cache entries each model keeps. K is the step's draft count (every row is fed
K drafts); row b tests only its own ``num_drafts[b]`` <= K of them (per-row K), which bounds
n but does not change what the caches were fed:

- target: the step fed [last, d_1..d_K] (K+1 entries); a row that emits m tokens keeps
  [last, d_1..d_(m-1)], i.e. m entries (the last emitted token has no KV yet and is fed
  next step);
- draft: the step fed the row's pending tokens then d_1..d_(K-1) (it never processes d_K);
  it keeps its pending tokens plus the drafts that are now committed and processed,
  ``min(m - 1, K - 1)``; the emitted tokens after those become its new pending tokens (one,
  or two after a fully accepted step). With K = 0, or an n-gram step, the draft model ran
  nothing and the emitted tokens join its pending list; when n-gram drafts replaced its own
  for a row, it keeps only its pending tokens and every emitted token becomes pending.
A finished row keeps nothing of a step (it runs in the batch until all rows are done).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, List, Optional, Sequence

__all__ = ["RowCommit", "commit_row", "commit_step"]


@dataclass(frozen=True)
class RowCommit:
    """One row's share of a step."""

    emitted: List[int]        # tokens the row emits this step (after the EOS / budget cut)
    accepted: int             # drafts verify accepted (n, before any cut)
    tested: int               # drafts verify tested for the row (its num_drafts, <= the step's K)
    kept_target: int          # of the K+1 entries the target appended this step
    kept_draft: int           # of the len(pending) + K - 1 entries the draft appended (K > 0)
    draft_pending: List[int]  # tokens the draft has not processed yet, after this step
    done: bool                # EOS emitted or max_new_tokens reached


def commit_row(tokens: Sequence[int], num_accepted: int, k: int, draft_pending: Sequence[int],
               num_generated: int, max_new_tokens: int, eos: AbstractSet[int],
               draft_model: str = "drafted", num_drafts: Optional[int] = None) -> RowCommit:
    """The commit of one active row. ``tokens`` [K+1] from verify (accepted drafts, then the
    correction / bonus token, then -1); ``k``: the step's K; ``num_drafts``: the drafts
    verify tested for this row (default ``k``); ``num_generated``: tokens the row emitted
    before this step. ``draft_model`` says what the draft model did for the row this step:
    "drafted" (it proposed the drafts), "overridden" (it ran, but n-gram drafts replaced its
    own) or "idle" (it did not run: K = 0 or an n-gram step)."""
    tested = k if num_drafts is None else num_drafts
    if not 0 <= num_accepted <= tested <= k:
        raise ValueError(f"num_accepted ({num_accepted}) must lie in [0, num_drafts ({tested})], "
                         f"and num_drafts in [0, k ({k})]")
    emitted = list(tokens[:num_accepted + 1])[:max(0, max_new_tokens - num_generated)]
    for i, t in enumerate(emitted):
        if t in eos:
            emitted = emitted[:i + 1]
            break
    m = len(emitted)
    if k > 0 and draft_model == "drafted":
        in_draft_cache = min(m - 1, k - 1)
        kept_draft, pending = len(draft_pending) + in_draft_cache, emitted[in_draft_cache:]
    elif k > 0 and draft_model == "overridden":  # it processed its pending tokens, then its own drafts
        kept_draft, pending = len(draft_pending), emitted
    else:
        kept_draft, pending = 0, list(draft_pending) + emitted
    done = num_generated + m >= max_new_tokens or (m > 0 and emitted[-1] in eos)
    return RowCommit(emitted, num_accepted, tested, m, kept_draft, pending, done)


def commit_step(rows: Sequence[Sequence[int]], k: int, active: Sequence[bool],
                draft_pending: Sequence[Sequence[int]], num_generated: Sequence[int], max_new_tokens: int,
                eos: AbstractSet[int], draft_model: Optional[Sequence[str]] = None,
                num_drafts: Optional[Sequence[int]] = None) -> List[Optional[RowCommit]]:
    """:func:`commit_row` for every row; None for a finished (inactive) row.

    rows[b] is the step's host copy of row b: tokens [K+1], then num_accepted.
    draft_model[b] as in :func:`commit_row` (default: "drafted" for every row).
    num_drafts[b]: drafts verify tested for row b (default: K for every row).
    """
    how = draft_model or ["drafted"] * len(rows)
    tested = num_drafts or [k] * len(rows)
    return [commit_row(row[:k + 1], row[k + 1], k, draft_pending[b], num_generated[b], max_new_tokens, eos, how[b],
                       tested[b]) if active[b] else None for b, row in enumerate(rows)]
