"""Tree verification: the fused ``specdec_ext.verify_tree`` against the same walk in plain
PyTorch (:func:`specdec_ext.bench.tree_baseline.verify_tree_torch`), at N tree nodes, B rows,
V tokens, with the draft law of every node (sampled children, the exact mode).

``python -m specdec_ext.bench verify --tree-only`` (or ``--tree`` with the chain rows) runs the
grid; ``torch/fused`` is the median time of the plain-PyTorch walk over ours (same inputs,
same device, measured in one run)."""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

import specdec_ext

from .timing import time_call
from .tree_baseline import verify_tree_torch

__all__ = ["FULL", "QUICK", "bfs_tree", "bench_rows", "format_row"]

#: the grid of the issue: N nodes, B rows, V = Llama-3's vocabulary
FULL = dict(N=[8, 32, 64], B=[1, 8], V=[128256])
QUICK = dict(N=[8], B=[1], V=[32000])

HEADER = (f"{'op':<12}{'device':<7}{'B':>4}{'N':>5}{'D':>3}{'V':>8}  {'fused ms':>9}  {'torch ms':>9}  "
          f"{'torch/fused':>11}")
LEGEND = "torch/fused = torch ms / fused ms (the plain-PyTorch tree walk's median time over the fused op's)"


def bfs_tree(N: int, branching: Sequence[int] = (4, 2, 2, 2, 2, 2, 2, 2)) -> List[int]:
    """parents [N] of a BFS tree with branching[d] children per node at depth d, cut at N nodes
    (the last level partly filled), the shape EAGLE-style drafters grow."""
    parents, level, depth = [-1], [0], 0
    while len(parents) < N:
        nxt = []
        for node in level:
            for _ in range(branching[min(depth, len(branching) - 1)]):
                if len(parents) == N:
                    break
                parents.append(node)
                nxt.append(len(parents) - 1)
        level, depth = nxt, depth + 1
    return parents


def _inputs(B: int, N: int, V: int, device: str, seed: int = 0):
    """Target logits [B, N, V] fp32, node tokens [B, N] drawn from the draft law [B, N, V]
    of each node's parent (a draft correlated with the target, as a real one is)."""
    g = torch.Generator().manual_seed(seed)
    parents = bfs_tree(N)
    logits = torch.randn(B, N, V, generator=g) * 3
    q = torch.softmax(logits * 0.9 + torch.randn(B, N, V, generator=g), -1)
    ids = torch.zeros(B, N, dtype=torch.long)
    for c in range(1, N):
        ids[:, c] = torch.multinomial(q[:, parents[c]], 1, generator=g)[:, 0]
    return [t.to(device) for t in (logits, ids, q)] + [parents]


def format_row(row: dict) -> str:
    """One table line (HEADER's columns) of a bench_rows row."""
    return (f"{'verify_tree':<12}{row['device']:<7}{row['B']:>4}{row['N']:>5}{row['depth']:>3}{row['V']:>8}  "
            f"{row['fused_s'] * 1e3:>9.3f}  {row['torch_s'] * 1e3:>9.3f}  {row['speedup']:>10.1f}x")


def bench_rows(devices: Sequence[str], grid: Dict[str, list]) -> List[dict]:
    """Times both implementations over the grid; returns one dict per (device, B, N, V)
    (printed by the caller, with format_row, once every row is measured)."""
    rows = []
    for device in devices:
        for V in grid["V"]:
            for N in grid["N"]:
                for B in grid["B"]:
                    logits, ids, q, parents = _inputs(B, N, V, device)
                    depth = specdec_ext.tree_depth(parents)
                    p = torch.tensor(parents, device=device)

                    def fused():
                        return specdec_ext.verify_tree(logits, ids, p, q, 1.0, seed=1, depth=depth)

                    def plain():
                        return verify_tree_torch(logits, ids, p, q, 1.0)

                    t_fused, t_torch = time_call(fused, device), time_call(plain, device)
                    row = dict(op="verify_tree", device=device, B=B, N=N, depth=depth, V=V, fused_s=t_fused,
                               torch_s=t_torch, speedup=t_torch / t_fused)
                    rows.append(row)
    return rows
