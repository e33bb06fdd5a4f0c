"""Tree speculation: the tree's shape and the phases of a tree step.

A tree of branching ``(b_1, .., b_D)``: every node at depth l - 1 has b_l children. Nodes
are numbered in BFS order (level by level, a parent's children consecutive), node 0 being
the row's last committed token, so ``parents[0] = -1`` and a parent precedes its children.
A step may use the first d <= D levels (:func:`choose_depth`); that tree is a prefix of the
full one (N_d nodes).

One step (B rows; each phase a function below):

1. draft (:func:`draft_tree`): the draft catches up on its pending tokens (its logits at
   the root), then level by level draws the children of every node of the level above --
   ``sampled``: b_l i.i.d. draws from q with :func:`specdec_ext.sample` (q written to
   ``draft_probs``), ``topk``: the b_l most likely tokens (deterministic candidates; also
   every greedy row) -- and feeds the new level in ONE ``forward_tree`` (levels 1..d-1: the
   leaves are never fed, as d_K in a chain);
2. score: the target's ``forward_tree`` over all N_d nodes (the root is its first new token);
3. verify (:func:`verify_tree_phase`): :func:`specdec_ext.verify_tree` -> tokens, path,
   num_accepted, valid, packed for the step's one device-to-host copy;
4. compact (:func:`compact_caches`): each model moves the accepted path's entries to the
   front of the step's entries; committing and rolling back then follow the chain rules
   (:mod:`.commit`) with K = d.

Cache slots of a row: the target holds L tokens before the step and node n goes to L + n;
the draft's last caught-up token is the root, at L' - 1, and node n goes to L' - 1 + n.

Randomness (:mod:`.rng_keys`): the run's keys are ``StepKeys(k_max = N_D - 1)``, the draw of
node n >= 1 at step s uses draft offset ``s * N_D + n - 1`` (one offset per node, so
siblings are independent whatever the seed kind) and verify uses offset s.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .._validate import check_int
from ..cache import TreeNodes
from ..models.base import SpecModel
from ..ops.sampling import sample
from ..ops.tree import TreeVerifyResult, verify_tree
from .commit import commit_step
from .inputs import SamplingArgs
from .phases import ToDevice, catch_up
from .rng_keys import StepKeys

__all__ = ["TREE_MODES", "TreeShape", "batch_text_trees", "choose_depth", "commit_text_trees", "compact_caches",
           "draft_entries", "draft_tree", "score_text_tree", "verify_tree_phase"]

#: how the draft picks a node's children: i.i.d. draws from q (exact multi-draft sampling), or its top-b
TREE_MODES = ("sampled", "topk")


class TreeShape:
    """A tree of branching ``(b_1, .., b_D)`` (ints >= 1) in BFS order.

    Attributes: ``branching``; ``depth`` D; ``level_sizes`` [1, b_1, b_1 b_2, ..] (D + 1
    entries); ``firsts``: the index of each level's first node; ``parents``: the host list
    of N_D entries.
    """

    def __init__(self, branching: Sequence[int]) -> None:
        if isinstance(branching, (str, bytes)) or not isinstance(branching, Sequence) or not branching:
            raise ValueError(f"tree must be a non-empty sequence of branching factors (children per node at each "
                             f"depth, e.g. (4, 2, 2)), got {branching!r}")
        self.branching = tuple(check_int(f"tree[{i}]", b, 1) for i, b in enumerate(branching))
        self.depth = len(self.branching)
        self.level_sizes = [1]
        for b in self.branching:
            self.level_sizes.append(self.level_sizes[-1] * b)
        self.firsts = [sum(self.level_sizes[:level]) for level in range(self.depth + 1)]
        self.parents = [-1]
        for level, b in enumerate(self.branching):
            self.parents += [self.firsts[level] + m for m in range(self.level_sizes[level]) for _ in range(b)]
        self._on_device: Dict[Tuple[int, torch.device], torch.Tensor] = {}

    def num_nodes(self, depth: Optional[int] = None) -> int:
        """N_d: nodes of the tree's first ``depth`` levels (default D) and the root."""
        d = self.depth if depth is None else depth
        return self.firsts[d] + self.level_sizes[d]

    def parents_on(self, depth: int, device: torch.device) -> torch.Tensor:
        """int64 [N_depth] on ``device`` (built once per depth and device)."""
        key = (depth, torch.device(device))
        if key not in self._on_device:
            self._on_device[key] = torch.tensor(self.parents[:self.num_nodes(depth)], dtype=torch.int64,
                                                device=device)
        return self._on_device[key]

    def __repr__(self) -> str:
        return f"TreeShape({self.branching}, nodes={self.num_nodes()})"


def choose_depth(shape: TreeShape, run) -> int:
    """The step's depth d <= D: no deeper than any active row's token budget needs (a step
    emits at most d + 1 tokens) and shallow enough that every active row can take the step's
    N_d entries (the chain's K caps of :meth:`Run.choose_ks`, with N_d - 1 in place of K;
    finished rows are trimmed to fit, :meth:`Run.trim_finished`)."""
    room = run.active_room()
    budget = max(run.max_new_tokens - len(g) - 1 for g, a in zip(run.generated, run.active) if a)
    d = max(0, min(shape.depth, budget))
    while d > 0 and shape.num_nodes(d) - 1 > room:
        d -= 1
    return d


def _children(logits: torch.Tensor, b: int, sampled: bool, sampling: SamplingArgs, offsets: torch.Tensor,
              q_out: Optional[torch.Tensor]) -> torch.Tensor:
    """The b children of each of M nodes: int64 [B, M, b] (-1 where a draw failed).

    logits  : Tensor [B, M, V], the draft's prediction after each node
    offsets : int64 [M, b] on the device, the draft offset of each child's draw
    q_out   : float32 [B * M, V] written with each node's law q (sampled mode), or None
    Greedy rows take the top-b (i.i.d. draws from a one-hot law would all be the argmax).
    """
    B, M, V = logits.shape
    top = logits.topk(b, dim=-1).indices
    if not sampled:
        return top
    flat = logits.reshape(B * M, V)

    def per_node(x):  # a per-row [B] value -> [B * M] (row b's value for each of its M nodes)
        return x.repeat_interleave(M) if isinstance(x, torch.Tensor) and x.dim() == 1 else x

    temperature, seed = per_node(sampling.temperature), per_node(sampling.seed)
    filters = {name: per_node(value) for name, value in sampling.filters.items()}  # q: the filtered draft law
    draws = [sample(flat, temperature, **filters, seed=seed, offset=offsets[:, c].repeat(B),
                    probs_out=q_out if c == 0 else None) for c in range(b)]
    return torch.where((sampling.temperature == 0).view(B, 1, 1), top, torch.stack(draws, dim=-1).view(B, M, b))


def draft_tree(draft: SpecModel, pending: Sequence[Sequence[int]], shape: TreeShape, depth: int,
               last: torch.Tensor, sampling: SamplingArgs, keys: StepKeys, step: int, sampled: bool,
               want_probs: bool, to_device: ToDevice) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The step's tree, drafted level by level (one draft forward per level, see the module
    docstring), depth >= 1.

    last    : int64 [B] on the device, each row's last committed token (the root)
    Returns tree_ids int64 [B, N_depth] on the device (node 0 = ``last``; -1 where the
    draft's logits were unusable) and, when ``want_probs`` (sampled mode, some row at T > 0),
    draft_probs float32 [B, N_depth, V] (row n: the law node n's children were drawn from;
    zero for the leaves), else None.
    """
    B, dev = len(pending), last.device
    N = shape.num_nodes(depth)
    parents = shape.parents_on(depth, dev)
    ids = torch.empty(B, N, dtype=torch.int64, device=dev)
    ids[:, 0] = last
    logits = catch_up(draft, pending, keys.k_max, to_device).unsqueeze(1)  # [B, 1, V]: after the root
    probs = torch.zeros(B, N, logits.shape[-1], dtype=torch.float32, device=dev) if want_probs else None
    for level in range(1, depth + 1):
        M, b = shape.level_sizes[level - 1], shape.branching[level - 1]
        first, above = shape.firsts[level], shape.firsts[level - 1]
        nodes = first + torch.arange(M * b, device=dev, dtype=torch.int64).view(M, b)
        q = torch.empty(B * M, logits.shape[-1], dtype=torch.float32, device=dev) if probs is not None else None
        kids = _children(logits, b, sampled, sampling, keys.draft(step, nodes - 1), q)
        if q is not None:
            probs[:, above:above + M] = q.view(B, M, -1)
        ids[:, first:first + M * b] = kids.reshape(B, M * b)
        if level < depth:  # an unusable draw (-1) feeds token 0 on; verify marks the row invalid anyway
            logits = draft.forward_tree(ids[:, first:first + M * b].clamp(min=0), TreeNodes(parents, first))
    return ids, probs


def verify_tree_phase(target_logits: torch.Tensor, tree_ids: torch.Tensor, parents: torch.Tensor,
                      draft_probs: Optional[torch.Tensor], sampling: SamplingArgs, offset: int,
                      depth: int) -> Tuple[TreeVerifyResult, torch.Tensor]:
    """:func:`specdec_ext.verify_tree` with the run's temperature, filters and seed (``depth``
    given: no host sync). Returns its :class:`~specdec_ext.TreeVerifyResult` and the row
    summary packed for the step's one device-to-host copy: int64 [B, 2 d + 5] = tokens
    [d+1], num_accepted, valid, draft_ok (every node got a usable draft token), path [d+1]
    -- the chain layout of :func:`.phases.verify_phase` with K = d, then the path."""
    res = verify_tree(target_logits, tree_ids, parents, draft_probs, sampling.temperature, **sampling.kwargs(),
                      offset=offset, depth=depth)
    tokens, path, num_accepted, valid = res
    draft_ok = (tree_ids >= 0).all(dim=1)
    packed = torch.cat([tokens, num_accepted.view(-1, 1), valid.view(-1, 1).long(), draft_ok.view(-1, 1).long(),
                        path], dim=1)
    return res, packed


def compact_caches(target: SpecModel, draft: Optional[SpecModel], result: TreeVerifyResult,
                   shape: TreeShape, depth: int) -> None:
    """Move the accepted path's entries to the front of the step's, on the device.

    target: of its N_d new entries (node n at entry n), entries 0..num_accepted take the
    path's nodes (the root, then the accepted nodes). draft (None when it did not run): of
    its N_(d-1) tree entries (the root and the nodes of levels 1..d-1), the path's nodes
    below depth d. Invalid rows move nothing (they are rolled back or raise anyway).
    """
    _, path, num_accepted, valid = result
    count = torch.where(valid, num_accepted + 1, 0)
    target.compact(shape.num_nodes(depth), path, count)
    if draft is not None and depth >= 2:  # at depth 1 the draft holds the root alone
        draft.compact(shape.num_nodes(depth - 1), path[:, :depth], count.clamp(max=depth))


def draft_entries(shape: TreeShape, depth: int, pending: List[int]) -> List[int]:
    """Entries the draft appended this step per row: its pending tokens, then the nodes of
    levels 1..d-1 (0 at depth 0: the draft did not run)."""
    return [n + shape.num_nodes(depth - 1) - 1 if depth > 0 else 0 for n in pending]


def batch_text_trees(trees: Sequence[Sequence[Sequence[int]]], last: Sequence[int]):
    """Per-row trees of deterministic candidates (``trees[b]`` = (tokens, parents, ...): parent
    -1 = after the row's last token, else an earlier node's index) -> (tree_ids int64 [B, N],
    parents int64 [B, N], the step's depth, each row's depth). Node 0 is the row's last token,
    then its tree's nodes (parent p -> p + 1); a row with fewer nodes is padded with children
    of the root repeating its first candidate (a repeated deterministic candidate is never
    accepted twice: verify_tree zeroes it after a rejection). A row without a tree is padded
    with token 0 and has depth 0: :func:`commit_text_trees` keeps its first token alone."""
    N = 1 + max((len(t[0]) for t in trees), default=0)
    ids, par, depths = [], [], []
    for b, tree in enumerate(trees):
        tokens, parents = tree[0], tree[1]
        d = [0] * (len(tokens) + 1)
        for i, p in enumerate(parents):
            d[i + 1] = d[p + 1] + 1
        pad = N - 1 - len(tokens)
        depths.append(max(d))
        ids.append([last[b]] + list(tokens) + [tokens[0] if tokens else 0] * pad)
        par.append([-1] + [p + 1 for p in parents] + [0] * pad)
    return (torch.tensor(ids, dtype=torch.int64), torch.tensor(par, dtype=torch.int64),
            max(depths, default=0), depths)


def commit_text_trees(run, rows: List[List[int]], depth: int, depths: Sequence[int]):
    """:func:`.commit.commit_step` for a step of :func:`batch_text_trees` (no draft model):
    row b tested ``depths[b]`` drafts (its tree's depth). A row without a tree (depth 0) may
    still have its padding accepted: its ``num_accepted`` in ``rows`` is set to 0, so that it
    emits its first token alone. That stays exact: the first token's law is the target's
    whether or not a candidate was accepted, and the cut was decided before verification.
    Returns the rows' commits (None for a finished row)."""
    for b, row in enumerate(rows):
        if depths[b] == 0:
            row[depth + 1] = 0
    B = len(rows)
    return commit_step(rows, depth, run.active, run.pending, [len(g) for g in run.generated], run.max_new_tokens,
                       run.eos, ["idle"] * B, list(depths))


def score_text_tree(engine, run, ids: torch.Tensor, parents: torch.Tensor, depth: int, timer):
    """The target's part of a step over trees of deterministic candidates
    (:func:`batch_text_trees`' ids and parents, host int64 [B, N]): finished rows trimmed to
    take N entries, every node scored in one ``forward_tree`` (timed as the target phase),
    :func:`verify_tree_phase` without q (the verify phase). Returns (its TreeVerifyResult,
    the packed rows, N)."""
    N = ids.shape[1]
    engine._trim_finished(run, N)
    ids, parents = engine._to_device(ids), engine._to_device(parents)
    timer.mark()
    logits = engine.target.forward_tree(ids, TreeNodes(parents))
    timer.mark()
    result, packed = verify_tree_phase(logits, ids, parents, None, run.sampling, run.keys.verify(run.step), depth)
    timer.mark()
    return result, packed, N
