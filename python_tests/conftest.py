import pytest
import torch

import specdec_ext

CUDA = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a GPU and CUDA kernels"))]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def ragged_prompts(vocab=97, seed=3):
    """ids [3, 7] int64 with left padding (0) and attention_mask [3, 7]: prompts of 7, 5, 2 tokens."""
    torch.manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :5] = 0
    ids[mask == 0] = 0
    return ids, mask
