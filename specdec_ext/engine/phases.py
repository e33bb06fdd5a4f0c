"""The phases of one engine step, each a short function over the models and the ops.

Vocabulary (as in :mod:`specdec_ext.engine.commit`): a row's *pending* tokens are committed
tokens the draft has not processed yet; *last* is the last committed token, which the
target has not processed yet. Shapes: B rows, K drafts this step, V vocabulary.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ..errors import ModelOutputError
from ..models.base import SpecModel
from ..ops.sampling import sample, verify
from .inputs import SamplingArgs
from .rng_keys import StepKeys

__all__ = ["catch_up", "check_rows", "draft_phase", "drop_entries", "ngram_drafts", "override_drafts", "padded_ids",
           "prefill", "score_phase", "verify_phase"]

ToDevice = Callable[[torch.Tensor], torch.Tensor]


def padded_ids(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Right-padded (with 0) int64 [B, max row length] on the CPU."""
    out = torch.zeros(len(rows), max((len(r) for r in rows), default=0), dtype=torch.int64)
    for b, r in enumerate(rows):
        if r:
            out[b, :len(r)] = torch.tensor(list(r), dtype=torch.int64)
    return out


def drop_entries(model: SpecModel, counts: Sequence[int]) -> None:
    """Drop the newest ``counts[b]`` cache entries of each row b (one rollback call)."""
    n = max(counts, default=0)
    if n > 0:
        model.rollback(n, torch.tensor([n - c for c in counts], dtype=torch.int64))


def prefill(model: SpecModel, prompts: Sequence[Sequence[int]], to_device: ToDevice) -> None:
    """Feed each prompt minus its last token (right-padded; the pads are dropped again)."""
    heads = [p[:-1] for p in prompts]
    width = max(len(h) for h in heads)
    if width > 0:
        model.forward(to_device(padded_ids(heads)))
        drop_entries(model, [width - len(h) for h in heads])


def catch_up(model: SpecModel, pending: Sequence[Sequence[int]], chunk: int, to_device: ToDevice) -> torch.Tensor:
    """Feed each row's pending tokens (right-padded, the pads dropped again) in forwards of
    at most ``chunk`` columns, so that a row never holds more than its caught-up length +
    ``chunk`` entries, however many tokens another row has pending (they pile up while
    every row has K = 0). The engine uses chunk = k_max: a finished row holds at most its
    text, and the caches have k_max positions of slack past it. Returns the logits [B, V]
    at each row's last pending token (one forward in the usual case, where no row has more
    than ``chunk`` pending)."""
    counts = [len(p) for p in pending]
    out = None
    for start in range(0, max(counts), chunk):
        part = [p[start:start + chunk] for p in pending]
        logits = model.forward(to_device(padded_ids(part)))  # [B, width <= chunk, V]
        drop_entries(model, [logits.shape[1] - len(p) for p in part])
        ends = [b for b, c in enumerate(counts) if start < c <= start + chunk]  # last pending token is here
        rows = to_device(torch.tensor(ends, dtype=torch.int64))
        cols = to_device(torch.tensor([counts[b] - 1 - start for b in ends], dtype=torch.int64))
        if out is None and len(ends) == len(counts):
            return logits[rows, cols]
        out = logits.new_empty(len(counts), logits.shape[-1]) if out is None else out
        out[rows] = logits[rows, cols]
    return out


def draft_phase(draft: SpecModel, pending: Sequence[Sequence[int]], k: int, sampling: SamplingArgs,
                keys: StepKeys, step: int, positions: Optional[torch.Tensor], want_probs: bool,
                to_device: ToDevice) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """K draft tokens per row: the draft catches up on its pending tokens, then samples K
    tokens (K - 1 more single-token forwards), each with :func:`sample` (the run's
    temperature, filters and seed; offsets from ``keys``, ``positions`` [B] int64 in coupled
    mode) writing the filtered draft law in place (no host sync).

    Returns draft_ids int64 [B, K] on the device (-1 where the draft's logits were unusable)
    and, when ``want_probs``, draft_probs float32 [B, K, V] (else None: greedy rows only,
    or coupled mode, which does not read q).
    """
    B, dev = len(pending), sampling.temperature.device
    draft_ids = torch.empty(B, k, dtype=torch.int64, device=dev)
    if k == 0:
        return draft_ids, None
    logits = catch_up(draft, pending, keys.k_max, to_device)
    probs = torch.empty(B, k, logits.shape[-1], dtype=torch.float32, device=dev) if want_probs else None
    for i in range(k):
        offset = keys.draft(step, i, positions)
        draft_ids[:, i] = sample(logits, sampling.temperature, **sampling.kwargs(), offset=offset,
                                 probs_out=None if probs is None else probs[:, i])
        if i + 1 < k:  # an invalid row (-1) feeds token 0 on; verify marks the row invalid anyway
            logits = draft.forward(draft_ids[:, i:i + 1].clamp(min=0))[:, 0]
    return draft_ids, probs


def ngram_drafts(proposals: Sequence[Sequence[int]], k: int, to_device: ToDevice) -> torch.Tensor:
    """Host proposals -> draft_ids int64 [B, K] on the device. A row with fewer than K
    proposed tokens repeats its last one (any token is a valid deterministic draft: at worst
    it is rejected), a row with none gets token 0."""
    rows = [list(p[:k]) + [p[-1] if p else 0] * (k - len(p[:k])) for p in proposals]
    return to_device(torch.tensor(rows, dtype=torch.int64).view(len(rows), k))


def override_drafts(draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor], proposals: Sequence[Sequence[int]],
                    rows: Sequence[int], to_device: ToDevice) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Replace the model's drafts of ``rows`` by their n-gram proposals (q one-hot there)."""
    if not rows:
        return draft_ids, draft_probs
    k = draft_ids.shape[1]
    sel = to_device(torch.tensor(list(rows), dtype=torch.int64))
    draft_ids = draft_ids.index_copy(0, sel, ngram_drafts([proposals[b] for b in rows], k, to_device))
    if draft_probs is not None:
        onehot = torch.zeros(len(rows), k, draft_probs.shape[-1], dtype=draft_probs.dtype, device=draft_probs.device)
        onehot.scatter_(2, draft_ids.index_select(0, sel).unsqueeze(-1), 1.0)
        draft_probs = draft_probs.index_copy(0, sel, onehot)
    return draft_ids, draft_probs


def score_phase(target: SpecModel, last: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """Target logits [B, K+1, V] over [last, d_1..d_K] (one forward)."""
    return target.forward(torch.cat([last.view(-1, 1), draft_ids.clamp(min=0)], dim=1))


def verify_phase(target_logits: torch.Tensor, draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor],
                 sampling: SamplingArgs, offset, num_drafts: Optional[torch.Tensor], mode: str,
                 shard=None) -> torch.Tensor:
    """:func:`verify` (the run's temperature, filters and seed; ``offset`` an int or int64
    [B]; ``num_drafts`` int64 [B] on the device, None = K for every row; ``mode`` "exact" |
    "coupled" | "block"), packed for the step's one device-to-host copy: int64 [B, K+4] = tokens
    [K+1], num_accepted, valid, draft_ok (the draft gave every row a usable token).
    ``shard`` (the target's :class:`~specdec_ext.distributed.VocabShard`): target_logits
    [B, K+1, shard.size] hold this rank's vocabulary shard and draft_probs the whole
    vocabulary; :func:`specdec_ext.distributed.verify` runs instead."""
    if shard is None:
        res = verify(target_logits, draft_ids, draft_probs, sampling.temperature, **sampling.kwargs(),
                     offset=offset, num_drafts=num_drafts, mode=mode)
    else:
        from .. import distributed

        local_probs = None if draft_probs is None else draft_probs[..., shard.start:shard.end]
        res = distributed.verify(target_logits, draft_ids, local_probs, sampling.temperature, **sampling.kwargs(),
                                 offset=offset, num_drafts=num_drafts, mode=mode, vocab_start=shard.start,
                                 vocab_size=shard.vocab_size, group=shard.group)
    draft_ok = (draft_ids >= 0).all(dim=1) if draft_ids.shape[1] else torch.ones_like(res.valid)
    return torch.cat([res.tokens, res.num_accepted.view(-1, 1), res.valid.view(-1, 1).long(),
                      draft_ok.view(-1, 1).long()], dim=1)


def shared_seed(group) -> int:
    """A run seed drawn by rank 0 of ``group`` (torch's default CPU generator) and broadcast,
    so that every rank of a vocabulary-parallel target draws the same numbers."""
    import torch.distributed as dist

    t = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    dist.broadcast(t, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    return int(t[0])


def check_rows(rows: List[List[int]], k: int, active: Sequence[bool], step: int) -> None:
    """Raise :class:`ModelOutputError` for an active row that verify flagged invalid, naming
    the model whose logits were unusable (NaN / +inf, or all -inf) and the step."""
    for b, row in enumerate(rows):
        if active[b] and not row[k + 2]:
            who = "target" if row[k + 3] else "draft"
            raise ModelOutputError(f"the {who} model produced unusable logits (NaN / +inf, or every token "
                                   f"-inf) for row {b} at step {step}; generation stopped")
