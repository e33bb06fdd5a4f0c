"""Drop-in for FlashInfer's sampling functions (``flashinfer.sampling``), on specdec_ext's ops.

Same names, argument names, order and defaults as ``flashinfer/sampling.py``; outputs in
FlashInfer's dtypes: samples int32 (or the dtype of ``indices``), ``valid`` bool, renormalised
probabilities float32 (``top_k_renorm_probs``: the input's dtype), masked logits in the
input's dtype, chain verification int32 with -1 padding. Every draw is one
:func:`specdec_ext.sample` / :func:`specdec_ext.verify` call; probabilities go in with
``probs_input=True`` (the kernel reads log p in place of a logit: one fused pass, no
Python ``torch.log``).

    from specdec_ext.compat import flashinfer as fi
    samples = fi.top_k_top_p_sampling_from_logits(logits, 50, 0.9, seed=0, offset=step)

Shared parameters
-----------------
indices : Tensor [N] int32 | int64, optional
    Output row i is drawn from row ``indices[i]`` of the probabilities / logits (which
    then have R "unique" rows); the samples take ``indices``' dtype. The rows are
    gathered (a copy of N x V). An index outside [0, R) raises ``ValueError`` for a CPU
    tensor; in a device tensor it makes that output row invalid (no host sync).
top_k, top_p, min_p : number, or Tensor [R] (one value per probability row)
    A 0-dim or 2-D tensor, or one whose length is not R, raises ``ValueError``, as in
    FlashInfer. With ``indices``, output row i uses the value of row ``indices[i]``.
deterministic, is_deterministic : bool
    Accepted and ignored: the kernels are always deterministic (same inputs, seed and
    offset -> same output, on any batch).
generator : torch.Generator, optional
    Used only when ``seed`` is None: the seed is one draw from it.
check_nan : bool
    True: raise ``ValueError`` if the input holds a NaN (a host sync, as in FlashInfer).
seed, offset : int, or Tensor [1] / [batch_size] int64 | uint64
    Both ints or both tensors. As in FlashInfer's kernels only element 0 of a tensor is
    read, and output row i draws from its own stream keyed by (seed, offset, i). A tensor
    on the device keeps a captured CUDA graph replayable with fresh numbers.
return_valid : bool
    True: return ``(samples, valid)``; ``valid`` [N] bool is False for a row with no
    usable distribution, whose sample is 0 (FlashInfer's convention).

Differences from FlashInfer, point by point
-------------------------------------------
1. Ties are kept. Top-k keeps every token whose value equals the k-th largest, so more
   than k may survive (FlashInfer's renorm / mask kernels may keep only some ties).
   Top-p keeps v iff the mass of tokens with a strictly larger value is < top_p, so tokens
   tied at the cutoff are all kept or all dropped.
2. ``filter_apply_order="joint"`` is implemented, as two passes: the top-p set of the
   unfiltered law (:func:`specdec_ext.filtered_probs`), then a draw with top-k from it;
   the law is FlashInfer's (top-k set intersected with the top-p set of the unfiltered
   law, renormalised). ``"top_k_first"`` (top-p on the renormalised top-k survivors) is
   one fused call. Anything else raises ``ValueError``.
3. ``chain_speculative_sampling``'s ``output_accepted_token_num`` has FlashInfer's
   definition and law (the accepted prefix, plus an independent ratio test u * q(x) < p(x)
   with a fresh u at every later position, on the probabilities as given), but those extra
   tests draw from :func:`specdec_ext.sample`'s stream under a salted seed, not from the
   verification's stream. A row :func:`specdec_ext.verify` finds invalid (a NaN, +inf or
   negative target probability, an all-zero target row at a used position, a bad draft
   probability it reads, a tested draft id outside [0, V)) emits nothing: its tokens are
   all -1 and both counts add 0 (FlashInfer always emits one token).
4. The random stream is specdec_ext's counter-based Philox keyed by (seed, offset, row,
   ...), not curand's: the same seed and offset give other (equally distributed) samples
   than FlashInfer's. Offset is a plain counter: any change gives fresh numbers.
   ``seed=None`` draws the seed from ``generator``, else from torch's default CPU generator
   (``torch.manual_seed`` makes runs repeatable; no device sync); ``generator`` is advanced
   by one draw, not by FlashInfer's offset increment, and never read when a seed is given.
   ``offset=None`` means 0. (FlashInfer ignores a lone seed or offset and then takes both
   from the generator.)
5. Probabilities need not sum to 1: a row is used as p / sum(p) (FlashInfer assumes
   normalised rows). A row holding a NaN, +inf or a negative value, or only zeros, is
   invalid (sample 0, ``valid`` False). float16 / bfloat16 / float64 probabilities are
   cast to float32 first.
6. ``top_k = 0`` means no top-k filter (FlashInfer expects 1 <= k); ``top_k >= V`` keeps
   every token. ``min_p = 1`` keeps only the tokens tied with the most likely one (done
   as top-k = 1); per-row ``top_k`` / ``min_p`` tensors are read at the probability row
   (``indices[i]``) in every function (FlashInfer's top-k and min-p kernels read them at
   the output row i). A bad per-row value raises ``ValueError`` in a CPU tensor and makes
   the row invalid in a device tensor.
7. Logits: a row with a NaN / +inf logit or all -inf is invalid (sample 0); in
   ``top_k_mask_logits`` it comes back all NaN.
"""
from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch

import specdec_ext

from .._validate import check_int
from ..ops._args import bool_arg, seed_arg

__all__ = ["chain_speculative_sampling", "min_p_sampling_from_probs", "sampling_from_logits", "sampling_from_probs",
           "softmax", "top_k_mask_logits", "top_k_renorm_prob", "top_k_renorm_probs", "top_k_sampling_from_probs",
           "top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_probs", "top_p_renorm_prob",
           "top_p_renorm_probs", "top_p_sampling_from_probs"]

Samples = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]
IntParam = Union[int, torch.Tensor]
FloatParam = Union[float, torch.Tensor]
Seed = Optional[Union[int, torch.Tensor]]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_ORDERS = ("top_k_first", "joint")
# mixed into the seed of chain_speculative_sampling's extra ratio tests (point 3), so their
# stream differs from a draft sampler's that uses the same seed and offset
_ACCEPT_SALT = 0x2545F4914F6CDD1D


# ---- argument checks (the package's policy: TypeError for a type / dtype, ValueError else) ----

def _check_bool(**flags) -> None:
    for name, value in flags.items():
        bool_arg(value, name)


def _check_top_k_max(top_k_max) -> None:
    if top_k_max is not None:
        check_int("top_k_max", top_k_max, 1)


def _check_data(t, name: str, dims: int, layout: str, dtypes=None) -> None:
    """A float tensor of rank ``dims`` (``dtypes``: the allowed ones; default any float)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor {layout}, got {type(t).__name__}")
    if not (t.dtype in dtypes if dtypes else t.is_floating_point()):
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes) if dtypes else "a float dtype"
        raise TypeError(f"{name} must be {allowed}, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")


def _check_nan(t: torch.Tensor, name: str, check_nan: bool) -> None:
    if check_nan and bool(torch.isnan(t).any()):
        raise ValueError(f"{name} contains NaN (check_nan=True)")


def _probs32(probs: torch.Tensor) -> torch.Tensor:
    """Probabilities as ``probs_input=True`` reads them: float32 (a cast, never a log)."""
    return probs if probs.dtype == torch.float32 else probs.float()


def _row_param(value, name: str, rows: int, integer: bool):
    """top_k (``integer``) / top_p / min_p: a Python number as is (the ops check it), or a
    tensor [rows], converted to the dtype the ops read."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() != 1:
        got = "a 0-dimensional tensor" if value.dim() == 0 else f"a {value.dim()}D tensor"
        raise ValueError(f"{name} must be a number or a 1D tensor of shape (batch_size,) = ({rows},), got {got}")
    if value.shape[0] != rows:
        raise ValueError(f"{name}: sampling parameter tensor batch size mismatch: expected length {rows} (the rows "
                         f"of the input), got length {value.shape[0]}")
    if value.dtype == torch.bool or value.is_complex() or (integer and value.is_floating_point()):
        raise TypeError(f"{name} must be {'an integer' if integer else 'a real'} tensor, got {value.dtype}")
    if integer:
        return value if value.dtype in (torch.int32, torch.int64) else value.long()
    return value if value.dtype == torch.float32 else value.float()


def _min_p_args(min_p):
    """(min_p, top_k) for the ops: min_p = 1 (keep only the ties of the top token) becomes
    top_k = 1, since the ops take min_p in [0, 1)."""
    if isinstance(min_p, torch.Tensor):
        one = min_p == 1
        return torch.where(one, torch.zeros_like(min_p), min_p), one.long()
    if isinstance(min_p, numbers.Real) and not isinstance(min_p, bool):
        if min_p == 1:
            return None, 1
        if min_p > 1:
            raise ValueError(f"min_p must be in [0, 1], got {min_p!r}")
    return min_p, None


def _first(t: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    """Element 0 of a seed / offset tensor [1] or [batch] as an int64 [] view (no sync)."""
    if t.dtype not in (torch.int64, torch.uint64):
        raise TypeError(f"{name} tensor must be int64 or uint64, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] not in (1, batch):
        raise ValueError(f"{name} tensor must be 1D of length 1 or {batch} (batch_size), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    t = t[:1].reshape(())
    return t.view(torch.int64) if t.dtype == torch.uint64 else t


def _seed_offset(seed, offset, generator, batch: int):
    """(seed, offset) as :func:`specdec_ext.sample` takes them (point 4)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if seed is not None and offset is not None and isinstance(seed, torch.Tensor) != isinstance(offset, torch.Tensor):
        raise ValueError("seed and offset must both be tensors or both be ints")
    if isinstance(seed, torch.Tensor):
        seed = _first(seed, "seed", batch)
    if isinstance(offset, torch.Tensor):
        offset = _first(offset, "offset", batch)
    if seed is None:
        seed = (seed_arg(None) if generator is None else
                torch.randint(0, 2**62, (), dtype=torch.int64, generator=generator, device=generator.device))
    return seed, 0 if offset is None else offset


def _select_rows(x: torch.Tensor, indices, name: str):
    """(rows to draw from [N, V], index of each [N] int64 or None, ok [N] bool or None)."""
    if indices is None:
        return x, None, None
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be None or a tensor [batch_size], got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"indices must be int32 or int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be a 1D tensor [batch_size], got shape {tuple(indices.shape)}")
    if indices.device != x.device:
        raise ValueError(f"indices is on {indices.device} but {name} is on {x.device}")
    rows = x.shape[0]
    ok = (indices >= 0) & (indices < rows)
    if indices.device.type == "cpu" and not bool(ok.all()):
        bad = indices[~ok][0].item()
        raise ValueError(f"indices must lie in [0, {rows}) (the rows of {name}), got {bad}")
    if rows == 0:
        return x.new_zeros((indices.shape[0], x.shape[1])), torch.zeros_like(indices, dtype=torch.int64), ok
    idx = torch.where(ok, indices, torch.zeros_like(indices)).long()
    return x.index_select(0, idx), idx, ok


def _take(value, idx):
    """A per-row filter tensor [R] at the selected rows (R = 0: no rows to read, and every
    output row is invalid anyway)."""
    if not isinstance(value, torch.Tensor) or idx is None:
        return value
    return value.to(idx.device, non_blocking=True).index_select(0, idx) if value.shape[0] else None


def _draw(x: torch.Tensor, name: str, *, probs: bool, indices, generator, check_nan: bool, seed, offset,
          return_valid: bool, top_k=None, top_p=None, min_p=None, joint: bool = False) -> Samples:
    """One draw per output row from x [R, V] (probabilities or logits) under the filters."""
    _check_data(x, name, 2, "[batch_size, num_classes]")
    _check_nan(x, name, check_nan)
    rows = x.shape[0]
    top_k = _row_param(top_k, "top_k", rows, integer=True)
    top_p = _row_param(top_p, "top_p", rows, integer=False)
    min_p = _row_param(min_p, "min_p", rows, integer=False)
    if min_p is not None:
        min_p, top_k = _min_p_args(min_p)
    if probs or x.dtype == torch.float64:
        x = _probs32(x)  # float64 logits: cast, as the ops' wrappers do
    if joint and not (isinstance(top_p, numbers.Real) and top_p == 1):
        # point 2: the top-p set of the unfiltered law, then top-k within it
        x = specdec_ext.filtered_probs(x, top_p=top_p, probs_input=probs)
        probs, top_p = True, None
    x, idx, ok = _select_rows(x, indices, name)
    seed, offset = _seed_offset(seed, offset, generator, x.shape[0])
    tokens = specdec_ext.sample(x, 1.0, top_k=_take(top_k, idx), top_p=_take(top_p, idx), min_p=_take(min_p, idx),
                                seed=seed, offset=offset, probs_input=probs)
    valid = tokens >= 0
    if ok is not None:
        valid &= ok
    samples = torch.where(valid, tokens, torch.zeros_like(tokens))
    samples = samples.to(torch.int32 if indices is None else indices.dtype)
    return (samples, valid) if return_valid else samples


def _order(filter_apply_order) -> bool:
    """filter_apply_order -> joint?"""
    if not isinstance(filter_apply_order, str) or filter_apply_order not in _ORDERS:
        raise ValueError(f"filter_apply_order must be one of {_ORDERS}, got {filter_apply_order!r}")
    return filter_apply_order == "joint"


# ---- sampling ----

def sampling_from_logits(
    logits: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
) -> torch.Tensor:
    """Draw one category per row from softmax(logits).

    Parameters
    ----------
    logits : Tensor [batch_size, num_classes] float32 | float16 | bfloat16 (float64 cast)
        ([unique_batch_size, num_classes] with ``indices``)
    indices, deterministic, generator, check_nan, seed, offset : see the module docstring

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype with ``indices``); 0 for an
        invalid row (point 7 of the module docstring)
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan)
    return _draw(logits, "logits", probs=False, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=False)


def sampling_from_probs(
    probs: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
) -> Samples:
    """Draw one category per row from the probabilities ``probs`` (rows used as p / sum p).

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float (cast to float32), >= 0
        ([unique_batch_size, num_classes] with ``indices``)
    indices, deterministic, generator, check_nan, seed, offset, return_valid : see the
        module docstring

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype with ``indices``), or
    (samples, valid [batch_size] bool) with ``return_valid``; an invalid row samples 0
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan, return_valid=return_valid)
    return _draw(probs, "probs", probs=True, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=return_valid)


def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: FloatParam,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
) -> Samples:
    """Top-p (nucleus) sampling from probabilities.

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float (cast to float32), >= 0
    top_p : float in (0, 1] or Tensor [batch_size] float: keep v iff the mass of tokens more
        likely than v is < top_p (point 1 of the module docstring); 1 = off
    indices, deterministic, generator, check_nan, seed, offset, return_valid : see the
        module docstring

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype), or (samples, valid bool)
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan, return_valid=return_valid)
    return _draw(probs, "probs", probs=True, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=return_valid, top_p=top_p)


def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: IntParam,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
) -> Samples:
    """Top-k sampling from probabilities.

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float (cast to float32), >= 0
    top_k : int >= 0 or Tensor [batch_size] int32 | int64: keep the tokens at least as likely
        as the k-th most likely (ties kept, point 1); 0 = off (point 6)
    indices, deterministic, generator, check_nan, seed, offset, return_valid : see the
        module docstring

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype), or (samples, valid bool)
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan, return_valid=return_valid)
    return _draw(probs, "probs", probs=True, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=return_valid, top_k=top_k)


def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: FloatParam,
    indices: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
) -> Samples:
    """Min-p sampling from probabilities: keep v iff p(v) >= min_p * max p.

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float (cast to float32), >= 0
    min_p : float in [0, 1] or Tensor [batch_size] float; 0 = off, 1 = only the ties of the
        most likely token (point 6)
    indices, deterministic, generator, check_nan, seed, offset, return_valid : see the
        module docstring

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype), or (samples, valid bool)
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan, return_valid=return_valid)
    return _draw(probs, "probs", probs=True, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=return_valid, min_p=min_p)


def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: IntParam,
    top_p: FloatParam,
    indices: Optional[torch.Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    top_k_max: Optional[int] = None,
) -> torch.Tensor:
    """Top-k and top-p sampling from logits.

    Parameters
    ----------
    logits : Tensor [batch_size, num_classes] float32 | float16 | bfloat16 (float64 cast)
    top_k : int or Tensor [batch_size] int32 | int64, as in :func:`top_k_sampling_from_probs`
    top_p : float or Tensor [batch_size] float, as in :func:`top_p_sampling_from_probs`
    filter_apply_order : "top_k_first" (top-p on the renormalised top-k survivors) or
        "joint" (top-k set intersected with the top-p set of softmax(logits)); point 2
    indices, deterministic, generator, check_nan, seed, offset : see the module docstring
    top_k_max : int >= 1 or None: FlashInfer's bound on top_k (it sizes its kernel's work);
        checked and otherwise ignored, every k is exact here

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype); 0 for an invalid row
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan)
    _check_top_k_max(top_k_max)
    return _draw(logits, "logits", probs=False, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=False, top_k=top_k, top_p=top_p, joint=_order(filter_apply_order))


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: IntParam,
    top_p: FloatParam,
    indices: Optional[torch.Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Seed = None,
    offset: Seed = None,
    return_valid: bool = False,
    top_k_max: Optional[int] = None,
) -> Samples:
    """Top-k and top-p sampling from probabilities.

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float (cast to float32), >= 0
    top_k, top_p, filter_apply_order : as in :func:`top_k_top_p_sampling_from_logits`
    indices, deterministic, generator, check_nan, seed, offset, return_valid : see the
        module docstring
    top_k_max : as in :func:`top_k_top_p_sampling_from_logits`

    Returns
    -------
    samples : Tensor [batch_size] int32 (``indices``' dtype), or (samples, valid bool)
    """
    _check_bool(deterministic=deterministic, check_nan=check_nan, return_valid=return_valid)
    _check_top_k_max(top_k_max)
    return _draw(probs, "probs", probs=True, indices=indices, generator=generator, check_nan=check_nan, seed=seed,
                 offset=offset, return_valid=return_valid, top_k=top_k, top_p=top_p,
                 joint=_order(filter_apply_order))


# ---- renormalising and masking (no draw) ----

def softmax(logits: torch.Tensor, temperature: Optional[FloatParam] = None, enable_pdl: Optional[bool] = None
            ) -> torch.Tensor:
    """softmax(logits / temperature) of each row (FlashInfer's ``sampling.softmax``), one fused
    :func:`specdec_ext.softmax` call: the usual first step before ``chain_speculative_sampling``.

    Parameters
    ----------
    logits : Tensor [batch_size, num_classes] float32 | float16 | bfloat16
    temperature : None (= 1), a float, or Tensor [batch_size] float; 0 gives the one-hot law at
        the first argmax (FlashInfer divides by it)
    enable_pdl : bool, accepted and ignored (programmatic dependent launch is a CUDA launch detail)

    Returns
    -------
    probs : Tensor [batch_size, num_classes] float32 (a row with a NaN / +inf logit or all -inf:
    all 0, point 7)
    """
    if enable_pdl is not None:
        _check_bool(enable_pdl=enable_pdl)
    _check_data(logits, "logits", 2, "[batch_size, num_classes]", _FLOATS)
    if temperature is None:
        temperature = 1.0
    elif isinstance(temperature, torch.Tensor) and tuple(temperature.shape) != (logits.shape[0],):
        raise ValueError(f"temperature must be a float or a tensor [batch_size] = [{logits.shape[0]}], "
                         f"got shape {tuple(temperature.shape)}")
    return specdec_ext.softmax(logits, temperature)


def top_p_renorm_probs(probs: torch.Tensor, top_p: FloatParam, is_deterministic: bool = False) -> torch.Tensor:
    """Zero the probabilities outside the top-p set and renormalise.

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float (cast to float32), >= 0
    top_p : float in (0, 1] or Tensor [batch_size] float (point 1 of the module docstring)
    is_deterministic : bool, ignored (always deterministic)

    Returns
    -------
    renorm_probs : Tensor [batch_size, num_classes] float32 (an invalid row: all 0)
    """
    _check_bool(is_deterministic=is_deterministic)
    _check_data(probs, "probs", 2, "[batch_size, num_classes]")
    top_p = _row_param(top_p, "top_p", probs.shape[0], integer=False)
    return specdec_ext.filtered_probs(_probs32(probs), top_p=top_p, probs_input=True)


def top_k_renorm_probs(probs: torch.Tensor, top_k: IntParam, is_deterministic: bool = False) -> torch.Tensor:
    """Zero the probabilities below the k-th largest and renormalise (ties kept).

    Parameters
    ----------
    probs : Tensor [batch_size, num_classes] float32 | float16 | bfloat16, >= 0
    top_k : int >= 0 or Tensor [batch_size] int32 | int64; 0 = off (points 1 and 6)
    is_deterministic : bool, ignored (always deterministic)

    Returns
    -------
    renorm_probs : Tensor [batch_size, num_classes], ``probs``' dtype (an invalid row: all 0)
    """
    _check_bool(is_deterministic=is_deterministic)
    _check_data(probs, "probs", 2, "[batch_size, num_classes]", _FLOATS)
    top_k = _row_param(top_k, "top_k", probs.shape[0], integer=True)
    return specdec_ext.filtered_probs(_probs32(probs), top_k=top_k, probs_input=True).to(probs.dtype)


def top_k_mask_logits(logits: torch.Tensor, top_k: IntParam) -> torch.Tensor:
    """Set the logits below the k-th largest to -inf (ties kept).

    Parameters
    ----------
    logits : Tensor [batch_size, num_classes] float32 | float16 | bfloat16
    top_k : int >= 0 or Tensor [batch_size] int32 | int64; 0 = off (points 1 and 6)

    Returns
    -------
    masked_logits : Tensor [batch_size, num_classes], ``logits``' dtype (an invalid row:
        all NaN, point 7)
    """
    _check_data(logits, "logits", 2, "[batch_size, num_classes]", _FLOATS)
    top_k = _row_param(top_k, "top_k", logits.shape[0], integer=True)
    return specdec_ext.mask_logits(logits, top_k=top_k)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


# ---- chain speculative sampling ----

def _counter(t, name: str, batch: int, device: torch.device) -> torch.Tensor:
    """An accumulator [batch] the counts are added to in place (int32 zeros when None)."""
    if t is None:
        return torch.zeros(batch, dtype=torch.int32, device=device)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be None or an integer tensor [batch_size], got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != (batch,):
        raise ValueError(f"{name} must have shape ({batch},) (batch_size), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but draft_probs is on {device}")
    return t


def _later_accepts(target_probs, draft_probs, draft_ids, num_accepted, seed, offset) -> torch.Tensor:
    """Point 3: at each position from the first rejection on, an independent ratio test
    u * q(x) < p(x) (FlashInfer's "accepted if considered independently"); [B] int64."""
    B, K = draft_ids.shape
    V = target_probs.shape[-1]
    if B == 0 or K == 0 or V == 0:
        return torch.zeros(B, dtype=torch.int64, device=draft_ids.device)
    ids = draft_ids.long()
    in_range = (ids >= 0) & (ids < V)
    at = ids.clamp(0, V - 1).unsqueeze(-1)
    p = target_probs[:, :K].gather(2, at).squeeze(-1)
    q = draft_probs.gather(2, at).squeeze(-1).float()
    ratio = torch.where(q > 0, p / q, (p > 0).float())  # q(x) = 0: u * 0 < p(x) iff p(x) > 0
    a = torch.where(in_range, torch.nan_to_num(ratio, nan=0.0).clamp(0.0, 1.0), torch.zeros_like(ratio))
    # Bernoulli(a) as a draw from [a, 1 - a]: token 0 = accepted (seeded, no host sync)
    salted = seed ^ _ACCEPT_SALT
    coin = specdec_ext.sample(torch.stack([a, 1.0 - a], -1).reshape(B * K, 2), seed=salted, offset=offset,
                              probs_input=True).view(B, K)
    later = torch.arange(K, device=ids.device) >= num_accepted.unsqueeze(-1)
    return ((coin == 0) & later).sum(-1)


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Seed = None,
    offset: Seed = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling of a chain of drafts (Chen et al. / Leviathan et al.), one fused
    :func:`specdec_ext.verify` call: draft x_i is accepted iff u * q_i(x_i) < p_i(x_i); at the
    first rejection a token is drawn from max(0, p - q) normalised, after K acceptances a
    bonus token from p_K. The emitted tokens are distributed as sampling from the target.

    Parameters
    ----------
    draft_probs : Tensor [batch_size, K, vocab_size] float (float64 cast to float32)
        The draft laws the drafts were drawn from.
    draft_token_ids : Tensor [batch_size, K] int32 | int64
    target_probs : Tensor [batch_size, K + 1, vocab_size] float (cast to float32), >= 0
        The target's probabilities (rows used as p / sum p, point 5).
    maybe_output_accepted_token_num : Tensor [batch_size] int32 | int64, optional
        Added to in place (and returned): the accepted prefix plus the drafts after it that
        an independent ratio test accepts (point 3 of the module docstring).
    maybe_output_emitted_draft_token_num : Tensor [batch_size] int32 | int64, optional
        Added to in place (and returned): the drafts emitted (the accepted prefix); the row
        emits that many + 1 tokens.
    deterministic, generator, seed, offset : see the module docstring

    Returns
    -------
    output_token_ids : Tensor [batch_size, K + 1] int32
        The accepted drafts, then the correction or bonus token, then -1 (an invalid row:
        all -1, point 3).
    output_accepted_token_num : Tensor [batch_size] (int32 when created here)
    output_emitted_draft_token_num : Tensor [batch_size] (int32 when created here)
    """
    _check_bool(deterministic=deterministic)
    _check_data(draft_probs, "draft_probs", 3, "[batch_size, num_speculate_tokens, vocab_size]")
    _check_data(target_probs, "target_probs", 3, "[batch_size, num_speculate_tokens + 1, vocab_size]")
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dtype not in (torch.int32, torch.int64):
        got = draft_token_ids.dtype if isinstance(draft_token_ids, torch.Tensor) else type(draft_token_ids).__name__
        raise TypeError(f"draft_token_ids must be an int32 or int64 tensor, got {got}")
    B, K, V = draft_probs.shape
    if tuple(draft_token_ids.shape) != (B, K):
        raise ValueError(f"draft_token_ids must have shape ({B}, {K}) (batch_size, num_speculate_tokens of "
                         f"draft_probs), got {tuple(draft_token_ids.shape)}")
    if tuple(target_probs.shape) != (B, K + 1, V):
        raise ValueError(f"target_probs must have shape ({B}, {K + 1}, {V}) (batch_size, num_speculate_tokens + 1, "
                         f"vocab_size), got {tuple(target_probs.shape)}")
    device = draft_probs.device
    accepted_out = _counter(maybe_output_accepted_token_num, "maybe_output_accepted_token_num", B, device)
    emitted_out = _counter(maybe_output_emitted_draft_token_num, "maybe_output_emitted_draft_token_num", B, device)
    seed, offset = _seed_offset(seed, offset, generator, B)
    target32 = _probs32(target_probs)
    res = specdec_ext.verify(target32, draft_token_ids, draft_probs, 1.0, seed=seed, offset=offset, probs_input=True)
    emitted = res.num_accepted
    accepted = emitted + _later_accepts(target32, draft_probs, draft_token_ids, emitted, seed, offset)
    accepted = torch.where(res.valid, accepted, torch.zeros_like(accepted))
    accepted_out.add_(accepted.to(accepted_out.dtype))
    emitted_out.add_(emitted.to(emitted_out.dtype))
    return res.tokens.to(torch.int32), accepted_out, emitted_out
