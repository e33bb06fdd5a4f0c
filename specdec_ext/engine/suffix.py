"""Suffix drafting (SuffixDecoding, Oliaro et al., NeurIPS 2025): drafts from a suffix index
of the request's own text and a global index of earlier requests' outputs.

Two indexes (native, :mod:`specdec_ext._suffix`, csrc/core/suffix_index.h):

* per request: the row's prompt and generated tokens (dropped when the run ends);
* global (:class:`GlobalSuffixCache`, one per engine, kept across ``generate`` calls): the
  OUTPUTS of the engine's requests (never prompts), each its own sequence, extended token
  by token while its request runs (rows of the same batch see each other's partial
  outputs). Bounded by ``max_cached_requests`` outputs, oldest evicted first (FIFO);
  memory is about max_depth trie nodes (~40 bytes each + a hash entry) per cached token.

A proposal (:meth:`SuffixRow.propose`) matches the row's last 1..max_depth tokens in both
indexes; the draft of the best score (sum of its tokens' continuation probabilities) wins,
ties to the per-request index. Its size is at most min(K, floor(factor * match_length +
offset)); candidates below ``min_prob`` are dropped. A chain shorter than K (its match ran
into the end of the text, as in a loop, or hit the size limit) is continued
(``SuffixConfig.continue_chains``): the same lookup after the text extended by the chain,
with probabilities multiplied by the chain's last one, while that running probability stays
>= ``min_prob``. The drafts stay a function of the text. Over bench e2e's 8 prompts
(greedy, 96 tokens, K = 16) a replay of the target's own text through the per-request index
gives 3.40 tokens per step continued against 2.80 without. Drafts are deterministic given the
text, so verification sees one-hot q (``draft_probs=None``) and stays exact at any
temperature: a chain goes through :func:`specdec_ext.verify` like an n-gram draft, a tree
(``SuffixConfig(tree=True)``) through :func:`specdec_ext.verify_tree` with the tree's
nodes as deterministic candidates (:func:`suffix_tree_step`).

Costs: an update is O(max_depth) per token and index, a proposal O(max_depth^2) hash
lookups plus the draft; the engine's ``phase_s.draft`` holds the proposal time.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from .._validate import check_int
from .phases import check_rows, drop_entries
from .tree import batch_text_trees, commit_text_trees, score_text_tree

__all__ = ["GlobalSuffixCache", "SuffixConfig", "SuffixRow", "suffix_tree_step"]


def _native():
    try:
        from .. import _suffix
    except ImportError as e:  # pragma: no cover - a build without the module
        raise ImportError("drafter='suffix' needs specdec_ext._suffix (built by setup.py with the package); "
                          f"rebuild the package: {e}") from e
    return _suffix


@dataclass(frozen=True)
class SuffixConfig:
    """Settings of suffix drafting.

    max_depth           : int >= 1, the longest pattern matched and indexed (vLLM's default 24)
    factor, offset      : a draft has at most floor(factor * match_length + offset) tokens
                          (and at most the engine's K); factor >= 0
    min_prob            : float in [0, 1], candidates whose probability is below are dropped
    max_cached_requests : int >= 0, outputs kept in the global index (FIFO eviction; 0 = none)
    tree                : propose trees (best-first by probability, verify_tree) instead of chains
    continue_chains     : a chain shorter than K is looked up again after the text plus the chain
                          (module docstring); False = one lookup, as vLLM's suffix method
    """

    max_depth: int = 24
    factor: float = 1.0
    offset: float = 0.0
    min_prob: float = 0.1
    max_cached_requests: int = 256
    tree: bool = False
    continue_chains: bool = True

    def __post_init__(self) -> None:
        check_int("max_depth", self.max_depth, 1)
        check_int("max_cached_requests", self.max_cached_requests, 0)
        for name in ("factor", "offset", "min_prob"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.factor < 0:
            raise ValueError(f"factor must be >= 0, got {self.factor!r}")
        if not 0.0 <= self.min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {self.min_prob!r}")
        for name in ("tree", "continue_chains"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")


class GlobalSuffixCache:
    """The engine's index of earlier outputs: at most ``max_cached_requests`` sequences,
    the oldest evicted first. ``seconds``: time spent updating and querying it and the
    per-request indexes of its rows (the proposal cost)."""

    def __init__(self, config: SuffixConfig) -> None:
        self.config = config
        self.index = _native().SuffixIndex(config.max_depth)
        self._order: deque = deque()
        self._next_id = 0
        self.seconds = 0.0

    def start(self) -> Optional[int]:
        """A new output sequence (its id), evicting the oldest past the bound; None when the
        bound is 0."""
        if self.config.max_cached_requests == 0:
            return None
        while len(self._order) >= self.config.max_cached_requests:
            self.index.remove(self._order.popleft())
        sid, self._next_id = self._next_id, self._next_id + 1
        self.index.add_sequence(sid)
        self._order.append(sid)
        return sid

    def clear(self) -> None:
        """Forget every cached output (the index of a fresh engine)."""
        while self._order:
            self.index.remove(self._order.popleft())

    def __len__(self) -> int:
        return len(self._order)


class SuffixRow:
    """One row's drafter (the interface of :class:`.ngram.NgramIndex`: ``extend``, ``propose``).
    The first ``extend`` is the prompt; later ones are outputs (also appended to the global index)."""

    def __init__(self, cache: GlobalSuffixCache, prompt: Sequence[int]) -> None:
        self.cache, self.config = cache, cache.config
        self.local = _native().SuffixIndex(self.config.max_depth)
        self.local.add_sequence(0)
        self.text: List[int] = []
        self.gid: Optional[int] = None
        self._prompt_done = False
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        t0 = time.perf_counter()
        tokens = [int(t) for t in tokens]
        self.local.append(0, tokens)
        self.text.extend(tokens)
        if self._prompt_done:
            if self.gid is None and tokens:
                self.gid = self.cache.start()
            if self.gid is not None and self.cache.index.has_sequence(self.gid):  # not evicted meanwhile
                self.cache.index.append(self.gid, tokens)
        self._prompt_done = True
        self.cache.seconds += time.perf_counter() - t0

    def propose_tree(self, k: int) -> Tuple[List[int], List[int], List[float]]:
        """The best draft of at most ``k`` nodes: (tokens, parents (-1 = after the row's
        last token), probs); a chain unless the config asks for trees."""
        t0 = time.perf_counter()
        c = self.config
        tail = self.text[-c.max_depth:]  # all a lookup reads of the text
        tokens, parents, probs = self._best(tail, k, c.min_prob) if k > 0 else ([], [], [])
        while c.continue_chains and not c.tree and 0 < len(tokens) < k:
            # the chain is a guess at the text: look up what follows the text extended by it,
            # keeping the running probability (last * the continuation's own) >= min_prob
            last = probs[-1]
            if last <= 0.0 or c.min_prob > last:
                break
            more, _, more_probs = self._best((tail + tokens)[-c.max_depth:], k - len(tokens),
                                             min(1.0, c.min_prob / last))
            if not more:
                break
            parents += list(range(len(tokens) - 1, len(tokens) + len(more) - 1))
            tokens += more
            probs += [last * q for q in more_probs]
        self.cache.seconds += time.perf_counter() - t0
        return tokens, parents, probs

    def _best(self, context: List[int], k: int, min_prob: float) -> Tuple[List[int], List[int], List[float]]:
        """The draft of the best score after ``context`` over both indexes (ties to the
        per-request one): (tokens, parents, probs), empty when neither matches."""
        c, best = self.config, None
        for index in (self.local, self.cache.index):
            d = index.propose(context, k, c.factor, c.offset, min_prob, c.tree)
            if d[0] and (best is None or d[3] > best[3]):
                best = d
        return (list(best[0]), list(best[1]), list(best[2])) if best is not None else ([], [], [])

    def propose(self, k: int) -> List[int]:
        """The chain draft (at most k tokens) for the engine's chain path."""
        return self.propose_tree(k)[0]


def suffix_tree_step(engine, run, sync) -> None:
    """One suffix-tree step (no draft model): every active row proposes a tree of at most
    min(k, its token budget - 1, the caches' room) nodes -> the target scores every node in
    one ``forward_tree`` -> :func:`specdec_ext.verify_tree` with deterministic candidates
    -> the target cache keeps the accepted path (``compact``) -> commit and roll back as a
    chain of K = the step's depth."""
    from .timing import make_timer

    t0 = time.perf_counter()
    timer = make_timer(engine.device)
    B = len(run.prompts)
    room = run.active_room()
    with sync:
        timer.mark()
        trees = [run.ngram[b].propose_tree(max(0, min(engine.k_max, run.max_new_tokens - len(run.generated[b]) - 1,
                                                      room)))
                 if run.active[b] else ([], [], []) for b in range(B)]
        ids, parents, depth, depths = batch_text_trees(trees, run.last_tokens())
        result, packed, N = score_text_tree(engine, run, ids, parents, depth, timer)
        _, path, num_accepted, valid = result
        engine.target.compact(N, path, torch.where(valid, num_accepted + 1, 0))
    rows = packed.cpu().tolist()  # the step's ONE device -> host copy
    check_rows(rows, depth, run.active, run.step)
    commits = commit_text_trees(run, rows, depth, depths)
    drop_entries(engine.target, [N - (c.kept_target if c else 0) for c in commits])
    run.apply(commits, depth)
    run.last = engine._to_device(torch.tensor(run.last_tokens(), dtype=torch.int64))
    engine._account(run, depth, commits, timer.read(), time.perf_counter() - t0, width=N, model_drafted=False)
