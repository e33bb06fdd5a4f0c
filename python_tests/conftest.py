import pytest
import torch

import specdec_ext

CUDA = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a GPU and CUDA kernels"))]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
