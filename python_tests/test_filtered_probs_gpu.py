"""filtered_probs / mask_logits and probs_input on the CUDA kernels (the ``gpu`` fixture:
emulated on every machine, and on a GPU where there is one): the same contracts as
test_filtered_probs.py."""
import pytest
import torch

import specdec_ext
from test_filtered_probs import FILTERS, _equal_to_sample_probs_out, _mask_consistent, _probs

@pytest.mark.parametrize("filters", [FILTERS[0], FILTERS[4]], ids=str)
def test_filtered_probs_is_sample_probs_out_gpu(gpu, filters):
    V = gpu.size(5000, 1100)  # > one stat block: the merged stats of several
    for dtype in (torch.float32, torch.bfloat16):
        _equal_to_sample_probs_out(gpu, 4, V, dtype, filters)


def test_mask_logits_gpu(gpu):
    V = gpu.size(5000, 1100)
    for dtype, filters in ((torch.float32, FILTERS[4]), (torch.float16, FILTERS[2]), (torch.bfloat16, FILTERS[0])):
        _mask_consistent(gpu, 4, V, dtype, filters)


def test_probs_input_gpu_agrees_with_cpu(gpu):
    """The CUDA kernels (emulated) read log p as the CPU kernels do: filtered_probs within
    float32 rounding, sample / verify tokens equal except for a row decided by a last bit."""
    B, V = 4, gpu.size(3000, 900)
    p = _probs(B, V, seed=8)
    got = gpu.filtered_probs(gpu.to(p), 1.0, top_k=40, probs_input=True).cpu()
    ref = specdec_ext.filtered_probs(p, 1.0, top_k=40, probs_input=True)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    tok = gpu.sample(gpu.to(p), 1.0, seed=3, probs_input=True).cpu()
    assert int((tok != specdec_ext.sample(p, 1.0, seed=3, probs_input=True)).sum()) <= 1
    target = _probs(B * 3, V, seed=9).view(B, 3, V)
    ids = torch.randint(0, V, (B, 2), generator=torch.Generator().manual_seed(1))
    res = gpu.verify(gpu.to(target), gpu.to(ids), None, 1.0, seed=5, probs_input=True)
    ref = specdec_ext.verify(target, ids, None, 1.0, seed=5, probs_input=True)
    assert bool(res.valid.all()) and int((res.tokens.cpu() != ref.tokens).any(-1).sum()) <= 1
