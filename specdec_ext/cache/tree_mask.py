"""Attention masks and positions for a token TREE appended to a KV cache (tree speculation).

A tree of N nodes is given by ``parents``: node 0 is the root (``parents[0] == -1``) and
every other node's parent has a smaller index (``0 <= parents[n] < n``), so any prefix
``parents[:P]`` is a tree too (BFS numbering satisfies this). Row b's node n sits at cache
slot ``past_lens[b] + n`` and at position (RoPE) ``past_lens[b] + depth(n)``; it sees the
row's cached prefix and its own ancestors (itself included), nothing else of the tree.

A chain (``parents = [-1, 0, 1, ...]``) gives :func:`spec_attention_mask`'s mask. Pure
PyTorch, built on the device of ``past_lens`` with no host sync; the loops run over
ceil(log2(N)) pointer-jumping rounds, never over rows or nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

from .attention_mask import PastLens, _past_tensor
from .._validate import check_int

__all__ = ["TreeNodes", "tree_attention_mask", "tree_attention_mask_bool", "tree_positions"]

Parents = Union[torch.Tensor, Sequence[int], Sequence[Sequence[int]]]


def _check_parent_values(parents: torch.Tensor) -> None:
    """ValueError naming the first bad entry of a host [B, N] parents tensor."""
    N = parents.shape[-1]
    n = torch.arange(N, dtype=torch.int64)
    ok = (parents >= 0) & (parents < n)
    ok[:, 0] = parents[:, 0] == -1
    if not bool(ok.all()):
        b, i = (~ok).nonzero()[0].tolist()
        where = f"parents[{i}]" if parents.shape[0] == 1 else f"parents[{b}, {i}]"
        rule = "must be -1 (node 0 is the root)" if i == 0 else f"must be in [0, {i}) (a parent precedes its child)"
        raise ValueError(f"{where} = {int(parents[b, i])} {rule}")


def tree_parents(parents: Parents, batch_size: int, device) -> torch.Tensor:
    """``parents`` as int64 [B, N] on ``device`` (a [N] tree is shared by every row).

    A list or a CPU tensor is checked here (``ValueError`` naming the bad entry); a device
    tensor is not (no host sync): bad entries there give a meaningless mask, never an
    out-of-bounds read.
    """
    if not isinstance(parents, torch.Tensor):
        parents = torch.tensor(parents, dtype=torch.int64)
    if parents.dtype.is_floating_point or parents.dtype.is_complex or parents.dtype == torch.bool:
        raise TypeError(f"parents must be an integer tensor, got {parents.dtype}")
    if parents.dim() not in (1, 2) or parents.shape[-1] == 0:
        raise ValueError(f"parents must be a non-empty [N] or [B, N] tensor, got shape {tuple(parents.shape)}")
    if parents.dim() == 2 and parents.shape[0] != batch_size:
        raise ValueError(f"parents has {parents.shape[0]} rows but past_lens has {batch_size}")
    parents = parents.to(torch.int64).view(-1, parents.shape[-1])
    if parents.device.type == "cpu":
        _check_parent_values(parents)
    return parents.to(device).expand(batch_size, parents.shape[-1])


def _ancestors(parents: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: ``[b, n, m]`` = m is n or an ancestor of n in row b's tree.

    Pointer jumping: after round k, ``seen[n]`` holds the ancestors at distance < 2^k and
    ``jump[n]`` the one at distance 2^k (N = "none", a sentinel row of no node), so
    ceil(log2(N)) rounds cover every depth.
    """
    B, N = parents.shape
    dev = parents.device
    none = torch.full((B, 1), N, dtype=torch.int64, device=dev)
    n = torch.arange(N, device=dev, dtype=torch.int64)
    # Out-of-range parents (only possible in an unchecked device tensor) become "none".
    jump = torch.cat([torch.where((parents >= 0) & (parents < N), parents, N), none], dim=1)  # [B, N+1]
    seen = torch.cat([n.view(1, N, 1) == n.view(1, 1, N),
                      torch.zeros(1, 1, N, dtype=torch.bool, device=dev)], dim=1).expand(B, N + 1, N)
    for _ in range((N - 1).bit_length()):
        seen = seen | seen.gather(1, jump.unsqueeze(-1).expand(B, N + 1, N))
        jump = jump.gather(1, jump)
    return seen[:, :N]


def tree_positions(past_lens: PastLens, parents: Parents, *,
                   device: Optional[Union[str, torch.device]] = None) -> torch.Tensor:
    """Positions int64 [B, N]: ``past_lens[b] + depth(n)`` (the root has depth 0).

    past_lens : Tensor [B] int32 | int64 (any device: the result is built there), list of
        ints, or int (B = 1). Tokens in the cache before the root.
    parents : Tensor [N] or [B, N] integer (per-row trees), or a list; see the module
        docstring for the rule (checked unless on a non-CPU device).
    device : where to build the result when past_lens is not a tensor.
    """
    past = _past_tensor(past_lens, device)
    par = tree_parents(parents, past.shape[0], past.device)
    return past.view(-1, 1) + (_ancestors(par).sum(-1) - 1)


def tree_attention_mask_bool(past_lens: PastLens, parents: Parents, kv_len: int, *,
                             device: Optional[Union[str, torch.device]] = None) -> torch.Tensor:
    """Boolean mask [B, 1, N, kv_len], True = may attend.

    Node n of row b (at slot ``past_lens[b] + n``) may attend key j iff ``j < past_lens[b]``
    or ``j = past_lens[b] + m`` for m an ancestor of n or n itself; keys past the row's
    own nodes (padding of a ragged batch, other branches) are never visible.

    Parameters
    ----------
    past_lens : as in :func:`tree_positions`.
    parents : Tensor [N] or [B, N] integer, or a list (see :func:`tree_positions`).
    kv_len : int >= 0, keys attention reads, normally ``max(past_lens) + N``. With host
        past_lens a row needing more is a ``ValueError``; with a device tensor this is not
        checked (no sync).
    device : where to build the mask when past_lens is not a tensor.

    A query row that would see no key at all (only possible for a negative past length, an
    unused batch slot, or a too-short kv_len) is made fully VISIBLE, as in
    :func:`spec_attention_mask_bool`, so SDPA stays finite.
    """
    kv_len = check_int("kv_len", kv_len, 0)
    past = _past_tensor(past_lens, device)
    par = tree_parents(parents, past.shape[0], past.device)
    N = par.shape[1]
    if past.device.type == "cpu" and past.numel() and int(past.max()) + N > kv_len:
        raise ValueError(f"kv_len={kv_len} is too short: a row with past length {int(past.max())} and "
                         f"N={N} tree nodes needs {int(past.max()) + N} keys")
    return _mask_bool(past, _ancestors(par), kv_len)


def _mask_bool(past: torch.Tensor, ancestors: torch.Tensor, kv_len: int) -> torch.Tensor:
    """:func:`tree_attention_mask_bool` [B, 1, Q, kv_len] from past int64 [B] and rows of
    :func:`_ancestors`, bool [B, Q, N] (Q query nodes of an N-node tree)."""
    B, Q, N = ancestors.shape
    rel = torch.arange(kv_len, device=past.device, dtype=torch.int64).view(1, kv_len) - past.view(B, 1)
    in_tree = (rel >= 0) & (rel < N)  # [B, kv_len]: key j holds node rel of the row's tree
    index = rel.clamp(0, max(N - 1, 0)).view(B, 1, kv_len).expand(B, Q, kv_len)
    allowed = (ancestors.gather(2, index) & in_tree.view(B, 1, kv_len)) | (rel < 0).view(B, 1, kv_len)
    return (allowed | ~allowed.any(-1, keepdim=True)).unsqueeze(1)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, else ``finfo(dtype).min`` (the conventions of :func:`spec_attention_mask`)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, neg)


def tree_attention_mask(past_lens: PastLens, parents: Parents, kv_len: int, dtype: torch.dtype = torch.float32, *,
                        device: Optional[Union[str, torch.device]] = None) -> torch.Tensor:
    """Additive float mask [B, 1, N, kv_len] of ``dtype`` for SDPA's ``attn_mask``: 0 where
    :func:`tree_attention_mask_bool` is True, else ``torch.finfo(dtype).min`` (the
    conventions of :func:`spec_attention_mask`)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    return _additive(tree_attention_mask_bool(past_lens, parents, kv_len, device=device), dtype)


@dataclass(frozen=True)
class TreeNodes:
    """The tree nodes a model forward step feeds: nodes ``start .. start + S - 1`` of the tree
    ``parents`` (Tensor [P] or [B, P] int64 on the model's device, P >= start + S).

    The tree's node 0 sits at cache slot ``lengths[b] - start`` (the row's length before
    the step minus ``start``): nodes 0 .. start - 1 were appended before, in index order,
    so node n sits at slot ``lengths[b] - start + n``. The target scores a whole tree with
    ``start = 0`` (the root is its first new token); the draft, whose cache already holds
    the root, feeds one level at a time (``start`` = the level's first node).
    """

    parents: torch.Tensor
    start: int = 0

    def step_inputs(self, lengths: torch.Tensor, num_tokens: int, kv_len: int,
                    dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """(positions int64 [B, S], additive mask [B, 1, S, kv_len] of ``dtype``) of the step.

        lengths : Tensor [B] int32 | int64 on the device, each row's length before the step.
        """
        start = check_int("start", self.start, 0)
        end = start + check_int("num_tokens", num_tokens, 1)
        if self.parents.shape[-1] < end:
            raise ValueError(f"parents covers {self.parents.shape[-1]} nodes; the step feeds nodes "
                             f"{start}..{end - 1}")
        # The nodes after the step's are not needed: a parent precedes its children, so
        # parents[:end] is the tree the step's nodes and their ancestors live in.
        base = lengths.to(torch.int64) - start
        ancestors = _ancestors(tree_parents(self.parents[..., :end], base.shape[0], base.device))
        positions = base.view(-1, 1) + (ancestors[:, start:].sum(-1) - 1)
        mask = _additive(_mask_bool(base, ancestors[:, start:], kv_len), dtype)
        return positions, mask

    def one_row_inputs(self, past: int, num_tokens: int, dtype: torch.dtype,
                       device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`step_inputs` of one row that holds exactly ``past`` tokens before a step
        that feeds the whole tree (``start`` 0, ``kv_len`` = past + num_tokens), from host
        ``parents``: the tree's part of the mask is built once per tree shape and kept, so a
        step costs two tensor ops instead of about twenty (a decode step of a small model is
        bound by op count). None where it does not apply (parents on a device, several rows,
        ``start`` > 0, a tree that breaks the rule: :meth:`step_inputs` raises for it)."""
        par = self.parents
        if self.start != 0 or par.device.type != "cpu" or (par.dim() == 2 and par.shape[0] != 1):
            return None
        key = tuple(par.reshape(-1)[:num_tokens].tolist())
        if len(key) != num_tokens:
            return None
        entry = _ONE_ROW.get((key, dtype, device))
        if entry is None:  # a new shape: checked once (a kept one passed), as step_inputs checks it
            rows = torch.tensor([key], dtype=torch.int64)
            try:
                _check_parent_values(rows)
            except ValueError:
                return None
            ancestors = _ancestors(rows)[0]  # [S, S]
            tree_mask = _additive(ancestors, dtype).to(device)
            depth = (ancestors.sum(-1) - 1).view(1, -1).to(device)
            if len(_ONE_ROW) >= _ONE_ROW_SHAPES:
                _ONE_ROW.clear()
            entry = _ONE_ROW[(key, dtype, device)] = (tree_mask, depth)
        tree_mask, depth = entry
        mask = torch.zeros((1, 1, num_tokens, past + num_tokens), dtype=dtype, device=device)
        mask[0, 0, :, past:].copy_(tree_mask)
        return depth + past, mask


#: Tree shapes whose one-row masks are kept (:meth:`TreeNodes.one_row_inputs`); a full table is emptied.
_ONE_ROW_SHAPES = 256
_ONE_ROW: dict = {}
