"""logprobs on the CUDA kernel (the ``gpu`` fixture: emulated on every machine, and on a GPU
where there is one): the CPU kernel's ids and ranks, logprobs within rounding."""
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
