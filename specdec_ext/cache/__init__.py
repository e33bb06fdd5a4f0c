"""KV caches and attention masks built on the ops.

- :class:`KVCache` (:mod:`.contiguous`): every layer's ``[B, H, max_len, D]`` keys and
  values, device lengths with a host mirror, O(1) rollback without a host sync;
- :class:`BlockManager` (:mod:`.block_manager`): the host-only block allocator of a paged
  cache (free list, reference counts, copy-on-write fork);
- :class:`PagedKVCache` (:mod:`.paged`): the paged device cache driven by a block manager;
- :func:`spec_attention_mask` / :func:`spec_attention_mask_bool` (:mod:`.attention_mask`);
- :func:`tree_attention_mask` / :func:`tree_attention_mask_bool` / :func:`tree_positions` and
  :class:`TreeNodes` (:mod:`.tree_mask`): the same for a token tree (tree speculation);
- :mod:`.compaction`: moving a tree step's accepted entries to the front of the step's
  (``KVCache.compact`` / ``PagedKVCache.compact``).
"""
from .attention_mask import spec_attention_mask, spec_attention_mask_bool
from .block_manager import Allocation, BlockManager
from .contiguous import KVCache
from .paged import PagedKVCache
from .tree_mask import TreeNodes, tree_attention_mask, tree_attention_mask_bool, tree_positions

__all__ = ["Allocation", "BlockManager", "KVCache", "PagedKVCache", "TreeNodes", "spec_attention_mask",
           "spec_attention_mask_bool", "tree_attention_mask", "tree_attention_mask_bool", "tree_positions"]
