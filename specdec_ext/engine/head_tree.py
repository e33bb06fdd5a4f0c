"""Draft-head trees: the head's drafts branch at the first token (``head_branches`` > 1).

The bundled head's first draft is the target's next token 44.8% of the time on held-out
text, and its second choice is right a good part of the rest (over the target's own greedy
text: 67% top-1, 78% top-2, 83% top-3). A step where a row drafts with the head therefore
scores a small tree instead of a chain: branch j starts with the head's (j+1)-th most likely
first token and goes on greedily, branch j holding max(1, K - j) nodes (K: the row's draft
count from adaptive K, at most ``HEAD_DRAFTS``). A row with a prompt-lookup match drafts its
chain as before (a tree with one branch). The target scores every node in one ``forward_tree``,
:func:`specdec_ext.verify_tree` tests the nodes as deterministic candidates (exact at any
temperature, as for suffix trees), the target cache keeps the accepted path (``compact``),
and the row's next feature is the hidden state of the path's last kept node.
"""
from __future__ import annotations

import time
from typing import List, Sequence, Tuple

import torch

from .phases import check_rows, drop_entries
from .tree import batch_text_trees, commit_text_trees, score_text_tree

__all__ = ["head_tree_step", "branch_tree"]

Tree = Tuple[List[int], List[int]]  # (tokens, parents: -1 = the row's last token, else a node index)


def branch_tree(chains: Sequence[Sequence[int]], max_nodes: int) -> Tree:
    """The chains as one tree below the row's last token, shared prefixes merged (a trie),
    cut to at most ``max_nodes`` nodes (the chains' nodes in order: earlier chains first).
    Returns (tokens, parents) with every parent before its children."""
    tokens: List[int] = []
    parents: List[int] = []
    children = {}  # (parent, token) -> node
    for chain in chains:
        at = -1
        for t in chain:
            node = children.get((at, t))
            if node is None:
                if len(tokens) >= max_nodes:
                    break
                node = len(tokens)
                tokens.append(int(t))
                parents.append(at)
                children[(at, t)] = node
            at = node
    return tokens, parents


def _trees(engine, run, props, sources, ks, head_source: str, head_drafts: int) -> List[Tree]:
    """Each row's tree: its text chain cut to its K, or the head's branches (one batched
    head call for the head rows; K at most ``head_drafts``), every tree cut to the caches' room."""
    B = len(ks)
    room = run.active_room()
    trees: List[Tree] = [([], [])] * B
    head_rows = []
    for b in range(B):
        if not run.active[b] or ks[b] == 0:
            continue
        if sources[b] == head_source:
            head_rows.append(b)
        else:
            trees[b] = branch_tree([props[b][:ks[b]]], room)
    if head_rows:
        k_head = {b: min(ks[b], head_drafts) for b in head_rows}
        k = max(k_head.values())
        drafts = engine.head.propose_branches(*engine._head_inputs(run, head_rows), k,
                                              engine.head_branches).cpu().tolist()
        for b, branches in zip(head_rows, drafts):
            trees[b] = branch_tree([chain[:max(1, k_head[b] - j)] for j, chain in enumerate(branches)], room)
    return trees


def head_tree_step(engine, run, sync, text, head_source: str, head_drafts: int, t0: float, timer) -> None:
    """One step of the drafter 'head' with branching head drafts (module docstring): text
    chains (``text``: the step's n-gram proposals and sources, from ``engine._propose``) and
    head trees -> one ``forward_tree`` -> ``verify_tree`` -> commit as a chain of K = the
    step's depth -> the target cache keeps each row's emitted path (moved to the front of
    the step's entries only where the path left the first branch) -> the rows' features.
    ``t0``, ``timer``: the step's start and its phase timer, marked before the text lookup
    (so the lookup counts as drafting)."""
    props, sources = text
    with sync:
        sources = [head_source if use else sources[b] for b, use in enumerate(engine._head_rows(run, props))]
        ks = run.choose_ks(sources)
        trees = _trees(engine, run, props, sources, ks, head_source, head_drafts)
        ids, parents, depth, depths = batch_text_trees(trees, run.last_tokens())
        _, packed, N = score_text_tree(engine, run, ids, parents, depth, timer)
    rows = packed.cpu().tolist()  # the step's ONE device -> host copy
    check_rows(rows, depth, run.active, run.step)
    commits = commit_text_trees(run, rows, depth, depths)
    # row b's emitted tokens came from its path's first kept_target nodes (packed: path at
    # columns depth + 4 ..); the cache keeps those entries, and the last one's hidden state
    # is the row's next feature
    paths = [row[depth + 4:depth + 4 + (c.kept_target if c else 0)] for row, c in zip(rows, commits)]
    if any(p != list(range(len(p))) for p in paths):
        keep = max(len(p) for p in paths)
        engine.target.compact(N, engine._to_device(torch.tensor([p + [0] * (keep - len(p)) for p in paths],
                                                                 dtype=torch.int64)),
                              engine._to_device(torch.tensor([len(p) for p in paths], dtype=torch.int64)))
    drop_entries(engine.target, [N - len(p) for p in paths])
    engine._keep_head_features(run, [p[-1] if p else -1 for p in paths])
    run.apply(commits, depth)
    run.last = engine._to_device(torch.tensor(run.last_tokens(), dtype=torch.int64))
    engine._account(run, depth, commits, timer.read(), time.perf_counter() - t0, width=N, model_drafted=False)
