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

The dataclasses carry vLLM's field names, so real vLLM ``SpecDecodeMetadata`` /
``SamplingMetadata`` objects are read the same way (fields are looked up by name).

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
- the bonus token is drawn inside the same op from ``logits[bonus_logits_indices]`` with
  the same temperature and filters. vLLM samples it with its full ``Sampler``; penalties,
  bad words, allowed-token masks, logit bias and other logits processors are NOT applied
  here: apply them to ``logits`` (masked entries = -inf) before calling.
- randomness: counter-based Philox keyed by (seed, offset, position, token), not torch
  generators, so the numbers differ from vLLM's for the same seed (the law is the same).
  See :meth:`RejectionSampler.forward` for how requests' generators map to seeds.
- a row the op reports invalid (a NaN / +inf logit in the rows it reads, a used position
  whose logits are all -inf, a draft id outside [0, V), a bad draft probability, a bad
  per-row value in a device tensor) comes back as a row of :data:`PLACEHOLDER_TOKEN_ID`
  only (vLLM's ``parse_output`` then yields no token for it) and ``valid[b] = False`` in
  :class:`SamplerOutput`.
- logprobs (``max_num_logprobs = n``) come in vLLM's ``LogprobsTensors`` layout, one row per
  (request, output position) of ``sampled_token_ids`` (B * (max_spec_len + 1) rows, row
  b * (max_spec_len + 1) + i): column 0 the token's own logprob, then the top-n, and its
  rank. ``RejectionSampler(logprobs_mode=)`` takes vLLM's ``"raw_logprobs"`` (log softmax of
  the target logits, vLLM's default) or ``"processed_logprobs"`` (the temperature-scaled,
  filtered law); the ``*_logits`` modes are not offered. Placeholder rows hold -1 ids and
  NaN logprobs (vLLM computes them on token 0 and drops them in ``parse_output``; so does
  the placeholder mask there). They come from :func:`specdec_ext.verify`'s ``logprobs=``:
  the tokens' logprobs from verify's own softmax stats, the ranks and the top-n from one more
  launch over the emitted positions, no host sync. A greedy row's processed
  logprobs are one-hot (0 at the argmax, -inf elsewhere: the law that row follows), where
  vLLM reports the softmax at temperature 1.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Union

import torch

from .._validate import check_int
from ..ops._args import bool_arg, float_arg
from ..ops._fake_checks import FLOATS, INDEX, check_devices, check_dim, check_dtype
from ..ops.logprobs import MAX_TOP_LOGPROBS
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


@dataclass
class SpecDecodeMetadata:
    """vLLM's ``SpecDecodeMetadata`` (vllm/v1/spec_decode/metadata.py): one step's drafts,
    flattened over the batch (B requests, num_tokens = sum(num_draft_tokens) drafts).

    Parameters
    ----------
    draft_token_ids : Tensor [num_tokens] int32 | int64
        Every request's drafts, request after request.
    num_draft_tokens : list[int] of length B
        Drafts of each request (0 allowed). Host data: only read for checks and sizes.
    cu_num_draft_tokens : Tensor [B] int32 | int64
        Inclusive cumulative sum of ``num_draft_tokens`` (must agree with it: not checked,
        which would need a host sync).
    cu_num_sampled_tokens : Tensor [B] int32 | int64, or None
        Inclusive cumsum of ``num_draft_tokens + 1``. Not read by this sampler.
    target_logits_indices : Tensor [num_tokens] int32 | int64
        Row of ``logits`` holding the target's prediction at each draft.
    bonus_logits_indices : Tensor [B] int32 | int64
        Row of ``logits`` holding each request's bonus (after-the-last-draft) prediction.
    logits_indices : Tensor [num_tokens + B] int32 | int64, or None
        Rows of the hidden states the logits were computed from. Not read by this sampler.

    Attributes
    ----------
    max_spec_len : int
        ``max(num_draft_tokens)`` (set on construction, as vLLM does); the output has
        ``max_spec_len + 1`` columns. May be raised afterwards (e.g. to a fixed K for a
        captured CUDA graph); it must stay >= every ``num_draft_tokens[i]``.
    """

    draft_token_ids: torch.Tensor
    num_draft_tokens: List[int]
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: Optional[torch.Tensor]
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: Optional[torch.Tensor] = None

    def __post_init__(self):
        self.max_spec_len = max(self.num_draft_tokens, default=0)

    @classmethod
    def from_draft_token_ids(cls, draft_token_ids: Sequence[Sequence[int]],
                             device: Union[str, torch.device, None] = None) -> "SpecDecodeMetadata":
        """Metadata for per-request draft lists, with the logits rows laid out as vLLM's
        GPU model runner lays them out: request i's ``num_draft_tokens[i]`` target rows,
        then its bonus row, request after request (so ``logits`` has num_tokens + B rows).

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
        n = [len(ids) for ids in draft_token_ids]
        flat = [int(t) for ids in draft_token_ids for t in ids]
        cu_draft, cu_sampled, target, bonus, row = [], [], [], [], 0
        for k in n:
            target.extend(range(row, row + k))
            bonus.append(row + k)
            row += k + 1
            cu_draft.append((cu_draft[-1] if cu_draft else 0) + k)
            cu_sampled.append(row)

        def i32(values):
            return torch.tensor(values, dtype=torch.int32, device=device)

        return cls(draft_token_ids=i32(flat), num_draft_tokens=n, cu_num_draft_tokens=i32(cu_draft),
                   cu_num_sampled_tokens=i32(cu_sampled), target_logits_indices=i32(target),
                   bonus_logits_indices=i32(bonus), logits_indices=i32(list(range(row))))


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


class RejectionSampler(torch.nn.Module):
    """vLLM v1's rejection sampler, on one :func:`specdec_ext.verify` call per step.

    ``forward`` runs no host sync and no data-dependent shape: the flat layout is gathered
    with index tensors built on the device from ``cu_num_draft_tokens``, and the output
    shape depends only on B, ``metadata.max_spec_len`` (a Python int) and V. Per-request
    generators are read on the host (a dict, as in vLLM); to capture the step in a CUDA
    graph, pass device ``seed`` / ``offset`` tensors instead (see :meth:`forward`).
    """

    def __init__(self, logprobs_mode: str = "raw_logprobs"):
        super().__init__()
        if not isinstance(logprobs_mode, str) or logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {tuple(_LOGPROBS_MODES)}, got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        # generator -> how many steps this sampler has drawn for it (its request's offset)
        self._steps: "weakref.WeakKeyDictionary[torch.Generator, int]" = weakref.WeakKeyDictionary()

    def forward(self, metadata: SpecDecodeMetadata, draft_probs: Optional[torch.Tensor], logits: torch.Tensor,
                sampling_metadata: SamplingMetadata, *, seed: Optional[torch.Tensor] = None,
                offset: Union[int, torch.Tensor, None] = None) -> SamplerOutput:
        """Verify one step's drafts and return vLLM's output tensor.

        Parameters
        ----------
        metadata : SpecDecodeMetadata (or vLLM's)
        draft_probs : Tensor [num_tokens, V] float32 | float16 | bfloat16 | float64, or None
            The (filtered) draft law each draft was sampled from; None for deterministic
            drafts (n-gram): q is then one-hot at the draft.
        logits : Tensor [num_tokens + B, V] float32 | float16 | bfloat16 | float64
            The target's logits, indexed by ``metadata.target_logits_indices`` and
            ``metadata.bonus_logits_indices`` (any row count those indices fit). Not
            modified.
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
        ``max_num_logprobs`` is set),
        valid [B] bool)

        Raises
        ------
        TypeError / ValueError naming the argument (e.g. ``metadata.cu_num_draft_tokens``,
        ``sampling_metadata.top_k``) for a wrong type / dtype, or a wrong shape, device or
        host-visible value. Values inside device tensors are not read (no sync): a bad one
        makes its row invalid, and indices in ``cu_num_draft_tokens`` /
        ``*_logits_indices`` must be in range (as for any gather).
        """
        md, sm = metadata, sampling_metadata
        drafts_flat, cu, target_idx, bonus_idx, B, K = self._check_metadata(md)
        num_tokens = drafts_flat.shape[0]
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a tensor [num_tokens + batch_size, vocab_size], got "
                            f"{type(logits).__name__}")
        _tensor(logits, "logits", _FLOAT_INPUTS, "[num_tokens + batch_size, vocab_size]")
        V = logits.shape[1]
        if V == 0:
            raise ValueError("logits must have a vocabulary (vocab_size >= 1), got shape "
                             f"{tuple(logits.shape)}")
        _tensor(draft_probs, "draft_probs", _FLOAT_INPUTS, "[num_tokens, vocab_size]", (num_tokens, V),
                optional=True)
        temperature, top_k, top_p, min_p = self._check_sampling(sm, B)
        check_devices(logits, "logits", {
            "metadata.draft_token_ids": drafts_flat, "metadata.cu_num_draft_tokens": cu,
            "metadata.target_logits_indices": target_idx, "metadata.bonus_logits_indices": bonus_idx,
            "draft_probs": draft_probs, "sampling_metadata.temperature": temperature,
            "sampling_metadata.top_k": top_k, "sampling_metadata.top_p": top_p,
            "sampling_metadata.min_p": min_p},
            host_ok=("sampling_metadata.temperature", "sampling_metadata.top_k", "sampling_metadata.top_p",
                     "sampling_metadata.min_p"))
        seeds, offsets = self._random_keys(sm, B, seed, offset)
        dev = logits.device

        # ---- the flat layout -> verify's padded one, by index tensors (no sync) ----
        cu = cu.to(torch.int64)
        num_drafts = torch.diff(cu, prepend=cu.new_zeros(1))                 # [B]
        start = (cu - num_drafts).unsqueeze(1)                               # [B, 1] first draft row
        pos = torch.arange(K + 1, device=dev, dtype=torch.int64)             # [K+1]
        is_draft = pos < num_drafts.unsqueeze(1)                             # [B, K+1]
        # a row of cat(target_logits_indices, bonus_logits_indices) for every (b, position):
        # the drafts' rows, then the bonus row at position num_drafts[b] (and, never read,
        # past it)
        bonus_slot = num_tokens + torch.arange(B, device=dev, dtype=torch.int64).unsqueeze(1)
        slot = torch.where(is_draft, start + pos, bonus_slot)                # [B, K+1]
        rows = torch.cat([target_idx.to(torch.int64), bonus_idx.to(torch.int64)]).index_select(0, slot.view(-1))
        target_logits = logits.index_select(0, rows).view(B, K + 1, V)
        if num_tokens > 0:
            draft_slot = torch.where(is_draft[:, :K], start + pos[:K], 0).view(-1)  # padding -> row 0, unread
            draft_ids = drafts_flat.index_select(0, draft_slot).view(B, K)
            q = None if draft_probs is None else draft_probs.index_select(0, draft_slot).view(B, K, V)
        else:  # no request has a draft: nothing is tested, so nothing is read
            draft_ids = torch.zeros(B, K, dtype=torch.int64, device=dev)
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

        n = self._num_logprobs(sm)
        res = verify(target_logits, draft_ids, q, temp, top_k=top_k, top_p=top_p, min_p=min_p,
                     num_drafts=num_drafts, seed=seeds, offset=offsets, logprobs=n,
                     logprobs_mode=_LOGPROBS_MODES[self.logprobs_mode])
        tensors = None
        if n is not None:
            res, lp = res
            rows = B * (K + 1)
            if lp.token_ranks is None:  # n = 0: verify launched nothing more; the ranks vLLM reports
                lp = lp._replace(token_ranks=torch.ops.specdec.logprobs(
                    float_arg(target_logits), res.tokens, temp, top_k, top_p, min_p, 0,
                    _LOGPROBS_MODES[self.logprobs_mode] == "processed")[1])
            tensors = LogprobsTensors(
                torch.cat([res.tokens.unsqueeze(-1), lp.top_ids], -1).view(rows, n + 1).to(torch.int32),
                torch.cat([lp.token_logprobs.unsqueeze(-1), lp.top_logprobs], -1).view(rows, n + 1),
                lp.token_ranks.reshape(rows))
        # verify writes -1 past the emitted tokens and over a whole invalid row: vLLM's placeholder
        return SamplerOutput(sampled_token_ids=res.tokens.to(torch.int32), logprobs_tensors=tensors, valid=res.valid)

    @staticmethod
    def _num_logprobs(sm) -> Optional[int]:
        n = _field(sm, "sampling_metadata.max_num_logprobs")
        return None if n is None else check_int("sampling_metadata.max_num_logprobs", n, 0, MAX_TOP_LOGPROBS)

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_metadata(md):
        """Host-only checks of the spec-decode metadata (shapes, dtypes, the host list)."""
        n = _field(md, "metadata.num_draft_tokens")
        if isinstance(n, torch.Tensor) or not isinstance(n, Sequence):
            raise TypeError(f"metadata.num_draft_tokens must be a list of ints (host data), got "
                            f"{type(n).__name__}")
        n = [check_int(f"metadata.num_draft_tokens[{i}]", v, 0) for i, v in enumerate(n)]
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
        target = _tensor(_field(md, "metadata.target_logits_indices"),
                         "metadata.target_logits_indices", INDEX, "[num_tokens]", (num_tokens,))
        bonus = _tensor(_field(md, "metadata.bonus_logits_indices"),
                        "metadata.bonus_logits_indices", INDEX, "[batch_size]", (B,))
        return drafts, cu, target, bonus, B, K

    @staticmethod
    def _check_sampling(sm, B: int):
        """Host-only checks of the sampling metadata; returns (temperature, top_k, top_p, min_p)."""
        flags = {}
        for name in ("all_greedy", "all_random"):
            flags[name] = bool_arg(_field(sm, f"sampling_metadata.{name}"), f"sampling_metadata.{name}")
        if flags["all_greedy"] and flags["all_random"]:
            raise ValueError("sampling_metadata.all_greedy and sampling_metadata.all_random are both True")
        RejectionSampler._num_logprobs(sm)  # checked before anything runs
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
        """(seed [B] int64, offset [B] int64 or int) for verify; see :meth:`forward`."""
        if seed is not None:
            _tensor(seed, "seed", (torch.int64,), "[batch_size]", (B,))
            if offset is None:
                offset = 0
            elif isinstance(offset, torch.Tensor):
                _tensor(offset, "offset", (torch.int64,), "[batch_size]", (B,))
            else:
                offset = check_int("offset", offset, -(2**63), 2**64 - 1)
            return seed, offset
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
        offsets = [0] * B
        for i, g in generators.items():
            s = g.initial_seed()
            seeds[i] = s - 2**64 if s >= 2**63 else s  # any 64-bit pattern is a seed
            offsets[i] = self._steps.get(g, 0)
            self._steps[g] = offsets[i] + 1
        return seeds, torch.tensor(offsets, dtype=torch.int64)
