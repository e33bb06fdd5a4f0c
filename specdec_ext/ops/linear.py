"""``skinny_linear``: a linear layer over a few rows on the CPU (the verification pass's
matmuls; :mod:`specdec_ext.models.cpu_linear` routes the reference model and the batched
transformers path through it)."""
from __future__ import annotations

from typing import Optional

import torch

from ._fake_checks import check_devices, check_dim, check_dtype

__all__ = ["PANEL", "pack_linear_weight", "skinny_linear"]

_F32 = (torch.float32,)

#: Outputs per panel of a packed weight (csrc/core/linear_params.h kSkinnyPanel).
PANEL = 16


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight.T (+ bias) (+ residual)`` for a few rows, on the CPU.

    Every weight element is read once per call whatever M. With the weight packed
    (:func:`pack_linear_weight`) a few rows cost little more than one; with an ``nn.Linear``
    weight as it is, each output is a dot product finished by a horizontal sum, and 4 rows
    cost about 1.8x one (torch's BLAS path is a GEMV for one row and a slower GEMM above it).

    Parameters
    ----------
    x : Tensor [M, K] float32 (last dim stride 1, else copied)
    weight : Tensor [N, K] float32 (last dim stride 1, else copied), e.g. an ``nn.Linear``
        weight; or Tensor [N / 16, K, 16] float32, that weight packed by
        :func:`pack_linear_weight` (contiguous, else copied)
    bias : Tensor [N] float32, or None
    residual : Tensor [M, N] float32, or None; added after the bias

    Returns
    -------
    Tensor [M, N] float32, contiguous, new (the arguments are only read). Row m depends on
    x[m] alone: the same bits whatever other rows the call holds, on any thread count. The
    order of the sums depends on the layout, so a packed and a plain weight agree to float32
    rounding, not bit for bit.

    Raises ``TypeError`` for a dtype other than float32 and ``ValueError`` for mismatched
    shapes or devices, naming the argument. CPU only (no CUDA kernel).
    """
    return torch.ops.specdec.skinny_linear(x, weight, bias, residual)


@torch.library.register_fake("specdec::skinny_linear")
def _skinny_linear_fake(x, weight, bias=None, residual=None):
    check_devices(x, "x", dict(weight=weight, bias=bias, residual=residual))
    for t, name in ((x, "x"), (weight, "weight"), (bias, "bias"), (residual, "residual")):
        check_dtype(t, name, _F32)
    check_dim(x, "x", 2, "[M, K]")
    M, K = x.shape
    if weight.dim() == 3:
        if weight.shape[1] != K or weight.shape[2] != PANEL:
            raise ValueError(f"packed weight must be [N / {PANEL}, K, {PANEL}] with K = {K} (x's last dim), "
                             f"got shape {tuple(weight.shape)}")
        N = weight.shape[0] * PANEL
    else:
        check_dim(weight, "weight", 2, f"[N, K] or packed [N / {PANEL}, K, {PANEL}]")
        N = weight.shape[0]
        if weight.shape[1] != K:
            raise ValueError(f"weight must be [N, K] with K = {K} (x's last dim), got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias must be [N] with N = {N} (the weight's outputs), got shape {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != (M, N):
        raise ValueError(f"residual must be [M, N] = [{M}, {N}], got shape {tuple(residual.shape)}")
    return x.new_empty(M, N)


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """The packed layout of an ``nn.Linear`` weight for :func:`skinny_linear`.

    weight : Tensor [N, K] float32, N a multiple of :data:`PANEL` (16)
    Returns a new contiguous Tensor [N / 16, K, 16]: panel p holds outputs 16p .. 16p + 15 as K
    rows of 16 (``packed[p, k, j] = weight[16 p + j, k]``), which the kernel reads front to
    back. It is a copy: repack after changing the weight. Raises ``TypeError`` for another
    dtype and ``ValueError`` for another shape, naming ``weight``.
    """
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a Tensor, got {type(weight).__name__}")
    check_dtype(weight, "weight", _F32)
    check_dim(weight, "weight", 2, "[N, K]")
    N, K = weight.shape
    if N % PANEL:
        raise ValueError(f"weight must have a multiple of {PANEL} rows to be packed, got shape {tuple(weight.shape)}")
    return weight.detach().reshape(N // PANEL, PANEL, K).transpose(1, 2).contiguous()
