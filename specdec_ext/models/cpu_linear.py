"""Linear layers over a few rows on the CPU: the verification pass's matmuls.

A speculative step scores K + 1 tokens per row in one target pass, so its linear layers
multiply a handful of rows (M = B * (K + 1), 2 to ~17) by each weight. A small model's forward
on a CPU streams its weights from memory, and torch's default path (the BLAS behind
``F.linear``) spends more per call on a few rows than on one (a GEMV). In the bundled
target's forwards (transformers-loaded, 2 threads of a 2-core AMD EPYC VM, fp32, 2026-12-06,
one process, interleaved) its 43 linears took 1.73 / 2.51 / 2.53 ms at 1 / 4 / 17 rows through
``F.linear`` and 1.52 / 1.87 / 1.91 ms through ``torch.ops.specdec.skinny_linear``
(:func:`~specdec_ext.ops.skinny_linear`), which reads every weight row once per call whatever
M, so a few rows cost about what one row costs (``python -m specdec_ext.bench linear``).

:func:`linear` / :func:`residual_linear` take it for 1 to :data:`MAX_ROWS` rows of float32 CPU
tensors, and ``F.linear`` / ``addmm`` otherwise: more rows (prefills, wide batches: BLAS's
GEMM is efficient there), other devices and dtypes, autograd, and inside ``torch.compile``
(Inductor plans its own GEMMs). It is row-invariant (a row's result does not depend on the
other rows of the call), so the one-token pass and a K-token pass compute a token's
projections with the same bits; it agrees with ``F.linear`` to float32 rounding.

:func:`fast_linears` runs a ``transformers`` model's ``nn.Linear`` layers through it for the
duration of a ``with`` block (the batched HF path's forwards, :mod:`.hf`).

:func:`pack_linears_` gives layers a packed copy of their weight (:func:`~specdec_ext.ops.pack_linear_weight`),
which :func:`layer_linear` / :func:`layer_residual_linear` hand the kernel instead: outputs
vectorised, no horizontal sum per output, so a K + 1-row pass costs little more than a one-row
step in its matmuls (``python -m specdec_ext.bench linear``, method ``skinny_packed``). The
reference model packs its projections at load (:meth:`~specdec_ext.models.LlamaModel.pack_linears_`):
the bundled target's decode forward took 1.75 / 1.99 / 2.17 / 3.16 ms at 1 / 4 / 5 / 17 tokens
packed against 2.17 / 2.60 / 2.63 / 3.39 ms without (2026-12-06, commit 3486b22, 2 threads of
the 2-core EPYC VM, ``python -m specdec_ext.bench linear --forward``, interleaved).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.linear import PANEL, pack_linear_weight, skinny_linear  # noqa: F401  (registers the fake; re-exported)

_op = torch.ops.specdec.skinny_linear  # looked up once: a step calls it ~25-45 times

__all__ = ["AUTO_PACK_BYTES", "MAX_ROWS", "RowsLinear", "auto_pack_linears_", "fast_linears", "layer_linear",
           "layer_residual_linear", "linear", "pack_linears_", "packed_weight", "plain_linears", "residual_linear",
           "skinny_linear"]

#: The most rows :func:`linear` gives the skinny kernel (a B = 1 pass at the CLI's K = 16);
#: more go to ``F.linear``. Each weight row is reused from L1 by every row tile, so the cost
#: per extra row is its multiply-adds alone; past ~17 rows BLAS's blocked GEMM is faster.
MAX_ROWS = 17


def _skinny(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether x [M, in] @ weight.T (+ bias) takes the skinny kernel (see the module docstring).
    Mismatched shapes go to ``F.linear``, whose error names them as torch's users expect."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == torch.float32
            and x.device.type == "cpu" and weight.dtype == torch.float32 and weight.device.type == "cpu"
            and weight.dim() == 2 and x.shape[1] == weight.shape[1]
            and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"
                                  and bias.shape == weight.shape[:1]))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad)))
            and not torch.compiler.is_compiling())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           packed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [M, in], weight [out, in], bias [out] or None -> [M, out]
    (x of any other rank goes to ``F.linear`` as it is). packed: weight's
    :func:`~specdec_ext.ops.pack_linear_weight` [out / 16, in, 16] (it must hold the same
    values), which the skinny kernel then reads instead (see :func:`pack_linears_`)."""
    if _skinny(x, weight, bias):
        return _op(x, weight if packed is None else packed, bias, None)
    return F.linear(x, weight, bias)


def residual_linear(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor] = None, packed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``residual + F.linear(x, weight, bias)`` for 2-D residual [M, out] and x [M, in]: the
    skinny kernel with the add fused in (reading ``packed`` where given, as in :func:`linear`),
    or one ``addmm`` (no bias)."""
    if (_skinny(x, weight, bias) and residual.dtype == torch.float32 and residual.device.type == "cpu"
            and residual.shape == (x.shape[0], weight.shape[0])
            and not (torch.is_grad_enabled() and residual.requires_grad)):
        return _op(x, weight if packed is None else packed, bias, residual)
    if bias is None:
        return torch.addmm(residual, x, weight.t())
    return residual + F.linear(x, weight, bias)


class RowsLinear(nn.Linear):
    """``nn.Linear`` whose forward flattens the input to rows and calls :func:`linear` (with the
    module's packed weight where it has one): input [..., in] -> [..., out]. :func:`fast_linears`
    gives modules this class for a while."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        packed = _packed_outside_compile(self)  # its packed copy, where pack_linears_ gave it one
        if input.dim() == 2:
            return linear(input, self.weight, self.bias, packed)
        out = linear(input.reshape(-1, input.shape[-1]), self.weight, self.bias, packed)
        return out.view(*input.shape[:-1], out.shape[-1])  # not -1: a batch of 0 rows leaves it ambiguous


def plain_linears(model: nn.Module) -> List[nn.Linear]:
    """The modules of ``model`` whose class is exactly ``nn.Linear`` (a subclass may compute
    something else, so it is left alone)."""
    return [m for m in model.modules() if type(m) is nn.Linear]


@contextlib.contextmanager
def fast_linears(linears: Sequence[nn.Linear]) -> Iterator[None]:
    """Within the block, the given ``nn.Linear`` modules run through :func:`linear` (their
    class is :class:`RowsLinear`); afterwards they are plain ``nn.Linear`` again, also when the
    block raises. Their parameters, hooks and state dict are untouched. The class is swapped on
    the module objects, so another thread calling the same modules meanwhile also takes the
    skinny path (the same results to float32 rounding)."""
    done = []
    try:
        for m in linears:
            if type(m) is nn.Linear:
                object.__setattr__(m, "__class__", RowsLinear)  # no nn.Module.__setattr__ checks: ~0.1 us
                done.append(m)
        yield
    finally:
        for m in done:
            object.__setattr__(m, "__class__", nn.Linear)


# ---- packed weights ----------------------------------------------------------------

#: :func:`auto_pack_linears_` (the reference model at load, ``HFBatchedSpecModel``) packs a
#: model's linears when their weights hold at most this many bytes (the packed copies cost as
#: much memory again); a larger model packs on request (:func:`pack_linears_`).
AUTO_PACK_BYTES = 1 << 30

_PACKED = "_specdec_packed"  # module attribute: [packed tensor, weight version, weight data_ptr]


def pack_linears_(layers: Sequence[nn.Linear]) -> int:
    """Give each float32 CPU ``nn.Linear`` whose output count is a multiple of 16 a packed copy
    of its weight (:func:`~specdec_ext.ops.pack_linear_weight`), which :func:`layer_linear` /
    :func:`layer_residual_linear` then hand the skinny kernel: at 2 to 17 rows it costs little
    more than one row (csrc/cpu/skinny_linear_kernels.h gives the figures). Memory: as much
    again as those weights. The copy follows the weight: an in-place change or a new tensor
    (``load_state_dict``, ``.to()``) repacks it on the next call, or drops it where the weight
    is no longer float32 on the CPU. Not seen: a change through ``.data`` or an in-place change
    of an inference tensor (a weight made under ``torch.inference_mode``): call this again after
    one. Returns how many layers have a packed copy now.
    """
    done = 0
    for layer in layers:
        w = layer.weight
        if _packable(w):
            layer.__dict__[_PACKED] = [pack_linear_weight(w), _version(w), w.data_ptr()]
            done += 1
    return done


def auto_pack_linears_(layers: Sequence[nn.Linear]) -> int:
    """:func:`pack_linears_` when the layers' weights hold at most :data:`AUTO_PACK_BYTES`
    (else nothing); returns how many layers it packed."""
    if sum(m.weight.numel() * m.weight.element_size() for m in layers) > AUTO_PACK_BYTES:
        return 0
    return pack_linears_(layers)


def _packable(w: torch.Tensor) -> bool:
    """Whether :func:`~specdec_ext.ops.pack_linear_weight` takes w and the skinny kernel can read it."""
    return w.dim() == 2 and w.dtype == torch.float32 and w.device.type == "cpu" and w.shape[0] % PANEL == 0


def packed_weight(layer: nn.Module) -> Optional[torch.Tensor]:
    """The layer's packed weight (:func:`pack_linears_`), repacked first if the weight changed
    since; None where it has none (or the weight can no longer be packed: then it is dropped)."""
    entry = layer.__dict__.get(_PACKED)
    if entry is None:
        return None
    w = layer.weight
    if entry[1] != _version(w) or entry[2] != w.data_ptr():
        if not _packable(w):
            del layer.__dict__[_PACKED]
            return None
        entry[:] = [pack_linear_weight(w), _version(w), w.data_ptr()]
    return entry[0]


def _version(w: torch.Tensor) -> int:
    """w's version counter (bumped by every in-place change), or -1 for an inference tensor
    (made under ``torch.inference_mode``), which has none: an in-place change of one is not
    seen (a new tensor still is)."""
    return -1 if w.is_inference() else w._version


def layer_linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """:func:`linear` through an ``nn.Linear``'s weight and bias, its packed copy where it has one."""
    return linear(x, layer.weight, layer.bias, _packed_outside_compile(layer))


def layer_residual_linear(residual: torch.Tensor, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """:func:`residual_linear` through an ``nn.Linear``, its packed copy where it has one."""
    return residual_linear(residual, x, layer.weight, layer.bias, _packed_outside_compile(layer))


def _packed_outside_compile(layer: nn.Module) -> Optional[torch.Tensor]:
    """:func:`packed_weight`, or None while ``torch.compile`` traces (it plans its own GEMMs,
    and a version check would only add guards)."""
    return None if torch.compiler.is_compiling() else packed_weight(layer)
