"""The filter-only ops ``specdec::filtered_probs`` and ``specdec::mask_logits``: the
filtered law of each row without a draw. Python wrappers (thin, over ``torch.ops.specdec``)
and their fake kernels for torch.compile.

Both run :func:`~specdec_ext.sample`'s passes up to the draw: the same cutoffs
(top-k / top-p / min-p, csrc/core/filter_math.h), the same softmax statistics and the same
arithmetic, so ``filtered_probs`` is bit for bit what ``sample(..., probs_out=)`` writes.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._args import FloatOrTensor, IntOrTensor, Temperature, bool_arg, filter_args, float_arg, temperature_arg
from .registry import host_args
from ._fake_checks import FLOATS, check_devices, check_dim, check_dtype, check_filters

__all__ = ["filtered_probs", "mask_logits"]

#: the op namespace the wrappers call (specdec_ext.testing.simt rebinds it to the SIMT emulation)
_OPS = torch.ops.specdec


def filtered_probs(
    logits: torch.Tensor,
    temperature: Temperature = 1.0,
    *,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
    probs_input: bool = False,
) -> torch.Tensor:
    """The renormalised filtered law of each row, in one fused op and with no draw.

    Parameters
    ----------
    logits : Tensor [B, V] float32 | float16 | bfloat16 (any row stride; float64 converted)
        With ``probs_input=True``: probabilities, float32 (read as log p, see
        :func:`~specdec_ext.verify`).
    temperature : float or Tensor [B] float32; 0 = greedy (one-hot at the first argmax,
        filters not applied)
    top_k, top_p, min_p : as in :func:`~specdec_ext.verify` (Hugging Face warper order:
        temperature, top-k, top-p, min-p; ties at a cutoff are kept)
    probs_input : bool, see above

    Returns
    -------
    Tensor [B, V] float32: softmax(logits / T) restricted to the kept tokens and
    renormalised, exactly what :func:`~specdec_ext.sample` writes to ``probs_out`` for the
    same row; all 0 for an invalid row (NaN / +inf logits, all -inf, or an unusable
    per-row device temperature / filter value).
    """
    return _OPS.filtered_probs(float_arg(logits), temperature_arg(temperature), *filter_args(top_k, top_p, min_p),
                               bool_arg(probs_input, "probs_input"))


def mask_logits(
    logits: torch.Tensor,
    temperature: Temperature = 1.0,
    *,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
) -> torch.Tensor:
    """The logits with -inf outside the kept set of the filters: the same cutoffs as
    :func:`filtered_probs`, in one fused op.

    Parameters
    ----------
    logits : Tensor [B, V] float32 | float16 | bfloat16 (any row stride; float64 converted)
    temperature : float or Tensor [B] float32
        Only moves the top-p / min-p cutoffs (they are defined on softmax(logits / T)); the
        output is NOT divided by it, so ``softmax(out / T) == filtered_probs(logits, T, ...)``.
        0 = greedy: only the first argmax is kept.
    top_k, top_p, min_p : as in :func:`~specdec_ext.verify`

    Returns
    -------
    Tensor [B, V], the dtype of ``logits`` (float32 for float64 input): each kept logit
    copied bit for bit, -inf elsewhere; all NaN for an invalid row.
    """
    return _OPS.mask_logits(float_arg(logits), temperature_arg(temperature), *filter_args(top_k, top_p, min_p))


# ---- fake (meta) kernels: output shapes / dtypes for torch.compile tracing ----

def _check_fake(logits, temperature, top_k, top_p, min_p, probs_input):
    check_devices(logits, "logits", dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p),
                  host_ok=host_args("filtered_probs"))  # mask_logits has the same
    check_filters(top_k, top_p, min_p)
    check_dim(logits, "logits", 2, "[B, V]")
    check_dtype(logits, "logits", (torch.float32,) if probs_input else FLOATS)
    check_dtype(temperature, "temperature", FLOATS + (torch.float64,))


@torch.library.register_fake("specdec::filtered_probs")
def _filtered_probs_fake(logits, temperature, top_k=None, top_p=None, min_p=None, probs_input=False):
    _check_fake(logits, temperature, top_k, top_p, min_p, probs_input)
    return logits.new_empty(logits.shape, dtype=torch.float32)


@torch.library.register_fake("specdec::mask_logits")
def _mask_logits_fake(logits, temperature, top_k=None, top_p=None, min_p=None):
    _check_fake(logits, temperature, top_k, top_p, min_p, False)
    return logits.new_empty(logits.shape)
