"""logprobs on the CUDA kernel (the ``gpu`` fixture: emulated on every machine, and on a GPU
where there is one): the CPU kernel's ids and ranks, logprobs within rounding."""
import pytest
import torch

import specdec_ext
from test_logprobs import _tied_logits

def test_logprobs_gpu(gpu):
    """The CUDA kernel (emulated): the same ids as the CPU kernel, logprobs within rounding."""
    B, K, V, n = 3, 2, gpu.size(3000, 700), 6
    logits = _tied_logits(B, K + 1, V, torch.float32, seed=9)
    draft = logits[:, :K].argmax(-1)
    temps = torch.tensor([0.8, 0.0, 1.0])
    for mode, filters in (("raw", dict()), ("processed", dict(top_k=9, top_p=0.8))):
        res, lp = gpu.verify(gpu.to(logits), gpu.to(draft), None, gpu.to(temps), seed=2, logprobs=n,
                             logprobs_mode=mode, **filters)
        ref, ref_lp = specdec_ext.verify(logits, draft, None, temps, seed=2, logprobs=n, logprobs_mode=mode, **filters)
        assert torch.equal(res.tokens.cpu(), ref.tokens)
        assert torch.equal(lp.top_ids.cpu(), ref_lp.top_ids)
        for a, b in zip(lp, ref_lp):
            torch.testing.assert_close(a.cpu(), b, atol=2e-5, rtol=1e-5, equal_nan=True)
    p = torch.softmax(logits[:, 0], -1)
    tok, plp = gpu.sample(gpu.to(p), 1.0, seed=1, probs_input=True, logprobs=3)
    ref_tok, ref_plp = specdec_ext.sample(p, 1.0, seed=1, probs_input=True, logprobs=3)
    assert torch.equal(plp.top_ids.cpu(), ref_plp.top_ids)
    torch.testing.assert_close(plp.top_logprobs.cpu(), ref_plp.top_logprobs, atol=2e-5, rtol=1e-5)


def test_token_logprobs_gpu(gpu):
    """The emitted tokens' logprobs written by the CUDA verify / sample kernels from their stat
    blocks (n = 0: no logprobs launch): the CPU kernel's, within rounding, in every path
    (sampled, filtered, greedy, coupled, ragged num_drafts); tokens as without logprobs."""
    from test_logprobs import _CASES, _verify_case

    for case in _CASES:
        for mode in ("raw", "processed"):
            logits, temps, args, kw = _verify_case(case, torch.float32, "cpu")
            kw_gpu = {k: (gpu.to(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
            res, lp = gpu.verify(*(None if a is None else gpu.to(a) for a in args), logprobs=0, logprobs_mode=mode,
                                 **kw_gpu)
            plain = gpu.verify(*(None if a is None else gpu.to(a) for a in args), **kw_gpu)
            ref, ref_lp = specdec_ext.verify(*args, logprobs=0, logprobs_mode=mode, **kw)
            assert torch.equal(res.tokens.cpu(), ref.tokens) and torch.equal(plain.tokens.cpu(), ref.tokens), case
            torch.testing.assert_close(lp.token_logprobs.cpu(), ref_lp.token_logprobs, atol=2e-5, rtol=1e-5,
                                       equal_nan=True, msg=f"{case} {mode}")
    x = _tied_logits(4, 1, gpu.size(3000, 700), torch.float32, seed=3)[:, 0]
    temps = torch.tensor([0.0, 1.0, 0.6, 1.5])
    for mode in ("raw", "processed"):
        for filters in (dict(), dict(top_k=12, min_p=0.01)):
            tok, lp = gpu.sample(gpu.to(x), gpu.to(temps), seed=4, logprobs=0, logprobs_mode=mode, **filters)
            ref_tok, ref_lp = specdec_ext.sample(x, temps, seed=4, logprobs=0, logprobs_mode=mode, **filters)
            assert torch.equal(tok.cpu(), ref_tok)
            torch.testing.assert_close(lp.token_logprobs.cpu(), ref_lp.token_logprobs, atol=2e-5, rtol=1e-5)


@pytest.mark.simt
def test_emulated_logprobs_run_the_emulated_kernels(monkeypatch):
    """The emulated wrappers' second launch (top-n and ranks, n > 0) goes to the emulated
    logprobs kernel, never to the CPU op (the real namespace is made to raise)."""
    import specdec_ext.ops.sampling as sampling_ops
    from specdec_ext.testing import simt

    class _NoRealOps:
        def __getattr__(self, name):
            raise AssertionError(f"the emulated wrapper called torch.ops.specdec.{name}")

    monkeypatch.setattr(sampling_ops, "_OPS", _NoRealOps())
    x = _tied_logits(2, 2, 64, torch.float32, seed=6)
    res, lp = simt.verify(x, x[:, :1].argmax(-1), None, 1.0, seed=1, logprobs=2)
    tok, lp1 = simt.sample(x[:, 0], 1.0, seed=1, logprobs=2)
    assert lp.top_ids.shape == (2, 2, 2) and lp1.top_ids.shape == (2, 2) and lp1.token_ranks is not None
