"""filtered_probs / mask_logits (the filtered law with no draw) and the probs_input mode of
sample / verify / filtered_probs (probabilities read as log p by the kernels).

* filtered_probs is bit for bit what sample(..., probs_out=) writes for the same row, on every
  CPU kernel copy and on the CUDA kernels (emulated everywhere);
* mask_logits keeps exactly the tokens filtered_probs gives mass (logits copied bit for bit),
  -inf elsewhere, NaN rows for invalid rows; softmax(mask / T) == filtered_probs;
* both against the float64 sort-based oracle (stats_reference.filtered_softmax64);
* probs_input: the same results as the ops on log p, the emitted law is p (chi-square),
  zero / negative / NaN probabilities, and the errors.
"""
import math

import numpy as np
import pytest
import torch

import specdec_ext
from helpers import draws
from stats_reference import ALPHA, chi_square_pvalue, filtered_softmax64, joint_counts, verify_joint

FILTERS = [dict(), dict(top_k=5), dict(top_p=0.7), dict(min_p=0.05), dict(top_k=20, top_p=0.9, min_p=0.01)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _logits(B, V, dtype, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, V, generator=g) * scale).to(dtype)


def _with_special_rows(logits, temperature):
    """Row 1 greedy (T = 0), row 2 NaN, row 3 all -inf (invalid): per-row temperatures."""
    logits = logits.clone()
    logits[2, 7] = float("nan")
    logits[3] = float("-inf")
    t = torch.full((logits.shape[0],), temperature)
    t[1] = 0.0
    return logits, t


def _ops(backend):
    """(filtered_probs, mask_logits, sample, to) of a device name or a gpu fixture."""
    if isinstance(backend, str):
        return (specdec_ext.filtered_probs, specdec_ext.mask_logits, specdec_ext.sample,
                lambda t: None if t is None else t.to(backend))
    return backend.filtered_probs, backend.mask_logits, backend.sample, backend.to


def _equal_to_sample_probs_out(backend, B, V, dtype, filters, temperature=0.8):
    filtered_probs, _, sample, to = _ops(backend)
    logits, t = _with_special_rows(_logits(B, V, dtype, seed=V), temperature)
    logits, t = to(logits), to(t)
    probs = filtered_probs(logits, t, **filters)
    ref = torch.full((B, V), 7.0, device=logits.device)
    sample(logits, t, seed=1, probs_out=ref, **filters)
    assert probs.dtype == torch.float32 and probs.shape == (B, V)
    assert torch.equal(probs.cpu(), ref.cpu())
    assert torch.equal(probs[2].cpu(), torch.zeros(V)) and torch.equal(probs[3].cpu(), torch.zeros(V))
    assert float(probs[1].sum()) == 1.0 and int(probs[1].argmax()) == int(logits[1].float().argmax())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("filters", FILTERS, ids=str)
def test_filtered_probs_is_sample_probs_out(variant, dtype, filters):
    _equal_to_sample_probs_out(variant, 6, 1000, dtype, filters)


def _mask_consistent(backend, B, V, dtype, filters, temperature=0.8):
    filtered_probs, mask_logits, _, to = _ops(backend)
    logits, t = _with_special_rows(_logits(B, V, dtype, seed=V + 1), temperature)
    logits, t = to(logits), to(t)
    masked = mask_logits(logits, t, **filters).cpu()
    probs = filtered_probs(logits, t, **filters).cpu()
    logits, t = logits.cpu(), t.cpu()
    assert masked.dtype == dtype and masked.shape == (B, V)
    assert torch.isnan(masked[2]).all() and torch.isnan(masked[3]).all()  # invalid rows
    greedy = torch.full((V,), float("-inf"), dtype=dtype)
    greedy[int(logits[1].float().argmax())] = logits[1, int(logits[1].float().argmax())]
    assert torch.equal(masked[1], greedy)
    for b in [0] + list(range(4, B)):
        kept = masked[b] != float("-inf")
        # logits N(0, 4) at T = 0.8: no kept token's probability underflows
        assert torch.equal(kept, probs[b] > 0), f"row {b}"
        assert torch.equal(masked[b][kept], logits[b][kept])  # bit for bit (no NaN here)
        law = torch.softmax(masked[b].float() / float(t[b]), 0)
        torch.testing.assert_close(law, probs[b], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("filters", FILTERS, ids=str)
def test_mask_logits_keeps_what_filtered_probs_weighs(variant, dtype, filters):
    _mask_consistent(variant, 6, 1000, dtype, filters)


@pytest.mark.parametrize("filters", FILTERS + [dict(top_k=1), dict(top_p=0.01)], ids=str)
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_filtered_probs_against_float64_oracle(device, filters, temperature):
    """Distinct logits (no ties at a cutoff, margins far above float32 rounding): the kept set
    is the sort-based oracle's, the probabilities within float32 rounding."""
    B, V = 8, 300
    g = torch.Generator().manual_seed(11)
    logits = torch.randperm(B * V, generator=g).view(B, V).float() * (6.0 / (B * V)) * 4 - 12
    probs = specdec_ext.filtered_probs(logits.to(device), temperature, **filters).cpu().double()
    ref = torch.from_numpy(filtered_softmax64(logits, temperature, **filters))
    assert torch.equal(probs > 0, ref > 0)
    torch.testing.assert_close(probs, ref, atol=1e-6, rtol=1e-4)
    masked = specdec_ext.mask_logits(logits.to(device), temperature, **filters).cpu()
    assert torch.equal(masked != float("-inf"), ref > 0)


def test_filtered_ops_take_strided_rows_and_per_row_values():
    base = _logits(5, 2 * 257, torch.float32, seed=3)
    logits = base[:, ::2]  # vocab stride 2: copied by the op
    t = torch.tensor([0.5, 1.0, 0.0, 2.0, 1.5])
    top_k = torch.tensor([0, 3, 5, 50, 256])
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.3, 1.0])
    probs = specdec_ext.filtered_probs(logits, t, top_k=top_k, top_p=top_p)
    for b in range(5):
        one = specdec_ext.filtered_probs(logits[b:b + 1].contiguous(), float(t[b]), top_k=int(top_k[b]),
                                         top_p=float(top_p[b]))
        assert torch.equal(probs[b:b + 1], one)
    masked = specdec_ext.mask_logits(logits, t, top_k=top_k, top_p=top_p)
    assert torch.equal(masked != float("-inf"), probs > 0)


def test_filtered_ops_errors():
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="logits"):
        specdec_ext.filtered_probs(torch.randn(10))
    with pytest.raises(TypeError, match="logits"):
        specdec_ext.mask_logits(torch.zeros(2, 10, dtype=torch.int32))
    with pytest.raises(ValueError, match="top_p"):
        specdec_ext.filtered_probs(x, top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        specdec_ext.mask_logits(x, top_k=-1)
    with pytest.raises(ValueError, match="temperature"):
        specdec_ext.filtered_probs(x, -1.0)
    with pytest.raises(ValueError, match="temperature"):
        specdec_ext.mask_logits(x, torch.ones(3))
    with pytest.raises(TypeError, match="probs_input"):
        specdec_ext.filtered_probs(x, probs_input="yes")
    with pytest.raises(TypeError, match="logits"):
        specdec_ext.filtered_probs(x.half(), probs_input=True)
    assert specdec_ext.filtered_probs(torch.zeros(0, 10)).shape == (0, 10)
    assert specdec_ext.mask_logits(torch.zeros(0, 10, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_filtered_ops_opcheck_and_compile():
    x = _logits(3, 64, torch.float32, seed=5)
    t = torch.tensor([0.7, 0.0, 1.3])
    for args in ((x, t, torch.tensor(5), None, None, False), (x.softmax(-1), torch.tensor(1.0), None,
                                                               torch.tensor(0.8), None, True)):
        torch.library.opcheck(torch.ops.specdec.filtered_probs.default, args)
    torch.library.opcheck(torch.ops.specdec.mask_logits.default, (x.bfloat16(), t, None, None, torch.tensor(0.1)))

    def f(logits, temperature):
        return (specdec_ext.filtered_probs(logits, temperature, top_k=5),
                specdec_ext.mask_logits(logits, temperature, top_p=0.9))

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, ref in zip(compiled(x, t), f(x, t)):
        assert torch.equal(got, ref)


# ---- probs_input -------------------------------------------------------------------------

def _probs(B, V, seed, zeros=True):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, V, generator=g) * 2, -1)
    if zeros:
        p[:, ::7] = 0.0  # no mass: log p = -inf
    return p * torch.linspace(0.5, 3.0, B).view(B, 1)  # any positive scale per row


def test_probs_input_is_log_p(variant):
    """Each op on probabilities with probs_input equals the op on log p: probabilities within
    float32 rounding of the two logs, tokens equal except where a log's last bit decides."""
    B, V = 64, 700
    p = _probs(B, V, seed=1)
    logp = p.log()
    for filters in (dict(), dict(top_k=30, top_p=0.8)):
        got = specdec_ext.filtered_probs(p, 1.0, probs_input=True, **filters)
        ref = specdec_ext.filtered_probs(logp, 1.0, **filters)
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
        assert torch.equal(got > 0, ref > 0)
        tok = specdec_ext.sample(p, 0.9, seed=4, probs_input=True, **filters)
        ref_tok = specdec_ext.sample(logp, 0.9, seed=4, **filters)
        assert int((tok != ref_tok).sum()) <= 1
    # at T = 1 with no filter the law is p / sum(p)
    torch.testing.assert_close(specdec_ext.filtered_probs(p, probs_input=True), p / p.sum(-1, keepdim=True),
                               atol=1e-6, rtol=1e-5)
    K = 3
    target = _probs(B * (K + 1), V, seed=2).view(B, K + 1, V)
    q = _probs(B * K, V, seed=3)
    q = (q / q.sum(-1, keepdim=True)).view(B, K, V)
    ids = torch.multinomial(q.view(-1, V), 1, generator=torch.Generator().manual_seed(5)).view(B, K)
    got = specdec_ext.verify(target, ids, q, 1.0, seed=7, probs_input=True)
    ref = specdec_ext.verify(target.log(), ids, q, 1.0, seed=7)
    assert int((got.tokens != ref.tokens).any(-1).sum()) <= 1
    assert bool(got.valid.all())


def test_probs_input_bad_probabilities_make_invalid_rows():
    p = _probs(4, 50, seed=6, zeros=False)
    p[1, 3] = -0.01
    p[2, 9] = float("nan")
    p[3] = 0.0  # no mass at all
    tok = specdec_ext.sample(p, 1.0, seed=1, probs_input=True)
    assert tok[0] >= 0 and tok[1:].tolist() == [-1, -1, -1]
    probs = specdec_ext.filtered_probs(p, 1.0, probs_input=True)
    assert probs[0].sum() > 0.999 and (probs[1:] == 0).all()
    res = specdec_ext.verify(p.unsqueeze(1), torch.zeros(4, 0, dtype=torch.long), None, 1.0, seed=1,
                             probs_input=True)
    assert res.valid.tolist() == [True, False, False, False]
    # p = 0 is never drawn (-inf logit), also greedy (argmax of log p)
    q = torch.tensor([[0.0, 0.2, 0.0, 0.8]])
    assert specdec_ext.sample(q, 0.0, seed=0, probs_input=True).item() == 3


def test_probs_input_errors():
    p = torch.rand(2, 3, 10)
    ids = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(TypeError, match="target_logits"):
        specdec_ext.verify(p.half(), ids, None, probs_input=True)
    with pytest.raises(TypeError, match="logits"):
        specdec_ext.sample(p[:, 0].bfloat16(), seed=0, probs_input=True)
    with pytest.raises(TypeError, match="probs_input"):
        specdec_ext.sample(p[:, 0], seed=0, probs_input=1)
    # float64 probabilities are converted to float32 like float64 logits
    assert specdec_ext.sample(p[:, 0].double(), seed=0, probs_input=True).shape == (2,)


@pytest.mark.law
@pytest.mark.parametrize("filters", [dict(), dict(top_p=0.75)], ids=str)
def test_probs_input_sample_law(filters):
    """sample(p, probs_input=True) draws from p / sum(p) (after the filters): chi-square at
    ALPHA with 40k draws over V = 8 (unnormalised p, a zero entry)."""
    p = torch.tensor([0.30, 0.0, 0.55, 0.05, 0.40, 0.10, 0.25, 0.35])
    n = draws(40_000)
    tokens = specdec_ext.sample(p.expand(n, -1).contiguous(), 1.0, seed=123, probs_input=True, **filters)
    counts = np.bincount(tokens.numpy(), minlength=8)
    expected = filtered_softmax64(torch.log(p.double()), 1.0, **filters)
    assert counts[1] == 0
    assert chi_square_pvalue(counts, expected) > ALPHA


@pytest.mark.law
def test_probs_input_verify_law():
    """verify on target probabilities with probs_input: the joint law of (accepted, emitted
    token) is the closed form on p / sum(p); chi-square at ALPHA, 40k rows, K = 2, V = 6."""
    K, V, n = 2, 6, draws(40_000)
    g = torch.Generator().manual_seed(9)
    target = torch.rand(K + 1, V, generator=g) * 3
    target[1, 4] = 0.0
    q = torch.softmax(torch.randn(K, V, generator=g), -1)
    draft = torch.tensor([2, 4])
    res = specdec_ext.verify(target.expand(n, -1, -1).contiguous(), draft.expand(n, -1).contiguous(),
                             q.expand(n, -1, -1).contiguous(), 1.0, seed=77, probs_input=True)
    assert bool(res.valid.all())
    p = (target / target.sum(-1, keepdim=True)).double().numpy()
    expected = verify_joint(p, q.double().numpy(), draft.numpy())
    counts = joint_counts(res.tokens, res.num_accepted, K, V)
    assert chi_square_pvalue(counts, expected) > ALPHA


def test_probs_input_reference_ops_agree():
    """The scalar references read probabilities through the same conversion (debug ops)."""
    p = _probs(6, 200, seed=12)
    tok, probs = torch.ops.specdec.sample_reference(p, torch.tensor(1.0), torch.tensor(3), torch.tensor(0), None,
                                                    None, None, True)
    fused = torch.empty(6, 200)
    fused_tok = specdec_ext.sample(p, 1.0, seed=3, probs_out=fused, probs_input=True)
    assert int((tok != fused_tok).sum()) <= 1
    torch.testing.assert_close(probs, fused, atol=1e-6, rtol=1e-5)
    assert not math.isnan(float(probs.sum()))
