"""specdec_ext: fast, exact speculative decoding ops for PyTorch.

Ops (``torch.ops.specdec.*``, CPU and CUDA kernels, fake kernels for torch.compile)
with Python wrappers that document every shape:

- :func:`verify`  fused chain verification of K drafts from the target's logits
- :func:`sample`  fused draft-step sampler (temperature softmax + one draw)
"""
import torch  # noqa: F401  (must come first: _C links against libtorch)

from . import _C  # noqa: F401  (loads the library: registers torch.ops.specdec.*)
from . import _fake  # noqa: F401  (fake kernels for torch.compile)
from .sampling import VerifyResult, sample, verify

__version__ = "0.1.0"


def has_cuda_kernels() -> bool:
    """True when this build of specdec_ext contains the CUDA kernels."""
    return bool(_C.CUDA_KERNELS)


__all__ = ["VerifyResult", "has_cuda_kernels", "sample", "verify"]
