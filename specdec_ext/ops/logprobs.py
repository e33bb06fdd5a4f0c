"""Log-probabilities of emitted tokens (``specdec::logprobs``): what :func:`verify` and
:func:`sample` return with ``logprobs=n``, and the op's fake kernel.

Two laws (``logprobs_mode``): ``"raw"`` is log softmax(logits) at T = 1 with no filter (what
the model said); ``"processed"`` is the log of the target's law p' at the position, which
the emitted tokens follow: temperature-scaled and filtered (-inf outside the kept set; a
greedy row is one-hot at its argmax: 0 there; a correction token of exact verify is drawn
from the residual max(0, p' - q) but reported under p'). Top-n: the n largest logits per position (ties: lower id first),
found with top-k's counting passes and sorted; every filter keeps a prefix of that order,
so it is also the processed law's order. Positions without an emitted token are not read:
NaN / -1 there.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._validate import check_int
from .registry import host_args
from ._fake_checks import FLOATS, INDEX, check_devices, check_dim, check_dtype, check_filters

__all__ = ["LogprobsResult", "MAX_TOP_LOGPROBS"]

#: the largest top-n (csrc/core/logprob_math.h kMaxTopLogprobs)
MAX_TOP_LOGPROBS = 128
_MODES = ("raw", "processed")


class LogprobsResult(NamedTuple):
    """Logprobs of the emitted tokens (:func:`~specdec_ext.verify` / :func:`~specdec_ext.sample`
    with ``logprobs=n``). P = K + 1 positions for verify (row b's emitted tokens are positions
    0 .. num_accepted[b]), none for sample (its tensors drop the P dimension).

    token_logprobs float32 [B, P]: the logprob of the emitted token (NaN past a row's emitted
                   tokens and for an invalid row). Written by the verify / sample kernel itself
                   from the softmax stats it takes of each position (no further pass over the
                   logits; the raw law's sum is taken in the same stats pass)
    token_ranks    int64 [B, P], or None for n = 0: its 1-based rank, the number of tokens whose
                   logit is >= its logit (vLLM's selected_token_ranks; 1 for a greedy row's
                   processed law); -1 where no token
    top_ids        int64 [B, P, n]: the n most likely ids, best first (-1 where none)
    top_logprobs   float32 [B, P, n]: their logprobs (NaN where none; -inf for a processed
                   law's filtered-out token)

    For n > 0, token_ranks and the top-n come from one more launch (``specdec::logprobs``: top-k's
    counting passes over each emitted position); n = 0 launches nothing more.
    """

    token_logprobs: torch.Tensor
    token_ranks: Optional[torch.Tensor]
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


def logprobs_args(logprobs, logprobs_mode) -> Optional[tuple]:
    """(num_top, processed) for the op, or None when ``logprobs`` is None (not asked)."""
    if not isinstance(logprobs_mode, str) or logprobs_mode not in _MODES:
        raise ValueError(f"logprobs_mode must be one of {_MODES}, got {logprobs_mode!r}")
    if logprobs is None:
        return None
    return check_int("logprobs", logprobs, 0, MAX_TOP_LOGPROBS), logprobs_mode == "processed"


@torch.library.register_fake("specdec::logprobs")
def _logprobs_fake(logits, tokens, temperature, top_k=None, top_p=None, min_p=None, num_top=0, processed=False,
                   probs_input=False):
    check_devices(logits, "logits", dict(tokens=tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                         min_p=min_p), host_ok=host_args("logprobs"))
    check_filters(top_k, top_p, min_p)
    check_dim(logits, "logits", 3, "[B, P, V]")
    check_dim(tokens, "tokens", 2, "[B, P]")
    if tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"tokens must be [B, P] = {list(logits.shape[:2])}, got shape {tuple(tokens.shape)}")
    check_dtype(logits, "logits", (torch.float32,) if probs_input else FLOATS)
    check_dtype(tokens, "tokens", INDEX)
    check_dtype(temperature, "temperature", FLOATS + (torch.float64,))
    if not 0 <= num_top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"num_top must be in [0, {MAX_TOP_LOGPROBS}], got {num_top}")
    B, P = logits.shape[0], logits.shape[1]
    return (logits.new_empty((B, P), dtype=torch.float32), logits.new_empty((B, P), dtype=torch.int64),
            logits.new_empty((B, P, num_top), dtype=torch.int64), logits.new_empty((B, P, num_top), dtype=torch.float32))
