"""Random draft trees, for the verify_tree tests.

A "table model" gives the target's (and the draft's) logits after every prefix of up to
``depth`` tokens, so the target's joint law of the next n tokens has a closed form:
P(t1, ..., tn) = p'(t1 | ()) p'(t2 | t1) ... (joint_law; first_tokens counts the emitted
ones). A BigramModel's logits depend on the last token only, so its vocabulary can span
several 128-token tiles. A tree of shape ``branching`` (children per node at each depth, BFS
numbering) is drawn per row: children i.i.d. from the draft's law q (sampled mode,
``draft_probs`` passed) or the draft's top candidates (deterministic mode)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from stats_reference import filtered_softmax64, tiled_logits


def bfs_parents(branching: Sequence[int]) -> list:
    """parents [N] of the tree with branching[d] children per node at depth d (BFS order)."""
    parents, level = [-1], [0]
    for width in branching:
        nxt = []
        for node in level:
            for _ in range(width):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def chain_parents(k: int) -> list:
    """The chain-shaped tree of k drafts: [-1, 0, 1, ..., k-1]."""
    return [-1] + list(range(k))


def node_paths(parents: Sequence[int]) -> list:
    """For each node, the node indices from the root's first child down to it."""
    paths = [[]]
    for n in range(1, len(parents)):
        paths.append(paths[parents[n]] + [n])
    return paths


@dataclass
class TableModel:
    """Logits after every prefix of <= depth tokens: row index of a prefix x1..xd is
    sum over i of (x_i + 1) * V^(d - i) (0 for the empty prefix)."""

    logits: torch.Tensor  # [rows, V] float32
    V: int

    def index(self, prefix: np.ndarray) -> np.ndarray:
        """prefix [..., d] int -> row index [...]."""
        idx = np.zeros(prefix.shape[:-1], dtype=np.int64)
        for i in range(prefix.shape[-1]):
            idx = idx * (self.V + 1) + prefix[..., i] + 1
        return idx

    def law(self, prefix: np.ndarray, T: float, **filt) -> np.ndarray:
        """p'(. | prefix) [..., V] float64 (filtered, temperature T)."""
        # each distinct row once: a batch of trees revisits the same few rows
        rows, inverse = np.unique(self.index(prefix).reshape(-1), return_inverse=True)
        law = filtered_softmax64(self.logits[torch.from_numpy(rows)], T, **filt)
        return law[inverse.reshape(-1)].reshape(*prefix.shape[:-1], self.V)


def _table_rows(V: int, depth: int) -> int:
    return (V + 1) ** (depth + 1)


def table(V: int, depth: int, scale: float, seed: int) -> TableModel:
    g = torch.Generator().manual_seed(seed)
    return TableModel(torch.randn(_table_rows(V, depth), V, generator=g) * scale, V)


@dataclass
class TreeBatch:
    logits: torch.Tensor               # [B, N, V] float32: the target after each node
    ids: torch.Tensor                  # [B, N] int64 (node 0: 0, not read)
    parents: torch.Tensor              # [N] int64
    draft_probs: Optional[torch.Tensor]  # [B, N, V] float32 (sampled mode) or None
    draft_law: torch.Tensor            # [B, N, V] float32: the draft's law at each node (both modes)


def draw_trees(target: TableModel, draft: TableModel, branching: Sequence[int], B: int, T_draft: float,
               sampled: bool, seed: int, candidates: Optional[Sequence[Sequence[int]]] = None) -> TreeBatch:
    """B random trees. sampled: children i.i.d. from the draft's law at their parent (temperature
    T_draft), draft_probs = that law. Else deterministic children: ``candidates[d]`` (token ids per
    child slot at depth d; repeats allowed) or the draft's top tokens."""
    parents = bfs_parents(branching)
    N, V = len(parents), target.V
    paths = node_paths(parents)
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, N), dtype=np.int64)
    q = np.zeros((B, N, V), dtype=np.float64)
    slot = [0] * N  # which child of its parent a node is
    for n in range(1, N):
        slot[n] = sum(1 for m in range(1, n) if parents[m] == parents[n])
    for n in range(N):  # nodes in BFS order: a node's prefix is known before its children
        prefix = ids[:, [m for m in paths[n]]]
        q[:, n] = draft.law(prefix, T_draft)
        for c in (c for c in range(n + 1, N) if parents[c] == n):
            if sampled:
                u = rng.random(B)[:, None]
                ids[:, c] = np.minimum((np.cumsum(q[:, n], axis=1) < u).sum(1), V - 1)
            elif candidates is not None:
                ids[:, c] = candidates[len(paths[c]) - 1][slot[c]]
            else:
                ids[:, c] = np.argsort(-q[:, n], axis=1, kind="stable")[:, slot[c]]
    logits = torch.stack([target.logits[torch.from_numpy(target.index(ids[:, paths[n]]))] for n in range(N)], 1)
    law = torch.from_numpy(q).float()
    return TreeBatch(logits.float(), torch.from_numpy(ids), torch.tensor(parents), law if sampled else None, law)


def _prefix_laws(target: TableModel, T: float, d: int, **filt) -> np.ndarray:
    """p'(. | x1..xd) [V^d, V] for every prefix of d tokens (row: the prefix raveled, x1 major)."""
    V = target.V
    prefixes = np.stack(np.unravel_index(np.arange(V ** d), (V,) * d), -1) if d else np.zeros((1, 0), np.int64)
    return target.law(prefixes.astype(np.int64), T, **filt)


def first_tokens(tokens: torch.Tensor, num_accepted: torch.Tensor, target: TableModel, T: float, seed: int,
                 n: int = 2, **filt) -> np.ndarray:
    """Counts [V] * n of the first ``n`` emitted tokens (tokens [B, >= n], num_accepted [B]);
    where a row emitted fewer (num_accepted + 1 < n), the rest are drawn from the target's law
    after the tokens so far (exactly, float64), completing the sequence. n = 3 on a depth-2
    tree reaches the bonus token after two accepted drafts."""
    V = target.V
    t = tokens.cpu().numpy()[:, :n].copy()
    emitted = num_accepted.cpu().numpy() + 1
    rng = np.random.default_rng(seed)
    for j in range(1, n):
        short = emitted <= j
        if short.any():
            law = _prefix_laws(target, T, j, **filt)[np.ravel_multi_index(t[short, :j].T, (V,) * j)]
            u = rng.random(short.sum())[:, None]
            t[short, j] = np.minimum((np.cumsum(law, axis=1) < u).sum(1), V - 1)
    assert (t >= 0).all()
    return np.bincount(np.ravel_multi_index(t.T, (V,) * n), minlength=V ** n).reshape((V,) * n)


def first_two(tokens: torch.Tensor, num_accepted: torch.Tensor, target: TableModel, T: float, seed: int,
              **filt) -> np.ndarray:
    """Counts [V, V] of the first two emitted tokens (first_tokens with n = 2)."""
    return first_tokens(tokens, num_accepted, target, T, seed, 2, **filt)


def joint_law(target: TableModel, T: float, n: int = 2, **filt) -> np.ndarray:
    """The target's P(t1, ..., tn) [V] * n: the chain rule over the table's rows."""
    V = target.V
    joint = np.ones(1)
    for d in range(n):
        joint = (joint[:, None] * _prefix_laws(target, T, d, **filt)).reshape(-1)
    return joint.reshape((V,) * n)


@dataclass
class BigramModel(TableModel):
    """A table model whose logits after a prefix depend on its last token only (row
    last + 1; row 0 the empty prefix): [V + 1, V] logits, so V can span several 128-token
    tiles (a full table at V = 1000 and depth 2 would hold 10^9 rows)."""

    def index(self, prefix: np.ndarray) -> np.ndarray:
        if prefix.shape[-1] == 0:
            return np.zeros(prefix.shape[:-1], dtype=np.int64)
        return prefix[..., -1] + 1


def tiled_bigram(V: int, seed: int) -> BigramModel:
    """A BigramModel with stats_reference.tiled_logits rows: after every token the likely next
    tokens are spread over every tile (the same token set, each row its own logits)."""
    return BigramModel(tiled_logits(V + 1, V, seed), V)
