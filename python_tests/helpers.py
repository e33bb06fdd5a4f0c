"""Shared helpers of the test suite (import as ``from helpers import ...``; the pytest
fixtures themselves live in conftest.py)."""
import pytest
import torch

import specdec_ext

#: a GPU and a build with the CUDA kernels: tests marked ``cuda`` run only then
CUDA = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()

#: the devices an op test runs on (the CUDA one is marked ``cuda``)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def ragged_prompts(vocab=97, seed=3):
    """ids [3, 7] int64 with left padding (0) and attention_mask [3, 7]: prompts of 7, 5, 2 tokens."""
    torch.manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :5] = 0
    ids[mask == 0] = 0
    return ids, mask
