"""Building head trees (specdec_ext/engine/head_tree.py): chains merged into one tree below the
row's last token, cut to the caches' room, and batched for forward_tree / verify_tree
(engine/tree.py batch_text_trees, which suffix trees share)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_ext.engine.head_tree import branch_tree
from specdec_ext.engine.tree import batch_text_trees


def _paths(tokens, parents):
    """Every node's token path from the root."""
    out = []
    for n in range(len(tokens)):
        path, at = [], n
        while at != -1:
            path.append(tokens[at])
            at = parents[at]
        out.append(path[::-1])
    return out


def test_branches_share_their_common_prefix():
    tokens, parents = branch_tree([[5, 6, 7], [5, 8], [9]], 10)
    assert tokens == [5, 6, 7, 8, 9] and parents == [-1, 0, 1, 0, -1]


def test_a_tree_is_cut_to_max_nodes_earlier_chains_first():
    assert branch_tree([[1, 2, 3], [4, 5]], 4) == ([1, 2, 3, 4], [-1, 0, 1, -1])
    assert branch_tree([[1, 2, 3], [4, 5]], 0) == ([], [])
    assert branch_tree([], 5) == ([], [])


@given(chains=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), max_size=4),
       max_nodes=st.integers(0, 12))
@settings(max_examples=300, deadline=None)
def test_branch_tree_is_the_trie_of_the_chains(chains, max_nodes):
    """Parents precede children, no two siblings hold one token, at most max_nodes nodes, and
    every node's path is a prefix of some chain; with room for all, every chain is a path."""
    tokens, parents = branch_tree(chains, max_nodes)
    assert len(tokens) == len(parents) <= max_nodes
    assert all(-1 <= p < n for n, p in enumerate(parents))
    assert len({(p, t) for p, t in zip(parents, tokens)}) == len(tokens)
    paths = _paths(tokens, parents)
    assert all(any(c[:len(path)] == path for c in chains) for path in paths)
    if max_nodes >= sum(map(len, chains)):
        assert all(c in paths for c in chains)


def test_batch_pads_rows_and_gives_each_row_its_depth():
    """Node 0 is the row's last token; a shorter row is padded with root children repeating
    its first candidate (a row without drafts repeats token 0 and has depth 0: it tested
    nothing)."""
    trees = [branch_tree([[5, 6, 7], [8]], 10), ([], []), branch_tree([[3]], 10)]
    ids, parents, depth, depths = batch_text_trees(trees, [1, 2, 4])
    assert ids.tolist() == [[1, 5, 6, 7, 8], [2, 0, 0, 0, 0], [4, 3, 3, 3, 3]]
    assert parents.tolist() == [[-1, 0, 1, 2, 0], [-1, 0, 0, 0, 0], [-1, 0, 0, 0, 0]]
    assert depth == 3 and depths == [3, 0, 1]
    ids, parents, depth, depths = batch_text_trees([([], [])], [7])
    assert ids.tolist() == [[7]] and parents.tolist() == [[-1]] and depth == 0 and depths == [0]
    assert ids.dtype == parents.dtype == torch.int64


def test_a_row_without_a_tree_emits_its_first_token_alone():
    """commit_text_trees: a row of depth 0 whose padding (token 0) verify accepted emits that
    first token alone and counts no drafts tested (they were padding, not drafts: counting
    them would lower the row's acceptance estimate for nothing); a row with a tree counts its
    own depth, not the step's."""
    from types import SimpleNamespace
    from specdec_ext.engine.tree import commit_text_trees
    run = SimpleNamespace(active=[True, True, False], pending=[[], [], []], generated=[[], [3], []],
                          max_new_tokens=10, eos=frozenset())
    d = 3  # packed: tokens [d+1], num_accepted, valid, draft_ok, path [d+1]
    rows = [[0, 9, -1, -1, 1, 1, 1, 0, 1, -1, -1],
            [5, 6, -1, -1, 1, 1, 1, 0, 2, -1, -1],
            [0, -1, -1, -1, 0, 1, 1, 0, -1, -1, -1]]
    pad, tree, done = commit_text_trees(run, rows, d, [0, 2, 0])
    assert (pad.emitted, pad.tested, pad.accepted, pad.kept_target) == ([0], 0, 0, 1)
    assert (tree.emitted, tree.tested, tree.accepted, tree.kept_target) == ([5, 6], 2, 1, 2)
    assert done is None
