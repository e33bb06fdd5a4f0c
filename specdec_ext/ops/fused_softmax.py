"""The fused temperature softmax ``specdec::softmax``: Python wrapper (thin, over
``torch.ops.specdec``) and its fake kernel for torch.compile."""
from __future__ import annotations

import torch

from ._args import Temperature, float_arg, temperature_arg
from ._fake_checks import FLOATS, check_devices, check_dim, check_dtype
from .registry import host_args

__all__ = ["softmax"]

#: the op namespace the wrapper calls (specdec_ext.testing.simt rebinds it to the SIMT emulation)
_OPS = torch.ops.specdec


def softmax(logits: torch.Tensor, temperature: Temperature = 1.0) -> torch.Tensor:
    """softmax(logits / temperature) of each row, in one fused op (no scaled copy of the logits).

    Parameters
    ----------
    logits : Tensor [B, V] float32 | float16 | bfloat16 (| float64, converted)
        Read natively, math in float32. Any row stride (a vocab dim with stride != 1 is copied).
    temperature : float or Tensor [] / [B] float32 | float64 | float16 | bfloat16
        0 (per row) gives the one-hot law at the first argmax. The one temperature rule: a
        Python value or a 0-dim CPU tensor that is negative, NaN, inf, overflows 1/T in float32
        or that float32 rounds to 0 raises ``ValueError``; in a [B] (or device) tensor such a
        value makes its row invalid.

    Returns
    -------
    Tensor [B, V] float32: the probabilities, exactly what :func:`specdec_ext.filtered_probs`
    gives with no filter (and :func:`specdec_ext.sample` writes to ``probs_out``); a row with a
    NaN / +inf logit, all -inf logits or an unusable per-row temperature is all 0 (as in
    ``filtered_probs``: such a row has no law; check ``probs.sum(-1) > 0``).
    """
    return _OPS.softmax(float_arg(logits), temperature_arg(temperature))


@torch.library.register_fake("specdec::softmax")
def _softmax_fake(logits, temperature):
    check_devices(logits, "logits", dict(temperature=temperature), host_ok=host_args("softmax"))
    check_dim(logits, "logits", 2, "[B, V]")
    check_dtype(logits, "logits", FLOATS)
    check_dtype(temperature, "temperature", FLOATS + (torch.float64,))
    return logits.new_empty(tuple(logits.shape), dtype=torch.float32)
