"""The ``torch.ops.specdec.*`` custom ops: one module per op family, each holding the
Python wrappers (shapes and dtypes in NumPy-style docstrings) next to the fake (meta)
kernels torch.compile traces with. The schemas live in csrc/ops.cpp.

- :mod:`.sampling`  ``verify``, ``sample``
- :mod:`.filtered`  ``filtered_probs``, ``mask_logits`` (the filtered law, no draw)
- :mod:`.fused_softmax` ``softmax`` (the fused temperature softmax)
- :mod:`.logprobs`  ``logprobs`` (verify / sample's ``logprobs=``: :class:`LogprobsResult`)
- :mod:`.tree`      ``verify_tree`` (tree speculation)
- :mod:`.shard`     ``verify_shard``, ``verify_shard_finish`` (the local stages of
  :mod:`specdec_ext.distributed`)
- :mod:`.kv`        ``kv_append_``, ``kv_rollback_``, ``kv_compact_`` (contiguous cache)
- :mod:`.paged_kv`  ``paged_kv_append_``, ``paged_kv_gather`` / ``paged_kv_gather_into_``,
  ``paged_kv_compact_``
- :mod:`.linear`    ``skinny_linear`` (a few rows through a linear layer, CPU) and
  ``pack_linear_weight`` (its fast weight layout)
- :mod:`._no_outputs` the ``no_outputs`` overload of ``sample`` / ``verify`` (their calls
  without output buffers, as torch.compile records them)
"""
from .. import _C  # noqa: F401  (registers the schemas the fake kernels below attach to)
from .filtered import filtered_probs, mask_logits
from .kv import kv_append_, kv_compact_, kv_rollback_
from .linear import pack_linear_weight, skinny_linear
from .logprobs import LogprobsResult
from .paged_kv import paged_kv_append_, paged_kv_compact_, paged_kv_gather
from .sampling import VerifyResult, sample, verify
from .fused_softmax import softmax
from . import shard  # noqa: F401  (fake kernels of verify_shard / verify_shard_finish)
from .tree import TreeVerifyResult, tree_depth, verify_tree
from . import _no_outputs

_no_outputs.register()  # sample / verify without output buffers compile as functional ops (see the module)

__all__ = ["LogprobsResult", "TreeVerifyResult", "VerifyResult", "filtered_probs", "kv_append_", "kv_compact_",
           "kv_rollback_", "mask_logits", "pack_linear_weight", "paged_kv_append_", "paged_kv_compact_", "paged_kv_gather",
           "sample", "skinny_linear", "softmax", "tree_depth", "verify", "verify_tree"]
