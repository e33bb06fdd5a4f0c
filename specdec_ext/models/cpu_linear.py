"""Linear layers over a few rows on the CPU: the verification pass's matmuls.

A speculative step scores K + 1 tokens per row in one target pass, so its linear layers
multiply a handful of rows (M = B * (K + 1), 2 to ~33) by each weight. On a CPU torch's
default path (the BLAS ``sgemm`` behind ``F.linear``) is built for one row (a GEMV reading
the weight once) or for many; in between it is slow. Measured on the bundled target's 25
weights (2 threads of a 2-core AMD EPYC VM, fp32, 2026-12-06): one row 0.52 ms, 2 rows
1.0 ms, 5 rows 1.2 ms, 17 rows 2.2-2.6 ms; the same weights prepacked once for oneDNN
(``torch.ops.mkldnn._reorder_linear_weight``, the layout Inductor's freezing uses) 0.57,
0.54, 0.60 and 0.97 ms. So a 2-token pass cost 1.3-1.5 one-token passes only because of its
matmuls, which wasted much of what speculation gains on a CPU. The whole forward with BLAS:
2.96 / 4.34 / 5.81 ms for 1 / 2 / 17 tokens; with this module 2.32 / 2.86 / 3.43 ms.

:func:`linear` takes the oneDNN path for 1 to :data:`MAX_ROWS` rows of a large enough weight
(:data:`MIN_NUMEL_ROWS`, :data:`MIN_NUMEL_ONE_ROW`; packed on first use, kept while the weight
tensor lives and is unchanged) and ``F.linear`` otherwise: more rows, small weights, other
devices and dtypes than float32, autograd, weights made under ``torch.inference_mode`` (no
version counter tells when they change), and inside ``torch.compile`` (which packs weights
itself when freezing). The results agree with ``F.linear`` to float32 rounding (another
summation order, as between BLAS's own paths).
"""
from __future__ import annotations

import weakref
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ["MAX_ROWS", "MIN_NUMEL_ONE_ROW", "MIN_NUMEL_ROWS", "linear", "prime", "residual_linear",
           "wide_linear_available"]

# id(weight) -> (a weak reference to it, its _version and data_ptr when packed, the packed copy)
_PACKED: Dict[int, Tuple[weakref.ref, int, int, torch.Tensor]] = {}


def wide_linear_available() -> bool:
    """Whether this torch has the oneDNN linear ops :func:`linear` uses."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


_AVAILABLE = wide_linear_available()

#: The most rows the packed path takes (a B = 1 pass at the CLI's K = 16); more go to
#: ``F.linear`` (prefills, wide batches: BLAS's GEMM is efficient there). oneDNN keeps a kernel
#: for each (row count, weight shape) it has run, about 0.7 MiB each (measured: 32 row counts
#: of one weight shape grew the process by 21.6-27 MiB, from 64x32 to 4096x192 weights), so the
#: bound keeps that at most MAX_ROWS kernels per weight shape and kind (plain, or with the
#: residual add fused): about 60 MiB for a Llama, whose five weight shapes each run one kind.
#: :func:`prime` makes them all up front.
MAX_ROWS = 17
#: The smallest weight (elements) the packed path takes for several rows, and for one row.
#: oneDNN spends 15-20 us more per call than the BLAS before any arithmetic, so it pays only
#: where BLAS is slow: a GEMM of a few rows, or a one-row GEMV of a large weight. Measured in
#: the bundled pair's forwards (2026-12-06): the 1-layer draft's one-token forward 0.34 ms with
#: BLAS throughout, 0.54 ms packed throughout, 0.38 ms with these bounds; the target's 2.78,
#: 2.81 and 2.48 ms; a 3-token target forward 4.18 ms with BLAS, 3.05 ms with these bounds.
MIN_NUMEL_ROWS = 2 ** 15
MIN_NUMEL_ONE_ROW = 2 ** 17


def _packed(weight: torch.Tensor) -> torch.Tensor:
    """The oneDNN-packed copy of ``weight`` [out, in], made once and renewed when the weight
    is written (its version counter moves) or its storage changes."""
    key = id(weight)
    entry = _PACKED.get(key)
    if entry is not None and entry[0]() is weight and entry[1] == weight._version and entry[2] == weight.data_ptr():
        return entry[3]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    _PACKED[key] = (weakref.ref(weight, lambda _, k=key: _PACKED.pop(k, None)), weight._version,
                    weight.data_ptr(), packed)
    return packed


def _wide(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether x [M, in] @ weight.T (+ bias) takes the packed path (see the module docstring).
    Mismatched shapes go to ``F.linear``, whose error names them (oneDNN's would not)."""
    return (_AVAILABLE and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS
            and weight.dim() == 2 and x.shape[1] == weight.shape[1]
            and (bias is None or (bias.shape == weight.shape[:1] and bias.dtype == torch.float32
                                  and bias.device.type == "cpu"))
            and weight.numel() >= (MIN_NUMEL_ONE_ROW if x.shape[0] == 1 else MIN_NUMEL_ROWS)
            and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.device.type == "cpu" and weight.device.type == "cpu"
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and not weight.is_inference())  # an inference tensor keeps no version counter to renew the pack by


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [M, in], weight [out, in], bias [out] or None -> [M, out]
    (x of any other rank goes to ``F.linear`` as it is)."""
    if _wide(x, weight, bias):
        return torch.ops.mkldnn._linear_pointwise(x, _packed(weight), bias, "none", [], "")
    return F.linear(x, weight, bias)


def residual_linear(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``residual + F.linear(x, weight, bias)`` for 2-D residual [M, out] and x [M, in]: one
    ``addmm`` (no bias) or the packed linear with the add fused in."""
    if (_wide(x, weight, bias) and residual.dtype == torch.float32 and residual.is_contiguous()
            and residual.shape == (x.shape[0], weight.shape[0])):
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, _packed(weight), bias, "add")
    if bias is None:
        return torch.addmm(residual, x, weight.t())
    return residual + F.linear(x, weight, bias)


def prime(weights) -> None:
    """Pack ``weights`` (tensors [out, in]) and run each once at every row count the packed
    path takes (1..MAX_ROWS), as :func:`linear` and as :func:`residual_linear` (oneDNN makes
    a kernel for each: the fused add is another one), so that the kernels exist up front and
    resident memory stays flat afterwards (a server's warm-up; a soak test's baseline)."""
    with torch.no_grad():
        for w in weights:
            for rows in range(1, MAX_ROWS + 1):
                x = torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device)
                linear(x, w)
                residual_linear(torch.zeros(rows, w.shape[0], dtype=w.dtype, device=w.device), x, w)
