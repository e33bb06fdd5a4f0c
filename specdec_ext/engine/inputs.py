"""Argument checks of :meth:`SpeculativeEngine.generate` (host side, before any forward)."""
from __future__ import annotations

import numbers
from typing import FrozenSet, List, Optional, Tuple

import torch

from .._validate import check_int, valid_temperatures

__all__ = ["check_eos", "check_prompts", "check_seed", "check_temperature_rows"]


def check_prompts(input_ids, attention_mask, vocab_size: int) -> Tuple[torch.Tensor, List[List[int]]]:
    """input_ids [B, T] (or [T]) int64|int32, attention_mask [B, T] of 0/1 (left or right
    padding) -> (ids [B, T] int64 CPU, each row's prompt as a list of ids)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an int64 (or int32) tensor [B, T], got "
                        f"{input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__}")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor [B, T] of 0/1, got {type(attention_mask).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
        attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): every row needs a prompt")
    ids = input_ids.detach().cpu().long()
    mask = torch.ones_like(ids, dtype=torch.bool)
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(ids.shape):
            raise ValueError(f"attention_mask must have input_ids' shape {tuple(ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
        m = attention_mask.detach().cpu()
        if not bool(((m == 0) | (m == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token), got values "
                             f"{torch.unique(m).tolist()[:8]}")
        mask = m == 1
    prompts = [ids[b][mask[b]].tolist() for b in range(ids.shape[0])]
    for b, p in enumerate(prompts):
        if not p:
            raise ValueError(f"row {b} of input_ids has an empty prompt (attention_mask is all 0)")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"row {b} of input_ids holds ids outside [0, {vocab_size}): {bad[:5]}")
    return ids, prompts


def check_temperature_rows(temperature, B: int) -> torch.Tensor:
    """float or Tensor [B] -> float32 [B] (CPU), every value valid by the one temperature rule."""
    if isinstance(temperature, bool) or not isinstance(temperature, (numbers.Real, torch.Tensor)):
        raise TypeError(f"temperature must be a float or a tensor [B], got {type(temperature).__name__}")
    t = torch.as_tensor(temperature).detach().cpu()
    if not t.dtype.is_floating_point and not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a floating tensor, got {t.dtype}")
    if t.dim() == 0:
        t = t.expand(B)
    if tuple(t.shape) != (B,):
        raise ValueError(f"temperature must be a float or a tensor [B] = [{B}], got shape {tuple(t.shape)}")
    ok = valid_temperatures(t.double())
    if not bool(ok.all()):
        raise ValueError("temperature must be 0 (greedy) or positive and finite with a finite inverse in float32; "
                         f"got {t[~ok].tolist()[:4]}")
    return t.to(torch.float32).clone()


def check_eos(eos_token_id, vocab_size: int) -> FrozenSet[int]:
    """None, an int, or ints -> a set of ids in [0, vocab_size)."""
    if eos_token_id is None:
        return frozenset()
    ids = eos_token_id if isinstance(eos_token_id, (list, tuple, set, frozenset)) else [eos_token_id]
    return frozenset(check_int("eos_token_id", e, 0, vocab_size - 1) for e in ids)


def check_seed(seed) -> Optional[int]:
    """None or an int that fits 64 bits."""
    return None if seed is None else check_int("seed", seed, -(2**63), 2**64 - 1)
