"""specdec_ext: fast, exact speculative decoding ops for PyTorch.

Layers, bottom up (each package documents its modules):

- :mod:`specdec_ext.ops`     the ``torch.ops.specdec.*`` custom ops: wrappers + fake kernels
  (:func:`verify`, :func:`sample`, :func:`filtered_probs`, :func:`mask_logits`, :func:`verify_tree`,
  :func:`kv_append_`, :func:`kv_rollback_`,
  :func:`kv_compact_`, :func:`paged_kv_append_`, :func:`paged_kv_gather`, :func:`paged_kv_compact_`)
- :mod:`specdec_ext.cache`   :class:`KVCache`, :class:`BlockManager`, :class:`PagedKVCache`,
  :func:`spec_attention_mask`, :func:`spec_attention_mask_bool`
- :mod:`specdec_ext.models`  the model protocol (:class:`~specdec_ext.models.SpecModel`),
  the reference Llama decoder, the Hugging Face wrapper
- :mod:`specdec_ext.engine`  :class:`SpeculativeEngine` (draft -> score -> verify -> commit
  -> rollback, adaptive K), :class:`SpecDecMetrics`
- :mod:`specdec_ext.errors`  the error policy and the package's exception classes
- ``python -m specdec_ext.generate`` (CLI), ``python -m specdec_ext.bench`` (benchmarks),
  :mod:`specdec_ext.bundled` (the bundled model pair)
"""
import torch  # noqa: F401  (must come first: _C links against libtorch)

from ._load import _C  # noqa: F401  (loads the library: registers torch.ops.specdec.*; says why when it cannot)
from .cache import (Allocation, BlockManager, KVCache, PagedKVCache, TreeNodes, spec_attention_mask,
                    spec_attention_mask_bool, tree_attention_mask, tree_attention_mask_bool, tree_positions)
from .engine import Datastore, GenerationOutput, RowStats, SpecDecMetrics, SpeculativeEngine, SuffixConfig
from .errors import CacheFullError, DeviceFlagError, ModelOutputError, OutOfBlocksError, SpecDecError
from .ops import (LogprobsResult, TreeVerifyResult, VerifyResult, filtered_probs, kv_append_, kv_compact_,
                  kv_rollback_, mask_logits, pack_linear_weight, paged_kv_append_, paged_kv_compact_, paged_kv_gather, sample,
                  skinny_linear, softmax, tree_depth, verify, verify_tree)

__version__ = "0.1.0"


def has_cuda_kernels() -> bool:
    """True when this build of specdec_ext contains the CUDA kernels."""
    return bool(_C.CUDA_KERNELS)


__all__ = ["Allocation", "BlockManager", "CacheFullError", "Datastore", "DeviceFlagError", "GenerationOutput", "KVCache",
           "LogprobsResult", "ModelOutputError", "OutOfBlocksError", "PagedKVCache", "RowStats",
           "SpecDecError", "SpecDecMetrics", "SpeculativeEngine", "SuffixConfig", "TreeNodes", "TreeVerifyResult",
           "VerifyResult", "filtered_probs", "has_cuda_kernels", "kv_append_", "kv_compact_",
           "kv_rollback_", "mask_logits", "pack_linear_weight", "paged_kv_append_", "paged_kv_compact_", "paged_kv_gather",
           "sample", "skinny_linear", "softmax", "spec_attention_mask", "spec_attention_mask_bool", "tree_attention_mask",
           "tree_attention_mask_bool", "tree_depth", "tree_positions", "verify", "verify_tree"]
