"""Fake (meta) kernels: output shapes/dtypes of each op for torch.compile tracing."""
import torch


@torch.library.register_fake("specdec::verify")
def _verify_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset):
    torch._check(target_logits.dim() == 3, lambda: "target_logits must be [B, K+1, V]")
    B, K1 = target_logits.shape[0], target_logits.shape[1]
    tokens = target_logits.new_empty((B, K1), dtype=torch.int64)
    num_accepted = target_logits.new_empty((B,), dtype=torch.int64)
    valid = target_logits.new_empty((B,), dtype=torch.bool)
    return tokens, num_accepted, valid


@torch.library.register_fake("specdec::sample")
def _sample_fake(logits, temperature, seed, offset, probs_out):
    torch._check(logits.dim() == 2, lambda: "logits must be [B, V]")
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


# ---- KV cache ops (specdec_ext/kv_cache.py, specdec_ext/paged_kv_cache.py) ----

@torch.library.register_fake("specdec::kv_append_")
def _kv_append_fake(key_cache, value_cache, new_k, new_v, lengths, overflow=None):
    torch._check(key_cache.dim() == 4, lambda: "key_cache must be [B, H, max_len, D]")
    torch._check(new_k.dim() == 4, lambda: "new_k must be [B, H, S, D]")
    return None


@torch.library.register_fake("specdec::kv_rollback_")
def _kv_rollback_fake(lengths, num_appended, num_kept, invalid=None):
    torch._check(lengths.dim() == 1, lambda: "lengths must be [B]")
    return None


@torch.library.register_fake("specdec::paged_kv_append_")
def _paged_kv_append_fake(key_cache, value_cache, new_k, new_v, slot_mapping, invalid=None):
    torch._check(key_cache.dim() == 4, lambda: "key_cache must be [num_blocks, block_size, H, D]")
    torch._check(new_k.dim() == 3, lambda: "new_k must be [T, H, D]")
    return None


@torch.library.register_fake("specdec::paged_kv_gather")
def _paged_kv_gather_fake(key_cache, value_cache, block_tables, lengths, max_len):
    torch._check(key_cache.dim() == 4, lambda: "key_cache must be [num_blocks, block_size, H, D]")
    torch._check(block_tables.dim() == 2, lambda: "block_tables must be [B, max_blocks_per_seq]")
    B, H, D = block_tables.shape[0], key_cache.shape[2], key_cache.shape[3]
    keys = key_cache.new_empty((B, H, max_len, D))
    values = value_cache.new_empty((B, H, max_len, D))
    return keys, values


@torch.library.register_fake("specdec::paged_kv_gather_into_")
def _paged_kv_gather_into_fake(key_cache, value_cache, block_tables, lengths, keys_out, values_out):
    torch._check(keys_out.dim() == 4, lambda: "keys_out must be [B, H, max_len, D]")
    return None
