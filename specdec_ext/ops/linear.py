"""``skinny_linear``: a linear layer over a few rows on the CPU (the verification pass's
matmuls; :mod:`specdec_ext.models.cpu_linear` routes the reference model and the batched
transformers path through it)."""
from __future__ import annotations

from typing import Optional

import torch

from ._fake_checks import check_devices, check_dim, check_dtype

__all__ = ["skinny_linear"]

_F32 = (torch.float32,)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight.T (+ bias) (+ residual)`` for a few rows, on the CPU.

    Every weight row is read once per call whatever M, so 2 to ~17 rows cost about what one
    row costs (torch's BLAS path is a GEMV for one row and a slower GEMM above it).

    Parameters
    ----------
    x : Tensor [M, K] float32 (last dim stride 1, else copied)
    weight : Tensor [N, K] float32 (last dim stride 1, else copied), e.g. an ``nn.Linear`` weight
    bias : Tensor [N] float32, or None
    residual : Tensor [M, N] float32, or None; added after the bias

    Returns
    -------
    Tensor [M, N] float32, contiguous, new (the arguments are only read). Row m depends on
    x[m] alone: the same bits whatever other rows the call holds, on any thread count.

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
    check_dim(weight, "weight", 2, "[N, K]")
    M, K = x.shape
    N = weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(f"weight must be [N, K] with K = {K} (x's last dim), got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias must be [N] with N = {N} (weight's first dim), got shape {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != (M, N):
        raise ValueError(f"residual must be [M, N] = [{M}, {N}], got shape {tuple(residual.shape)}")
    return x.new_empty(M, N)
