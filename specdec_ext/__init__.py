"""specdec_ext: fast, exact speculative decoding ops for PyTorch.

Ops (``torch.ops.specdec.*``, CPU and CUDA kernels, fake kernels for torch.compile)
with Python wrappers that document every shape:

- :func:`verify`  fused chain verification of K drafts from the target's logits
- :func:`sample`  fused draft-step sampler (temperature softmax + one draw)
- :func:`kv_append_`, :func:`kv_rollback_`, :class:`KVCache`  contiguous KV cache
- :func:`paged_kv_append_`, :func:`paged_kv_gather`, :class:`BlockManager`,
  :class:`PagedKVCache`  paged KV cache
- :func:`spec_attention_mask`, :func:`spec_attention_mask_bool`  masks for the new tokens
- :class:`SpeculativeEngine`  draft -> verify -> rollback loop, adaptive K, :class:`SpecDecMetrics`
"""
import torch  # noqa: F401  (must come first: _C links against libtorch)

from . import _C  # noqa: F401  (loads the library: registers torch.ops.specdec.*)
from . import _fake  # noqa: F401  (fake kernels for torch.compile)
from .sampling import VerifyResult, sample, verify
from .attention_mask import spec_attention_mask, spec_attention_mask_bool
from .kv_cache import KVCache, kv_append_, kv_rollback_
from .metrics import SpecDecMetrics
from .engine import GenerationOutput, RowStats, SpeculativeEngine
from .paged_kv_cache import (Allocation, BlockManager, OutOfBlocksError, PagedKVCache, paged_kv_append_,
                             paged_kv_gather)

__version__ = "0.1.0"


def has_cuda_kernels() -> bool:
    """True when this build of specdec_ext contains the CUDA kernels."""
    return bool(_C.CUDA_KERNELS)


__all__ = ["GenerationOutput", "RowStats", "SpecDecMetrics", "SpeculativeEngine", "VerifyResult", "has_cuda_kernels", "sample", "verify",
           "Allocation", "BlockManager", "KVCache", "OutOfBlocksError", "PagedKVCache", "kv_append_",
           "kv_rollback_", "paged_kv_append_", "paged_kv_gather", "spec_attention_mask",
           "spec_attention_mask_bool"]
