"""top-k / top-p / min-p inside verify and sample, per-row draft counts and coupled mode:
goodness of fit of the emitted laws against the filtered target law computed in float64 by
sorting (stats_reference.filtered_softmax64), Pearson chi-square at ALPHA; plus the coupled
contract, argument errors, opcheck and torch.compile.

The filtered laws run over vocabularies of several 128-token tiles (V = 300 and 1000, the
likely tokens of stats_reference.tiled_logits spread over every tile) at two temperatures,
so that a filter decided within one tile, or a survivor lost when the tiles' candidates are
merged, changes the law (test_power_tile_local_filters_are_rejected plants that bug)."""
import numpy as np
import pytest
import torch

import specdec_ext
from helpers import draws
from stats_reference import (ALPHA, chi_square_pvalue, filtered_softmax64, joint_counts, tiled_logits,
                             verify_joint)

N_DRAWS = draws(60_000)
#: the draws of a law at V = 300 / 1000 (rows broadcast, so memory is N x (K + 1) x V)
N_TILED = draws(30_000)
TILE = 128

FILTERS = {
    "top_k": dict(top_k=20),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.1),
    "all": dict(top_k=30, top_p=0.9, min_p=0.05),
    "top_p_after_top_k": dict(top_k=12, top_p=0.6),
}


def _logits(K1, V, seed, dtype=torch.float32, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(K1, V, generator=g) * scale).to(dtype)


def _tiles(p):
    """The 128-token tiles holding a surviving token of the law(s) p [..., V]."""
    return set((np.flatnonzero((np.asarray(p) > 0).reshape(-1, p.shape[-1]).any(0)) // TILE).tolist())


def _filtered_draft(K, V, filt, seed, temperature=1.0, target=None):
    """A draft law q' [K, V] (a different model's logits under the SAME filters) and draft
    ids [K] drawn from it. With ``target`` [K+1, V] logits the draft model is correlated with
    the target (its logits plus noise) and each draft is drawn among the tokens the filtered
    target keeps (p'(x) > 0), so the ratio test can accept it: the filtered acceptance path."""
    g = torch.Generator().manual_seed(seed + 1)
    noise = _logits(K, V, seed + 2)
    draft_logits = noise if target is None else target[:K].float() + 0.5 * noise
    q = torch.from_numpy(filtered_softmax64(draft_logits, temperature, **filt)).float()
    pick = q if target is None else q * torch.from_numpy(filtered_softmax64(target[:K], temperature, **filt) > 0)
    return q, torch.multinomial(pick, 1, generator=g).view(K)


def _expand(t, n):
    return t.unsqueeze(0).expand(n, *t.shape)


def _joint_pvalue(res, p, q, draft, K, V):
    assert res.valid.all()
    return chi_square_pvalue(joint_counts(res.tokens, res.num_accepted, K, V), verify_joint(p, q, draft))


# (K, logits dtype, V, temperature): every filter at both vocabularies, both temperatures, both dtypes
VERIFY_CASES = [(2, torch.float32, 300, 0.7), (1, torch.float32, 1000, 1.3), (1, torch.bfloat16, 1000, 0.7)]


@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("K,dtype,V,T", VERIFY_CASES, ids=lambda c: str(c).replace("torch.", ""))
def test_filtered_verify_law(name, K, dtype, V, T, device):
    """The joint law of (accepted drafts, emitted token) under each filter, with drafts the
    filtered target can accept (the filtered ratio test, the filtered residual, the bonus)."""
    filt = FILTERS[name]
    logits = tiled_logits(K + 1, V, seed=K * 7 + len(name)).to(dtype)
    q, draft = _filtered_draft(K, V, filt, seed=11 + K, temperature=T, target=logits)
    res = specdec_ext.verify(_expand(logits, N_TILED).to(device), _expand(draft, N_TILED).to(device),
                             _expand(q, N_TILED).to(device), T, seed=5, **filt)
    p = filtered_softmax64(logits, T, **filt)
    assert len(_tiles(p)) >= 2  # the survivors span tiles
    assert (p[np.arange(K), draft.numpy()] > 0).all()  # every draft can be accepted
    assert res.num_accepted.float().mean().item() > 0.1
    assert _joint_pvalue(res, p, q.double().numpy(), draft.numpy(), K, V) > ALPHA


# (logits dtype, V, temperature)
SAMPLE_CASES = [(torch.float32, 300, 0.7), (torch.float32, 1000, 1.3), (torch.bfloat16, 1000, 0.7)]


def _sample_law_pvalue(sample, name, dtype, V, T, device):
    """p-value of N_TILED draws of ``sample`` (specdec_ext.sample's signature) from one row
    of tiled logits under FILTERS[name], against the filtered law."""
    filt = FILTERS[name]
    logits = tiled_logits(1, V, seed=3 + len(name) + V).to(dtype)[0]
    p = filtered_softmax64(logits, T, **filt)
    assert len(_tiles(p)) >= 2  # the survivors span tiles
    tokens = sample(_expand(logits, N_TILED).to(device), T, seed=9, **filt)
    return chi_square_pvalue(torch.bincount(tokens.cpu(), minlength=V).numpy(), p)


@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("dtype,V,T", SAMPLE_CASES, ids=lambda c: str(c).replace("torch.", ""))
def test_filtered_sample_law_and_probs(name, dtype, V, T, device):
    """sample's law under each filter, and the filtered probabilities it writes (probs_out)."""
    assert _sample_law_pvalue(specdec_ext.sample, name, dtype, V, T, device) > ALPHA
    logits = tiled_logits(1, V, seed=3 + len(name) + V).to(dtype)
    p = filtered_softmax64(logits[0], T, **FILTERS[name])
    probs = torch.full((4, V), -1.0, device=device)
    specdec_ext.sample(_expand(logits[0], 4).to(device), T, seed=9, probs_out=probs, **FILTERS[name])
    written = probs.double().cpu().numpy()
    assert (np.equal(written > 0, p > 0)).all()  # exactly the surviving tokens, every row
    assert np.abs(written - p).max() < 1e-5


def _first_tile_law(logits, T, top_k=0, top_p=1.0, min_p=0.0):
    """A planted bug's law: each filter's threshold (the k-th largest logit, the top-p cut,
    the max probability of min-p) taken over the first 128-token tile only, then applied to
    the whole row. It is the filtered law whenever V <= 128."""
    x = logits.detach().cpu().double()
    first = x[..., :TILE]
    p = torch.softmax(x / T, -1)
    keep = torch.ones_like(x, dtype=torch.bool)
    if 0 < top_k < first.shape[-1]:
        keep &= x >= torch.topk(first, top_k, -1).values[..., -1:]
    if top_p < 1.0:
        pf = torch.from_numpy(filtered_softmax64(first, T, top_k=top_k, top_p=top_p))
        cut = torch.where(pf > 0, first, torch.full_like(first, float("inf"))).min(-1, keepdim=True).values
        keep &= x >= cut
    if min_p > 0.0:
        keep &= p >= min_p * torch.softmax(x / T, -1)[..., :TILE].max(-1, keepdim=True).values
    out = torch.where(keep, p, torch.zeros_like(p))
    return (out / out.sum(-1, keepdim=True)).numpy()


@pytest.mark.parametrize("name", list(FILTERS))
def test_power_tile_local_filters_are_rejected(name):
    """The planted bug of _first_tile_law (filters decided within the first tile): a sampler
    drawing from it passes the single-tile laws these tests replaced (V = 40: the law is the
    same, number for number) and is rejected by _sample_law_pvalue at V = 300 and at V = 1000."""
    def planted(logits, T, seed, **filt):
        law = torch.from_numpy(_first_tile_law(logits[:1], T, **filt)[0])
        return torch.multinomial(law, logits.shape[0], replacement=True, generator=torch.Generator().manual_seed(seed))

    small = _logits(1, 40, seed=3 + len(name))
    assert np.array_equal(_first_tile_law(small, 1.2, **FILTERS[name]), filtered_softmax64(small, 1.2, **FILTERS[name]))
    assert _sample_law_pvalue(planted, name, torch.float32, 300, 0.7, "cpu") < ALPHA
    assert _sample_law_pvalue(planted, name, torch.float32, 1000, 1.3, "cpu") < ALPHA


def test_ties_at_the_top_k_boundary_are_kept(device):
    """Logits 3, 2, 2, 2, 1, 0: top_k = 2 keeps all three 2s (their logit equals the 2nd largest)."""
    logits = torch.tensor([1.0, 2.0, 3.0, 2.0, 0.0, 2.0]).log1p()
    p = filtered_softmax64(logits, 1.0, top_k=2)
    assert (p > 0).sum() == 4
    tokens = specdec_ext.sample(_expand(logits, N_DRAWS).to(device), 1.0, top_k=2, seed=1)
    assert chi_square_pvalue(torch.bincount(tokens.cpu(), minlength=6).numpy(), p) > ALPHA


def test_per_row_filters_mix(device):
    """[B] filter tensors: four interleaved groups of rows with different filters (one
    unfiltered), each group's law checked on its own; V = 300 (three tiles), T = 0.8."""
    V, T, groups = 300, 0.8, 4
    logits = tiled_logits(2, V, seed=21)
    top_k = torch.tensor([0, 8, 0, 20]).repeat(N_TILED // groups)
    top_p = torch.tensor([1.0, 1.0, 0.7, 0.9]).repeat(N_TILED // groups)
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1]).repeat(N_TILED // groups)
    n = top_k.numel()
    draft = torch.tensor([int(logits[0].argmax())])
    res = specdec_ext.verify(_expand(logits, n).to(device), _expand(draft, n).to(device), None, T, seed=3,
                             top_k=top_k.to(device), top_p=top_p.to(device), min_p=min_p.to(device))
    for g in range(groups):
        sel = torch.arange(g, n, groups)
        filt = dict(top_k=int(top_k[g]), top_p=float(top_p[g]), min_p=float(min_p[g]))
        sub = specdec_ext.VerifyResult(res.tokens[sel], res.num_accepted[sel], res.valid[sel])
        assert _joint_pvalue(sub, filtered_softmax64(logits, T, **filt), None, draft.numpy(), 1, V) > ALPHA, g


def test_power_unfiltered_q_with_filtered_drafts_is_detected(device):
    """Hugging Face assisted generation's bug: drafts drawn from the filtered draft law but
    q passed unfiltered. The emitted law is then wrong, and the same test must say so."""
    K, V, T, filt = 1, 40, 1.0, dict(top_k=3)
    logits = _logits(K + 1, V, seed=2, scale=3.0)
    draft_logits = 0.3 * logits[:K]  # a flatter draft: its top 3 are the target's
    q_filtered = torch.from_numpy(filtered_softmax64(draft_logits, T, **filt)).float()
    q_unfiltered = torch.softmax(draft_logits, -1)
    g = torch.Generator().manual_seed(0)
    draft = torch.multinomial(q_filtered.expand(N_DRAWS, V), 1, generator=g).view(N_DRAWS, K)
    p = filtered_softmax64(logits, T, **filt)
    for q, correct in ((q_filtered, True), (q_unfiltered, False)):
        res = specdec_ext.verify(_expand(logits, N_DRAWS).to(device), draft.to(device), _expand(q, N_DRAWS).to(device),
                                 T, seed=8, **filt)
        # position-0 law: p' whatever the draft was, if q is the law drafts were drawn from
        first = res.tokens[:, 0].cpu()
        pval = chi_square_pvalue(torch.bincount(first, minlength=V).numpy(), p[0])
        assert (pval > ALPHA) == correct, (correct, pval)


def test_ragged_num_drafts_joint_law(device):
    """Rows with num_drafts 0..K in one call (one-hot drafts): each group's joint law of
    (accepted count, token) is the closed form of a K = num_drafts row; tokens after the
    row's bonus position are -1, and num_drafts = 0 is plain sampling from position 0.
    V = 300, T = 1.3 (top-p 0.9 keeps tokens in every tile)."""
    K, V, T, filt = 3, 300, 1.3, dict(top_p=0.9)
    logits = tiled_logits(K + 1, V, seed=31)
    p = filtered_softmax64(logits, T, **filt)
    draft = torch.from_numpy(p[:K].argmax(-1))  # likely drafts: every group reaches deep positions
    nd = torch.arange(K + 1).repeat(N_TILED // (K + 1))
    n = nd.numel()
    res = specdec_ext.verify(_expand(logits, n).to(device), _expand(draft, n).to(device), None, T, seed=4,
                             num_drafts=nd.to(device), **filt)
    assert res.valid.all()
    for k in range(K + 1):
        sel = nd == k
        assert (res.num_accepted[sel.to(device)] <= k).all()
        assert (res.tokens[sel.to(device)][:, k + 1:] == -1).all()
        sub = specdec_ext.VerifyResult(res.tokens[sel.to(device)][:, :k + 1], res.num_accepted[sel.to(device)],
                                       res.valid[sel.to(device)])
        assert _joint_pvalue(sub, p[:k + 1], None, draft[:k].numpy(), k, V) > ALPHA, k


def test_ragged_rows_mix_greedy_one_hot_and_dense(device):
    """One call: greedy rows, one-hot rows and dense-q rows with different num_drafts.
    verify with a [B, K, V] q reads only the rows' own q; greedy rows are argmax chains."""
    K, V = 2, 25
    logits = _logits(K + 1, V, seed=41)
    q, draft = _filtered_draft(K, V, {}, seed=43)
    n = draws(30_000)
    temps = torch.tensor([0.0, 1.0, 1.0]).repeat(n // 3)
    nd = torch.tensor([2, 1, 2]).repeat(n // 3)
    res = specdec_ext.verify(_expand(logits, n).to(device), _expand(draft, n).to(device), _expand(q, n).to(device),
                             temps.to(device), seed=6, num_drafts=nd.to(device))
    assert res.valid.all()
    greedy = res.tokens[0::3].cpu()
    arg = logits.argmax(-1)
    stop = next((i for i in range(K) if draft[i] != arg[i]), K)
    assert (greedy[:, stop] == arg[stop]).all() and (res.num_accepted[0::3] == stop).all()
    p = filtered_softmax64(logits, 1.0)
    for start, k in ((1, 1), (2, 2)):
        sub = specdec_ext.VerifyResult(res.tokens[start::3][:, :k + 1], res.num_accepted[start::3],
                                       res.valid[start::3])
        assert _joint_pvalue(sub, p[:k + 1], q[:k].double().numpy(), draft[:k].numpy(), k, V) > ALPHA


@pytest.mark.parametrize("filt", [{}, dict(top_p=0.85, top_k=20)])
def test_coupled_marginal_law(filt, device):
    """Coupled mode with fixed drafts: the target's own samples are independent across
    positions (offsets differ), so the joint law equals the one-hot closed form, and every
    emitted token follows p'. V = 300, T = 0.7."""
    K, V, T = 2, 300, 0.7
    logits = tiled_logits(K + 1, V, seed=51)
    p = filtered_softmax64(logits, T, **filt)
    draft = torch.from_numpy(p[:K].argmax(-1))
    res = specdec_ext.verify(_expand(logits, N_TILED).to(device), _expand(draft, N_TILED).to(device), None, T,
                             seed=12, mode="coupled", **filt)
    assert _joint_pvalue(res, p, None, draft.numpy(), K, V) > ALPHA


def test_coupled_contract_token_equals_sample_at_offset_plus_i(device):
    """The contract: the token emitted or matched at position i of row b is
    sample(target_logits[b, i], T, filters, seed=seed[b], offset=offset[b] + i)."""
    B, K, V = 64, 4, 200
    g = torch.Generator().manual_seed(0)
    L = (torch.randn(B, K + 1, V, generator=g) * 2).to(device)
    seeds = torch.randint(0, 2**40, (B,), generator=g).to(device)
    offsets = torch.randint(0, 1000, (B,), generator=g).to(device)
    filt = dict(top_k=torch.randint(0, 20, (B,), generator=g).to(device),
                top_p=(torch.rand(B, generator=g) * 0.5 + 0.5).to(device))
    temps = (torch.rand(B, generator=g) + 0.5).to(device)
    nd = torch.randint(0, K + 1, (B,), generator=g).to(device)
    own = torch.stack([specdec_ext.sample(L[:, i], temps, seed=seeds, offset=offsets + i, **filt)
                       for i in range(K + 1)], 1)
    draft = own[:, :K].clone()
    draft[::2, 1] = (draft[::2, 1] + 1) % V  # even rows mismatch at position 1
    res = specdec_ext.verify(L, draft, None, temps, seed=seeds, offset=offsets, num_drafts=nd, mode="coupled",
                             **filt)
    assert res.valid.all()
    for b in range(B):
        j, n = int(res.num_accepted[b]), int(nd[b])
        expect_j = min(n, 1) if b % 2 == 0 else n
        assert j == expect_j, b
        assert torch.equal(res.tokens[b, :j + 1], own[b, :j + 1]), b
        assert (res.tokens[b, j + 1:] == -1).all()
    # batch makeup does not matter with per-row seeds: reversed rows give reversed results
    rev = torch.arange(B - 1, -1, -1, device=device)
    res_rev = specdec_ext.verify(L[rev], draft[rev], None, temps[rev], seed=seeds[rev], offset=offsets[rev],
                                 num_drafts=nd[rev], mode="coupled", **{k: v[rev] for k, v in filt.items()})
    assert torch.equal(res_rev.tokens, res.tokens[rev])


def test_greedy_rows_ignore_filters(device):
    L = _logits(3, 50, seed=61).unsqueeze(0).to(device)
    arg = L[0].argmax(-1)
    res = specdec_ext.verify(L, arg[:2].view(1, 2), None, 0.0, top_k=1, top_p=0.01, min_p=0.99, seed=1)
    assert torch.equal(res.tokens[0], arg) and int(res.num_accepted) == 2


def test_no_filter_values_are_the_unfiltered_ops(device):
    """Off values (top_k=0, top_p=1, min_p=0) are the plain ops, number for number."""
    L = _logits(3, 100, seed=71).unsqueeze(0).expand(50, 3, 100).contiguous().to(device)
    D = torch.randint(0, 100, (50, 2)).to(device)
    a = specdec_ext.verify(L, D, None, 1.0, seed=3)
    b = specdec_ext.verify(L, D, None, 1.0, seed=3, top_k=0, top_p=1.0, min_p=0.0)
    c = specdec_ext.verify(L, D, None, 1.0, seed=3, top_k=torch.zeros(50, dtype=torch.int64, device=device))
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a, b, c))


BAD = [
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_k=2.5), TypeError, "top_k"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.01), ValueError, "top_p"),
    (dict(min_p=1.0), ValueError, "min_p"),
    (dict(min_p=-0.1), ValueError, "min_p"),
    (dict(top_p=float("nan")), ValueError, "top_p"),
    (dict(top_k=torch.tensor([1, -2])), ValueError, "top_k"),
    (dict(top_p=torch.tensor([0.5, 1.5])), ValueError, "top_p"),
    (dict(min_p=torch.tensor([0.5, 1.0])), ValueError, "min_p"),
    (dict(top_k=torch.tensor([1.0, 2.0])), TypeError, "top_k"),
    (dict(top_p=torch.tensor([1, 1])), TypeError, "top_p"),
    (dict(top_p=torch.tensor([0.5, 0.5, 0.5])), ValueError, "top_p"),
]


@pytest.mark.parametrize("kwargs,err,name", BAD)
def test_bad_filter_values_are_clear_errors_and_write_nothing(kwargs, err, name):
    L = torch.randn(2, 3, 10)
    probs = torch.full((2, 10), 7.0)
    with pytest.raises(err, match=name):
        specdec_ext.sample(L[:, 0], 1.0, probs_out=probs, **kwargs)
    assert (probs == 7.0).all()
    with pytest.raises(err, match=name):
        specdec_ext.verify(L, torch.zeros(2, 2, dtype=torch.int64), None, 1.0, **kwargs)


def test_bad_num_drafts_and_mode():
    L, D = torch.randn(2, 3, 10), torch.zeros(2, 2, dtype=torch.int64)
    for nd, err in ((torch.tensor([0, 3]), ValueError), (torch.tensor([-1, 0]), ValueError),
                    (torch.tensor([1]), ValueError), (torch.tensor([1.0, 1.0]), TypeError), ([1, 1], TypeError)):
        with pytest.raises(err, match="num_drafts"):
            specdec_ext.verify(L, D, None, 1.0, num_drafts=nd)
    with pytest.raises(ValueError, match="mode"):
        specdec_ext.verify(L, D, None, 1.0, mode="fast")


def test_opcheck_with_filters_ragged_and_coupled(device):
    B, K, V = 3, 2, 64
    L = torch.randn(B, K + 1, V, device=device)
    D = torch.randint(0, V, (B, K), device=device)
    Q = torch.softmax(torch.randn(B, K, V, device=device), -1)
    tk = torch.tensor([0, 5, 9], device=device)
    tp = torch.tensor([0.9, 1.0, 0.5], device=device)
    mp = torch.tensor(0.05)
    nd = torch.tensor([2, 0, 1], device=device)
    t, s, o = torch.tensor(1.0), torch.tensor(3), torch.tensor(0)
    for coupled in (False, True):
        torch.library.opcheck(torch.ops.specdec.verify.default, (L, D, Q, t, s, o, tk, tp, mp, nd, coupled))
    torch.library.opcheck(torch.ops.specdec.sample.default,
                          (L[:, 0], t, s, o, torch.empty(B, V, device=device), tk, tp, mp))


def test_torch_compile_with_filters(device):
    def step(logits, draft, tk, tp):
        return specdec_ext.verify(logits, draft, None, 1.0, top_k=tk, top_p=tp, seed=7, mode="coupled").tokens

    L = torch.randn(4, 3, 100, device=device)
    D = torch.randint(0, 100, (4, 2), device=device)
    tk, tp = torch.tensor([1, 5, 0, 20], device=device), torch.tensor([0.9, 0.5, 1.0, 0.7], device=device)
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(L, D, tk, tp), step(L, D, tk, tp))
