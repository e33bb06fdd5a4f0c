"""Tree verification in plain PyTorch: the baseline ``bench`` compares the fused
``specdec_ext.verify_tree`` with, and an oracle for tests.

:func:`verify_tree_torch` implements multi-draft speculative sampling (SpecInfer style)
without filters. Node 0 is the root (the last committed token, ``parents[0] = -1``), every
other node's parent has a smaller index; ``target_logits[b, n]`` is the target's prediction
after node n and ``draft_probs[b, n]`` the draft law node n's children were drawn from.
Walking from the root, at node n with children c_1 < c_2 < ... (index order) and
r = p_n = softmax(logits_n / T):

- with draft_probs (children i.i.d. from q_n): accept c_i with probability
  min(1, r(x_i) / q_n(x_i)); else r <- normalise(max(0, r - q_n)) and try the next child;
- without (deterministic candidates, e.g. the draft's top-k): accept c_i with probability
  r(x_i); else r(x_i) <- 0, renormalise;
- a greedy row (T = 0): p_n is one-hot at the argmax, so the first child whose token is
  the argmax is accepted (the candidate rule, draft_probs ignored), else the argmax is emitted.

An accepted child is moved to; when none is, a token is drawn from r and the walk stops;
at a leaf a bonus token is drawn from p_leaf. Vectorised over rows; the walk loops over
the depth and, at each node, over the largest number of children.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from ..cache.tree_mask import _ancestors, tree_parents

__all__ = ["verify_tree_torch"]


def _temperatures(temperature: Union[float, torch.Tensor], B: int, device) -> torch.Tensor:
    """float32 [B] on ``device``; ValueError for a negative / non-finite host value."""
    t = torch.as_tensor(temperature, dtype=torch.float32)
    if t.device.type == "cpu" and not bool((torch.isfinite(t) & (t >= 0)).all()):
        raise ValueError(f"temperature must be >= 0 and finite, got {t.tolist()}")
    return t.to(device).expand(B).clone() if t.dim() == 0 else t.to(device).view(B)


def _draw(r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from each row of r [B, V] (unnormalised, >= 0) with u [B] in [0, 1):
    the first token whose cumulative mass exceeds u * total, so never a zero-mass token."""
    cdf = r.cumsum(-1)
    x = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return x.clamp(max=r.shape[-1] - 1)


def _renormalised(r: torch.Tensor, new: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """r with ``rows`` replaced by new / sum(new); a row of new with no mass keeps r (exact
    arithmetic never rejects there)."""
    total = new.sum(-1, keepdim=True)
    use = rows.unsqueeze(-1) & (total > 0)
    return torch.where(use, new / total.clamp(min=torch.finfo(new.dtype).tiny), r)


def verify_tree_torch(
    target_logits: torch.Tensor,
    tree_token_ids: torch.Tensor,
    parents: Union[torch.Tensor, Sequence[int]],
    draft_probs: Optional[torch.Tensor] = None,
    temperature: Union[float, torch.Tensor] = 1.0,
    generator: Optional[torch.Generator] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a tree of drafted tokens per row (see the module docstring).

    Parameters
    ----------
    target_logits : Tensor [B, N, V] float (math in float32)
    tree_token_ids : Tensor [B, N] int64 | int32; node 0's entry (the root) is not read
    parents : Tensor [N] or [B, N] integer, or a list (checked on the host)
    draft_probs : Tensor [B, N, V] float, optional: q_n per node (None: deterministic children)
    temperature : float or Tensor [B] float (0 = greedy row)
    generator : torch.Generator on target_logits' device, optional

    Returns
    -------
    tokens       int64 [B, D+1]: accepted tokens, the correction / bonus token, then -1
    path         int64 [B, D+1]: 0 (root), the accepted nodes, then -1
    num_accepted int64 [B]
    valid        bool  [B]: False for a row with a NaN / +inf logit, a node whose logits are all
                 -inf, a non-root token outside [0, V) or a NaN / inf / negative draft
                 probability; such a row is all -1 with num_accepted 0.
    D is the depth of the deepest row's tree.
    """
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be [B, N, V], got shape {tuple(target_logits.shape)}")
    B, N, V = target_logits.shape
    dev = target_logits.device
    if tuple(tree_token_ids.shape) != (B, N):
        raise ValueError(f"tree_token_ids must be [B, N] = [{B}, {N}], got {tuple(tree_token_ids.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (B, N, V):
        raise ValueError(f"draft_probs must be [B, N, V] = [{B}, {N}, {V}], got {tuple(draft_probs.shape)}")
    if isinstance(parents, torch.Tensor):
        parents = parents.cpu()  # checked on the host: this is a baseline, one copy is fine
    par = tree_parents(parents, B, dev)
    if par.shape[1] != N:
        raise ValueError(f"parents has {par.shape[1]} nodes but target_logits has N = {N}")
    temp = _temperatures(temperature, B, dev)
    greedy = temp == 0

    logits = target_logits.float()
    ids = tree_token_ids.long()
    valid = ~(torch.isnan(logits) | (logits == float("inf"))).flatten(1).any(1)
    valid &= (logits > float("-inf")).any(-1).all(-1)
    valid &= ((ids[:, 1:] >= 0) & (ids[:, 1:] < V)).all(1)
    q = None
    if draft_probs is not None:
        q = draft_probs.float()
        valid &= (torch.isfinite(q) & (q >= 0)).flatten(1).all(1)
        q = torch.where(valid.view(B, 1, 1), q, 0.0)
    # Invalid rows walk on uniform logits (their outputs are replaced at the end).
    logits = torch.where(valid.view(B, 1, 1), logits, 0.0)
    p = torch.softmax(logits / torch.where(greedy, 1.0, temp).view(B, 1, 1), dim=-1)
    onehot = torch.zeros_like(p).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    p = torch.where(greedy.view(B, 1, 1), onehot, p)
    ids = ids.clamp(0, V - 1)

    depth = _ancestors(par).sum(-1) - 1                    # [B, N]
    D = int(depth.max())
    # rank[b, n]: how many earlier siblings node n has (its place among its parent's children)
    n_idx = torch.arange(N, device=dev)
    sibling = (par.unsqueeze(2) == par.unsqueeze(1)) & (n_idx.view(1, 1, N) < n_idx.view(1, N, 1))
    rank = sibling.sum(-1)
    rank[:, 0] = -1                                        # the root is nobody's child
    max_children = int(rank.max()) + 1 if N > 1 else 0
    rows = torch.arange(B, device=dev)

    def uniform() -> torch.Tensor:
        return torch.rand(B, device=dev, generator=generator)

    tokens = torch.full((B, D + 1), -1, dtype=torch.int64, device=dev)
    path = torch.full((B, D + 1), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    num_accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    cur = torch.zeros(B, dtype=torch.int64, device=dev)
    walking = torch.ones(B, dtype=torch.bool, device=dev)
    for level in range(D + 1):
        r = p[rows, cur]                                   # [B, V] residual law at the current node
        q_n = None if q is None else q[rows, cur]
        chosen = torch.full((B,), -1, dtype=torch.int64, device=dev)
        for i in range(max_children):
            is_child = (par == cur.view(B, 1)) & (rank == i)
            testing = walking & (chosen < 0) & is_child.any(1)
            c = is_child.int().argmax(1)                   # the i-th child (0 where there is none)
            x = ids[rows, c]
            rx = r[rows, x]
            u = uniform()
            if q_n is None:
                accept = u < rx
            else:  # u * q(x) < r(x) is u < min(1, r(x) / q(x)), q(x) = 0 included
                qx = q_n[rows, x]
                accept = torch.where(greedy, u < rx, u * qx < rx)
            rejected = testing & ~accept
            cut = r.scatter(1, x.view(B, 1), 0.0)
            if q_n is not None:
                cut = torch.where(greedy.view(B, 1), cut, (r - q_n).clamp(min=0))
            r = _renormalised(r, cut, rejected)
            chosen = torch.where(testing & accept, c, chosen)
        moved = walking & (chosen >= 0)
        stopped = walking & ~moved
        tokens[:, level] = torch.where(moved, ids[rows, chosen.clamp(min=0)],
                                       torch.where(stopped, _draw(r, uniform()), tokens[:, level]))
        if level < D:
            path[:, level + 1] = torch.where(moved, chosen, path[:, level + 1])
        num_accepted += moved.long()
        cur = torch.where(moved, chosen, cur)
        walking = moved
    tokens = torch.where(valid.view(B, 1), tokens, -1)
    path = torch.where(valid.view(B, 1), path, -1)
    return tokens, path, torch.where(valid, num_accepted, 0), valid
