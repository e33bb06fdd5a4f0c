"""verify / sample with ``logprobs=n``: the emitted tokens' logprobs and the top-n per
position (specdec::logprobs), against torch.log_softmax + a sort in float64 (raw law) and the
sort-based filtered law (stats_reference.filtered_softmax64, processed law): ties, filters,
greedy rows, invalid rows, positions past the emitted tokens, both modes, every CPU kernel
copy and the CUDA kernels (emulated everywhere)."""
import numpy as np
import pytest
import torch

import specdec_ext
from helpers import CountingOps
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


# ---- the emitted tokens' logprobs from verify / sample's own stats (token_logprobs) ----

_CASES = {  # name -> (verify kwargs, temperatures of the 6 rows)
    "sampled": (dict(), [0.7, 1.0, 0.0, 1.3, 0.9, 1.0]),
    "top_k": (dict(top_k=7), [0.7, 1.0, 0.0, 1.3, 0.9, 1.0]),
    "top_p+min_p": (dict(top_p=0.6, min_p=0.02), [0.7, 1.0, 0.0, 1.3, 0.9, 1.0]),
    "greedy": (dict(), [0.0] * 6),
    "coupled": (dict(mode="coupled", top_k=9), [0.8, 1.0, 0.0, 1.2, 1.0, 0.6]),
    "num_drafts": (dict(num_drafts=torch.tensor([0, 3, 1, 2, 3, 0])), [1.0, 0.5, 0.0, 1.0, 2.0, 1.0]),
}


def _verify_case(name, dtype, device="cpu", seed=3, **extra):
    B, K, V = 6, 3, 300
    logits = _tied_logits(B, K + 1, V, dtype, seed=V + K + 1)
    draft = logits[:, :K].float().argmax(-1)  # mostly accepted: several emitted positions
    draft[1, 1] = (draft[1, 1] + 1) % V
    kwargs, temps = _CASES[name]
    temps = torch.tensor(temps)
    q = None
    if name == "sampled":  # dense draft probabilities: rejections at dense-residual positions
        q = torch.softmax(torch.randn(B, K, V, generator=torch.Generator().manual_seed(1)), -1)
    args = (logits.to(device), draft.to(device), None if q is None else q.to(device), temps.to(device))
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return logits, temps, args, dict(kw, seed=seed, **extra)


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_token_logprobs_from_own_stats(variant, monkeypatch, case, mode, dtype):
    """logprobs=0: one verify launch and nothing else; the tokens are those of a call without
    logprobs; the logprobs are the float64 law's, and on the CPU bit for bit those of the
    separate specdec::logprobs op (same formula, same sums)."""
    import specdec_ext.ops.sampling as sampling_ops

    logits, temps, args, kw = _verify_case(case, dtype, variant)
    counter = CountingOps(sampling_ops._OPS)
    monkeypatch.setattr(sampling_ops, "_OPS", counter)
    res, lp = specdec_ext.verify(*args, logprobs=0, logprobs_mode=mode, **kw)
    assert counter.calls == {"verify": 1}
    monkeypatch.setattr(sampling_ops, "_OPS", counter._real)  # (not undo(): that also drops the variant's env)
    plain = specdec_ext.verify(*args, **kw)
    assert all(torch.equal(a, b) for a, b in zip(res, plain))  # asking for logprobs changes no token
    assert lp.token_ranks is None and lp.top_ids.shape == (6, 4, 0) and lp.top_logprobs.shape == (6, 4, 0)
    tokens = res.tokens.cpu()
    got = lp.token_logprobs.cpu()
    assert got.dtype == torch.float32 and got.shape == (6, 4)
    assert torch.isnan(got[tokens < 0]).all() and not torch.isnan(got[tokens >= 0]).any()
    filters = {k: v for k, v in _CASES[case][0].items() if k in ("top_k", "top_p", "min_p")}
    processed = mode == "processed"
    for b, i in (tokens >= 0).nonzero().tolist():
        ref, _, _ = _ref_row(logits[b, i], int(tokens[b, i]), 0, processed, float(temps[b]), filters)
        torch.testing.assert_close(got[b, i].double(), torch.tensor(ref, dtype=torch.float64), atol=2e-5, rtol=1e-5,
                                   msg=f"{case} {mode} ({b}, {i})")
    from specdec_ext.ops._args import filter_args

    op = torch.ops.specdec.logprobs(args[0], res.tokens, args[3], *filter_args(kw.get("top_k"), kw.get("top_p"),
                                                                              kw.get("min_p")),
                                    0, processed, False)[0].cpu()
    if variant == "cpu":
        assert torch.equal(got.nan_to_num(7.0), op.nan_to_num(7.0))
    else:
        torch.testing.assert_close(got, op, atol=2e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_sample_token_logprobs_from_own_stats(variant, monkeypatch, mode):
    """sample(logprobs=0): one launch; tokens as without logprobs; probabilities in; every
    filter; greedy and invalid rows."""
    import specdec_ext.ops.sampling as sampling_ops

    B, V = 8, 257
    logits = _tied_logits(B, 1, V, torch.float32, seed=8)[:, 0]
    logits[5] = float("-inf")
    temps = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.8, 1.0, 1.0])
    for filters, probs_input in ((dict(), False), (dict(top_k=20), False), (dict(top_p=0.7, min_p=0.05), False),
                                 (dict(), True), (dict(top_k=5), True)):
        x = torch.softmax(logits * 0.7, -1) * 3.0 if probs_input else logits
        counter = CountingOps(sampling_ops._OPS)
        monkeypatch.setattr(sampling_ops, "_OPS", counter)
        tokens, lp = specdec_ext.sample(x.to(variant), temps.to(variant), seed=5, logprobs=0, logprobs_mode=mode,
                                        probs_input=probs_input, **filters)
        assert counter.calls == {"sample": 1}
        monkeypatch.setattr(sampling_ops, "_OPS", counter._real)
        plain = specdec_ext.sample(x.to(variant), temps.to(variant), seed=5, probs_input=probs_input, **filters)
        assert torch.equal(tokens, plain)
        tokens, got = tokens.cpu(), lp.token_logprobs.cpu()
        assert (tokens[5] == -1) and torch.isnan(got[5]) and lp.token_ranks is None
        ref_logits = x.log() if probs_input else x
        for b in range(B):
            if tokens[b] < 0:
                continue
            ref, _, _ = _ref_row(ref_logits[b], int(tokens[b]), 0, mode == "processed", float(temps[b]), filters)
            torch.testing.assert_close(got[b].double(), torch.tensor(ref, dtype=torch.float64), atol=2e-5, rtol=1e-5,
                                       msg=f"{filters} probs_input={probs_input} row {b}")


def test_token_logprobs_argument_errors():
    """The raw ops' token_logprobs: a clear error naming it, and nothing written."""
    ops = torch.ops.specdec
    x = torch.randn(2, 3, 10)
    draft = torch.zeros(2, 2, dtype=torch.long)
    one, seed, off = torch.tensor(1.0), torch.tensor(0), torch.tensor(0)
    bad = {
        "float64": (torch.zeros(2, 3, dtype=torch.float64), TypeError),
        "shape": (torch.zeros(2, 4), ValueError),
        "strided": (torch.zeros(3, 2).t(), ValueError),
    }
    for what, (out, err) in bad.items():
        before = out.clone()
        with pytest.raises(err, match="token_logprobs"):
            ops.verify(x, draft, None, one, seed, off, None, None, None, None, False, False, out, False)
        assert torch.equal(out, before), what
    alias = x.view(-1)[:6].view(2, 3)  # the logits' own memory
    before = x.clone()
    with pytest.raises(ValueError, match="token_logprobs and target_logits overlap"):
        ops.verify(x, draft, None, one, seed, off, None, None, None, None, False, False, alias, False)
    assert torch.equal(x, before)
    xs = x[:, 0]
    probs = torch.zeros(2, 10)
    with pytest.raises(ValueError, match="token_logprobs"):
        ops.sample(xs, one, seed, off, probs, None, None, None, False, torch.zeros(3), False)
    with pytest.raises(ValueError, match="token_logprobs and probs_out overlap"):
        ops.sample(xs, one, seed, off, probs, None, None, None, False, probs.view(-1)[:2], False)
    assert (probs == 0).all()


def test_token_logprobs_opcheck_and_compile():
    x = _tied_logits(3, 3, 40, torch.float32, seed=5)
    draft = x[:, :2].argmax(-1)
    for processed in (False, True):
        out = torch.empty(3, 3)
        torch.library.opcheck(torch.ops.specdec.verify.default,
                              (x, draft, None, torch.tensor([1.0, 0.0, 0.5]), torch.tensor(1), torch.tensor(0),
                               None, None, None, None, False, False, out, processed),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
        torch.library.opcheck(torch.ops.specdec.sample.default,
                              (x[:, 0], torch.tensor(0.7), torch.tensor(1), torch.tensor(0), None, torch.tensor(5),
                               None, None, False, torch.empty(3), processed))

    def f(logits, d):
        return specdec_ext.verify(logits, d, None, 0.8, seed=1, logprobs=0, logprobs_mode="raw", top_k=6)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, ref = compiled(x, draft), f(x, draft)
    assert all(torch.equal(a, b) for a, b in zip(got[0], ref[0]))
    torch.testing.assert_close(got[1].token_logprobs, ref[1].token_logprobs, equal_nan=True, rtol=0, atol=0)


def _same_bits(a, b):
    """Tensors equal bit for bit (NaN where NaN, and the sign of zero)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                                              b.view(torch.int32) if b.dtype == torch.float32 else b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_independent_of_thread_split(variant, dtype, mode):
    """The CPU op splits a position's vocabulary across threads when positions are fewer than
    threads (logprob_kernels.h): every output is the same bits with 1 thread or 2, and for a
    row alone (split) or in a batch of 4 (one thread per row). V spans several shards and a
    ragged last tile; row 2 is greedy under the processed law, row 3 filtered (one-thread
    stats, split rank pass), row 1 has ties at the top-n boundary, row 0 is peaked."""
    if variant == "cuda":
        pytest.skip("a CPU kernel property")
    B, V, n = 4, 3 * 8 * 1024 + 517, 7
    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(B, 1, V, generator=g) * 3).to(dtype)
    logits[1, 0, ::5] = logits[1, 0].float().max()  # many ties at the top
    # row 0 peaked (sum of exponentials ~1.5): a one-ulp change of the sum shows in log(sum),
    # so a sum that is not the canonical tile tree of the whole row fails the comparison
    logits[0, 0] = (torch.randn(V, generator=g) - 11.3).to(dtype)
    logits[0, 0, 777] = 0.0
    tokens = torch.randint(0, V, (B, 1), generator=g)
    temps = torch.tensor([0.8, 1.0, 0.0, 1.3])
    top_k = torch.tensor([0, 0, 0, 40])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.9])
    processed = mode == "processed"

    def run(rows, threads):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return torch.ops.specdec.logprobs(logits[rows], tokens[rows], temps[rows], top_k[rows], top_p[rows], None,
                                              n, processed, False)
        finally:
            torch.set_num_threads(old)

    ref = run(slice(None), 1)
    for rows, threads in [(slice(None), 2)] + [(slice(b, b + 1), t) for b in range(B) for t in (1, 2)]:
        got = run(rows, threads)
        for name, a, r in zip(["token_logprobs", "ranks", "top_ids", "top_logprobs"], got, ref):
            assert _same_bits(a, r[rows]), (name, rows, threads)
    if not processed:  # and right: the float64 law
        _check(run(slice(0, 1), 2), logits[:1], tokens[:1], n, False, temps[:1], {}, atol=1e-4)
