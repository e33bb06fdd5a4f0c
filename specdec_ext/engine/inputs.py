"""Argument checks of :meth:`SpeculativeEngine.generate` (host side, before any forward)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Tuple, Union

import torch

from .._validate import FILTER_DTYPES, check_filter, check_int, valid_temperatures

__all__ = ["FILTER_NAMES", "SamplingArgs", "check_eos", "check_filter_rows", "check_filters", "check_prompts",
           "check_seed", "check_temperature_rows"]

#: the sampling filters generate() passes on to sample / verify, in Hugging Face's warper order
FILTER_NAMES = tuple(FILTER_DTYPES)


@dataclass(frozen=True)
class SamplingArgs:
    """What every ``sample`` / ``verify`` call of a run gets besides logits and offsets,
    already checked and on the device.

    temperature : Tensor [B] float32 (0 = greedy row)
    filters     : {"top_k": None | int | Tensor [B] int64, "top_p" / "min_p": None | float |
                  Tensor [B] float32}
    seed        : int (the ops mix the row index in) or Tensor [B] int64 (per-row seeds)
    """

    temperature: torch.Tensor
    filters: Dict[str, Union[None, int, float, torch.Tensor]]
    seed: Union[int, torch.Tensor]

    def kwargs(self) -> dict:
        """The keyword arguments of sample / verify: top_k, top_p, min_p and seed."""
        return dict(self.filters, seed=self.seed)


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


def check_seed(seed, B: int) -> Union[None, int, torch.Tensor]:
    """None, an int that fits 64 bits, or a tensor [B] int64 of per-row seeds (returned as
    an int64 [B] CPU tensor; a seed is any 64-bit pattern)."""
    if not isinstance(seed, torch.Tensor):
        return None if seed is None else check_int("seed", seed, -(2**63), 2**64 - 1)
    if seed.dtype != torch.int64:
        raise TypeError(f"seed must be None, an int or an int64 tensor [B] of per-row seeds, got a {seed.dtype} tensor")
    if tuple(seed.shape) != (B,):
        raise ValueError(f"seed must be an int or a tensor [B] = [{B}] of per-row seeds, got shape {tuple(seed.shape)}")
    return seed.detach().cpu().clone()


def check_filter_rows(name: str, value, B: int) -> Union[None, int, float, torch.Tensor]:
    """One sampling filter of generate() (``name`` in :data:`FILTER_NAMES`), checked by the
    kernels' rule (:func:`specdec_ext._validate.check_filter`): None, a Python number
    (returned as the kernels see it), or a tensor [B] (int for top_k, float for top_p /
    min_p; returned as an int64 / float32 [B] CPU tensor, every value checked)."""
    if not isinstance(value, torch.Tensor):
        return None if value is None else check_filter(name, value)
    if tuple(value.shape) != (B,):
        raise ValueError(f"{name} must be a number or a tensor [B] = [{B}], got shape {tuple(value.shape)}")
    want_int = name == "top_k"
    if value.dtype == torch.bool or value.dtype.is_floating_point == want_int or value.dtype.is_complex:
        kind = "an integer" if want_int else "a floating"
        raise TypeError(f"{name} must be {kind} tensor [B], got {value.dtype}")
    rows = value.detach().cpu()
    for b, v in enumerate(rows.tolist()):
        try:
            check_filter(name, v)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{e} (at row {b} of the tensor)") from None
    return rows.to(FILTER_DTYPES[name]).clone()


def check_filters(B: int, **filters) -> Dict[str, Union[None, int, float, torch.Tensor]]:
    """{name: :func:`check_filter_rows`} for the filters of :data:`FILTER_NAMES`."""
    return {name: check_filter_rows(name, filters[name], B) for name in FILTER_NAMES}
