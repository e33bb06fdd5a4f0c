"""The fused sampling ops ``specdec::verify`` and ``specdec::sample``: Python wrappers
(thin, over ``torch.ops.specdec``) and their fake kernels for torch.compile."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .registry import host_args
from ._fake_checks import (FLOATS, INDEX, check_devices, check_dim, check_dtype, check_filters,
                           check_row_values, check_token_logprobs)
from .logprobs import LogprobsResult, logprobs_args
from ._args import (FloatOrTensor, IntOrTensor, Temperature, bool_arg, filter_args, float_arg, int64_arg,
                    seed_arg, temperature_arg, verify_mode_arg)

__all__ = ["LogprobsResult", "VerifyResult", "sample", "verify"]

#: the op namespace the wrappers call (specdec_ext.testing.simt rebinds it to the SIMT emulation)
_OPS = torch.ops.specdec


class VerifyResult(NamedTuple):
    """Result of :func:`verify`.

    tokens       int64 [B, K+1]: accepted drafts, then the correction (or bonus) token, then -1
    num_accepted int64 [B] in [0, K]: row b emits num_accepted[b] + 1 tokens
    valid        bool  [B]: False exactly for a row with a NaN / +inf logit (positions 0 ..
                 num_drafts[b]), a used position whose logits are all -inf, a tested draft id
                 outside [0, V), a bad draft probability (NaN, +inf, negative) among the
                 entries the op reads (q(x) of every tested draft, the whole q row at the
                 rejected position), or an unusable value in a per-row DEVICE tensor
                 (temperature negative / NaN / inf / 1/T overflowing float32, a filter out of
                 range, num_drafts[b] outside [0, K]); such a row has tokens all -1 and
                 num_accepted 0. Finite logits of any size are fine (softmax is
                 exp((l - max) / T)): a valid row never holds an id outside [0, V)
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    valid: torch.Tensor


def verify(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: Temperature = 1.0,
    *,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
    num_drafts: Optional[torch.Tensor] = None,
    seed: Optional[IntOrTensor] = None,
    offset: IntOrTensor = 0,
    mode: str = "exact",
    probs_input: bool = False,
    logprobs: Optional[int] = None,
    logprobs_mode: str = "raw",
):
    """Verify K drafted tokens per row against the target model, in one fused op.

    Speculative sampling (Leviathan et al. / Chen et al.): draft x_i is accepted with
    probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token is drawn
    from max(0, p_i - q_i) normalised; if all K are accepted a bonus token is drawn
    from p_K. The emitted tokens are distributed exactly as sampling from the target
    (after the filters, if any: p is then the filtered law p').

    Parameters
    ----------
    target_logits : Tensor [B, K+1, V] float32 | float16 | bfloat16 (| float64)
        Target logits at the last committed token and the K drafts. Read natively,
        math in float32 (the wrapper converts float64 to float32; the raw op refuses it).
        Any strides (a vocab dim with stride != 1 is copied).
    draft_token_ids : Tensor [B, K] int64 | int32
    draft_probs : Tensor [B, K, V] float32 | float16 | bfloat16 (| float64, converted), optional
        The distributions the drafts were sampled from (after the draft's
        temperature), e.g. from :func:`sample` with ``probs_out``. None means
        deterministic drafts (n-gram, greedy drafter): q is one-hot at the draft.
    temperature : float or Tensor [B] float32
        Target temperature; 0 (per row) means greedy: accept iff the draft is the
        argmax, correction / bonus = argmax (filters do not apply).
    top_k : None, int, or Tensor [] / [B] int64 | int32
        Keep the tokens whose logit is >= the k-th largest (ties kept); 0 / None = off.
    top_p : None, float, or Tensor [] / [B] float32
        On the top-k survivors: keep token v iff the mass of survivors with a strictly
        higher logit is < top_p; in (0, 1], 1 / None = off.
    min_p : None, float, or Tensor [] / [B] float32
        Keep v iff p(v) >= min_p * max p; in [0, 1), 0 / None = off.
        The filters follow Hugging Face generate's warper order (temperature, top-k,
        top-p, min-p), are found without sorting (radix passes, csrc/core/filter_math.h)
        and the result is renormalised; the argmax always survives. Python numbers and
        CPU tensors are checked here (``ValueError``); a bad value in a device tensor
        makes its row invalid (no host sync). ``draft_probs`` must be the FILTERED draft
        law (what :func:`sample` with the same filters writes to ``probs_out``).
    num_drafts : Tensor [B] int64 | int32, optional
        Drafts row b tests, in [0, K] (None = K for every row). Row b uses drafts
        0..num_drafts[b]-1 and its correction / bonus comes from position
        num_drafts[b]; later positions are never read and their tokens are -1;
        num_drafts[b] = 0 is plain sampling from position 0. Shapes stay [B, K+1, V],
        so a captured CUDA graph replays with any mix.
    seed : None, int, or Tensor [] / [B] int64 (any device)
        None draws one from torch's default generator. An int seeds every row with
        its own stream (the row index joins the key); a [B] tensor gives each row
        (request) its own seed, so its result does not depend on its batch position.
    offset : int or Tensor [] / [B] int64 (any device)
        Philox counter offset; advance it between calls for fresh randomness. A
        device tensor lets a captured CUDA graph replay with new numbers. In coupled
        mode: the absolute position of each row's first verified token.
    mode : "exact" | "coupled" | "block"
        "exact": Leviathan's ratio test, token by token. "block": block verification (Sun et
        al., ICLR 2025; csrc/core/block_verify.h): the drafts are verified jointly, with a
        weighted residual at the stop; the emitted tokens follow the same law as "exact" and
        the expected number of accepted drafts is never lower (higher when p and q differ
        over several positions). It gains only with ``draft_probs`` (sampled drafts): with
        one-hot drafts (``draft_probs=None``) its law is exactly "exact"'s. Greedy rows are
        the same in every mode. One more pass over each draft position after the first;
        other tokens and random numbers than "exact" for the same seed. Block rows' logprobs
        come from :mod:`specdec::logprobs` (one more launch). "coupled": the token the target emits or
        matches at verified position i of row b is exactly
        ``sample(target_logits[b, i], temperature, top_k=, top_p=, min_p=, seed=seed[b],
        offset=offset[b] + i)`` (row b's stream of :func:`sample`); draft i is accepted
        iff it equals that token and the first mismatch emits it. If the draft also
        samples with ``offset = position`` (shared noise), it often draws the same token.
        The output is target-only sampling with the same seed, token for token, for any
        K, draft or batch makeup (with per-row seeds); ``draft_probs`` is not read.
    probs_input : bool
        True: ``target_logits`` holds PROBABILITIES (float32, >= 0, any positive scale per
        row), e.g. FlashInfer-style ``target_probs``. The kernel reads log p wherever it
        reads a logit, in the same pass (no separate log pass, no converted copy): p = 0 is
        -inf (no mass), a negative / NaN / +inf p makes the row invalid. At temperature 1
        the law is p / sum(p); a temperature T gives p^(1/T) renormalised.
    logprobs : None or int n in [0, 128]
        Also return the logprob of every emitted token and, for n > 0, the top-n (id,
        logprob) at each emitted position and the tokens' ranks (:class:`LogprobsResult`,
        P = K + 1). The emitted tokens' logprobs are written by the verify kernel itself,
        from the softmax stats it takes of each position (no further pass over the logits;
        the raw law's sum is taken in the same stats pass). For n > 0, one more launch over
        the emitted positions finds the top-n and the ranks (positions past a row's emitted
        tokens are not read: NaN / -1 there). No host sync.
    logprobs_mode : "raw" | "processed"
        "raw": log softmax(target_logits) at T = 1, no filter. "processed": the log of the
        target's law p' at that position, the law the emitted tokens follow (temperature, then
        the filters; -inf outside the kept set; a greedy row is one-hot: 0 at its argmax). A
        correction token of exact verify is drawn from the residual max(0, p' - q) but its
        logprob is reported under p'.

    Returns
    -------
    VerifyResult(tokens [B, K+1] int64, num_accepted [B] int64, valid [B] bool), or with
    ``logprobs``: (VerifyResult, LogprobsResult)
    """
    mode = verify_mode_arg(mode)
    coupled = mode == "coupled"
    lp = logprobs_args(logprobs, logprobs_mode)
    if num_drafts is not None and not isinstance(num_drafts, torch.Tensor):
        raise TypeError(f"num_drafts must be None or an int tensor [B], got {type(num_drafts).__name__}")
    logits, t, filters = float_arg(target_logits), temperature_arg(temperature), filter_args(top_k, top_p, min_p)
    probs_input = bool_arg(probs_input, "probs_input")
    if mode == "block":
        tokens, num_accepted, valid = _OPS.verify_block(
            logits, draft_token_ids, float_arg(draft_probs), t, seed_arg(seed), int64_arg(offset, "offset"), *filters,
            num_drafts, probs_input)
        result = VerifyResult(tokens, num_accepted, valid)
        if lp is None:
            return result
        return result, _logprobs_result(_OPS, logits, tokens, None, t, filters, lp, probs_input)
    token_lp = _token_logprobs_out(logits, lp, 3)
    tokens, num_accepted, valid = _OPS.verify(
        logits, draft_token_ids, float_arg(draft_probs), t, seed_arg(seed), int64_arg(offset, "offset"), *filters,
        num_drafts, coupled, probs_input, token_lp, lp is not None and lp[1])
    result = VerifyResult(tokens, num_accepted, valid)
    if lp is None:
        return result
    return result, _logprobs_result(_OPS, logits, tokens, token_lp, t, filters, lp, probs_input)


def sample(
    logits: torch.Tensor,
    temperature: Temperature = 1.0,
    *,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
    seed: Optional[IntOrTensor] = None,
    offset: IntOrTensor = 0,
    probs_out: Optional[torch.Tensor] = None,
    probs_input: bool = False,
    logprobs: Optional[int] = None,
    logprobs_mode: str = "raw",
):
    """Draw one token per row from softmax(logits / temperature), after the optional
    top-k / top-p / min-p filters, in one fused op.

    Parameters
    ----------
    logits : Tensor [B, V] float32 | float16 | bfloat16 (any row stride; float64 converted)
    temperature : float or Tensor [B] float32; 0 = argmax (greedy)
    top_k, top_p, min_p : as in :func:`verify`
    seed, offset : as in :func:`verify` (a separate random stream: the same seed in
        both ops gives independent numbers, except that coupled :func:`verify` reuses
        this op's stream at ``offset + i``)
    probs_out : Tensor [B, V] float32, optional
        Written in place with the normalised (filtered) probabilities the token was drawn from
        (one-hot at the argmax for a greedy row); may be a strided slice such as
        ``draft_probs[:, i]`` so K draft steps feed :func:`verify` with no host sync.
    probs_input : bool
        True: ``logits`` holds probabilities (float32), read as log p: see :func:`verify`.
    logprobs, logprobs_mode : as in :func:`verify` (the LogprobsResult tensors have no P
        dimension: token_logprobs / token_ranks [B], top_ids / top_logprobs [B, n])

    Returns
    -------
    Tensor [B] int64: the sampled ids, always in [0, V) for finite logits (any size) and a
    usable temperature; -1 for a row whose logits hold NaN / +inf or are all -inf, or whose
    device tensor temperature or filter value is unusable; its probs_out row is then 0.
    With ``logprobs``: (tokens, LogprobsResult).
    """
    lp = logprobs_args(logprobs, logprobs_mode)
    x, t, filters = float_arg(logits), temperature_arg(temperature), filter_args(top_k, top_p, min_p)
    probs_input = bool_arg(probs_input, "probs_input")
    token_lp = _token_logprobs_out(x, lp, 2)
    tokens = _OPS.sample(x, t, seed_arg(seed), int64_arg(offset, "offset"), probs_out, *filters, probs_input,
                         token_lp, lp is not None and lp[1])
    if lp is None:
        return tokens
    out = _logprobs_result(_OPS, x.unsqueeze(1), tokens.unsqueeze(1), token_lp.unsqueeze(1), t, filters, lp,
                           probs_input)
    return tokens, LogprobsResult(*(o if o is None else o[:, 0] for o in out))


def _token_logprobs_out(logits, lp, dim: int) -> Optional[torch.Tensor]:
    """The token_logprobs buffer the op fills when logprobs are asked ([B, K+1] / [B] float32), else None.
    Shapes the op would refuse get no buffer: the op's own error then names the argument."""
    if lp is None or not isinstance(logits, torch.Tensor) or logits.dim() != dim:
        return None
    return torch.empty(tuple(logits.shape[:dim - 1]), dtype=torch.float32, device=logits.device)


def _logprobs_result(ops, logits, tokens, token_lp, t, filters, lp, probs_input) -> LogprobsResult:
    """LogprobsResult from the op's token_logprobs; ranks and the top-n (n > 0) from specdec::logprobs,
    one more launch over the emitted positions (the top-n needs its own passes). ``ops``: the
    calling wrapper's op namespace (specdec_ext.testing.simt rebinds the wrappers' ``_OPS``)."""
    num_top, processed = lp
    if token_lp is None:  # the op wrote none (verify_block): every entry from specdec::logprobs
        token_lp, ranks, top_ids, top_lp = ops.logprobs(logits, tokens, t, *filters, num_top, processed, probs_input)
        return LogprobsResult(token_lp, ranks if num_top > 0 else None, top_ids, top_lp)
    if num_top == 0:  # no launch: no ranks, empty top-n
        none = tokens.new_empty(tuple(tokens.shape) + (0,))
        return LogprobsResult(token_lp, None, none, none.to(torch.float32))
    _, ranks, top_ids, top_lp = ops.logprobs(logits, tokens, t, *filters, num_top, processed, probs_input)
    return LogprobsResult(token_lp, ranks, top_ids, top_lp)


# ---- fake (meta) kernels: output shapes / dtypes for torch.compile tracing ----

@torch.library.register_fake("specdec::verify")
def _verify_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k=None, top_p=None,
                 min_p=None, num_drafts=None, coupled=False, probs_input=False, token_logprobs=None,
                 logprobs_processed=False):
    check_devices(target_logits, "target_logits",
                  dict(draft_token_ids=draft_token_ids, draft_probs=draft_probs, temperature=temperature, seed=seed,
                       offset=offset, top_k=top_k, top_p=top_p, min_p=min_p, num_drafts=num_drafts,
                       token_logprobs=token_logprobs),
                  host_ok=host_args("verify"))
    check_filters(top_k, top_p, min_p)
    check_dim(num_drafts, "num_drafts", 1, "[B]")
    check_dtype(num_drafts, "num_drafts", INDEX)
    check_dim(target_logits, "target_logits", 3, "[B, K+1, V]")
    check_dim(draft_token_ids, "draft_token_ids", 2, "[B, K]")
    check_dim(draft_probs, "draft_probs", 3, "[B, K, V]")
    check_dtype(target_logits, "target_logits", (torch.float32,) if probs_input else FLOATS)
    check_dtype(draft_token_ids, "draft_token_ids", INDEX)
    check_dtype(draft_probs, "draft_probs", FLOATS)
    check_row_values(temperature, seed, offset)
    B, K1 = target_logits.shape[0], target_logits.shape[1]
    check_token_logprobs(token_logprobs, (B, K1), "[B, K+1]")
    tokens = target_logits.new_empty((B, K1), dtype=torch.int64)
    num_accepted = target_logits.new_empty((B,), dtype=torch.int64)
    valid = target_logits.new_empty((B,), dtype=torch.bool)
    return tokens, num_accepted, valid


@torch.library.register_fake("specdec::verify_block")
def _verify_block_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k=None, top_p=None,
                       min_p=None, num_drafts=None, probs_input=False):
    return _verify_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p, min_p,
                        num_drafts, False, probs_input)


@torch.library.register_fake("specdec::sample")
def _sample_fake(logits, temperature, seed, offset, probs_out, top_k=None, top_p=None, min_p=None, probs_input=False,
                 token_logprobs=None, logprobs_processed=False):
    check_devices(logits, "logits", dict(temperature=temperature, seed=seed, offset=offset, probs_out=probs_out,
                                         top_k=top_k, top_p=top_p, min_p=min_p, token_logprobs=token_logprobs),
                  host_ok=host_args("sample"))
    check_filters(top_k, top_p, min_p)
    check_dim(logits, "logits", 2, "[B, V]")
    check_dim(probs_out, "probs_out", 2, "[B, V]")
    check_dtype(logits, "logits", (torch.float32,) if probs_input else FLOATS)
    check_dtype(probs_out, "probs_out", (torch.float32,))
    check_row_values(temperature, seed, offset)
    check_token_logprobs(token_logprobs, (logits.shape[0],), "[B]")
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


@torch.library.register_fake("specdec::verify_reference")
def _verify_reference_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k=None,
                           top_p=None, min_p=None, num_drafts=None, coupled=False, probs_input=False):
    """verify's fake kernel (the reference takes verify's arguments, less the logprobs output)."""
    return _verify_fake(target_logits, draft_token_ids, draft_probs, temperature, seed, offset, top_k, top_p, min_p,
                        num_drafts, coupled, probs_input)


@torch.library.register_fake("specdec::sample_reference")
def _sample_reference_fake(logits, temperature, seed, offset, top_k=None, top_p=None, min_p=None, probs_input=False):
    """sample's fake kernel, plus the probs [B, V] float32 the reference returns."""
    tokens = _sample_fake(logits, temperature, seed, offset, None, top_k, top_p, min_p, probs_input)
    return tokens, logits.new_empty(tuple(logits.shape), dtype=torch.float32)
