"""verify_tree_torch (the plain-PyTorch tree verifier: benchmark baseline and oracle) on a
tiny vocabulary against closed-form enumeration of the algorithm, which is itself checked
to emit the target's law whatever the drafted tree (i.i.d. and deterministic children)."""
import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from helpers import draws
from specdec_ext.bench.tree_baseline import verify_tree_torch
from stats_reference import ALPHA, chi_square_pvalue, verify_joint

V = 3
PARENTS = [-1, 0, 0, 1, 1, 2]    # root with two children, each with two children (depth 2)


def children(parents):
    return {n: [c for c in range(1, len(parents)) if parents[c] == n] for n in range(len(parents))}


def exact_law(p, q, ids, parents):
    """{emitted token tuple: probability} of one row, by enumerating the walk's decisions.
    p [N, V] target law per node, q [N, V] draft law per node (None: deterministic)."""
    kids, out = children(parents), Counter()

    def walk(n, prefix, mass):
        r = p[n].copy()
        for c in kids[n]:
            x = ids[c]
            if q is None:
                a = r[x]
            else:
                a = min(1.0, r[x] / q[n][x]) if q[n][x] > 0 else float(r[x] > 0)
            if a > 0:
                walk(c, prefix + (x,), mass * a)
            mass *= 1.0 - a
            new = r.copy()
            if q is None:
                new[x] = 0.0
            else:
                new = np.maximum(r - q[n], 0.0)
            r = new / new.sum() if new.sum() > 0 else r
        for v in range(V):
            if mass * r[v] > 0:
                out[prefix + (v,)] += mass * r[v]

    walk(0, (), 1.0)
    return out


def context_laws(seed, temperature=1.0):
    """Target and draft laws as functions of the context (the path's tokens): the same
    context gives the same law at any node, as for a real model."""
    g = np.random.default_rng(seed)
    contexts = [()] + [(a,) for a in range(V)] + [(a, b) for a in range(V) for b in range(V)]
    soft = lambda x: np.exp(x / temperature) / np.exp(x / temperature).sum()  # noqa: E731
    target = {c: soft(g.normal(size=V) * 1.5) for c in contexts}
    draft = {c: soft(target_logit + g.normal(size=V)) for c, target_logit in
             ((c, np.log(target[c]) * temperature) for c in contexts)}
    return target, draft


def node_contexts(ids, parents):
    ctx = [()]
    for n in range(1, len(parents)):
        ctx.append(ctx[parents[n]] + (ids[n],))
    return ctx


@pytest.mark.parametrize("mode", ["sampled", "topk"])
def test_algorithm_emits_the_target_law(mode):
    """Closed form: averaged over the drafted tree (children i.i.d. from q, or the draft's
    top-2), the first token follows p(.|root) and the second, given the first, p(.|first)."""
    target, draft = context_laws(0)
    total = Counter()
    if mode == "sampled":
        trees = []
        for toks in itertools.product(range(V), repeat=len(PARENTS) - 1):
            ids = (0,) + toks
            ctx = node_contexts(ids, PARENTS)
            weight = np.prod([draft[ctx[PARENTS[n]]][ids[n]] for n in range(1, len(PARENTS))])
            trees.append((ids, weight))
    else:
        ids = [0, *np.argsort(-draft[()])[:2]]
        ids += [int(t) for n in (1, 2) for t in np.argsort(-draft[(ids[n],)])[:2]]
        trees = [(tuple(ids), 1.0)]
    for ids, weight in trees:
        ctx = node_contexts(ids, PARENTS)
        p = np.stack([target[c] for c in ctx])
        q = np.stack([draft[c] for c in ctx]) if mode == "sampled" else None
        for seq, prob in exact_law(p, q, ids, PARENTS).items():
            total[seq] += weight * prob
    assert sum(total.values()) == pytest.approx(1.0, abs=1e-12)
    first = np.array([sum(v for s, v in total.items() if s[0] == a) for a in range(V)])
    np.testing.assert_allclose(first, target[()], atol=1e-12)
    for a in range(V):
        second = np.array([sum(v for s, v in total.items() if len(s) > 1 and s[:2] == (a, b)) for b in range(V)])
        if second.sum() > 0:
            np.testing.assert_allclose(second / second.sum(), target[(a,)], atol=1e-12)


@pytest.mark.law
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("mode", ["sampled", "topk"])
def test_baseline_matches_enumeration(mode, temperature):
    """Many rows of one fixed input (a repeated sibling token included): the emitted token
    sequences follow the enumerated law (chi-square)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(len(PARENTS), V, generator=g, dtype=torch.float64) * 1.5
    q = torch.softmax(logits + torch.randn(len(PARENTS), V, generator=g, dtype=torch.float64), -1)
    ids = [0, 1, 1, 0, 2, 1] if mode == "sampled" else [0, 1, 2, 0, 2, 1]
    p = torch.softmax(logits / temperature, -1).numpy()
    law = exact_law(p, q.numpy() if mode == "sampled" else None, ids, PARENTS)
    B = draws(30000)
    tokens, path, num_accepted, valid = verify_tree_torch(
        logits.float().expand(B, -1, -1), torch.tensor(ids).expand(B, -1), PARENTS,
        q.float().expand(B, -1, -1) if mode == "sampled" else None, temperature,
        generator=torch.Generator().manual_seed(2))
    assert valid.all() and tokens.shape == (B, 3) and path.shape == (B, 3)
    seqs = [tuple(t[:n + 1]) for t, n in zip(tokens.tolist(), num_accepted.tolist())]
    keys = sorted(law)
    counts = Counter(seqs)
    assert set(counts) <= set(keys)
    assert chi_square_pvalue(np.array([counts[k] for k in keys]), np.array([law[k] for k in keys])) > ALPHA
    # the path names the accepted nodes: their tokens are the emitted ones
    tok = torch.tensor(ids)
    for t, pth, n in zip(tokens[:200].tolist(), path[:200].tolist(), num_accepted[:200].tolist()):
        assert [int(tok[i]) for i in pth[1:n + 1]] == t[:n] and pth[0] == 0 and all(x == -1 for x in pth[n + 1:])


def test_greedy_and_invalid_rows():
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]])
    logits = logits.expand(3, -1, -1).clone()
    ids = torch.tensor([[0, 2, 1, 0, 0, 0]]).expand(3, -1).clone()
    logits[1, 4, 0] = float("nan")
    ids[2, 3] = V
    tokens, path, n, valid = verify_tree_torch(logits, ids, PARENTS, None, 0.0)
    # row 0: argmax 1 is node 2's token; at node 2 the argmax 2 is not among its children (0, 1) -> emitted
    assert tokens[0].tolist() == [1, 2, -1] and path[0].tolist() == [0, 2, -1] and n[0] == 1 and valid[0]
    assert valid.tolist() == [True, False, False]
    assert (tokens[1:] == -1).all() and (path[1:] == -1).all() and (n[1:] == 0).all()


@pytest.mark.law
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_chain_tree_law_is_leviathan(temperature):
    """At T > 0 a chain-shaped tree with draft_probs has chain verification's law: the joint
    law of (accepted drafts, emitted token) of one row repeated N times is Leviathan's closed
    form (stats_reference.verify_joint on softmax(logits / T)), by chi-square at
    stats_reference.ALPHA; the draft laws drawn unlike the target's so most rows reject."""
    g = torch.Generator().manual_seed(8)
    K, W, N = 3, 7, draws(12000, 4000)
    logits = torch.randn(1, K + 1, W, generator=g) * 1.5
    q = torch.softmax(torch.randn(1, K + 1, W, generator=g) * 1.5, -1)
    drafts = torch.tensor([[int(torch.multinomial(q[0, i], 1, generator=g)) for i in range(K)]])
    tree_ids = torch.cat([torch.zeros(1, 1, dtype=torch.int64), drafts], 1)
    tokens, _, n, valid = verify_tree_torch(logits.expand(N, -1, -1), tree_ids.expand(N, -1), [-1, 0, 1, 2],
                                            q.expand(N, -1, -1), temperature,
                                            generator=torch.Generator().manual_seed(9))
    assert valid.all()
    last = tokens.gather(1, n.view(-1, 1)).view(-1)
    counts = torch.bincount(n * W + last, minlength=(K + 1) * W).numpy()
    p = torch.softmax(logits[0].double() / temperature, -1).numpy()
    law = verify_joint(p, q[0, :K].double().numpy(), drafts[0].numpy()).reshape(-1)
    assert chi_square_pvalue(counts, law) > ALPHA


def test_chain_tree_is_leviathan():
    """A chain-shaped tree with draft_probs walks like chain verification: greedy rows give
    the same tokens as specdec_ext.verify."""
    import specdec_ext

    g = torch.Generator().manual_seed(3)
    B, K, W = 4, 3, 11
    logits = torch.randn(B, K + 1, W, generator=g)
    drafts = logits[:, :K].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % W
    q = torch.softmax(torch.randn(B, K + 1, W, generator=g), -1)
    tree_ids = torch.cat([torch.zeros(B, 1, dtype=torch.int64), drafts], 1)
    got = verify_tree_torch(logits, tree_ids, [-1, 0, 1, 2], q, 0.0)
    ref = specdec_ext.verify(logits, drafts, q[:, :K], 0.0)
    assert torch.equal(got[0], ref.tokens) and torch.equal(got[2], ref.num_accepted)
