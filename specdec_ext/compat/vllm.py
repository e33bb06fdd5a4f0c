"""A rejection sampler with the shape of vLLM v1's (``vllm/v1/sample/rejection_sampler.py``),
running on ONE :func:`specdec_ext.verify` call. vLLM is not imported.

vLLM flattens a step's drafts over the batch: request i owns draft rows
``cu_num_draft_tokens[i] - num_draft_tokens[i] .. cu_num_draft_tokens[i] - 1`` of
``draft_token_ids`` / ``draft_probs`` and of ``target_logits_indices`` (rows of ``logits``
holding the target's prediction at each draft), and its bonus row is
``logits[bonus_logits_indices[i]]``. :class:`RejectionSampler` gathers that layout into
verify's padded one (``[B, max_spec_len + 1, V]`` with ``num_drafts``) with index tensors
only, calls verify once, and returns vLLM's output: ``[B, max_spec_len + 1]`` int32, the
accepted drafts, then the recovered (or bonus) token, then :data:`PLACEHOLDER_TOKEN_ID`.

The vLLM releases whose calls it takes (their V1 model runner and rejection-sampler tests;
checked against the releases 0.8.5 to 0.33, the last with these files; the releases between
0.15 and 0.20, if any, were not checked):

- <= 0.11: ``RejectionSampler()``, ``forward(metadata, draft_probs, target_logits,
  bonus_token_ids, sampling_metadata)`` -> Tensor [B, max_spec_len + 1] int32.
- 0.12 - 0.15: ``RejectionSampler(sampler)``, ``forward(metadata, draft_probs, logits,
  sampling_metadata)`` -> :class:`SamplerOutput`.
- 0.20 - 0.33: ``RejectionSampler(sampler, spec_config=None, device=None)``, the same forward.
- :class:`SpecDecodeMetadata`'s fields (``cu_num_sampled_tokens`` from 0.12) and
  ``SpecDecodeMetadata.make_dummy(draft_token_ids, device)``.

How the forms behave:

- with a ``sampler`` (vLLM's ``Sampler``, or a mock of it as vLLM's tests use), the bonus
  token is what ``sampler(logits=logits[bonus_logits_indices], sampling_metadata=...)``
  returns (its ``sampled_token_ids``, [B] or [B, 1]), as in vLLM (so its penalties and
  logits processors apply to the bonus token); its ``logprobs_mode`` is the sampler's.
- ``RejectionSampler()`` takes both forwards: vLLM <= 0.11's (the runner gathered
  ``target_logits`` [num_tokens, V] and sampled ``bonus_token_ids``; the result is the
  [B, max_spec_len + 1] tensor) and 0.12's, where this sampler draws the bonus itself, in the
  same verify call, from ``logits[bonus_logits_indices]`` with the request's temperature
  and filters.
- :class:`SpecDecodeMetadata` takes vLLM's fields by keyword or in either release's order
  (0.12+: 7 fields; <= 0.11: 6, without ``cu_num_sampled_tokens``), derives
  ``cu_num_sampled_tokens`` (and ``max_spec_len``) as vLLM does, and has vLLM's
  ``make_dummy(draft_token_ids, device)``.
- not offered, refused with the signatures above: 0.34's Model Runner V2 sampler
  (``RejectionSampler(sampler, spec_config, device, *, watermark_key=None)`` called
  ``(logits, input_batch, draft_logits)``), and the 5-argument forward on a RejectionSampler
  built with a ``sampler`` (no vLLM release has that pair). ``spec_config`` and ``device`` are
  accepted and not read (the method is exact speculative sampling; tensors carry their
  device).

Every shape that disagrees with the metadata (``logits`` rows, ``draft_probs``,
``bonus_token_ids``, the ``cu_num_*`` and index lengths, the sampler's output) is a
``ValueError`` naming the argument, raised before anything runs: the sampler is not called,
nothing is written, no request's step count advances. (The sampler's own output is checked
when it returns, and a filter value verify refuses in a CPU tensor is raised by verify after
the sampler ran; the step counts still do not advance.)

Semantics, as vLLM's where it has one:

- greedy: every row when ``all_greedy`` (``temperature`` may then be None), else a row
  whose temperature is < 1e-5 (vLLM's ``_SAMPLING_EPS``; its input batch writes 0.0 for
  greedy requests, older versions -1): accept a draft iff it is the target's argmax, the
  correction and the bonus are the argmax. Filters do not apply to greedy rows.
- filters "off": ``top_k`` <= 0 or >= V (vLLM writes V for "off"), ``top_p`` = 1,
  ``min_p`` = 0; a field that is None is off for every row.
- the law: drafts are tested against the FILTERED target law p' (temperature, top-k,
  top-p, min-p), the recovered token is drawn from max(0, p' - q) normalised and the bonus
  from p' at the bonus row, so every emitted token follows p' exactly. ``draft_probs=None``
  (n-gram drafts) means q is one-hot at the draft: accept with probability p'(x).

Differences from vLLM, all deliberate:

- min_p also applies to the verified tokens. vLLM applies it (a logits processor) only
  when sampling the bonus token: its rejection sampler skips argmax-invariant logits
  processors (vllm-project/vllm#42744), so under speculation its min_p is silently
  dropped at every verified position. Applying it everywhere is the fix, not a difference
  in intent. vLLM keeps min_p in ``logitsprocs``; here it is the ``min_p`` field.
- filter order: Hugging Face's (temperature, top-k, top-p, min-p). vLLM's sampler applies
  min-p before top-k / top-p. The laws agree unless top-p and min-p are both on (top-p's
  mass is then taken over the top-k survivors here, over the min-p and top-k survivors
  in vLLM). A vLLM ``min_p`` of exactly 1 is read as the largest float32 below 1.
- without a ``sampler``, the bonus token is drawn inside the same op from
  ``logits[bonus_logits_indices]`` with the same temperature and filters. vLLM samples it
  with its full ``Sampler`` (as this sampler does when given one); penalties, bad words,
  allowed-token masks, logit bias and other logits processors are NOT applied to the
  verified positions here: apply them to ``logits`` (masked entries = -inf) before calling.
- an external bonus token (the sampler's, or <= 0.11's ``bonus_token_ids``) enters verify as
  a one-hot law at the bonus position, so it is emitted exactly when every draft is
  accepted; one outside [0, V) makes that row invalid when it would be emitted.
- randomness: counter-based Philox keyed by (seed, offset, position, token), not torch
  generators, so the numbers differ from vLLM's for the same seed (the law is the same).
  See :meth:`RejectionSampler.forward` for how requests' generators map to seeds.
- a row the op reports invalid (a NaN / +inf logit in the rows it reads, a used position
  whose logits are all -inf, a draft id outside [0, V), a bad draft probability, a bad
  per-row value in a device tensor, an index in ``*_logits_indices`` outside ``logits``' rows
  or a ``cu_num_draft_tokens`` that disagrees with ``num_draft_tokens``, at a position it
  reads: these are device values, read without a sync and never gathered out of range)
  comes back as a row of :data:`PLACEHOLDER_TOKEN_ID`
  only (vLLM's ``parse_output`` then yields no token for it) and ``valid[b] = False`` in
  :class:`SamplerOutput`.
- logprobs (``max_num_logprobs = n``) come in vLLM's ``LogprobsTensors`` layout, one row per
  (request, output position) of ``sampled_token_ids`` (B * (max_spec_len + 1) rows, row
  b * (max_spec_len + 1) + i): column 0 the token's own logprob, then the top-n, and its
  rank. ``RejectionSampler(logprobs_mode=)`` takes vLLM's ``"raw_logprobs"`` (log softmax of
  the target logits, vLLM's default) or ``"processed_logprobs"`` (the temperature-scaled,
  filtered law); the ``*_logits`` modes are not offered. Placeholder rows hold -1 ids and
  NaN logprobs (vLLM computes them on token 0 and drops them in ``parse_output``; so does
  the placeholder mask there). With a sampler, ``logprobs_mode`` is the sampler's
  ``logprobs_mode`` and ``bonus_logits_indices`` must then be [B] (the bonus position's
  logprobs are the bonus row's). They come from :func:`specdec_ext.verify`'s ``logprobs=``:
  the tokens' logprobs from verify's own softmax stats, the ranks and the top-n from one more
  launch over the emitted positions, no host sync. A greedy row's processed
  logprobs are one-hot (0 at the argmax, -inf elsewhere: the law that row follows), where
  vLLM reports the softmax at temperature 1.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Union

import torch

from .._validate import check_int
from ..ops._args import bool_arg, float_arg
from ..ops._fake_checks import FLOATS, INDEX, check_devices, check_dim, check_dtype
from ..ops.logprobs import MAX_TOP_LOGPROBS, LogprobsResult
from ..ops.sampling import verify

__all__ = ["LogprobsTensors", "PLACEHOLDER_TOKEN_ID", "RejectionSampler", "SamplerOutput", "SamplingMetadata",
           "SpecDecodeMetadata"]

#: vLLM's filler for the positions of ``sampled_token_ids`` past a request's last token
PLACEHOLDER_TOKEN_ID = -1

#: vLLM's greedy threshold (``_SAMPLING_EPS``): temperature below it means greedy
SAMPLING_EPS = 1e-5
# vLLM's logprobs modes this sampler offers -> verify's logprobs_mode
_LOGPROBS_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}

_FLOAT_INPUTS = FLOATS + (torch.float64,)  # verify's wrapper converts float64 to float32
_MIN_P_BELOW_ONE = float(torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)))
_SEED_HIGH = 2**62


# vLLM's SpecDecodeMetadata fields, in its order from 0.12 (7 fields) and up to 0.11 (6: no
# cu_num_sampled_tokens); either order is taken positionally (see SpecDecodeMetadata)
_MD_FIELDS = ("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens", "cu_num_sampled_tokens",
              "target_logits_indices", "bonus_logits_indices", "logits_indices")
_MD_FIELDS_011 = tuple(f for f in _MD_FIELDS if f != "cu_num_sampled_tokens")
_MD_REQUIRED = ("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens", "target_logits_indices",
                "bonus_logits_indices")


def _md_signature_text() -> str:
    return (f"SpecDecodeMetadata({', '.join(_MD_FIELDS)}) (vLLM >= 0.12) or "
            f"SpecDecodeMetadata({', '.join(_MD_FIELDS_011)}) (vLLM <= 0.11), positionally or by keyword "
            "(cu_num_sampled_tokens and logits_indices may be omitted)")


def _draft_lists(draft_token_ids, name: str = "draft_token_ids") -> List[List[int]]:
    """``draft_token_ids`` (B host lists of ints) checked: a TypeError / ValueError naming it."""
    if isinstance(draft_token_ids, torch.Tensor) or not isinstance(draft_token_ids, Sequence):
        raise TypeError(f"{name} must be a list of B lists of ints (host data), got "
                        f"{type(draft_token_ids).__name__}")
    out = []
    for i, ids in enumerate(draft_token_ids):
        if isinstance(ids, (torch.Tensor, str)) or not isinstance(ids, Sequence):
            raise TypeError(f"{name}[{i}] must be a list of ints, got {type(ids).__name__}")
        if all(type(t) is int for t in ids):  # the common case, without a call per token
            out.append(list(ids))
        else:
            out.append([check_int(f"{name}[{i}][{j}]", t) for j, t in enumerate(ids)])
    return out


@dataclass(init=False)
class SpecDecodeMetadata:
    """vLLM's ``SpecDecodeMetadata`` (vllm/v1/spec_decode/metadata.py): one step's drafts,
    flattened over the batch (B requests, num_tokens = sum(num_draft_tokens) drafts).

    Built as vLLM builds it: by keyword, or positionally in vLLM's field order (all 7 fields
    from 0.12, or the 6 of <= 0.11, which had no ``cu_num_sampled_tokens``; with 4 or 5
    positional arguments the order is ambiguous and refused). Fields may be reassigned
    afterwards, as vLLM's tests do; :meth:`RejectionSampler.forward` checks them.

    Parameters
    ----------
    draft_token_ids : Tensor [num_tokens] int32 | int64
        Every request's drafts, request after request.
    num_draft_tokens : list[int] of length B
        Drafts of each request (0 allowed). Host data: only read for checks and sizes.
    cu_num_draft_tokens : Tensor [B] int32 | int64
        Inclusive cumulative sum of ``num_draft_tokens``. Its values must agree with
        ``num_draft_tokens`` (not checked on the host, which would need a sync: a request
        whose drafts fall outside ``draft_token_ids`` comes back invalid).
    cu_num_sampled_tokens : Tensor [B] int32 | int64, optional
        Inclusive cumsum of ``num_draft_tokens + 1``. Omitted (or None): derived as vLLM
        derives it, ``cu_num_draft_tokens + [1, 2, .., B]`` on ``cu_num_draft_tokens``'
        device and dtype (no host sync). Not read by this sampler; its shape is checked.
    target_logits_indices : Tensor [num_tokens] int32 | int64
        Row of ``logits`` holding the target's prediction at each draft.
    bonus_logits_indices : Tensor [B] int32 | int64
        Row of ``logits`` holding each request's bonus (after-the-last-draft) prediction.
        With a sampler it only selects the rows passed to it (any length: vLLM's tests mock
        the sampler and pass an empty one), unless logprobs are asked.
    logits_indices : Tensor [num_tokens + B] int32 | int64, optional
        Rows of the hidden states the logits were computed from. Not read by this sampler;
        its shape is checked when given.

    Attributes
    ----------
    max_spec_len : int
        ``max(num_draft_tokens)`` (set on construction, as vLLM does); the output has
        ``max_spec_len + 1`` columns. May be raised afterwards (e.g. to a fixed K for a
        captured CUDA graph); it must stay >= every ``num_draft_tokens[i]``.

    Raises
    ------
    TypeError for a wrong call (the message gives both field orders) or a ``num_draft_tokens``
    that is not a list of ints; ValueError for a negative count, or, when
    ``cu_num_sampled_tokens`` is derived, a ``cu_num_draft_tokens`` that is not an int
    tensor [B].
    """

    draft_token_ids: torch.Tensor
    num_draft_tokens: List[int]
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: Optional[torch.Tensor]
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: Optional[torch.Tensor]

    def __init__(self, *args, **kwargs):
        if len(args) > 7 or len(args) in (4, 5):
            raise TypeError(f"{len(args)} positional arguments (with 4 or 5 the release's order is ambiguous: give "
                            f"all 7 or 6, or the rest by keyword): expected {_md_signature_text()}")
        order = _MD_FIELDS_011 if len(args) == 6 else _MD_FIELDS
        values = dict(zip(order, args))
        for name, value in kwargs.items():
            if name not in _MD_FIELDS:
                raise TypeError(f"unexpected field {name!r}: expected {_md_signature_text()}")
            if name in values:
                raise TypeError(f"field {name!r} given twice (positionally and by keyword): expected "
                                f"{_md_signature_text()}")
            values[name] = value
        missing = [f for f in _MD_REQUIRED if f not in values]
        if missing:
            raise TypeError(f"missing field(s) {', '.join(missing)}: expected {_md_signature_text()}")
        n = _num_draft_tokens(values["num_draft_tokens"])
        if values.get("cu_num_sampled_tokens") is None:
            # vLLM computes it on the host as cumsum(num_draft_tokens + 1); from the device
            # cumsum it is the same numbers without a sync (and without reading the host list twice)
            cu = _tensor(values["cu_num_draft_tokens"], "cu_num_draft_tokens", INDEX, "[batch_size]", (len(n),))
            values["cu_num_sampled_tokens"] = cu + torch.arange(1, len(n) + 1, dtype=cu.dtype, device=cu.device)
        for name in _MD_FIELDS:
            setattr(self, name, values.get(name))
        self.max_spec_len = max(n, default=0)

    @classmethod
    def make_dummy(cls, draft_token_ids: Sequence[Sequence[int]],
                   device: Union[str, torch.device, None]) -> "SpecDecodeMetadata":
        """vLLM's ``make_dummy``: metadata for per-request draft lists whose logits indices
        are all 0 (vLLM's profiling run and its tests build it so, then set the indices they
        need).

        Parameters
        ----------
        draft_token_ids : list of B lists of ints (a list may be empty)
        device : where the tensors go

        Returns
        -------
        SpecDecodeMetadata with int32 tensors: ``draft_token_ids`` [num_tokens],
        ``cu_num_draft_tokens`` / ``cu_num_sampled_tokens`` [B] (inclusive cumsums of the
        counts and of the counts + 1), ``target_logits_indices`` [num_tokens],
        ``bonus_logits_indices`` [B] and ``logits_indices`` [num_tokens + B] all zeros.
        """
        lists = _draft_lists(draft_token_ids)
        n = [len(ids) for ids in lists]
        num_tokens, B = sum(n), len(n)

        def i32(values):
            return torch.tensor(values, dtype=torch.int32, device=device)

        cu = list(itertools.accumulate(n))
        zeros = lambda size: torch.zeros(size, dtype=torch.int32, device=device)  # noqa: E731
        return cls(draft_token_ids=i32([t for ids in lists for t in ids]), num_draft_tokens=n,
                   cu_num_draft_tokens=i32(cu), cu_num_sampled_tokens=i32([c + i + 1 for i, c in enumerate(cu)]),
                   target_logits_indices=zeros(num_tokens), bonus_logits_indices=zeros(B),
                   logits_indices=zeros(num_tokens + B))

    @classmethod
    def from_draft_token_ids(cls, draft_token_ids: Sequence[Sequence[int]],
                             device: Union[str, torch.device, None] = None) -> "SpecDecodeMetadata":
        """Metadata for per-request draft lists, with the logits rows laid out as vLLM's
        GPU model runner lays them out: request i's ``num_draft_tokens[i]`` target rows,
        then its bonus row, request after request (so ``logits`` has num_tokens + B rows).
        Not a vLLM function (its :meth:`make_dummy` leaves the indices 0).

        Parameters
        ----------
        draft_token_ids : list of B lists of ints (a list may be empty)
        device : where the tensors go (default: the CPU)

        Returns
        -------
        SpecDecodeMetadata with int32 tensors (``draft_token_ids`` [num_tokens],
        ``cu_num_*`` [B], ``target_logits_indices`` [num_tokens], ``bonus_logits_indices``
        [B], ``logits_indices`` [num_tokens + B] = arange)
        """
        lists = _draft_lists(draft_token_ids)
        cu_draft, target, bonus, row = [], [], [], 0
        for ids in lists:
            k = len(ids)
            target.extend(range(row, row + k))
            bonus.append(row + k)
            row += k + 1
            cu_draft.append((cu_draft[-1] if cu_draft else 0) + k)

        def i32(values):
            return torch.tensor(values, dtype=torch.int32, device=device)

        # cu_num_sampled_tokens is left to the derivation (the runner's numbers: cu + 1, 2, ..)
        return cls(draft_token_ids=i32([t for ids in lists for t in ids]), num_draft_tokens=[len(i) for i in lists],
                   cu_num_draft_tokens=i32(cu_draft), target_logits_indices=i32(target),
                   bonus_logits_indices=i32(bonus), logits_indices=i32(list(range(row))))


def _num_draft_tokens(n, name: str = "num_draft_tokens") -> List[int]:
    """vLLM's host list of per-request draft counts, checked (TypeError / ValueError naming it)."""
    if isinstance(n, torch.Tensor) or not isinstance(n, Sequence):
        raise TypeError(f"{name} must be a list of ints (host data), got {type(n).__name__}")
    if all(type(v) is int and v >= 0 for v in n):  # the common case, without a call per request
        return list(n)
    return [check_int(f"{name}[{i}]", v, 0) for i, v in enumerate(n)]


@dataclass
class SamplingMetadata:
    """The fields of vLLM's ``SamplingMetadata`` (vllm/v1/sample/metadata.py) this sampler
    reads, with vLLM's names and order, plus ``min_p``. Penalties, bad words, allowed-token
    masks and other logits processors are not fields here: apply them to the logits first.

    Parameters
    ----------
    temperature : Tensor [B] float32 | float16 | bfloat16 | float64, or None
        Per-request temperature; < 1e-5 (vLLM writes 0.0) = greedy. None only when
        ``all_greedy``.
    all_greedy : bool
        Every request is greedy (then ``temperature`` is not read).
    all_random : bool
        No request is greedy. A hint in vLLM (it skips its greedy kernel); not needed here
        (greedy and random rows run in the same launch), but it may not be True together
        with ``all_greedy``.
    top_p : Tensor [B] float32 (| float16, bfloat16, float64), or None
        In (0, 1]; 1 = off. None = off for every request.
    top_k : Tensor [B] int32 | int64, or None
        <= 0 or >= V = off (vLLM writes V). None = off for every request.
    generators : dict[int, torch.Generator]
        Batch index -> the request's generator (requests with a user seed). Only the
        generator's ``initial_seed()`` is read; see :meth:`RejectionSampler.forward`.
    max_num_logprobs : int or None
        n in [0, 128]: return the sampled tokens' logprobs and the top-n of each position
        (:class:`LogprobsTensors`); None: no logprobs.
    min_p : Tensor [B] float32 (| float16, bfloat16, float64), or None
        In [0, 1]; 0 = off. None = off for every request. (vLLM keeps min_p in its
        ``MinPLogitsProcessor``; it is applied at verified positions too, see the module.)
    """

    temperature: Optional[torch.Tensor]
    all_greedy: bool
    all_random: bool
    top_p: Optional[torch.Tensor] = None
    top_k: Optional[torch.Tensor] = None
    generators: Dict[int, torch.Generator] = field(default_factory=dict)
    max_num_logprobs: Optional[int] = None
    min_p: Optional[torch.Tensor] = None


class LogprobsTensors(NamedTuple):
    """vLLM's ``LogprobsTensors`` (vllm/v1/outputs.py), as the rejection sampler fills it.
    R = B * (max_spec_len + 1) rows (row b * (max_spec_len + 1) + i: output position i of
    request b), n = ``max_num_logprobs``.

    logprob_token_ids    int32 [R, n + 1]: the sampled token, then the top-n ids (-1: none)
    logprobs             float32 [R, n + 1]: their logprobs (NaN on a placeholder row)
    selected_token_ranks int64 [R]: the sampled token's rank, the number of tokens whose
                         logit is >= its logit (-1 on a placeholder row)
    """

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor


@dataclass
class SamplerOutput:
    """vLLM's ``SamplerOutput`` (vllm/v1/outputs.py) as the rejection sampler returns it.

    Attributes
    ----------
    sampled_token_ids : Tensor [B, max_spec_len + 1] int32
        Request b's accepted drafts, then its recovered (or bonus) token, then
        :data:`PLACEHOLDER_TOKEN_ID`; an invalid row is all placeholder.
    logprobs_tensors : LogprobsTensors or None
        With ``sampling_metadata.max_num_logprobs`` set; else None.
    valid : Tensor [B] bool
        False exactly for a row verify reported invalid (see the module docstring).
        Not a vLLM field.
    """

    sampled_token_ids: torch.Tensor
    logprobs_tensors: Optional[object] = None
    valid: Optional[torch.Tensor] = None


def _field(obj, where: str):
    """``obj``'s field named by ``where`` ("metadata.cu_num_draft_tokens"); a missing one is a
    TypeError (``obj`` is not a metadata object)."""
    owner, name = where.split(".")
    try:
        return getattr(obj, name)
    except AttributeError:
        kind = "SpecDecodeMetadata" if owner == "metadata" else "SamplingMetadata"
        raise TypeError(f"{owner} must be a {kind} (or an object with its fields); a {type(obj).__name__} "
                        f"has no '{name}'") from None


def _tensor(t, name: str, dtypes, layout: str, shape=None, optional: bool = False):
    """``t`` checked to be a tensor of one of ``dtypes`` (TypeError) with ``layout``'s rank
    and, when given, exactly ``shape`` (ValueError); None passes when ``optional``."""
    if t is None and optional:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor {layout}, got {type(t).__name__}")
    check_dtype(t, name, dtypes)
    check_dim(t, name, layout.count(",") + 1, layout)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {layout} = {list(shape)}, got shape {tuple(t.shape)}")
    return t


_CTOR_TEXT = ("RejectionSampler() (vLLM <= 0.11), RejectionSampler(sampler) (vLLM 0.12 - 0.15) or "
              "RejectionSampler(sampler, spec_config=None, device=None) (vLLM 0.20 - 0.33), with this "
              "package's keyword-only logprobs_mode=")
_FORWARD_TEXT = ("forward(metadata, draft_probs, logits, sampling_metadata) (vLLM >= 0.12) or, on a "
                 "RejectionSampler() built without a sampler, forward(metadata, draft_probs, target_logits, "
                 "bonus_token_ids, sampling_metadata) (vLLM <= 0.11); seed= and offset= are keyword-only "
                 "(vLLM 0.34's Model Runner V2 call (logits, input_batch, draft_logits) is not offered)")


def _forward_v012(metadata, draft_probs, logits, sampling_metadata, *, seed=None, offset=None):
    """vLLM >= 0.12's forward (the bonus sampled inside), plus this package's seed / offset."""


def _forward_v011(metadata, draft_probs, target_logits, bonus_token_ids, sampling_metadata, *, seed=None,
                  offset=None):
    """vLLM <= 0.11's forward (target rows gathered, bonus sampled by the runner)."""


_SIG_V012 = inspect.signature(_forward_v012)
_SIG_V011 = inspect.signature(_forward_v011)


def _takes_keyword(sampler, name: str) -> bool:
    """Whether ``sampler``'s class forward takes keyword ``name`` (vLLM's Sampler gained
    ``predict_bonus_token`` over the releases); a mock or a plain callable gets the two
    arguments every release passes."""
    try:
        params = inspect.signature(type(sampler).forward).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _bonus_ids(t, name: str, B: int, device: torch.device, hint: str = "") -> torch.Tensor:
    """An external bonus token per request (vLLM's [B, 1], or [B]) checked; returns [B]."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int tensor [batch_size] or [batch_size, 1], got {type(t).__name__}")
    check_dtype(t, name, INDEX)
    if tuple(t.shape) not in ((B,), (B, 1)):
        raise ValueError(f"{name} must be [batch_size] or [batch_size, 1] = [{B}] or [{B}, 1], got shape "
                         f"{tuple(t.shape)}{hint}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the logits are on {device}: all tensors must be on one "
                         "device")
    return t.reshape(B)


class RejectionSampler(torch.nn.Module):
    """vLLM v1's rejection sampler, on one :func:`specdec_ext.verify` call per step.

    ``forward`` runs no host sync and no data-dependent shape: the flat layout is gathered
    with index tensors built on the device from ``cu_num_draft_tokens``, and the output
    shape depends only on B, ``metadata.max_spec_len`` (a Python int) and V. Per-request
    generators are read on the host (a dict, as in vLLM); to capture the step in a CUDA
    graph, pass device ``seed`` / ``offset`` tensors instead (see :meth:`forward`).

    Parameters
    ----------
    sampler : vLLM's ``Sampler`` (any callable returning an object with ``sampled_token_ids``),
        or None
        vLLM >= 0.12's argument: it samples the bonus token, called as vLLM calls it,
        ``sampler(logits=logits[metadata.bonus_logits_indices], sampling_metadata=...)``
        (with ``max_num_logprobs`` None, and ``predict_bonus_token=True`` where its forward
        takes it). None: the bonus is drawn by verify (and vLLM <= 0.11's forward is
        accepted).
    spec_config, device : vLLM 0.20+'s arguments, accepted and not read (``device`` must
        be None, a str or a torch.device).
    logprobs_mode : "raw_logprobs" | "processed_logprobs", keyword-only, optional
        Default: ``sampler.logprobs_mode`` (as vLLM reads it), else "raw_logprobs".

    Raises
    ------
    TypeError naming the accepted constructors for any other call (0.34's
    ``watermark_key=``, extra arguments, a ``sampler`` that is not callable: a string
    there is taken for the old positional ``logprobs_mode``); ValueError for a logprobs
    mode this sampler does not offer (the ``*_logits`` modes).
    """

    def __init__(self, sampler=None, spec_config=None, device=None, *more, logprobs_mode: Optional[str] = None,
                 **unknown):
        super().__init__()
        if "watermark_key" in unknown:
            raise TypeError("watermark_key= is vLLM 0.34's Model Runner V2 RejectionSampler, which is not offered: "
                            f"expected {_CTOR_TEXT}")
        if more or unknown:
            extra = [f"{len(more)} more positional"] if more else []
            raise TypeError(f"unexpected argument(s) {', '.join(extra + sorted(unknown))}: expected {_CTOR_TEXT}")
        if sampler is not None and (isinstance(sampler, str) or not callable(sampler)):
            hint = ("; logprobs_mode is keyword-only: RejectionSampler(logprobs_mode=...)"
                    if isinstance(sampler, str) else "")
            raise TypeError(f"sampler must be vLLM's Sampler (a callable returning a SamplerOutput) or None, got "
                            f"{type(sampler).__name__}{hint}: expected {_CTOR_TEXT}")
        if device is not None:
            if not isinstance(device, (str, torch.device)):
                raise TypeError(f"device must be None, a str or a torch.device, got {type(device).__name__}")
            try:
                device = torch.device(device)
            except RuntimeError:
                raise ValueError(f"device must name a torch device, got {device!r}") from None
        where = "logprobs_mode"
        if logprobs_mode is None:
            where = "sampler.logprobs_mode"
            logprobs_mode = "raw_logprobs" if sampler is None else getattr(sampler, "logprobs_mode", "raw_logprobs")
        if not isinstance(logprobs_mode, str) or logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"{where} must be one of {tuple(_LOGPROBS_MODES)}, got {logprobs_mode!r}")
        self.sampler = sampler
        self.spec_config = spec_config
        self.device = device
        self.logprobs_mode = logprobs_mode
        self._predict_bonus_kw = sampler is not None and _takes_keyword(sampler, "predict_bonus_token")
        # generator -> how many steps this sampler has drawn for it (its request's offset)
        self._steps: "weakref.WeakKeyDictionary[torch.Generator, int]" = weakref.WeakKeyDictionary()

    def forward(self, *args, **kwargs):
        """Verify one step's drafts, called as vLLM calls its sampler.

        ``forward(metadata, draft_probs, logits, sampling_metadata, *, seed=None, offset=None)``
        -> :class:`SamplerOutput` (vLLM >= 0.12), or, on a sampler built without a
        ``sampler``, ``forward(metadata, draft_probs, target_logits, bonus_token_ids,
        sampling_metadata, *, seed=None, offset=None)`` -> Tensor [B, max_spec_len + 1] int32
        (vLLM <= 0.11: its ``sampled_token_ids``; ``max_num_logprobs`` is not read, an
        invalid row is all placeholder). Both positionally or by keyword.

        Parameters
        ----------
        metadata : SpecDecodeMetadata (or vLLM's)
        draft_probs : Tensor [num_tokens, V] float32 | float16 | bfloat16 | float64, or None
            The (filtered) draft law each draft was sampled from; None for deterministic
            drafts (n-gram): q is then one-hot at the draft.
        logits : Tensor [R, V] float32 | float16 | bfloat16 | float64
            The target's logits, indexed by ``metadata.target_logits_indices`` and
            ``metadata.bonus_logits_indices``: R >= len(target_logits_indices) +
            len(bonus_logits_indices) (vLLM's runner: num_tokens + B; vLLM's tests, whose
            mocked sampler takes no bonus rows: num_tokens). Not modified.
        target_logits : Tensor [num_tokens, V] (vLLM <= 0.11)
            The target rows, draft after draft (the runner's ``logits[target_logits_indices]``).
        bonus_token_ids : Tensor [B, 1] or [B] int32 | int64 (vLLM <= 0.11)
            Each request's bonus token, emitted when every draft is accepted.
        sampling_metadata : SamplingMetadata (or vLLM's; ``min_p`` is read if present)
        seed : Tensor [B] int64, optional (not a vLLM argument)
            Per-request seeds for the op (any device). When given, ``generators`` is not
            read and nothing is built on the host: with device ``seed`` / ``offset``
            tensors, updated in place between replays, the step can be captured in a CUDA
            graph. When None: a request with a generator in
            ``sampling_metadata.generators`` gets seed = ``generator.initial_seed()`` and
            offset = the number of earlier steps this sampler ran for that generator (so
            the same seed and the same sequence of steps reproduce the same tokens,
            whatever the batch makeup; the generator's own state is neither used nor
            advanced); every other request gets a fresh seed drawn from torch's default
            CPU generator (``torch.manual_seed`` makes a run repeatable) and offset 0.
            These [B] CPU tensors are copied to the device without a host sync.
        offset : int or Tensor [B] int64, optional (only with ``seed``; default 0)
            Philox offset per request; advance it between steps for fresh numbers.

        Returns
        -------
        SamplerOutput(sampled_token_ids [B, max_spec_len + 1] int32, logprobs_tensors (None unless
        ``max_num_logprobs`` is set), valid [B] bool); vLLM <= 0.11's form: the tensor.

        Raises
        ------
        TypeError naming the two forward signatures for any other call; TypeError /
        ValueError naming the argument (e.g. ``metadata.cu_num_draft_tokens``, ``logits``,
        ``bonus_token_ids``, ``sampling_metadata.top_k``) for a wrong type / dtype, a shape
        that disagrees with the metadata, a device or a host-visible value, before anything
        runs. Values inside device tensors are not read (no sync): a bad one makes its row
        invalid (see the module).
        """
        legacy = len(args) >= 5 or "target_logits" in kwargs or "bonus_token_ids" in kwargs
        try:
            a = (_SIG_V011 if legacy else _SIG_V012).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"RejectionSampler.forward: {e}; expected {_FORWARD_TEXT}") from None
        a.apply_defaults()
        a = a.arguments
        if not legacy:
            return self._step(a["metadata"], a["draft_probs"], a["logits"], a["sampling_metadata"], a["seed"],
                              a["offset"])
        if self.sampler is not None:
            raise TypeError("this RejectionSampler was built with a sampler (vLLM >= 0.12), whose forward is "
                            "forward(metadata, draft_probs, logits, sampling_metadata); the 5-argument form "
                            "(..., target_logits, bonus_token_ids, ...) is vLLM <= 0.11's, for RejectionSampler()")
        return self._step(a["metadata"], a["draft_probs"], a["target_logits"], a["sampling_metadata"], a["seed"],
                          a["offset"], legacy_bonus=a["bonus_token_ids"]).sampled_token_ids

    def _step(self, md, draft_probs, logits, sm, seed, offset, legacy_bonus=None) -> SamplerOutput:
        """One step; ``legacy_bonus`` is vLLM <= 0.11's ``bonus_token_ids`` (None: 0.12's form)."""
        legacy = legacy_bonus is not None
        external = legacy or self.sampler is not None  # the bonus token comes from outside verify
        n = None if legacy else self._num_logprobs(sm)
        drafts_flat, cu, target_idx, bonus_idx, B, K = self._check_metadata(
            md, legacy, loose_bonus=self.sampler is not None and n is None)
        num_tokens = drafts_flat.shape[0]
        name, layout = ("target_logits", "[num_tokens, vocab_size]") if legacy else ("logits", "[rows, vocab_size]")
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"{name} must be a tensor {layout}, got {type(logits).__name__}")
        _tensor(logits, name, _FLOAT_INPUTS, layout)
        R, V = logits.shape
        if V == 0:
            raise ValueError(f"{name} must have a vocabulary (vocab_size >= 1), got shape {tuple(logits.shape)}")
        if legacy:
            if R != num_tokens:
                raise ValueError(f"target_logits must be [num_tokens, vocab_size] = [{num_tokens}, {V}] (one row per "
                                 f"draft, as vLLM <= 0.11's runner gathers them), got shape {tuple(logits.shape)}")
            legacy_bonus = _bonus_ids(legacy_bonus, "bonus_token_ids", B, logits.device)
        elif R < num_tokens + bonus_idx.shape[0]:
            raise ValueError(
                f"logits has {R} rows, but the metadata needs at least len(metadata.target_logits_indices) + "
                f"len(metadata.bonus_logits_indices) = {num_tokens} + {bonus_idx.shape[0]} = "
                f"{num_tokens + bonus_idx.shape[0]} (vLLM's layout: a row per draft, then one per bonus)")
        _tensor(draft_probs, "draft_probs", _FLOAT_INPUTS, "[num_tokens, vocab_size]", (num_tokens, V),
                optional=True)
        temperature, top_k, top_p, min_p = self._check_sampling(sm, B)
        check_devices(logits, name, {
            "metadata.draft_token_ids": drafts_flat, "metadata.cu_num_draft_tokens": cu,
            "metadata.target_logits_indices": target_idx, "metadata.bonus_logits_indices": bonus_idx,
            "draft_probs": draft_probs, "sampling_metadata.temperature": temperature,
            "sampling_metadata.top_k": top_k, "sampling_metadata.top_p": top_p,
            "sampling_metadata.min_p": min_p},
            host_ok=("sampling_metadata.temperature", "sampling_metadata.top_k", "sampling_metadata.top_p",
                     "sampling_metadata.min_p", "metadata.target_logits_indices", "metadata.bonus_logits_indices"))
        seeds, offsets, steps = self._random_keys(sm, B, seed, offset)
        dev = logits.device
        i64 = dict(dtype=torch.int64, device=dev)
        if not legacy:  # CPU indices into device logits, as vLLM's tests pass them (indexing allows it)
            target_idx, bonus_idx = (t.to(dev, non_blocking=True) for t in (target_idx, bonus_idx))

        # ---- the flat layout -> verify's padded one, by index tensors (no sync) ----
        # Device values are never trusted to be in range (that would take a sync): each is
        # clamped into range for the gather and its position marked bad; a bad position
        # reads NaN, which verify reports as an invalid row where it reads that position.
        cu = cu.to(torch.int64)
        num_drafts = torch.diff(cu, prepend=cu.new_zeros(1))                 # [B]
        bad_count = (num_drafts < 0) | (num_drafts > K)   # cu_num_draft_tokens disagrees with num_draft_tokens
        num_drafts = num_drafts.clamp(0, K)
        start = (cu - num_drafts).unsqueeze(1)                               # [B, 1] first draft row
        pos = torch.arange(K + 1, **i64)                                     # [K+1]
        is_draft = pos < num_drafts.unsqueeze(1)                             # [B, K+1]
        draft_row = start + pos
        bad = (is_draft & ((draft_row < 0) | (draft_row >= num_tokens))) | (bad_count.unsqueeze(1) & (pos == 0))
        # a slot of the flat [num_tokens + B] rows (the drafts', then the bonuses') for every
        # (b, position): the drafts, then the bonus at position num_drafts[b] (and, never read, past it)
        bonus_slot = num_tokens + torch.arange(B, **i64).unsqueeze(1)
        slot = torch.where(is_draft, draft_row, bonus_slot).clamp(0, num_tokens + B - 1)  # [B, K+1]

        def in_rows(idx):  # (idx clamped into logits' rows, idx out of them) for int64 indices
            idx = idx.to(torch.int64)
            return idx.clamp(0, max(R - 1, 0)), (idx < 0) | (idx >= R)

        # the row of logits for each flat slot, and whether that row was out of range
        if legacy:  # target_logits is the drafts' rows in order; the bonus slots are overwritten below
            flat_rows = torch.cat([torch.arange(num_tokens, **i64), torch.zeros(B, **i64)])
            flat_bad = torch.zeros(num_tokens + B, dtype=torch.bool, device=dev)
        else:
            flat_rows, flat_bad = in_rows(torch.cat([target_idx, bonus_idx]))
            bonus_rows = flat_rows[num_tokens:]
            if bonus_idx.shape[0] != B:  # a sampler's rows only (vLLM's tests pass none); overwritten below
                flat_rows = torch.cat([flat_rows[:num_tokens], torch.zeros(B, **i64)])
                flat_bad = torch.cat([flat_bad[:num_tokens], torch.zeros(B, dtype=torch.bool, device=dev)])
        flat_slot = slot.view(-1)
        bad = bad | flat_bad.index_select(0, flat_slot).view(B, K + 1)
        if R > 0:
            target_logits = logits.index_select(0, flat_rows.index_select(0, flat_slot)).view(B, K + 1, V)
        else:  # no rows at all (vLLM's test of a request without drafts): every position read is the bonus
            target_logits = logits.new_zeros(B, K + 1, V)
        real = None
        if external:
            if n is not None:  # the bonus position's logprobs are its logits row's, not the one-hot law's
                real = target_logits.clone()
            bonus = legacy_bonus if legacy else self._sample_bonus(
                logits.index_select(0, bonus_rows), sm, B, dev, bonus_idx.shape[0])
            # the external bonus as a one-hot law at position num_drafts[b]: emitted exactly when
            # every draft is accepted (a token outside [0, V) leaves the row all -inf: invalid there)
            vocab = torch.arange(V, **i64)
            one_hot = torch.where(vocab == bonus.to(torch.int64).unsqueeze(1), 0.0, float("-inf")).to(logits.dtype)
            at = torch.arange(B, **i64) * (K + 1) + num_drafts
            target_logits.view(B * (K + 1), V).index_copy_(0, at, one_hot)
        bad = bad.view(-1)
        first = target_logits.view(B * (K + 1), V)[:, 0]  # a view: writes go to the gathered copy only
        first.copy_(torch.where(bad, torch.full_like(first, float("nan")), first))
        if num_tokens > 0:
            draft_slot = torch.where(is_draft[:, :K], draft_row[:, :K], 0).clamp(0, num_tokens - 1).view(-1)
            draft_ids = drafts_flat.index_select(0, draft_slot).view(B, K)
            q = None if draft_probs is None else draft_probs.index_select(0, draft_slot).view(B, K, V)
        else:  # no request has a draft: nothing is tested, so nothing is read
            draft_ids = torch.zeros(B, K, **i64)
            q = None

        # ---- vLLM's per-request values -> verify's ----
        if sm.all_greedy:
            temp = torch.zeros(B, dtype=torch.float32, device=dev)
        else:
            temp = temperature.to(torch.float32)
            temp = torch.where(temp < SAMPLING_EPS, torch.zeros_like(temp), temp)
        if top_k is not None:
            k = top_k.to(torch.int64)
            top_k = torch.where((k <= 0) | (k >= V), torch.zeros_like(k), k)
        if top_p is not None:
            top_p = top_p.to(torch.float32)
        if min_p is not None:
            m = min_p.to(torch.float32)
            min_p = torch.where(m == 1.0, torch.full_like(m, _MIN_P_BELOW_ONE), m)

        mode = _LOGPROBS_MODES[self.logprobs_mode]
        res = verify(target_logits, draft_ids, q, temp, top_k=top_k, top_p=top_p, min_p=min_p,
                     num_drafts=num_drafts, seed=seeds, offset=offsets, logprobs=None if external else n,
                     logprobs_mode=mode)
        tensors = None
        if n is not None:
            if external:
                lp = LogprobsResult(*torch.ops.specdec.logprobs(float_arg(real), res.tokens, temp, top_k, top_p,
                                                                min_p, n, mode == "processed"))
            else:
                res, lp = res
                if lp.token_ranks is None:  # n = 0: verify launched nothing more; the ranks vLLM reports
                    lp = lp._replace(token_ranks=torch.ops.specdec.logprobs(
                        float_arg(target_logits), res.tokens, temp, top_k, top_p, min_p, 0, mode == "processed")[1])
            rows = B * (K + 1)
            tensors = LogprobsTensors(
                torch.cat([res.tokens.unsqueeze(-1), lp.top_ids], -1).view(rows, n + 1).to(torch.int32),
                torch.cat([lp.token_logprobs.unsqueeze(-1), lp.top_logprobs], -1).view(rows, n + 1),
                lp.token_ranks.reshape(rows))
        self._steps.update(steps)  # only a step that ran counts for its requests' generators
        # verify writes -1 past the emitted tokens and over a whole invalid row: vLLM's placeholder
        return SamplerOutput(sampled_token_ids=res.tokens.to(torch.int32), logprobs_tensors=tensors, valid=res.valid)

    def _sample_bonus(self, bonus_logits: torch.Tensor, sm, B: int, device: torch.device, n_rows: int):
        """The sampler's bonus tokens [B] for ``bonus_logits`` (vLLM's call; logprobs are
        this sampler's, so the sampler is asked for none)."""
        if getattr(sm, "max_num_logprobs", None) is not None:
            if dataclasses.is_dataclass(sm):
                sm = dataclasses.replace(sm, max_num_logprobs=None)
            else:
                sm = copy.copy(sm)
                sm.max_num_logprobs = None
        extra = {"predict_bonus_token": True} if self._predict_bonus_kw else {}
        out = self.sampler(logits=bonus_logits, sampling_metadata=sm, **extra)
        if not hasattr(out, "sampled_token_ids"):
            raise TypeError(f"sampler must return a SamplerOutput (with sampled_token_ids), got {type(out).__name__}")
        hint = (f" (it was given logits[metadata.bonus_logits_indices], {n_rows} rows)" if n_rows != B else "")
        return _bonus_ids(out.sampled_token_ids, "sampler(...).sampled_token_ids", B, device, hint)

    @staticmethod
    def _num_logprobs(sm) -> Optional[int]:
        n = _field(sm, "sampling_metadata.max_num_logprobs")
        return None if n is None else check_int("sampling_metadata.max_num_logprobs", n, 0, MAX_TOP_LOGPROBS)

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_metadata(md, legacy: bool, loose_bonus: bool):
        """Host-only checks of the spec-decode metadata (shapes, dtypes, the host list).
        ``legacy``: vLLM <= 0.11's form (the logits indices are not read); ``loose_bonus``: a
        sampler takes ``logits[bonus_logits_indices]``, so any length is its business."""
        n = _num_draft_tokens(_field(md, "metadata.num_draft_tokens"), "metadata.num_draft_tokens")
        B = len(n)
        if B == 0:
            raise ValueError("metadata.num_draft_tokens is empty: the batch needs at least one request")
        K = check_int("metadata.max_spec_len", _field(md, "metadata.max_spec_len"), max(n))
        num_tokens = sum(n)
        drafts = _tensor(_field(md, "metadata.draft_token_ids"), "metadata.draft_token_ids",
                         INDEX, "[num_tokens]")
        if drafts.shape[0] != num_tokens:
            raise ValueError(f"metadata.draft_token_ids must be [num_tokens] = [sum(num_draft_tokens)] = "
                             f"[{num_tokens}], got shape {tuple(drafts.shape)}")
        cu = _tensor(_field(md, "metadata.cu_num_draft_tokens"),
                     "metadata.cu_num_draft_tokens", INDEX, "[batch_size]", (B,))
        # not read here, but part of vLLM's layout: a wrong length means a wrong metadata (vLLM
        # <= 0.11's has no cu_num_sampled_tokens field)
        _tensor(getattr(md, "cu_num_sampled_tokens", None), "metadata.cu_num_sampled_tokens", INDEX,
                "[batch_size]", (B,), optional=True)
        _tensor(getattr(md, "logits_indices", None), "metadata.logits_indices", INDEX,
                "[num_tokens + batch_size]", (num_tokens + B,), optional=True)
        if legacy:
            return drafts, cu, None, None, B, K
        target = _tensor(_field(md, "metadata.target_logits_indices"),
                         "metadata.target_logits_indices", INDEX, "[num_tokens]", (num_tokens,))
        bonus = _tensor(_field(md, "metadata.bonus_logits_indices"), "metadata.bonus_logits_indices", INDEX,
                        "[batch_size]", None if loose_bonus else (B,))
        return drafts, cu, target, bonus, B, K

    @staticmethod
    def _check_sampling(sm, B: int):
        """Host-only checks of the sampling metadata; returns (temperature, top_k, top_p, min_p)."""
        flags = {}
        for name in ("all_greedy", "all_random"):
            flags[name] = bool_arg(_field(sm, f"sampling_metadata.{name}"), f"sampling_metadata.{name}")
        if flags["all_greedy"] and flags["all_random"]:
            raise ValueError("sampling_metadata.all_greedy and sampling_metadata.all_random are both True")
        temperature = _field(sm, "sampling_metadata.temperature")
        if flags["all_greedy"]:
            temperature = None  # vLLM passes None then; any value is ignored
        elif temperature is None:
            raise ValueError("sampling_metadata.temperature is None but all_greedy is False: a [B] tensor "
                             "is needed")
        _tensor(temperature, "sampling_metadata.temperature", _FLOAT_INPUTS, "[batch_size]", (B,), optional=True)
        top_k = _tensor(_field(sm, "sampling_metadata.top_k"), "sampling_metadata.top_k", INDEX,
                        "[batch_size]", (B,), optional=True)
        top_p = _tensor(_field(sm, "sampling_metadata.top_p"), "sampling_metadata.top_p", _FLOAT_INPUTS,
                        "[batch_size]", (B,), optional=True)
        min_p = _tensor(getattr(sm, "min_p", None), "sampling_metadata.min_p", _FLOAT_INPUTS, "[batch_size]", (B,),
                        optional=True)
        return temperature, top_k, top_p, min_p

    def _random_keys(self, sm, B: int, seed, offset):
        """(seed [B] int64, offset [B] int64 or int, {generator: its step count after this
        step}) for verify; see :meth:`forward`. The counts are committed by the caller once
        the step has run, so a refused call leaves every request's stream where it was."""
        if seed is not None:
            _tensor(seed, "seed", (torch.int64,), "[batch_size]", (B,))
            if offset is None:
                offset = 0
            elif isinstance(offset, torch.Tensor):
                _tensor(offset, "offset", (torch.int64,), "[batch_size]", (B,))
            else:
                offset = check_int("offset", offset, -(2**63), 2**64 - 1)
            return seed, offset, {}
        if offset is not None:
            raise ValueError("offset is given without seed: it only applies to the seed tensor passed with it "
                             "(without seed, each request's offset comes from its generator's step count)")
        generators = _field(sm, "sampling_metadata.generators")
        if not isinstance(generators, dict):
            raise TypeError(f"sampling_metadata.generators must be a dict[int, torch.Generator], got "
                            f"{type(generators).__name__}")
        for i, g in generators.items():
            check_int("sampling_metadata.generators key", i, 0, B - 1)
            if not isinstance(g, torch.Generator):
                raise TypeError(f"sampling_metadata.generators[{i}] must be a torch.Generator, got "
                                f"{type(g).__name__}")
        seeds = torch.randint(0, _SEED_HIGH, (B,), dtype=torch.int64)  # torch's default CPU generator
        offsets, steps = [0] * B, {}
        for i, g in generators.items():
            s = g.initial_seed()
            seeds[i] = s - 2**64 if s >= 2**63 else s  # any 64-bit pattern is a seed
            offsets[i] = steps.get(g, self._steps.get(g, 0))
            steps[g] = offsets[i] + 1
        return seeds, torch.tensor(offsets, dtype=torch.int64), steps
