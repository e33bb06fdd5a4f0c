"""verify(..., mode="block"): block verification (csrc/core/block_verify.h) against its closed-form
law in float64, the target's law end to end, token-wise verification's expected accepted drafts
(computed exactly), greedy rows, one-hot drafts, argument errors, and fuzzing.

Laws: chi-square at stats_reference.ALPHA with fixed seeds; every law test also checks its power
on the same samples (the law with token-wise verification's UNWEIGHTED residual at the stop, the
bug the weighted residual guards against, is rejected)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_ext
from helpers import draws
from stats_reference import ALPHA, chi_square_pvalue, filtered_softmax64, joint_counts, softmax64, verify_joint


# ---- the rule in float64 (NOTES.md: Sun et al., checked there by exact enumeration) ----

def block_joint(p: np.ndarray, q: np.ndarray | None, draft: np.ndarray, n: int | None = None,
                weighted: bool = True) -> np.ndarray:
    """Exact P(tau = k, emitted token = t) [K+1, V] of block verification for one row.

    p [K+1, V] target laws, q [K, V] draft laws (None: one-hot at the drafts), draft [K];
    n drafts tested (None = K). weighted=False: the residual at the stop without the block
    weight (the planted bug the power checks reject)."""
    K1, V = p.shape
    K = K1 - 1
    n = K if n is None else n
    if q is None:
        q = np.zeros((K, V))
        q[np.arange(K), draft] = 1.0
    w = np.zeros(n + 1)
    w[0] = 1.0
    for j in range(1, n + 1):
        x = draft[j - 1]
        wp = w[j - 1] * p[j - 1, x]
        w[j] = 0.0 if wp <= 0 else (1.0 if wp >= q[j - 1, x] else wp / q[j - 1, x])
    h = np.zeros(n + 1)
    for j in range(1, n):
        r = np.maximum(w[j] * p[j] - q[j], 0.0).sum()
        d = r + 1.0 - w[j]
        h[j] = r / d if d > 0 and r > 0 else 0.0
    if n > 0:
        h[n] = w[n]
    out = np.zeros((K1, V))
    survive = 1.0  # P(no j' > j has u_j' < h_j')
    for j in range(n, -1, -1):
        p_tau = survive * (h[j] if j > 0 else 1.0)
        survive *= 1.0 - h[j] if j > 0 else 0.0
        if j == n:
            out[j] = p_tau * p[n]
            continue
        resid = np.maximum((w[j] if weighted else 1.0) * p[j] - q[j], 0.0)
        out[j] = p_tau * (resid / resid.sum() if resid.sum() > 0 else p[j])
    return out


def expected_accepted(p, q, K, block: bool) -> float:
    """E[accepted drafts] over drafts x_i ~ q_i (independent positions), by enumerating V^K."""
    V = p.shape[1]
    total = 0.0
    for xs in itertools.product(range(V), repeat=K):
        draft = np.array(xs)
        px = float(np.prod([q[i, x] for i, x in enumerate(xs)]))
        if px == 0:
            continue
        law = block_joint(p, q, draft) if block else verify_joint(p, q, draft)
        total += px * float((law.sum(1) * np.arange(K + 1)).sum())
    return total


def _laws(seed, K, V, spread=1.5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(K + 1, V, generator=g) * spread
    q = torch.softmax(torch.randn(K, V, generator=g) * spread, -1)
    return logits, q


def _run(logits, q, draft, B, temperature, seed=11, **kw):
    K1, V = logits.shape
    out = specdec_ext.verify(logits.expand(B, K1, V), draft.expand(B, K1 - 1),
                             None if q is None else q.expand(B, *q.shape), temperature, seed=seed, mode="block", **kw)
    assert bool(out.valid.all())
    return out


def _check_law(out, law, K, V, power_law=None):
    counts = joint_counts(out.tokens, out.num_accepted, K, V)
    pv = chi_square_pvalue(counts, law)
    assert pv > ALPHA, f"block verification's law rejected (p = {pv:.2e})"
    if power_law is not None:
        pw = chi_square_pvalue(counts, power_law)
        assert pw <= ALPHA, f"power: the planted law was not rejected (p = {pw:.2e})"


# ---- the rule itself ----

def test_rule_keeps_the_target_law_and_never_accepts_fewer_than_token_wise():
    """Exact enumeration (V = 3, K = 3, 40 random (p, q)): drafts x ~ q, block verification, then
    target sampling for the positions after the emitted ones, equals the target's joint law to
    1e-12; E[accepted] >= token-wise in every trial and > in most."""
    rng = np.random.default_rng(5)
    K, V = 3, 3
    better = 0
    for _ in range(40):
        p = rng.dirichlet(np.ones(V) * 0.7, size=K + 1)
        q = rng.dirichlet(np.ones(V) * 0.7, size=K)
        seq = np.zeros((V,) * (K + 1))
        for xs in itertools.product(range(V), repeat=K):
            draft = np.array(xs)
            px = float(np.prod([q[i, x] for i, x in enumerate(xs)]))
            law = block_joint(p, q, draft)
            for tau in range(K + 1):
                for y in range(V):
                    if law[tau, y] == 0:
                        continue
                    prefix = list(xs[:tau]) + [y]
                    rest = K + 1 - len(prefix)  # extended by target sampling at the later positions
                    for tail in itertools.product(range(V), repeat=rest):
                        pt = float(np.prod([p[len(prefix) + i, t] for i, t in enumerate(tail)]))
                        seq[tuple(prefix + list(tail))] += px * law[tau, y] * pt
        target = np.ones((V,) * (K + 1))
        for i in range(K + 1):
            target = target * p[i].reshape((1,) * i + (V,) + (1,) * (K - i))
        assert np.abs(seq - target).max() < 1e-12
        eb, et = expected_accepted(p, q, K, True), expected_accepted(p, q, K, False)
        assert eb >= et - 1e-12
        better += eb > et + 1e-9
    assert better >= 30


def test_one_hot_drafts_have_token_wise_law():
    """With q one-hot (draft_probs None) block verification's (tau, token) law is token-wise's."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        p = rng.dirichlet(np.ones(4), size=4)
        draft = rng.integers(0, 4, 3)
        assert np.abs(block_joint(p, None, draft) - verify_joint(p, None, draft)).max() < 1e-12


# ---- the kernel against the rule ----

def _telling_drafts(p, q, candidates, K):
    """The fixed drafts (from ``candidates`` per position) under which the law with the
    unweighted residual differs most from the true one (chi-square noncentrality per sample)."""
    def noncentrality(xs):
        a, b = block_joint(p, q, np.array(xs)), block_joint(p, q, np.array(xs), weighted=False)
        m = b > 1e-5
        return float(((a - b)[m] ** 2 / b[m]).sum())
    return torch.tensor(max(itertools.product(candidates, repeat=K), key=noncentrality))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("V", [6, 300])
def test_law_fixed_drafts(temperature, V):
    """(tau, emitted token) for fixed drafts, dense q near p (a realistic draft), K = 3: the
    closed form; the law with token-wise verification's unweighted residual at the stop is
    rejected on the same samples. V = 300 puts the mass on tokens in three race tiles.
    60000 rows in both tiers (milliseconds at these sizes)."""
    K = 3
    g = torch.Generator().manual_seed(1 + V)
    logits = torch.randn(K + 1, V, generator=g) * 1.5
    candidates = range(V)
    if V > 6:
        heavy = [3, 131, 262, 299]
        logits = logits - 6.0
        logits[:, heavy] += 6.0
        candidates = heavy
    q = torch.softmax(logits[:K] / temperature + 0.8 * torch.randn(K, V, generator=g), -1)
    p, qd = softmax64(logits, temperature), q.double().numpy()
    draft = _telling_drafts(p, qd, candidates, K)
    out = _run(logits, q, draft, 60000, temperature)
    _check_law(out, block_joint(p, qd, draft.numpy()), K, V,
               power_law=block_joint(p, qd, draft.numpy(), weighted=False))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_law_end_to_end_sampled_drafts(temperature):
    """Drafts sampled from q per row, verified in block mode: the first two emitted tokens, each
    row extended by target sampling where it emitted fewer, follow the target law p0 x p1."""
    K, V = 3, 5
    logits, q = _laws(3, K, V)
    B = draws(60000, 20000)
    g = torch.Generator().manual_seed(4)
    draft = torch.stack([torch.multinomial(q[i], B, replacement=True, generator=g) for i in range(K)], 1)
    out = specdec_ext.verify(logits.expand(B, K + 1, V), draft, q.expand(B, K, V), temperature, seed=9, mode="block")
    assert bool(out.valid.all())
    p = softmax64(logits, temperature)
    second = out.tokens[:, 1].clone()
    short = out.num_accepted == 0  # one token emitted: the second from the target at position 1
    second[short] = torch.multinomial(torch.from_numpy(p[1]).float(), int(short.sum()), replacement=True,
                                      generator=g)
    counts = torch.bincount(out.tokens[:, 0] * V + second, minlength=V * V).numpy()
    pv = chi_square_pvalue(counts, np.outer(p[0], p[1]))
    assert pv > ALPHA, pv
    # more drafts accepted on average than token-wise verification with the same drafts
    tw = specdec_ext.verify(logits.expand(B, K + 1, V), draft, q.expand(B, K, V), temperature, seed=9)
    assert float(out.num_accepted.double().mean()) > float(tw.num_accepted.double().mean())


def test_law_filters_and_ragged_rows():
    """top-k 40 + top-p 0.9 at V = 300 (survivors in several tiles, the mass on four tokens in three
    tiles), rows testing 3, 1 and 0 drafts: each row's closed form on its filtered law (q: a noisy
    copy of p on p's support, as the draft's own filtered law would be); the unweighted residual
    is rejected at 3 drafts."""
    K, V = 3, 300
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(K + 1, V, generator=g)
    heavy = [5, 140, 270, 290]
    logits[:, heavy] += torch.rand(K + 1, 4, generator=g) * 2 + 3
    p = np.stack([filtered_softmax64(logits[i], 0.9, top_k=40, top_p=0.9) for i in range(K + 1)])
    qd = torch.softmax(logits[:K] / 0.9 + 0.8 * torch.randn(K, V, generator=g), -1).double().numpy() * (p[:K] > 0)
    qd /= qd.sum(1, keepdims=True)
    q = torch.from_numpy(qd).float()
    draft = _telling_drafts(p, qd, heavy, K)
    B = 60000
    for n in (3, 1, 0):
        out = _run(logits, q, draft, B, 0.9, seed=20 + n, top_k=40, top_p=0.9,
                   num_drafts=torch.full((B,), n, dtype=torch.int64))
        assert bool((out.tokens[:, n + 1:] == -1).all())
        _check_law(out, block_joint(p, qd, draft.numpy(), n=n), K, V,
                   power_law=block_joint(p, qd, draft.numpy(), n=n, weighted=False) if n == 3 else None)


def test_greedy_rows_are_verify():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 4, 50, generator=g)
    draft = logits[:, :3].argmax(-1)
    draft[::3, 1] = (draft[::3, 1] + 1) % 50
    q = torch.softmax(torch.randn(8, 3, 50, generator=g), -1)
    a = specdec_ext.verify(logits, draft, q, 0.0, seed=1, mode="block")
    b = specdec_ext.verify(logits, draft, q, 0.0, seed=1)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)


def test_logprobs_and_reproducibility():
    logits, q = _laws(8, 3, 40)
    B = 6
    draft = torch.randint(0, 40, (B, 3), generator=torch.Generator().manual_seed(1))
    args = (logits.expand(B, 4, 40), draft, q.expand(B, 3, 40), 0.8)
    a, lp = specdec_ext.verify(*args, seed=5, mode="block", logprobs=2, logprobs_mode="processed")
    b = specdec_ext.verify(*args, seed=5, mode="block")
    assert torch.equal(a.tokens, b.tokens)
    ref = torch.log_softmax(logits.double() / 0.8, -1)
    for r in range(B):
        for i in range(int(a.num_accepted[r]) + 1):
            assert abs(float(lp.token_logprobs[r, i]) - float(ref[i, a.tokens[r, i]])) < 1e-5
        assert bool(lp.token_logprobs[r, int(a.num_accepted[r]) + 1:].isnan().all())
    assert lp.top_ids.shape == (B, 4, 2)


def test_errors_name_the_argument():
    logits, q = _laws(8, 2, 10)
    with pytest.raises(ValueError, match="mode"):
        specdec_ext.verify(logits[None], torch.zeros(1, 2, dtype=torch.long), q[None], mode="blocks")
    with pytest.raises(ValueError, match="draft_probs"):
        specdec_ext.verify(logits[None], torch.zeros(1, 2, dtype=torch.long), q[None, :1], mode="block")
    with pytest.raises(ValueError, match="num_drafts"):
        specdec_ext.verify(logits[None], torch.zeros(1, 2, dtype=torch.long), q[None], mode="block",
                           num_drafts=torch.tensor([3]))


def test_invalid_rows():
    """NaN logits, bad q entries and out-of-range drafts make exactly their rows invalid."""
    logits, q = _laws(9, 2, 10)
    L, Q = logits.repeat(4, 1, 1), q.repeat(4, 1, 1)
    draft = torch.tensor([[1, 2]] * 4)
    L[1, 2, 3] = float("nan")
    Q[2, 1, 4] = -1.0  # read: the residual mass of draft 2's position
    out = specdec_ext.verify(L, draft, Q, 1.0, seed=0, mode="block")
    assert out.valid.tolist() == [True, False, False, True]
    assert bool((out.tokens[1:3] == -1).all())


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(B=st.integers(0, 4), K=st.integers(0, 4), V=st.integers(1, 300), dtype=st.sampled_from(DTYPES),
       strided=st.booleans(), one_hot=st.booleans(), scale=st.sampled_from([1e-3, 1.0, 30.0, 3e38]),
       temperature=st.sampled_from([0.0, 1e-3, 1.0, 5.0]), seed=st.integers(0, 2 ** 16))
def test_fuzz_verify_block(B, K, V, dtype, strided, one_hot, scale, temperature, seed):
    """Random shapes (B = 0, K = 0 included), strided views, one-hot or dense drafts, extreme scales
    and temperatures: a valid row emits its first num_accepted drafts then a token in [0, V) and -1
    after; a row is invalid iff a logit is NaN / +inf after the dtype cast (the q rows are laws);
    the same seed gives the same tokens from contiguous copies; inputs are not written."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, K + 1, 2 * V, generator=g) * scale
    logits = (base[..., ::2] if strided else base[..., :V]).to(dtype)
    qb = torch.softmax(torch.randn(B, K, 2 * V, generator=g), -1)
    q = None if one_hot else (qb[..., ::2] / qb[..., ::2].sum(-1, keepdim=True) if strided else qb[..., :V]).to(dtype)
    draft = torch.randint(0, V, (B, K), generator=g)
    before = (logits.clone(), None if q is None else q.clone(), draft.clone())
    out = specdec_ext.verify(logits, draft, q, temperature, seed=seed, mode="block")
    assert torch.equal(logits, before[0]) and torch.equal(draft, before[2])
    assert q is None or torch.equal(q, before[1])
    assert out.tokens.shape == (B, K + 1) and out.num_accepted.shape == (B,)
    x = logits.float().reshape(B, (K + 1) * V)
    nan_or_inf = (x.isnan() | (x == float("inf"))).any(-1)  # always invalid
    finite = torch.isfinite(x).all(-1)  # always valid (-inf rows: invalid iff a visited position is all -inf)
    assert not bool((out.valid & nan_or_inf).any()) and bool(out.valid[finite].all())
    for b in range(B):
        if not out.valid[b]:
            assert bool((out.tokens[b] == -1).all()) and int(out.num_accepted[b]) == 0
            continue
        a = int(out.num_accepted[b])
        assert torch.equal(out.tokens[b, :a], draft[b, :a])
        assert 0 <= int(out.tokens[b, a]) < V and bool((out.tokens[b, a + 1:] == -1).all())
    again = specdec_ext.verify(logits.contiguous(), draft, None if q is None else q.contiguous(), temperature,
                               seed=seed, mode="block")
    assert torch.equal(again.tokens, out.tokens)
