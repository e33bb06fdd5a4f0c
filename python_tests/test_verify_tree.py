"""specdec_ext.verify_tree on the CPU: the law of the emitted tokens (chi-square against the
target's closed-form joint law, with power checks: the first two tokens at V = 6, the first
three (the depth-2 bonus) at V = 6 and two more temperatures, the filtered laws at V = 300 and
1000 over several 128-token tiles at T = 0.7 and 1.3), chain-shaped trees == verify token for
token, greedy walks, the outputs' layout, invalid rows and argument errors, opcheck and
torch.compile. The CUDA kernel's families are in test_verify_tree_gpu.py."""
import numpy as np
import pytest
import torch

import specdec_ext
from helpers import draft_inputs, draws
from stats_reference import ALPHA, chi_square_pvalue
from tree_cases import (bfs_parents, chain_parents, draw_trees, first_tokens, first_two, joint_law, node_paths,
                        table, tiled_bigram)

LAW = pytest.mark.law


# ---- the law ------------------------------------------------------------------------------------

# (branching, sampled children, filters, deterministic candidates per depth (repeats allowed))
LAW_CASES = {
    "sampled_3x2": ((3, 2), True, {}, None),
    "sampled_2x3": ((2, 3), True, {}, None),
    "topk_3x2": ((3, 2), False, {}, None),
    "repeated_candidates": ((3, 2), False, {}, [[1, 1, 2], [0, 0]]),
    "sampled_filtered": ((3, 2), True, dict(top_k=4, top_p=0.9), None),
    "topk_min_p": ((2, 2), False, dict(min_p=0.1), None),
}


def tree_law_pvalue(verify_tree, n, case, seed, T=0.9, device="cpu", wrong_mode=False, tokens=2, plant=None):
    """p-value of the first ``tokens`` emitted tokens against the target's joint law
    (chi-square; tokens = 3 reaches the bonus after two accepted drafts of a depth-2 tree).
    wrong_mode: the draft's top candidates verified as if they were i.i.d. draws from its law
    (draft_probs passed): a biased walk. (The converse, i.i.d. draws verified as deterministic
    candidates, is exact: any candidate set chosen independently of the test's uniforms is.)
    plant(tree_batch) -> target logits [B, N, V]: a planted bug in the logits the op reads."""
    branching, sampled, filt, cands = LAW_CASES[case]
    V = 6
    target = table(V, len(branching), 1.3, seed)
    draft = table(V, len(branching), 1.3, seed + 1)
    tb = draw_trees(target, draft, branching, n, T_draft=1.0, sampled=sampled and not wrong_mode, seed=seed + 2,
                    candidates=cands)
    q = tb.draft_law if wrong_mode else tb.draft_probs
    q = None if q is None else q.to(device)
    logits = tb.logits if plant is None else plant(tb)
    res = verify_tree(logits.to(device), tb.ids.to(device), tb.parents, q, T, seed=seed, offset=3, **filt)
    assert bool(res.valid.all())
    counts = first_tokens(res.tokens, res.num_accepted, target, T, seed + 3, tokens, **filt)
    return chi_square_pvalue(counts, joint_law(target, T, tokens, **filt))


@LAW
@pytest.mark.parametrize("case", list(LAW_CASES))
def test_emitted_tokens_follow_the_target_law(case):
    """Pearson chi-square at ALPHA of the first two emitted tokens (the second completed from
    the target where a row stopped after one) against P(t1) P(t2 | t1) of the (filtered)
    target, 40000 random trees per case: i.i.d. sampled children (repeats happen often at
    V = 6), the draft's top candidates, explicitly repeated candidates, and filters."""
    assert tree_law_pvalue(specdec_ext.verify_tree, draws(40_000), case, seed=11) > ALPHA


@LAW
@pytest.mark.parametrize("case,T", [("sampled_3x2", 0.9), ("sampled_filtered", 1.3), ("topk_3x2", 0.6)])
def test_depth_two_trees_follow_the_target_law_to_the_bonus(case, T):
    """The first THREE emitted tokens of (3, 2) trees (216 cells; completed from the target
    where a row stopped early) against P(t1) P(t2 | t1) P(t3 | t1 t2): the bonus drawn after
    two accepted drafts, from the accepted leaf's logits, at two more temperatures."""
    assert tree_law_pvalue(specdec_ext.verify_tree, draws(40_000), case, seed=17, T=T, tokens=3) > ALPHA


def _bonus_from_the_parent(tb):
    """A planted bug: each depth-2 node's logits replaced by its parent's, so the bonus after
    two accepted drafts is drawn from the depth-1 law (the accept tests read the parents' rows,
    so the first two tokens keep their law)."""
    logits = tb.logits.clone()
    parents = tb.parents.tolist()
    for n in range(1, len(parents)):
        if parents[n] > 0:
            logits[:, n] = tb.logits[:, parents[n]]
    return logits


@LAW
def test_the_tree_law_tests_have_power():
    """At the same draw count the chi-square rejects a biased walk (the draft's top
    candidates verified as i.i.d. draws from its law), and the three-token law rejects a
    bonus drawn from the wrong node's logits, which the two-token law cannot see."""
    n = draws(40_000)
    assert tree_law_pvalue(specdec_ext.verify_tree, n, "sampled_3x2", seed=11, wrong_mode=True) < ALPHA
    assert tree_law_pvalue(specdec_ext.verify_tree, n, "sampled_3x2", seed=17, tokens=3,
                           plant=_bonus_from_the_parent) < ALPHA


# (V, T, branching, sampled children, filters): V over several 128-token tiles (tiled_bigram)
TILED_CASES = {
    "sampled_top_k_300": (300, 0.7, (2, 1), True, dict(top_k=20)),
    "topk_top_p_300": (300, 1.3, (3, 2), False, dict(top_p=0.8)),
    "topk_min_p_1000": (1000, 1.3, (3, 2), False, dict(min_p=0.1)),
    "topk_all_1000": (1000, 0.7, (3, 2), False, dict(top_k=30, top_p=0.9, min_p=0.05)),
}


def tiled_tree_law_pvalue(verify_tree, n, case, seed, device="cpu"):
    """p-value of the first two emitted tokens of trees over a tiled bigram target (chi-square
    over V^2 cells, the filtered support a few hundred). Sampled children: i.i.d. from the
    (unfiltered) draft's law, a tree per row; else one tree of the draft's top candidates
    broadcast to every row (candidates the filters drop are rejected)."""
    V, T, branching, sampled, filt = TILED_CASES[case]
    target, draft = tiled_bigram(V, seed), tiled_bigram(V, seed + 1)
    draft.logits = target.logits + 0.5 * draft.logits.sub(draft.logits.mean())  # a close draft
    tb = draw_trees(target, draft, branching, n if sampled else 1, T_draft=T, sampled=sampled, seed=seed + 2)
    logits, ids = tb.logits.expand(n, -1, -1), tb.ids.expand(n, -1)
    q = None if tb.draft_probs is None else tb.draft_probs.to(device)
    res = verify_tree(logits.to(device), ids.to(device), tb.parents, q, T, seed=seed, offset=5, **filt)
    assert bool(res.valid.all())
    assert res.num_accepted.float().mean().item() > 0.2  # the drafts are accepted often
    counts = first_two(res.tokens, res.num_accepted, target, T, seed + 3, **filt)
    return chi_square_pvalue(counts, joint_law(target, T, **filt))


@LAW
@pytest.mark.parametrize("case", list(TILED_CASES))
def test_tiled_trees_follow_the_filtered_target_law(case):
    """The filtered laws at V = 300 and 1000 (survivors in several tiles) and temperatures
    0.7 and 1.3: sampled children at V = 300, the draft's top candidates at V = 1000."""
    assert tiled_tree_law_pvalue(specdec_ext.verify_tree, draws(15_000, 5_000), case, seed=23) > ALPHA


@LAW
def test_tree_acceptance_is_higher_than_a_chain():
    """The point of a tree: with the same draft law, a 3-way root accepts at least one token
    more often than a single draft (chain of depth 2 vs tree (3, 2))."""
    V, n, T = 6, draws(20_000), 1.0
    target, draft = table(V, 2, 1.3, 5), table(V, 2, 1.3, 6)
    acc = {}
    for name, branching in (("chain", (1, 1)), ("tree", (3, 2))):
        tb = draw_trees(target, draft, branching, n, 1.0, sampled=True, seed=7)
        res = specdec_ext.verify_tree(tb.logits, tb.ids, tb.parents, tb.draft_probs, T, seed=1)
        acc[name] = res.num_accepted.float().mean().item()
    assert acc["tree"] > acc["chain"] + 0.1


# ---- chain-shaped trees are verify ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("filt", [{}, dict(top_k=20, top_p=0.8), dict(min_p=0.05)], ids=str)
def test_a_chain_shaped_tree_gives_verify_tokens(dtype, dense, filt):
    """parents = [-1, 0, 1, ...] draws verify's random numbers: identical tokens, valid flags
    and acceptance counts, greedy rows included (every 5th row)."""
    B, K, V = 48, 4, 300
    L, D, Q = draft_inputs(B, K, V, dtype, seed=3)
    temps = 0.4 + torch.rand(B, generator=torch.Generator().manual_seed(1))
    temps[::5] = 0.0
    Q = Q if dense else None
    ref = specdec_ext.verify(L, D, Q, temps, seed=9, offset=4, **filt)
    ids = torch.cat([torch.zeros(B, 1, dtype=torch.long), D], 1)
    q_nodes = None if Q is None else torch.cat([Q, torch.zeros(B, 1, V, dtype=Q.dtype)], 1)
    res = specdec_ext.verify_tree(L, ids, chain_parents(K), q_nodes, temps, seed=9, offset=4, **filt)
    assert torch.equal(res.tokens, ref.tokens)
    assert torch.equal(res.num_accepted, ref.num_accepted)
    assert torch.equal(res.valid, ref.valid)
    expect_path = torch.where(torch.arange(K + 1) <= ref.num_accepted[:, None], torch.arange(K + 1), -1)
    assert torch.equal(res.path, expect_path)


def residual_of_mass_zero_case(B=3, V=300):
    """Every row: p' one-hot at token 5 (the other logits -inf), q one-hot at 5, and three
    children holding token 7, which neither law can draw: the first is rejected and
    max(0, p' - q) is all 0 (r == q), so r stays p'; so does every later rejection; the
    correction is 5."""
    logits = torch.full((B, 4, V), float("-inf"))
    logits[:, :, 5] = 0.0
    q = torch.zeros(B, 4, V)
    q[:, :, 5] = 1.0
    ids = torch.full((B, 4), 7)
    return logits, ids, [-1, 0, 0, 0], q


def test_a_residual_of_mass_zero_leaves_r_as_it_was():
    logits, ids, parents, q = residual_of_mass_zero_case()
    res = specdec_ext.verify_tree(logits, ids, parents, q, 1.0, seed=3)
    assert bool(res.valid.all()) and res.tokens.tolist() == [[5, -1]] * 3 and res.path.tolist() == [[0, -1]] * 3


# ---- greedy walks and the output layout -----------------------------------------------------------

def greedy_walk(logits, ids, parents):
    """Python statement of the greedy walk: (tokens, path) of one row."""
    node, tokens, path = 0, [], [0]
    while True:
        arg = int(torch.argmax(logits[node]))
        nxt = [c for c in range(1, len(parents)) if parents[c] == node and int(ids[c]) == arg]
        tokens.append(arg)
        if not nxt:
            return tokens, path
        node = nxt[0]
        path.append(node)


def test_greedy_rows_walk_the_argmax():
    """T = 0: the first child holding the argmax is taken; tokens and path match a Python walk
    over random trees whose candidates often hold the argmax."""
    V, branching, B = 7, (3, 2, 2), 64
    parents = bfs_parents(branching)
    target, draft = table(V, 3, 2.0, 1), table(V, 3, 2.0, 1)  # same law: candidates often right
    tb = draw_trees(target, draft, branching, B, 1.0, sampled=False, seed=2)
    res = specdec_ext.verify_tree(tb.logits, tb.ids, parents, None, 0.0)
    D = len(branching)
    assert res.tokens.shape == (B, D + 1) and res.path.shape == (B, D + 1)
    for b in range(B):
        tokens, path = greedy_walk(tb.logits[b], tb.ids[b], parents)
        assert res.tokens[b].tolist() == tokens + [-1] * (D + 1 - len(tokens))
        assert res.path[b].tolist() == path + [-1] * (D + 1 - len(path))
        assert int(res.num_accepted[b]) == len(tokens) - 1
    assert int(res.num_accepted.max()) == D  # some rows accept a whole branch


def test_outputs_are_consistent_with_the_tree():
    """Sampled rows: path[j] is a child of path[j-1], tokens[j] is path[j+1]'s token, the
    outputs are -1 after num_accepted + 1 entries; a wider depth only pads with -1."""
    V, branching, B = 9, (4, 2, 2), 200
    parents = bfs_parents(branching)
    target, draft = table(V, 3, 1.0, 3), table(V, 3, 1.0, 4)
    tb = draw_trees(target, draft, branching, B, 1.0, sampled=True, seed=5)
    res = specdec_ext.verify_tree(tb.logits, tb.ids, tb.parents, tb.draft_probs, 0.8, seed=2)
    wide = specdec_ext.verify_tree(tb.logits, tb.ids, tb.parents, tb.draft_probs, 0.8, seed=2, depth=6)
    assert torch.equal(wide.tokens[:, :4], res.tokens) and bool((wide.tokens[:, 4:] == -1).all())
    assert torch.equal(wide.path[:, :4], res.path) and bool((wide.path[:, 4:] == -1).all())
    for b in range(B):
        n = int(res.num_accepted[b])
        path, tokens = res.path[b].tolist(), res.tokens[b].tolist()
        assert path[0] == 0 and all(parents[path[j]] == path[j - 1] for j in range(1, n + 1))
        assert all(tokens[j] == int(tb.ids[b, path[j + 1]]) for j in range(n))
        assert 0 <= tokens[n] < V and all(t == -1 for t in tokens[n + 1:]) and all(p == -1 for p in path[n + 1:])


def test_per_row_parents_and_a_single_node():
    """parents [B, N] gives each row its own tree (each row equals a call with its own
    parents); N = 1 (the root alone) is plain sampling of a bonus token."""
    V, B = 11, 6
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, 5, V, generator=g)
    ids = torch.randint(0, V, (B, 5), generator=g)
    rows = [[-1, 0, 0, 1, 1], [-1, 0, 1, 2, 3], [-1, 0, 0, 0, 0]] * 2
    res = specdec_ext.verify_tree(logits, ids, torch.tensor(rows), None, 0.7, seed=torch.arange(B))
    for b in range(B):
        one = specdec_ext.verify_tree(logits[b:b + 1], ids[b:b + 1], rows[b], None, 0.7, seed=torch.tensor([b]),
                                      depth=4)
        assert torch.equal(one.tokens[0, :res.tokens.shape[1]], res.tokens[b])
    root = specdec_ext.verify_tree(logits[:, :1], ids[:, :1], [-1], None, 0.7, seed=1)
    assert root.tokens.shape == (B, 1) and bool((root.num_accepted == 0).all()) and bool(root.valid.all())


# ---- invalid rows and argument errors --------------------------------------------------------------

def _tree_inputs(B=4, V=10, branching=(2, 2), seed=0):
    parents = bfs_parents(branching)
    g = torch.Generator().manual_seed(seed)
    N = len(parents)
    logits = torch.randn(B, N, V, generator=g)
    ids = torch.randint(0, V, (B, N), generator=g)
    q = torch.softmax(torch.randn(B, N, V, generator=g), -1)
    return logits, ids, parents, q


def test_invalid_rows():
    """NaN at an unvisited node, all -inf at the root, a node token outside [0, V), a NaN draft
    probability: that row only is invalid (-1 everywhere), the others unchanged."""
    logits, ids, parents, q = _tree_inputs(B=5)
    base = specdec_ext.verify_tree(logits, ids, parents, q, 1.0, seed=4)
    L, I, Q = logits.clone(), ids.clone(), q.clone()
    L[0, -1, 3] = float("nan")
    L[1, 0] = float("-inf")
    I[2, 4] = 10
    Q[3, 0, int(I[3, 1])] = float("nan")
    res = specdec_ext.verify_tree(L, I, parents, Q, 1.0, seed=4)
    assert res.valid.tolist() == [False, False, False, False, True]
    assert bool((res.tokens[:4] == -1).all()) and bool((res.path[:4] == -1).all())
    assert bool((res.num_accepted[:4] == 0).all())
    assert torch.equal(res.tokens[4], base.tokens[4])


@pytest.mark.parametrize("bad,match", [
    (dict(parents=[0, 0, 0]), "parents"), (dict(parents=[-1, 1, 0]), "parents"),
    (dict(parents=[-1, 0]), r"parents must be \[N\]"), (dict(depth=0, parents=[-1, 0, 1]), "deeper than depth"),
    (dict(depth=3), "depth must be in"), (dict(ids=torch.zeros(2, 2, dtype=torch.long)), "tree_token_ids"),
    (dict(q=torch.ones(2, 2, 5)), "draft_probs has N"), (dict(ids=torch.zeros(2, 3)), "tree_token_ids must be int"),
    (dict(temperature=-1.0), "temperature"), (dict(top_k=-1), "top_k"),
])
def test_argument_errors_name_the_argument(bad, match):
    logits = torch.randn(2, 3, 5)
    args = dict(ids=torch.zeros(2, 3, dtype=torch.long), parents=[-1, 0, 0], q=None, temperature=1.0)
    args.update(bad)
    extra = {k: args.pop(k) for k in ("depth", "top_k") if k in args}
    with pytest.raises((ValueError, TypeError), match=match):
        specdec_ext.verify_tree(logits, args["ids"], args["parents"], args["q"], args["temperature"], **extra)


@pytest.mark.parametrize("as_type", [list, tuple])
def test_compiles_without_depth_when_parents_is_a_list(as_type):
    """A Python-list (or tuple) parents gives its depth in Python: no guard on tensor data, so
    fullgraph Inductor compiles without depth= (dynamo used to fail on Eq(u0, 1) in tree_depth)."""
    logits, ids, parents, q = _tree_inputs(B=3, V=33)
    parents = as_type(parents)

    def step(logits, ids, q):
        return specdec_ext.verify_tree(logits, ids, parents, q, 0.8, seed=5)

    eager = step(logits, ids, q)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(logits, ids, q)
    assert eager.tokens.shape[1] == specdec_ext.tree_depth(list(parents)) + 1
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_tensor_parents_under_compile_without_depth_says_pass_depth():
    logits, ids, parents, q = _tree_inputs(B=3, V=33)
    p = torch.tensor(parents)

    def step(logits, ids, q):
        return specdec_ext.verify_tree(logits, ids, p, q, 0.8, seed=5)

    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(step, fullgraph=True)(logits, ids, q)
    first = str(info.value).strip().splitlines()[0]
    assert "needs depth=" in first and "verify_tree" in first, first
    torch._dynamo.reset()  # without fullgraph the depth is read eagerly (a graph break), as before
    assert torch.equal(torch.compile(step)(logits, ids, q).tokens, step(logits, ids, q).tokens)


def test_tree_depth():
    assert specdec_ext.tree_depth(bfs_parents((4, 2, 2))) == 3
    assert specdec_ext.tree_depth([-1]) == 0
    assert specdec_ext.tree_depth(torch.tensor([[-1, 0, 1], [-1, 0, 0]])) == 2
    assert specdec_ext.tree_depth([-1, 5, 0]) == 2  # malformed: N - 1 (the op's check names it)


# ---- torch.library / torch.compile -----------------------------------------------------------------

def test_opcheck():
    logits, ids, parents, q = _tree_inputs(B=3, V=33)
    p = torch.tensor(parents)
    for probs in (q, None):
        torch.library.opcheck(torch.ops.specdec.verify_tree.default,
                              (logits, ids, p, probs, torch.tensor(0.8), torch.tensor(3), torch.tensor(0), 2),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_torch_compile_fullgraph():
    logits, ids, parents, q = _tree_inputs(B=3, V=33)
    p = torch.tensor(parents)

    def step(logits, ids, q):
        return specdec_ext.verify_tree(logits, ids, p, q, 0.8, seed=5, depth=2)

    eager = step(logits, ids, q)
    compiled = torch.compile(step, fullgraph=True, backend="eager")(logits, ids, q)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
