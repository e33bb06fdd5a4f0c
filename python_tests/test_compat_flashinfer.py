"""specdec_ext.compat.flashinfer: FlashInfer's own sampling test cases (flashinfer-ai/flashinfer,
tests/utils/test_sampling.py), re-expressed through the shim at CPU sizes, plus chi-square
laws of the shim's draws (Pearson, fixed seeds, stats_reference.ALPHA, cells with expected
count < 5 merged: stats_reference.chi_square_pvalue), among them the filtered laws over
vocabularies of several 128-token tiles at two temperatures, the documented differences and
argument errors.

Where FlashInfer checks a law by cosine similarity of frequencies, these tests use the
chi-square test against the float64 law; where it allows a tie or two at the top-k boundary,
they check the exact kept set (ties kept)."""
import inspect

import numpy as np
import pytest
import torch

from helpers import draws
from specdec_ext.compat import flashinfer as fi
from stats_reference import ALPHA, chi_square_pvalue, filtered_softmax64, joint_counts, tiled_logits, verify_joint

N_DRAWS = draws(40_000)


# ---- inputs (the shapes of FlashInfer's test distributions, small) ----

def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _normal(std):
    return lambda shape, g: torch.randn(shape, generator=g) * std


def _gumbel(beta):
    def draw(shape, g):
        u = torch.rand(shape, generator=g)
        return torch.log(-torch.log(u + 1e-20) + 1e-20) / beta
    return draw


DISTRIBUTIONS = {"normal1": _normal(1.0), "normal5": _normal(5.0), "gumbel0.1": _gumbel(0.1)}


def _rand_probs(B, V, seed):
    """FlashInfer's test input: uniform numbers normalised per row, float32 [B, V]."""
    p = torch.rand(B, V, generator=_gen(seed))
    return p / p.sum(-1, keepdim=True)


def _counts(samples, V):
    return torch.bincount(samples.long(), minlength=V).numpy()


def _law_of_probs(probs, **filt):
    """The float64 filtered law of a probability row (its log as logits)."""
    return filtered_softmax64(torch.log(probs.double()), 1.0, **filt)


def _top_p_mask(probs, p, eps=0.0):
    """FlashInfer's top-p set: ascending cumulative mass > 1 - p (- eps); int [B, V]."""
    sorted_p, order = torch.sort(probs, descending=False)
    cdf = torch.cumsum(sorted_p, -1)
    mask = torch.zeros_like(probs, dtype=torch.int32)
    return mask.scatter_add_(1, order, (cdf > (1 - p) - eps).int())


def _top_k_mask(probs, k):
    """Tokens at least as likely as the k-th most likely (ties kept); k int or [B]."""
    sorted_p = torch.sort(probs, descending=True).values
    k = torch.as_tensor(k).expand(probs.shape[0])
    pivot = sorted_p.gather(1, (k - 1).view(-1, 1))
    return probs >= pivot


def _joint_law(probs, k, top_p):
    """FlashInfer's "joint" law in float64: the top-k set intersected with the top-p set of
    the UNFILTERED law (v kept iff the mass of strictly more likely tokens is < top_p)."""
    p = probs.double() / probs.double().sum()
    kth = torch.sort(p, descending=True).values[k - 1]
    above = ((p.unsqueeze(0) > p.unsqueeze(1)).double() * p.unsqueeze(0)).sum(1)
    kept = (p >= kth) & (above < top_p)
    out = torch.where(kept, p, torch.zeros_like(p))
    return (out / out.sum()).numpy()


# ---- laws: FlashInfer's *_freq tests as chi-square tests ----

@pytest.mark.law
@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
@pytest.mark.parametrize("zero_ratio", [0.0, 0.5])
def test_sampling_freq(dist, zero_ratio, device):
    """sampling_from_probs with indices = zeros(N): N draws from one row; zeroed tokens never."""
    V = 40
    g = _gen(42)
    logits = DISTRIBUTIONS[dist]((1, V), g)
    zeroed = torch.randperm(V, generator=g)[: int(V * zero_ratio)]
    logits[:, zeroed] = float("-inf")
    probs = torch.softmax(logits, -1)
    samples = fi.sampling_from_probs(probs.to(device), indices=torch.zeros(N_DRAWS, dtype=torch.int32, device=device),
                                     seed=1, offset=0)
    assert samples.dtype == torch.int32 and samples.shape == (N_DRAWS,)
    counts = _counts(samples.cpu(), V)
    assert (counts[zeroed.numpy()] == 0).all()
    assert chi_square_pvalue(counts, probs[0].double().numpy()) > ALPHA


@pytest.mark.law
@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
def test_sampling_from_logits_freq(dist, device):
    V = 40
    logits = DISTRIBUTIONS[dist]((1, V), _gen(7))
    samples = fi.sampling_from_logits(logits.to(device), indices=torch.zeros(N_DRAWS, dtype=torch.int32, device=device),
                                      seed=2, offset=0)
    assert chi_square_pvalue(_counts(samples.cpu(), V), torch.softmax(logits[0].double(), -1).numpy()) > ALPHA


@pytest.mark.law
@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling_freq(dist, p, device):
    """Every draw lies in FlashInfer's top-p set; the law is top_p_renorm_probs' row."""
    V = 40
    probs = torch.softmax(DISTRIBUTIONS[dist]((1, V), _gen(11)), -1)
    mask = _top_p_mask(probs, p)
    renorm = fi.top_p_renorm_probs(probs.to(device), p).cpu()
    samples = fi.top_p_sampling_from_probs(probs.to(device), p,
                                           indices=torch.zeros(N_DRAWS, dtype=torch.int32, device=device), seed=3,
                                           offset=0).cpu()
    assert (mask[0, samples.long()] == 1).all()
    law = _law_of_probs(probs[0], top_p=p)
    assert np.abs(renorm[0].double().numpy() - law).max() < 1e-5
    assert chi_square_pvalue(_counts(samples, V), law) > ALPHA


@pytest.mark.law
@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
@pytest.mark.parametrize("k", [3, 10])
def test_top_k_sampling_freq(dist, k, device):
    V = 40
    probs = torch.softmax(DISTRIBUTIONS[dist]((1, V), _gen(13)), -1)
    mask = _top_k_mask(probs, k)
    renorm = fi.top_k_renorm_probs(probs.to(device), k).cpu()
    samples = fi.top_k_sampling_from_probs(probs.to(device), k,
                                           indices=torch.zeros(N_DRAWS, dtype=torch.int32, device=device), seed=4,
                                           offset=0).cpu()
    assert mask[0, samples.long()].all()
    law = _law_of_probs(probs[0], top_k=k)
    assert np.abs(renorm[0].double().numpy() - law).max() < 1e-5
    assert chi_square_pvalue(_counts(samples, V), law) > ALPHA


@pytest.mark.law
@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_sampling_freq(min_p, device):
    """min_p = 1 (FlashInfer accepts it) keeps only the most likely token and its ties."""
    V = 30
    probs = _rand_probs(1, V, seed=17)
    probs[0, 5] = probs[0, 9] = probs.max()  # a tie at the top
    samples = fi.min_p_sampling_from_probs(probs.to(device), min_p, seed=5, offset=0,
                                           indices=torch.zeros(N_DRAWS, dtype=torch.int64, device=device)).cpu()
    assert samples.dtype == torch.int64
    law = _law_of_probs(probs[0]) * (probs[0].double().numpy() >= min_p * probs.max().item())
    law /= law.sum()
    assert chi_square_pvalue(_counts(samples, V), law) > ALPHA


@pytest.mark.law
@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize("source", ["probs", "logits"])
def test_top_k_top_p_law(order, source, device):
    """top_k_first: top-p on the renormalised top-k survivors (HF order); joint: FlashInfer's
    top-k set intersected with the top-p set of the unfiltered law. k, p chosen so the two
    laws differ."""
    V, k, top_p = 30, 8, 0.5
    logits = _normal(0.5)((1, V), _gen(19))  # top_k_first keeps 4 tokens, joint 8
    probs = torch.softmax(logits, -1)
    idx = torch.zeros(N_DRAWS, dtype=torch.int32, device=device)
    if source == "probs":
        samples = fi.top_k_top_p_sampling_from_probs(probs.to(device), k, top_p, indices=idx,
                                                     filter_apply_order=order, seed=6, offset=0)
    else:
        samples = fi.top_k_top_p_sampling_from_logits(logits.to(device), k, top_p, indices=idx,
                                                      filter_apply_order=order, seed=6, offset=0)
    first = filtered_softmax64(logits[0], 1.0, top_k=k, top_p=top_p)
    joint = _joint_law(probs[0], k, top_p)
    assert not np.array_equal(first > 0, joint > 0)  # the case tells the orders apart
    law = joint if order == "joint" else first
    assert chi_square_pvalue(_counts(samples.cpu(), V), law) > ALPHA


# ---- laws over several 128-token tiles, at two temperatures ----

#: (V, temperature): tiled_logits' likely tokens in every tile of V; the temperature through
#: fi.softmax (FlashInfer's samplers take probabilities) or dividing the logits
TILED = [(300, 0.7), (1000, 1.3)]
TILED_FNS = ["top_k", "top_p", "min_p", "top_k_first_logits", "joint_probs"]
N_TILED = draws(20_000)


@pytest.mark.law
@pytest.mark.parametrize("fn", TILED_FNS)
@pytest.mark.parametrize("V,T", TILED)
def test_filtered_laws_across_tiles(fn, V, T, device):
    """Each filtered sampler's law on a row whose survivors lie in several tiles."""
    logits = tiled_logits(1, V, seed=V + len(fn))
    probs = fi.softmax(logits.to(device), temperature=T)
    idx = torch.zeros(N_TILED, dtype=torch.int32, device=device)
    draw = dict(indices=idx, seed=12, offset=0)
    if fn == "top_k":
        samples, law = fi.top_k_sampling_from_probs(probs, 20, **draw), _law_of_probs(probs[0].cpu(), top_k=20)
    elif fn == "top_p":
        samples, law = fi.top_p_sampling_from_probs(probs, 0.8, **draw), _law_of_probs(probs[0].cpu(), top_p=0.8)
    elif fn == "min_p":
        samples, law = fi.min_p_sampling_from_probs(probs, 0.1, **draw), _law_of_probs(probs[0].cpu(), min_p=0.1)
    elif fn == "top_k_first_logits":
        samples = fi.top_k_top_p_sampling_from_logits((logits / T).to(device), 30, 0.9,
                                                      filter_apply_order="top_k_first", **draw)
        law = filtered_softmax64(logits[0] / T, 1.0, top_k=30, top_p=0.9)
    else:
        samples = fi.top_k_top_p_sampling_from_probs(probs, 30, 0.9, filter_apply_order="joint", **draw)
        law = _joint_law(probs[0].cpu(), 30, 0.9)
    assert len(set((np.flatnonzero(law) // 128).tolist())) >= 2  # the survivors span tiles
    assert chi_square_pvalue(_counts(samples.cpu(), V), law) > ALPHA


@pytest.mark.law
@pytest.mark.parametrize("V,T", TILED)
def test_chain_speculative_sampling_law_across_tiles(V, T, device):
    """chain_speculative_sampling on a top-k-renormalised target (top_k_renorm_probs of
    fi.softmax at T) and a filtered draft, K = 2: the joint law of (emitted count, token)."""
    K, n = 2, N_TILED
    logits = tiled_logits(K + 1, V, seed=40 + V)
    p = fi.top_k_renorm_probs(fi.softmax(logits, temperature=T), 20)
    q = fi.top_k_renorm_probs(fi.softmax(logits[:K] + torch.randn(K, V, generator=_gen(41)), temperature=T), 20)
    draft = torch.multinomial(q * (p[:K] > 0), 1, generator=_gen(42)).view(K)  # drafts the target can accept
    tokens, _, emitted = fi.chain_speculative_sampling(
        q.expand(n, K, V).to(device), draft.expand(n, K).to(device), p.expand(n, K + 1, V).to(device), seed=13,
        offset=0)
    p64, q64 = p.double().numpy(), q.double().numpy()
    law = verify_joint(p64 / p64.sum(-1, keepdims=True), q64 / q64.sum(-1, keepdims=True), draft.numpy())
    assert chi_square_pvalue(joint_counts(tokens.cpu(), emitted.cpu().long(), K, V), law) > ALPHA


# ---- FlashInfer's range / mask tests (every draw in the kept set), small batches ----

@pytest.mark.parametrize("B,V", [(1, 111), (19, 57)])
def test_sampling_in_range(B, V):
    probs = _rand_probs(B, V, seed=42)
    logits = torch.randn(B, V, generator=_gen(42))
    for step in range(20):
        for samples in (fi.sampling_from_probs(probs, seed=9, offset=step),
                        fi.sampling_from_logits(logits, seed=9, offset=step)):
            assert samples.dtype == torch.int32 and samples.shape == (B,)
            assert ((samples >= 0) & (samples < V)).all()


def test_input_dtypes_and_scale():
    """Probabilities in float16 / bfloat16 / float64 are cast to float32 (the same draws as
    the cast tensor); float64 logits are cast too; probability rows need not sum to 1
    (difference 5: x 8 gives the same law and, but for rounding, the same draws)."""
    B, V = 300, 57
    probs = _rand_probs(B, V, seed=8)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        low = probs.to(dtype)
        assert torch.equal(fi.top_p_sampling_from_probs(low, 0.8, seed=1, offset=0),
                           fi.top_p_sampling_from_probs(low.float(), 0.8, seed=1, offset=0))
    logits = torch.randn(B, V, generator=_gen(9))
    for order in ("top_k_first", "joint"):
        assert torch.equal(fi.top_k_top_p_sampling_from_logits(logits.double(), 9, 0.7, filter_apply_order=order,
                                                               seed=2, offset=0),
                           fi.top_k_top_p_sampling_from_logits(logits, 9, 0.7, filter_apply_order=order, seed=2,
                                                               offset=0))
    a = fi.sampling_from_probs(probs, seed=3, offset=0)
    assert (a == fi.sampling_from_probs(probs * 8, seed=3, offset=0)).float().mean().item() > 0.99


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling_in_mask(p):
    B, V = 19, 57
    probs = _rand_probs(B, V, seed=42)
    mask = _top_p_mask(probs, p, eps=1e-4)
    for step in range(30):
        samples = fi.top_p_sampling_from_probs(probs, p, seed=1, offset=step)
        assert (mask[torch.arange(B), samples.long()] == 1).all()


@pytest.mark.parametrize("variable_k", [False, True])
@pytest.mark.parametrize("k", [1, 10, 40])
def test_top_k_sampling_in_mask(k, variable_k):
    B, V = 19, 57
    probs = _rand_probs(B, V, seed=42)
    if variable_k:
        k = torch.randint(1, k + 1, (B,), generator=_gen(1))
    mask = _top_k_mask(probs, k)
    for step in range(30):
        samples = fi.top_k_sampling_from_probs(probs, k, seed=2, offset=step)
        assert mask[torch.arange(B), samples.long()].all()


@pytest.mark.parametrize("p", [0.05, 0.2, 0.7, 1.0])
def test_min_p_sampling_in_mask(p):
    B, V = 19, 57
    probs = _rand_probs(B, V, seed=42)
    mask = probs >= p * probs.max(-1, keepdim=True).values
    for step in range(30):
        samples = fi.min_p_sampling_from_probs(probs, torch.full((B,), p), seed=3, offset=step)
        assert mask[torch.arange(B), samples.long()].all()


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_joint_sampling_in_mask(p):
    B, V = 19, 60
    k = int(V * 0.5) if p == 0.1 else int(V * 0.1)
    probs = _rand_probs(B, V, seed=42)
    mask = (_top_p_mask(probs, p, eps=1e-4) == 1) & _top_k_mask(probs, k)
    for step in range(30):
        samples = fi.top_k_top_p_sampling_from_probs(probs, torch.full((B,), k), torch.full((B,), p),
                                                     filter_apply_order="joint", seed=4, offset=step)
        assert mask[torch.arange(B), samples.long()].all()


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_logits_probs_alignment(order, p):
    """The same seed from logits and from softmax(logits) gives (nearly) the same draws:
    FlashInfer allows 5% mismatches (rounding moves a cutoff or a draw boundary)."""
    B, V, k = 200, 57, 20
    logits = torch.randn(B, V, generator=_gen(42)) * 5
    from_logits = fi.top_k_top_p_sampling_from_logits(logits, k, p, filter_apply_order=order, seed=8, offset=1)
    from_probs = fi.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), k, p, filter_apply_order=order, seed=8,
                                                    offset=1)
    assert (from_logits == from_probs).float().mean().item() >= 0.95


# ---- renorm / mask ----

@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1.0])
def test_top_p_renorm_probs(p):
    B, V = 19, 57
    probs = _rand_probs(B, V, seed=42)
    sorted_p, order = torch.sort(probs, descending=False)
    cdf = torch.cumsum(sorted_p, -1)
    mask = torch.zeros(B, V, dtype=torch.int32).scatter_add_(1, order, (cdf >= (1 - p)).int())
    truth = torch.where(mask == 1, probs, torch.zeros_like(probs))
    truth = truth / truth.sum(-1, keepdim=True)
    out = fi.top_p_renorm_probs(probs, p)
    assert out.dtype == torch.float32 and out.shape == (B, V)
    torch.testing.assert_close(out, truth, rtol=1e-3, atol=1e-3)


def test_top_p_renorm_probs_per_request():
    B, V = 9, 57
    probs = _rand_probs(B, V, seed=42)
    top_p = torch.linspace(0.1, 0.9, B)
    out = fi.top_p_renorm_probs(probs, top_p)
    for b in range(B):
        expect = fi.top_p_renorm_probs(probs[b:b + 1], float(top_p[b]))
        torch.testing.assert_close(out[b:b + 1], expect)
        law = _law_of_probs(probs[b], top_p=float(top_p[b]))
        assert np.abs(out[b].double().numpy() - law).max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
@pytest.mark.parametrize("k", [1, 10, 40])
def test_top_k_renorm_probs(k, dist, dtype):
    """Output in the input's dtype, rows sum to 1, zero below the k-th largest, and (ties
    kept) nonzero exactly on the tokens >= the k-th largest wherever float32 holds them."""
    B, V = 19, 111
    probs = torch.softmax(DISTRIBUTIONS[dist]((B, V), _gen(42)), -1).to(dtype)
    out = fi.top_k_renorm_probs(probs, k)
    assert out.dtype == dtype and out.shape == (B, V)
    torch.testing.assert_close(out.float().sum(-1), torch.ones(B), rtol=1e-2, atol=1e-2)
    kept = _top_k_mask(probs.float(), k)
    assert (out[~kept] == 0).all()
    ref = torch.where(kept, probs.float(), torch.zeros(()))
    ref = ref / ref.sum(-1, keepdim=True)
    torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=2e-2, atol=1e-3)
    if dtype == torch.float32:
        assert ((out > 0) == (kept & (ref > 0))).all()


def test_top_k_renorm_keeps_ties():
    """Difference 1: probabilities 0.3, 0.2, 0.2, 0.2, 0.1 with k = 2 keep all three 0.2s."""
    probs = torch.tensor([[0.2, 0.3, 0.2, 0.1, 0.2]])
    out = fi.top_k_renorm_probs(probs, 2)
    torch.testing.assert_close(out, torch.tensor([[2, 3, 2, 0, 2]]) / 9.0)
    masked = fi.top_k_mask_logits(torch.log(probs), 2)
    assert torch.isfinite(masked).sum().item() == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_renorm_and_mask_mixed_k(dtype):
    """Per-row k, some >= V (every token kept), some small, and 0 (off, difference 6)."""
    B, V = 12, 64
    g = _gen(42)
    logits = torch.rand(B, V, generator=g).to(dtype)
    k = torch.randint(1, 20, (B,), generator=g)
    k[::3] = V
    k[1::3] = V + 5
    k[5] = 0
    probs = torch.softmax(logits.float(), -1).to(dtype)
    renorm = fi.top_k_renorm_probs(probs, k)
    masked = fi.top_k_mask_logits(logits, k)
    assert renorm.dtype == dtype and masked.dtype == dtype
    torch.testing.assert_close(renorm.float().sum(-1), torch.ones(B), rtol=1e-2, atol=1e-2)
    for b in range(B):
        kb = int(k[b])
        everything = kb == 0 or kb >= V
        want_r = V if everything else int((probs[b] >= torch.topk(probs[b].float(), kb).values[-1]).sum())
        want_m = V if everything else int((logits[b] >= torch.topk(logits[b].float(), kb).values[-1]).sum())
        assert int((renorm[b] > 0).sum()) == want_r, b
        assert int(torch.isfinite(masked[b]).sum()) == want_m, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("neginf", [False, True])
@pytest.mark.parametrize("k", [1, 10, 40])
def test_top_k_mask_logits(k, neginf, dtype):
    """Kept logits unchanged, the rest -inf; the finite count is the number of finite
    logits >= the k-th largest finite one (all of them when fewer than k are finite)."""
    B, V = 19, 111
    g = _gen(42)
    logits = DISTRIBUTIONS["normal5"]((B, V), g)
    if neginf:
        n = int(torch.randint(1, B * V // 2, (), generator=g))
        flat = torch.randperm(B * V, generator=g)[:n]
        logits.view(-1)[flat] = float("-inf")
    logits = logits.to(dtype)
    out = fi.top_k_mask_logits(logits, k)
    assert out.dtype == dtype and out.shape == (B, V)
    sums = torch.softmax(out.float(), -1).sum(-1)
    torch.testing.assert_close(sums, torch.ones(B), rtol=1e-3, atol=1e-3)
    finite = torch.isfinite(out)
    assert torch.equal(out[finite], logits[finite])
    for b in range(B):
        row = logits[b].float()
        n_finite = int(torch.isfinite(row).sum())
        pivot = torch.sort(row, descending=True).values[min(k, n_finite) - 1]
        assert int(finite[b].sum()) == int(((row >= pivot) & torch.isfinite(row)).sum()), b


# ---- chain speculative sampling ----

def test_chain_docstring_example():
    """FlashInfer's documented example is deterministic: draft 2 (p 0.6 >= q 0.3) accepted,
    draft 1 (p = 0) rejected, the residual max(0, p - q) is all on token 0."""
    draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    draft_ids = torch.tensor([[2, 1]], dtype=torch.int32)
    target_probs = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    for offset in range(5):
        tokens, accepted, emitted = fi.chain_speculative_sampling(draft_probs, draft_ids, target_probs, seed=0,
                                                                  offset=offset)
        assert tokens.dtype == torch.int32 and tokens.tolist() == [[2, 0, -1]]
        assert accepted.dtype == emitted.dtype == torch.int32
        assert accepted.tolist() == [1] and emitted.tolist() == [1]


@pytest.mark.parametrize("K", [1, 3, 5])
@pytest.mark.parametrize("onehot_target", [False, True])
def test_chain_speculative_sampling(K, onehot_target):
    """FlashInfer's structural test: one-hot targets are reproduced exactly; otherwise the
    accepted drafts form a prefix, then one token, then -1, and the counters are added to
    in place across calls."""
    B, V = 19, 57
    g = _gen(K)
    draft_probs = _rand_probs(B * K, V, seed=K).view(B, K, V)
    draft_ids = torch.randint(V, (B, K), generator=g)
    if onehot_target:
        target_ids = torch.randint(V, (B, K + 1), generator=g)
        target_ids[:, :K] = draft_ids
        target = torch.zeros(B, K + 1, V).scatter_(2, target_ids.unsqueeze(-1), 1.0)
    else:
        target = _rand_probs(B * (K + 1), V, seed=K + 100).view(B, K + 1, V)
    accepted_total = torch.zeros(B, dtype=torch.int32)
    emitted_total = torch.zeros(B, dtype=torch.int64)
    emitted_sum = torch.zeros(B, dtype=torch.int64)
    for trial in range(10):
        tokens, accepted, emitted = fi.chain_speculative_sampling(draft_probs, draft_ids, target, accepted_total,
                                                                  emitted_total, seed=5, offset=trial)
        assert accepted is accepted_total and emitted is emitted_total
        assert tokens.dtype == torch.int32 and tokens.shape == (B, K + 1)
        if onehot_target:
            assert torch.equal(tokens.long(), target_ids)
        assert (tokens < V).all()
        n = (tokens != -1).sum(1)
        assert (n >= 1).all()
        pos = torch.arange(K + 1)
        assert ((tokens != -1) == (pos < n.unsqueeze(1))).all()  # a prefix, then -1
        kept_drafts = pos[:K] < (n - 1).unsqueeze(1)
        assert torch.equal(tokens[:, :K][kept_drafts], draft_ids[kept_drafts].int())
        emitted_sum += n - 1
        assert torch.equal(emitted_total, emitted_sum)
    assert (accepted_total >= emitted_total).all() and (accepted_total <= 10 * K).all()


def _accepted_law(p, q, draft, K):
    """Exact P(emitted = e, accepted = a) [K+1, K+1]: emitted from the closed form, then an
    independent Bernoulli(min(1, p_i(x_i) / q_i(x_i))) at each position i >= e."""
    reach = verify_joint(p, q, draft).sum(1)
    r = np.minimum(1.0, p[np.arange(K), draft] / q[np.arange(K), draft])
    out = np.zeros((K + 1, K + 1))
    for e in range(K + 1):
        dist = np.zeros(K + 1)
        dist[e] = 1.0
        for i in range(e, K):
            dist = dist * (1 - r[i]) + np.roll(dist, 1) * r[i]
        out[e] = reach[e] * dist
    return out


@pytest.mark.law
@pytest.mark.parametrize("K", [1, 3])
def test_chain_speculative_sampling_law(K, device):
    """The emitted tokens are distributed as sampling from the target (joint law of
    (emitted count, token)), and (emitted, accepted) has FlashInfer's law (difference 3)."""
    V = 12
    g = _gen(30 + K)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.log(p[:K]) + torch.randn(K, V, generator=g), -1)
    draft = torch.multinomial(q, 1, generator=g).view(K)
    tokens, accepted, emitted = fi.chain_speculative_sampling(
        q.expand(N_DRAWS, K, V).to(device), draft.expand(N_DRAWS, K).to(device), p.expand(N_DRAWS, K + 1, V).to(device),
        seed=11, offset=0)
    tokens, accepted, emitted = tokens.cpu(), accepted.cpu().long(), emitted.cpu().long()
    p64, q64, d = p.double().numpy(), q.double().numpy(), draft.numpy()
    assert chi_square_pvalue(joint_counts(tokens, emitted, K, V), verify_joint(p64, q64, d)) > ALPHA
    pairs = torch.bincount(emitted * (K + 1) + accepted, minlength=(K + 1) ** 2).numpy()
    assert chi_square_pvalue(pairs, _accepted_law(p64, q64, d, K)) > ALPHA


def test_chain_unnormalised_target_and_invalid_rows():
    """Difference 5: target rows are used as p / sum(p) (x 7 changes nothing with the same
    seed); difference 3: a NaN target row or an out-of-range draft emits nothing."""
    B, K, V = 6, 2, 9
    q = _rand_probs(B * K, V, seed=1).view(B, K, V)
    p = _rand_probs(B * (K + 1), V, seed=2).view(B, K + 1, V)
    ids = torch.randint(V, (B, K), generator=_gen(3))
    base = fi.chain_speculative_sampling(q, ids, p, seed=4, offset=0)
    scaled = fi.chain_speculative_sampling(q, ids, p * 7, seed=4, offset=0)
    assert torch.equal(base[0], scaled[0]) and torch.equal(base[2], scaled[2])
    p[1, 0, 3] = float("nan")
    ids[4, 0] = V
    tokens, accepted, emitted = fi.chain_speculative_sampling(q, ids, p, seed=4, offset=0)
    for b in (1, 4):
        assert (tokens[b] == -1).all() and accepted[b] == 0 and emitted[b] == 0
    ok = [0, 2, 3, 5]
    assert torch.equal(tokens[ok], base[0][ok])


# ---- indices ----

SAMPLERS = {
    "from_probs": lambda x, **kw: fi.sampling_from_probs(x, **kw),
    "from_logits": lambda x, **kw: fi.sampling_from_logits(torch.log(x), **kw),
    "top_p": lambda x, **kw: fi.top_p_sampling_from_probs(x, 0.9, **kw),
    "top_k": lambda x, **kw: fi.top_k_sampling_from_probs(x, 10, **kw),
    "min_p": lambda x, **kw: fi.min_p_sampling_from_probs(x, 0.1, **kw),
    "top_k_top_p": lambda x, **kw: fi.top_k_top_p_sampling_from_probs(x, 10, 0.9, filter_apply_order="joint", **kw),
    "top_k_top_p_logits": lambda x, **kw: fi.top_k_top_p_sampling_from_logits(torch.log(x), 10, 0.9, **kw),
}


@pytest.mark.parametrize("indices_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_indices_dtype_and_mapping(name, indices_dtype):
    """The samples take indices' dtype, and output row i is drawn from row indices[i]
    (one-hot rows make the draw certain)."""
    R, V = 5, 23
    hot = torch.tensor([3, 0, 22, 7, 11])
    probs = torch.full((R, V), 1e-30).scatter_(1, hot.view(-1, 1), 1.0)
    indices = torch.tensor([4, 4, 0, 2, 1, 3, 0, 2], dtype=indices_dtype)
    samples = SAMPLERS[name](probs, indices=indices, seed=1, offset=0)
    assert samples.dtype == indices_dtype and samples.shape == (8,)
    assert torch.equal(samples.long(), hot[indices.long()])
    plain = SAMPLERS[name](_rand_probs(7, V, seed=1), seed=1, offset=0)
    assert plain.dtype == torch.int32 and ((plain >= 0) & (plain < V)).all()


def test_per_row_params_follow_indices():
    """Difference 6: a per-row top_k / min_p tensor has one value per probability row and
    output row i reads the value of row indices[i]."""
    V = 30
    probs = _rand_probs(2, V, seed=5)
    top = probs.argmax(-1)
    indices = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0] * 50)
    for draw in (lambda: fi.top_k_sampling_from_probs(probs, torch.tensor([1, 0]), indices=indices, seed=2, offset=0),
                 lambda: fi.min_p_sampling_from_probs(probs, torch.tensor([1.0, 0.0]), indices=indices, seed=2,
                                                      offset=0)):
        samples = draw()
        assert (samples[indices == 0] == top[0]).all()  # k = 1 / min_p = 1 on row 0
        assert len(set(samples[indices == 1].tolist())) > 3  # unfiltered on row 1


def test_out_of_range_indices():
    probs = _rand_probs(3, 10, seed=1)
    with pytest.raises(ValueError, match="indices"):
        fi.sampling_from_probs(probs, indices=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="indices"):
        fi.top_k_sampling_from_probs(probs, 2, indices=torch.tensor([-1]))


# ---- return_valid, check_nan, invalid rows ----

VALID_SAMPLERS = {
    "from_probs": lambda x: fi.sampling_from_probs(x, return_valid=True),
    "top_k": lambda x: fi.top_k_sampling_from_probs(x, top_k=5, return_valid=True),
    "top_p": lambda x: fi.top_p_sampling_from_probs(x, top_p=0.9, return_valid=True),
    "min_p": lambda x: fi.min_p_sampling_from_probs(x, min_p=0.1, return_valid=True),
    "joint": lambda x: fi.top_k_top_p_sampling_from_probs(x, top_k=5, top_p=0.9, filter_apply_order="joint",
                                                          return_valid=True),
    "top_k_first": lambda x: fi.top_k_top_p_sampling_from_probs(x, top_k=5, top_p=0.9, return_valid=True),
}


@pytest.mark.parametrize("name", list(VALID_SAMPLERS))
@pytest.mark.parametrize("B", [1, 4, 19])
def test_nan_rows_return_zero_and_invalid(name, B, device):
    """FlashInfer's NaN test: NaN rows (first, middle, last) sample 0 with valid False; the
    others are valid and in range. Also (difference 5) an all-zero and a negative row."""
    V = 31
    probs = _rand_probs(B, V, seed=42)
    bad = sorted({0, B // 2, B - 1})
    for i in bad:
        probs[i] = float("nan")
    if B > 4:
        probs[1] = 0.0
        probs[2, 4] = -0.5
        bad += [1, 2]
    torch.manual_seed(0)
    samples, valid = VALID_SAMPLERS[name](probs.to(device))
    samples, valid = samples.cpu(), valid.cpu()
    assert samples.dtype == torch.int32 and valid.dtype == torch.bool and valid.shape == (B,)
    good = [i for i in range(B) if i not in bad]
    assert (samples[bad] == 0).all() and not valid[bad].any()
    assert valid[good].all() and ((samples[good] >= 0) & (samples[good] < V)).all()
    assert isinstance(VALID_SAMPLERS[name](_rand_probs(2, V, seed=1).to(device)), tuple)


def test_return_valid_default_is_a_tensor():
    probs = _rand_probs(3, 10, seed=1)
    assert isinstance(fi.sampling_from_probs(probs), torch.Tensor)
    assert isinstance(fi.top_k_top_p_sampling_from_probs(probs, 3, 0.9), torch.Tensor)


def test_invalid_logit_rows_sample_zero():
    logits = torch.randn(4, 10, generator=_gen(1))
    logits[1, 2] = float("nan")
    logits[2] = float("-inf")
    out = fi.sampling_from_logits(logits, seed=0, offset=0)
    assert out[1] == 0 and out[2] == 0
    masked = fi.top_k_mask_logits(logits, 3)
    assert torch.isnan(masked[2]).all() and torch.isfinite(masked[0]).sum() == 3


CHECK_NAN = {
    "sampling_from_probs": lambda x: fi.sampling_from_probs(x, check_nan=True),
    "sampling_from_logits": lambda x: fi.sampling_from_logits(x, check_nan=True),
    "top_p": lambda x: fi.top_p_sampling_from_probs(x, 0.5, check_nan=True),
    "top_k": lambda x: fi.top_k_sampling_from_probs(x, 5, check_nan=True),
    "min_p": lambda x: fi.min_p_sampling_from_probs(x, 0.1, check_nan=True),
    "top_k_top_p_probs": lambda x: fi.top_k_top_p_sampling_from_probs(x, 5, 0.5, check_nan=True),
    "top_k_top_p_logits": lambda x: fi.top_k_top_p_sampling_from_logits(x, 5, 0.5, filter_apply_order="joint",
                                                                         check_nan=True),
}


@pytest.mark.parametrize("name", list(CHECK_NAN))
def test_check_nan(name):
    x = _rand_probs(3, 10, seed=1)
    assert CHECK_NAN[name](x).shape == (3,)  # no NaN: draws
    x[1, 4] = float("nan")
    with pytest.raises(ValueError, match="(probs|logits) contains NaN"):
        CHECK_NAN[name](x)


# ---- the random stream (difference 4) ----

def test_seed_offset_reproducibility_and_change():
    probs = _rand_probs(300, 57, seed=42)
    a = fi.sampling_from_probs(probs, seed=12345, offset=0)
    assert torch.equal(a, fi.sampling_from_probs(probs, seed=12345, offset=0))
    assert (a != fi.sampling_from_probs(probs, seed=67890, offset=0)).any()
    assert (a != fi.sampling_from_probs(probs, seed=12345, offset=1000)).any()
    assert (a != fi.sampling_from_probs(probs, seed=12345, offset=1)).any()
    logits = torch.randn(300, 57, generator=_gen(1))
    assert torch.equal(fi.sampling_from_logits(logits, seed=3, offset=2), fi.sampling_from_logits(logits, seed=3,
                                                                                                   offset=2))


def test_seed_tensors_read_element_zero():
    """As FlashInfer's kernels: a seed / offset tensor [1] or [B] (int64 or uint64) acts as
    its element 0, so it equals the int; rows still draw independent streams."""
    B, V = 50, 40
    probs = _rand_probs(1, V, seed=3).expand(B, V)
    ref = fi.sampling_from_probs(probs, seed=21, offset=4)
    assert len(set(ref.tolist())) > 5  # identical rows, independent draws
    for seed, offset in ((torch.tensor([21]), torch.tensor([4])),
                         (torch.full((B,), 21), torch.arange(4, 4 + B)),
                         (torch.tensor([21], dtype=torch.uint64), torch.tensor([4], dtype=torch.uint64))):
        assert torch.equal(fi.sampling_from_probs(probs, seed=seed, offset=offset), ref)
    assert torch.equal(fi.sampling_from_probs(probs, seed=21), fi.sampling_from_probs(probs, seed=21, offset=0))


def test_generator_and_default_generator():
    probs = _rand_probs(200, 30, seed=5)
    a = fi.top_p_sampling_from_probs(probs, 0.9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, fi.top_p_sampling_from_probs(probs, 0.9, generator=torch.Generator().manual_seed(7)))
    g = torch.Generator().manual_seed(7)
    first, second = (fi.top_p_sampling_from_probs(probs, 0.9, generator=g) for _ in range(2))
    assert torch.equal(first, a) and (second != first).any()  # the generator advanced
    torch.manual_seed(3)
    b = fi.sampling_from_probs(probs)
    torch.manual_seed(3)
    assert torch.equal(b, fi.sampling_from_probs(probs))
    assert torch.equal(fi.sampling_from_probs(probs, seed=9, offset=0, generator=g),
                       fi.sampling_from_probs(probs, seed=9, offset=0))  # an explicit seed wins


# ---- signatures and argument errors ----

# FlashInfer 0.7.4's public flashinfer.sampling functions: parameter names and defaults
# (flashinfer/sampling.py of that release; ../shared/reference/NOTES.md), in order
_SAMPLE_TAIL = [("deterministic", True), ("generator", None), ("check_nan", False), ("seed", None), ("offset", None)]
SIGNATURES = {
    "softmax": [("logits",), ("temperature", None), ("enable_pdl", None)],
    "sampling_from_logits": [("logits",), ("indices", None)] + _SAMPLE_TAIL,
    "sampling_from_probs": [("probs",), ("indices", None)] + _SAMPLE_TAIL + [("return_valid", False)],
    "top_p_sampling_from_probs": [("probs",), ("top_p",), ("indices", None)] + _SAMPLE_TAIL + [("return_valid", False)],
    "top_k_sampling_from_probs": [("probs",), ("top_k",), ("indices", None)] + _SAMPLE_TAIL + [("return_valid", False)],
    "min_p_sampling_from_probs": [("probs",), ("min_p",), ("indices", None)] + _SAMPLE_TAIL + [("return_valid", False)],
    "top_k_top_p_sampling_from_logits": [("logits",), ("top_k",), ("top_p",), ("indices", None),
                                         ("filter_apply_order", "top_k_first")] + _SAMPLE_TAIL
                                        + [("top_k_max", None)],
    "top_k_top_p_sampling_from_probs": [("probs",), ("top_k",), ("top_p",), ("indices", None),
                                        ("filter_apply_order", "top_k_first")] + _SAMPLE_TAIL
                                       + [("return_valid", False), ("top_k_max", None)],
    "top_p_renorm_probs": [("probs",), ("top_p",), ("is_deterministic", False)],
    "top_k_renorm_probs": [("probs",), ("top_k",), ("is_deterministic", False)],
    "top_k_mask_logits": [("logits",), ("top_k",)],
    "chain_speculative_sampling": [("draft_probs",), ("draft_token_ids",), ("target_probs",),
                                   ("maybe_output_accepted_token_num", None),
                                   ("maybe_output_emitted_draft_token_num", None), ("deterministic", True),
                                   ("generator", None), ("seed", None), ("offset", None)],
}


#: FlashInfer sampling functions not provided here, and why
DELIBERATELY_ABSENT = {
    "log_softmax": "newer than 0.7.4; verify / sample(logprobs=) report the emitted tokens' logprobs",
    "log_probs": "newer than 0.7.4; specdec_ext.ops logprobs (verify / sample with logprobs=n)",
}


def test_every_public_function_is_listed():
    """Every function the shim exports is one of FlashInfer's (SIGNATURES), and every FlashInfer
    function is either here or deliberately absent (the aliases *_renorm_prob are FlashInfer's
    own old names)."""
    exported = set(fi.__all__) - {"top_k_renorm_prob", "top_p_renorm_prob"}
    assert exported == set(SIGNATURES)
    assert not set(DELIBERATELY_ABSENT) & exported


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_matches_flashinfer(name):
    params = list(inspect.signature(getattr(fi, name)).parameters.values())
    got = [(p.name,) if p.default is inspect.Parameter.empty else (p.name, p.default) for p in params]
    assert got == SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert name in fi.__all__ and "Parameters" in getattr(fi, name).__doc__


def test_aliases():
    assert fi.top_p_renorm_prob is fi.top_p_renorm_probs and fi.top_k_renorm_prob is fi.top_k_renorm_probs


_P = _rand_probs(3, 10, seed=0)


@pytest.mark.parametrize("call,err,msg", [
    # FlashInfer's parameter-tensor checks (0-D, 2-D, wrong length), naming the parameter
    (lambda: fi.min_p_sampling_from_probs(_P, torch.tensor(0.1)), ValueError, "min_p.*0-dimensional"),
    (lambda: fi.min_p_sampling_from_probs(_P, torch.full((3, 10), 0.1)), ValueError, "min_p.*2D tensor"),
    (lambda: fi.min_p_sampling_from_probs(_P, torch.tensor([0.1])), ValueError, "min_p.*batch size mismatch"),
    (lambda: fi.top_p_renorm_probs(_P, torch.tensor(0.5)), ValueError, "top_p.*0-dimensional"),
    (lambda: fi.top_p_renorm_probs(_P, torch.full((3, 10), 0.5)), ValueError, "top_p.*2D tensor"),
    (lambda: fi.top_p_renorm_probs(_P, torch.tensor([0.5])), ValueError, "top_p.*batch size mismatch"),
    (lambda: fi.top_k_renorm_probs(_P, torch.tensor(2)), ValueError, "top_k.*0-dimensional"),
    (lambda: fi.top_k_renorm_probs(_P, torch.full((3, 10), 2)), ValueError, "top_k.*2D tensor"),
    (lambda: fi.top_k_renorm_probs(_P, torch.tensor([2])), ValueError, "top_k.*batch size mismatch"),
    (lambda: fi.top_k_mask_logits(_P, torch.tensor([2, 2])), ValueError, "top_k.*batch size mismatch"),
    (lambda: fi.top_k_sampling_from_probs(_P, torch.tensor([1.0, 2.0, 3.0])), TypeError, "top_k"),
    (lambda: fi.top_k_sampling_from_probs(_P, 2.5), TypeError, "top_k"),
    # values
    (lambda: fi.top_k_sampling_from_probs(_P, -1), ValueError, "top_k"),
    (lambda: fi.top_k_sampling_from_probs(_P, torch.tensor([1, -1, 2])), ValueError, "top_k"),
    (lambda: fi.top_p_sampling_from_probs(_P, 0.0), ValueError, "top_p"),
    (lambda: fi.top_p_sampling_from_probs(_P, 1.5), ValueError, "top_p"),
    (lambda: fi.top_p_sampling_from_probs(_P, torch.tensor([0.5, 0.0, 0.5])), ValueError, "top_p"),
    (lambda: fi.min_p_sampling_from_probs(_P, 1.5), ValueError, "min_p"),
    (lambda: fi.min_p_sampling_from_probs(_P, "0.1"), TypeError, "min_p"),
    (lambda: fi.top_k_top_p_sampling_from_probs(_P, 2, 0.5, filter_apply_order="top_p_first"), ValueError,
     "filter_apply_order"),
    (lambda: fi.top_k_top_p_sampling_from_logits(_P, 2, 0.5, filter_apply_order=None), ValueError,
     "filter_apply_order"),
    # data
    (lambda: fi.sampling_from_probs(_P[0]), ValueError, "probs"),
    (lambda: fi.sampling_from_probs(_P.long()), TypeError, "probs"),
    (lambda: fi.sampling_from_probs(_P.tolist()), TypeError, "probs"),
    (lambda: fi.sampling_from_logits(_P.unsqueeze(0)), ValueError, "logits"),
    (lambda: fi.top_k_mask_logits(_P.double(), 2), TypeError, "logits"),
    (lambda: fi.top_k_renorm_probs(_P.double(), 2), TypeError, "probs"),
    # indices
    (lambda: fi.sampling_from_probs(_P, indices=torch.zeros(2)), TypeError, "indices"),
    (lambda: fi.sampling_from_probs(_P, indices=torch.zeros(2, 1, dtype=torch.int32)), ValueError, "indices"),
    (lambda: fi.sampling_from_probs(_P, indices=[0, 1]), TypeError, "indices"),
    # seed, offset, generator, flags
    (lambda: fi.sampling_from_probs(_P, seed=torch.tensor([1], dtype=torch.int32), offset=torch.tensor([0])),
     TypeError, "seed"),
    (lambda: fi.sampling_from_probs(_P, seed=torch.tensor([1, 2]), offset=torch.tensor([0])), ValueError, "seed"),
    (lambda: fi.sampling_from_probs(_P, seed=torch.tensor(1), offset=torch.tensor([0])), ValueError, "seed"),
    (lambda: fi.sampling_from_probs(_P, seed=1, offset=torch.zeros(3, 1, dtype=torch.int64)), ValueError, "offset"),
    (lambda: fi.sampling_from_probs(_P, seed=torch.tensor([1]), offset=0), ValueError, "seed and offset"),
    (lambda: fi.sampling_from_probs(_P, seed=1.5, offset=0), TypeError, "seed"),
    (lambda: fi.sampling_from_probs(_P, seed=1, offset=-(2**70)), ValueError, "offset"),
    (lambda: fi.sampling_from_probs(_P, generator=7), TypeError, "generator"),
    (lambda: fi.sampling_from_probs(_P, deterministic="yes"), TypeError, "deterministic"),
    (lambda: fi.sampling_from_probs(_P, check_nan=1), TypeError, "check_nan"),
    (lambda: fi.sampling_from_probs(_P, return_valid=None), TypeError, "return_valid"),
    (lambda: fi.top_p_renorm_probs(_P, 0.5, is_deterministic="no"), TypeError, "is_deterministic"),
])
def test_bad_arguments(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


_Q = _rand_probs(6, 10, seed=1).view(3, 2, 10)
_T = _rand_probs(9, 10, seed=2).view(3, 3, 10)
_IDS = torch.zeros(3, 2, dtype=torch.int32)


@pytest.mark.parametrize("call,err,msg", [
    (lambda: fi.chain_speculative_sampling(_Q[0], _IDS, _T), ValueError, "draft_probs"),
    (lambda: fi.chain_speculative_sampling(_Q.long(), _IDS, _T), TypeError, "draft_probs"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS.float(), _T), TypeError, "draft_token_ids"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS[:, :1], _T), ValueError, "draft_token_ids"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS, _T[:, :2]), ValueError, "target_probs"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS, _T[..., :9]), ValueError, "target_probs"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS, _T, torch.zeros(2, dtype=torch.int32)), ValueError,
     "maybe_output_accepted_token_num"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS, _T, None, torch.zeros(3)), TypeError,
     "maybe_output_emitted_draft_token_num"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS, _T, deterministic=None), TypeError, "deterministic"),
    (lambda: fi.chain_speculative_sampling(_Q, _IDS, _T, seed=torch.tensor([1]), offset=1), ValueError,
     "seed and offset"),
])
def test_chain_bad_arguments(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


def test_softmax_then_chain_speculative_sampling():
    """The usual FlashInfer code path: probabilities from softmax, then chain verification."""
    g = torch.Generator().manual_seed(5)
    B, K, V = 4, 3, 50
    target = fi.softmax(torch.randn(B, K + 1, V, generator=g).view(B * (K + 1), V), 0.8).view(B, K + 1, V)
    draft = fi.softmax(torch.randn(B * K, V, generator=g), torch.full((B * K,), 0.9)).view(B, K, V)
    torch.testing.assert_close(target.sum(-1), torch.ones(B, K + 1))
    ids = torch.multinomial(draft.view(B * K, V), 1, generator=g).view(B, K).to(torch.int32)
    out, accepted, emitted = fi.chain_speculative_sampling(draft, ids, target, seed=1, offset=0)
    assert out.shape == (B, K + 1) and out.dtype == torch.int32
    assert bool(((out >= 0) & (out < V) | (out == -1)).all())
    with pytest.raises(ValueError, match="temperature"):
        fi.softmax(torch.randn(2, 5), torch.ones(3))
