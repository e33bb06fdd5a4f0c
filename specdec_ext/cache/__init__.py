"""KV caches and attention masks built on the ops.

- :class:`KVCache` (:mod:`.contiguous`): every layer's ``[B, H, max_len, D]`` keys and
  values, device lengths with a host mirror, O(1) rollback without a host sync;
- :class:`BlockManager` (:mod:`.block_manager`): the host-only block allocator of a paged
  cache (free list, reference counts, copy-on-write fork);
- :class:`PagedKVCache` (:mod:`.paged`): the paged device cache driven by a block manager;
- :func:`spec_attention_mask` / :func:`spec_attention_mask_bool` (:mod:`.attention_mask`).
"""
from .attention_mask import spec_attention_mask, spec_attention_mask_bool
from .block_manager import Allocation, BlockManager
from .contiguous import KVCache
from .paged import PagedKVCache

__all__ = ["Allocation", "BlockManager", "KVCache", "PagedKVCache", "spec_attention_mask", "spec_attention_mask_bool"]
