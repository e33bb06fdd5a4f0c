"""verify / sample with ``logprobs=n``: the emitted tokens' logprobs and the top-n per
position (specdec::logprobs), against torch.log_softmax + a sort in float64 (raw law) and the
sort-based filtered law (stats_reference.filtered_softmax64, processed law): ties, filters,
greedy rows, invalid rows, positions past the emitted tokens, both modes, every CPU kernel
copy and the CUDA kernels (emulated everywhere)."""
import numpy as np
import pytest
import torch

import specdec_ext
from stats_reference import filtered_softmax64

NAN = float("nan")


def _ref_row(x: torch.Tensor, token: int, n: int, processed: bool, T: float, filters: dict):
    """(token logprob, top ids, top logprobs) of one position, in float64 by sorting."""
    x32 = x.float()
    if processed:
        with np.errstate(divide="ignore"):
            lp = torch.from_numpy(np.log(filtered_softmax64(x32, T, **filters)))
    else:
        lp = torch.log_softmax(x32.double(), -1)
    V = x.shape[-1]
    order = np.lexsort((np.arange(V), -x32.double().numpy()))  # logit desc, then id asc
    ids = torch.full((n,), -1, dtype=torch.long)
    tops = torch.full((n,), NAN, dtype=torch.float64)
    k = min(n, V)
    ids[:k] = torch.from_numpy(order[:k])
    tops[:k] = lp[ids[:k]]
    return float(lp[token]), ids, tops


def _check(got, logits, tokens, n, processed, temps, filters, atol=2e-5):
    tok_lp, ranks, top_ids, top_lp = (t.cpu() for t in got)
    B, P = tokens.shape
    for b in range(B):
        for i in range(P):
            t = int(tokens[b, i])
            if t < 0:
                assert torch.isnan(tok_lp[b, i]) and (top_ids[b, i] == -1).all() and torch.isnan(top_lp[b, i]).all()
                assert ranks[b, i] == -1
                continue
            x = logits[b, i].float()
            greedy = processed and float(temps[b]) == 0
            assert int(ranks[b, i]) == (1 if greedy else int((x >= x[t]).sum())), (b, i)
            ref_lp, ref_ids, ref_top = _ref_row(logits[b, i], t, n, processed, float(temps[b]), filters)
            torch.testing.assert_close(tok_lp[b, i].double(), torch.tensor(ref_lp, dtype=torch.float64),
                                       atol=atol, rtol=1e-5, msg=f"token logprob ({b}, {i})")
            assert torch.equal(top_ids[b, i], ref_ids), (b, i, top_ids[b, i].tolist(), ref_ids.tolist())
            torch.testing.assert_close(top_lp[b, i].double(), ref_top, atol=atol, rtol=1e-5, equal_nan=True)


def _tied_logits(B, P, V, dtype, seed):
    """Logits on a 0.5 grid (many exact ties, also at the top-n boundary)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.round(torch.randn(B, P, V, generator=g) * 4) / 2).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("filters", [dict(), dict(top_k=7), dict(top_p=0.6, min_p=0.02)], ids=str)
def test_verify_logprobs(variant, dtype, mode, filters):
    B, K, V, n = 6, 3, 300, 5
    logits = _tied_logits(B, K + 1, V, dtype, seed=V + K)
    g = torch.Generator().manual_seed(1)
    draft = logits[:, :K].float().argmax(-1)  # likely accepted drafts: several emitted positions
    draft[1, 1] = (draft[1, 1] + 1) % V
    temps = torch.tensor([0.7, 1.0, 0.0, 1.3, 0.9, 1.0])
    logits[4, 2, 11] = NAN  # row 4 invalid (a NaN in a used position)
    res, lp = specdec_ext.verify(logits.to(variant), draft.to(variant), None, temps.to(variant), seed=3,
                                 logprobs=n, logprobs_mode=mode, **filters)
    assert res.valid.tolist() == [True, True, True, True, False, True]
    tokens = res.tokens.cpu()
    assert lp.token_logprobs.shape == (B, K + 1) and lp.top_ids.shape == (B, K + 1, n)
    assert lp.top_ids.dtype == torch.int64 and lp.top_logprobs.dtype == torch.float32
    _check(lp, logits, tokens, n, mode == "processed", temps, filters)
    del g


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_sample_logprobs(variant, mode):
    B, V, n = 8, 257, 4
    logits = _tied_logits(B, 1, V, torch.float32, seed=2)[:, 0]
    temps = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.8, 1.0, 1.0])
    logits[5] = float("-inf")  # no distribution: -1, NaN
    tokens, lp = specdec_ext.sample(logits.to(variant), temps.to(variant), seed=5, logprobs=n, logprobs_mode=mode,
                                    top_k=20)
    assert tokens[5] == -1
    assert lp.token_logprobs.shape == (B,) and lp.top_ids.shape == (B, n) and lp.top_logprobs.shape == (B, n)
    _check(tuple(t.unsqueeze(1) for t in lp), logits.unsqueeze(1), tokens.cpu().unsqueeze(1), n,
           mode == "processed", temps, dict(top_k=20))
    # the emitted token's processed logprob is the log of what sample drew it from
    if mode == "processed":
        probs = torch.empty(B, V)
        specdec_ext.sample(logits, temps, seed=5, top_k=20, probs_out=probs)
        ok = tokens >= 0
        torch.testing.assert_close(lp.token_logprobs[ok].cpu(), probs[ok].gather(1, tokens[ok].cpu().view(-1, 1))
                                   .view(-1).log(), atol=2e-5, rtol=1e-5)


def test_logprobs_topn_edges():
    """n = 0 (emitted token only), n >= V (every token, then -1 / NaN), all-equal logits (ties:
    lowest ids first), -inf tokens ranked last, probabilities in (probs_input)."""
    x = torch.zeros(2, 1, 6)
    x[1, 0, 2:] = float("-inf")
    tok = torch.tensor([[3], [1]])
    ops = torch.ops.specdec
    lp, ranks, ids, tops = ops.logprobs(x, tok, torch.tensor(1.0), None, None, None, 8, False, False)
    assert ranks.tolist() == [[6], [2]]
    assert ids[0, 0].tolist() == [0, 1, 2, 3, 4, 5, -1, -1]
    torch.testing.assert_close(tops[0, 0, :6], torch.full((6,), -float(np.log(6))))
    assert torch.isnan(tops[0, 0, 6:]).all()
    assert ids[1, 0].tolist()[:2] == [0, 1] and tops[1, 0, 2:6].eq(float("-inf")).all()
    torch.testing.assert_close(lp[1, 0], torch.tensor(-float(np.log(2))))
    lp0, _, ids0, tops0 = ops.logprobs(x, tok, torch.tensor(1.0), None, None, None, 0, False, False)
    assert ids0.shape == (2, 1, 0) and torch.equal(lp0, lp)
    p = torch.tensor([[[0.2, 0.0, 0.5, 0.3]]])
    lpp, rankp, idsp, topsp = ops.logprobs(p, torch.tensor([[3]]), torch.tensor(1.0), None, None, None, 2, False,
                                           True)
    assert rankp.item() == 2
    torch.testing.assert_close(lpp, torch.tensor([[np.log(0.3)]], dtype=torch.float32))
    assert idsp[0, 0].tolist() == [2, 3]


def test_logprobs_errors():
    x = torch.randn(2, 10)
    with pytest.raises(ValueError, match="logprobs"):
        specdec_ext.sample(x, seed=0, logprobs=-1)
    with pytest.raises(ValueError, match="logprobs"):
        specdec_ext.sample(x, seed=0, logprobs=129)
    with pytest.raises(TypeError, match="logprobs"):
        specdec_ext.sample(x, seed=0, logprobs=2.0)
    with pytest.raises(ValueError, match="logprobs_mode"):
        specdec_ext.verify(x.unsqueeze(1), torch.zeros(2, 0, dtype=torch.long), logprobs=1, logprobs_mode="logits")
    ops = torch.ops.specdec
    with pytest.raises(ValueError, match="tokens"):
        ops.logprobs(x.unsqueeze(1), torch.zeros(2, 2, dtype=torch.long), torch.tensor(1.0))
    with pytest.raises(TypeError, match="tokens"):
        ops.logprobs(x.unsqueeze(1), torch.zeros(2, 1), torch.tensor(1.0))
    with pytest.raises(ValueError, match="num_top"):
        ops.logprobs(x.unsqueeze(1), torch.zeros(2, 1, dtype=torch.long), torch.tensor(1.0), num_top=500)
    # without logprobs= the results are as before (no tuple)
    assert isinstance(specdec_ext.sample(x, seed=0), torch.Tensor)
    assert isinstance(specdec_ext.verify(x.unsqueeze(1), torch.zeros(2, 0, dtype=torch.long)),
                      specdec_ext.VerifyResult)


def test_logprobs_opcheck_and_compile():
    x = _tied_logits(3, 2, 40, torch.float32, seed=4)
    tok = torch.tensor([[1, 4], [5, 7], [0, 2]])  # no NaN output (opcheck compares without equal_nan)
    torch.library.opcheck(torch.ops.specdec.logprobs.default,
                          (x, tok, torch.tensor([1.0, 0.0, 0.5]), torch.tensor(5), None, None, 3, True, False))

    def f(logits, t):
        return specdec_ext.sample(logits, t, seed=1, logprobs=2, logprobs_mode="processed")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, ref = compiled(x[:, 0], torch.tensor(0.8)), f(x[:, 0], torch.tensor(0.8))
    assert torch.equal(got[0], ref[0]) and all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))
