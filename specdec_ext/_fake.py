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
