"""Any Hugging Face ``transformers`` causal LM as a :class:`SpecModel`.

Two wrappers; :func:`specdec_ext.models.adapt` picks one (see :func:`batched_support`):

- :class:`HFBatchedSpecModel`, the fast path, for model families whose attention takes a
  ready-made 4D additive mask (:data:`BATCHED_MODEL_TYPES`, ``eager`` or ``sdpa``
  attention): ONE forward per step for the whole batch, on a :class:`SpecDecCache` (a
  ``transformers`` ``Cache`` backed by the package's :class:`~specdec_ext.KVCache`). Ragged
  rows get their own ``position_ids`` and the speculative mask
  (:func:`~specdec_ext.spec_attention_mask`); rollback is ``kv_rollback_`` on device
  lengths (O(1), no host sync, no slicing). ``compile_decode()`` runs its forwards
  through ``torch.compile`` (the cache's update is traceable).
- :class:`HFSpecModel`, the compatibility path for every other causal LM: one
  ``DynamicCache`` and one forward per row, rollback by cropping (reads ``num_kept`` on
  the host).

transformers API this module relies on (present in 5.17 and 5.24): ``Cache`` (subclassed;
its ``__init__(layers=...)``, and the methods overridden below: ``update``,
``get_seq_length``, ``get_mask_sizes``, ``get_query_offset``, ``is_sliding``,
``is_linear``, ``is_dummy``, ``is_compileable``), ``DynamicCache(config=)`` (older:
``DynamicCache()``), ``config.model_type`` / ``_attn_implementation`` /
``sliding_window`` / ``layer_types``, and the model forward's ``attention_mask`` (a 4D
float mask is used as is by ``masking_utils``), ``position_ids``, ``use_cache`` and
``cache`` (older: ``past_key_values``) arguments.
"""
from __future__ import annotations

import inspect
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from transformers.cache_utils import Cache

from .._validate import check_int
from ..cache import TreeNodes
from ..errors import CacheFullError
from .base import CacheBackedSpecModel, SpecModel
from .compiling import RECOMPILE_LIMIT, compile_step
from .cpu_linear import auto_pack_linears_, fast_linears, plain_linears
from .llama_cache import ContiguousLlamaCache, LlamaCacheStep

__all__ = ["BATCHED_MODEL_TYPES", "HFBatchedSpecModel", "HFSpecModel", "RECOMPILE_LIMIT", "SpecDecCache",
           "batched_support", "sliding_window"]

#: ``config.model_type`` of the families whose decoder attention (eager and sdpa) adds a
#: 4D float ``attention_mask`` as given, with no attention sinks, chunking or per-layer
#: RoPE variants that a plain causal mask could not express.
BATCHED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"})
_MASK_IMPLEMENTATIONS = ("eager", "sdpa")


def _cache_kwarg(model) -> str:
    """Name of the forward's cache argument: newer transformers ``cache``, older ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def sliding_window(config) -> Optional[int]:
    """The window (in tokens) of the model's sliding-window attention layers, or None when
    every layer attends to all earlier tokens (``sliding_window`` unset, or ``layer_types``
    without a ``"sliding_attention"`` entry)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def batched_support(model) -> Optional[str]:
    """None when :class:`HFBatchedSpecModel` can serve ``model``, else why not (one line)."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in BATCHED_MODEL_TYPES:
        return (f"model_type {model_type!r} is not among the families known to take a 4D attention mask "
                f"({', '.join(sorted(BATCHED_MODEL_TYPES))})")
    impl = getattr(config, "_attn_implementation", None)
    if impl not in _MASK_IMPLEMENTATIONS:
        return f"attn_implementation {impl!r} does not take a 4D float mask (eager and sdpa do)"
    if not getattr(config, "is_decoder", True) or getattr(config, "is_encoder_decoder", False):
        return "it is not a decoder-only causal LM"
    return None


def _kv_shape(config) -> Tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a decoder config."""
    heads = int(config.num_attention_heads)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return int(config.num_hidden_layers), int(kv_heads), int(head_dim)


class SpecDecCache(Cache):
    """A ``transformers`` ``Cache`` on the package's contiguous KV cache (``kv_append_`` /
    ``kv_rollback_``), one length per row.

    Storage (see :class:`~specdec_ext.models.llama_cache.ContiguousLlamaCache`, which this
    wraps): per layer keys / values ``[B, H, max_len, D]`` of ``dtype`` (float64 rides as
    float32 ``[..., 2D]``, bit-exact), ``lengths`` [B] int64 on ``device``.

    A forward is one *step* of S tokens per row. Every layer's :meth:`update` writes its
    keys / values at each row's own length, and the lengths advance once, when the step
    ends (after the forward), never per layer:

    - explicit (what :class:`HFBatchedSpecModel` does)::

          step = cache.begin_step(S)     # positions [B, S], mask [B, 1, S, kv_len]
          model(ids, attention_mask=step.mask, position_ids=step.positions, cache=cache)
          cache.end_step()               # lengths += S

    - implicit (plain ``model(ids, cache=cache)``): the update of layer 0 opens a step and
      the update of the last layer ends it. transformers then builds its own mask from
      :meth:`get_mask_sizes`, which is right only when every row holds the same number of
      tokens; ragged rows need the explicit form and its mask.

    :meth:`rollback` drops rejected tokens on the device (O(1), no host sync with a device
    ``num_kept``). Cropping, reordering and batch reshaping of the generic ``Cache`` API
    are refused (``NotImplementedError``): use :meth:`rollback` / :meth:`reset`.

    Parameters
    ----------
    batch_size, max_len : int >= 1, rows and tokens per row
    num_layers, num_kv_heads, head_dim : int >= 1, the model's attention shape
    dtype : torch.float32 | float64 | float16 | bfloat16, the model's (keys and values are
        never converted: :meth:`update` refuses another dtype)
    device : the model's
    """

    def __init__(self, batch_size: int, max_len: int, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: Union[str, torch.device]) -> None:
        for name, value in (("batch_size", batch_size), ("max_len", max_len), ("num_layers", num_layers),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            check_int(name, value, 1)
        # No per-layer objects: every method of the base class that reads self.layers is
        # overridden or refused below.
        super().__init__(layers=[])
        self._kv = ContiguousLlamaCache(num_layers, num_kv_heads, head_dim, batch_size, max_len, dtype, device)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.max_len, self.dtype, self.device = max_len, dtype, self._kv.device
        self._step: Optional[LlamaCacheStep] = None
        self._implicit = False

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> "SpecDecCache":
        """An empty cache shaped for ``model`` (a ``PreTrainedModel``; its config, dtype and device)."""
        num_layers, kv_heads, head_dim = _kv_shape(model.config)
        param = next(model.parameters())
        return cls(batch_size, max_len, num_layers=num_layers, num_kv_heads=kv_heads, head_dim=head_dim,
                   dtype=param.dtype, device=param.device)

    # ---- steps -------------------------------------------------------------------
    def begin_step(self, num_tokens: int, tree: Optional[TreeNodes] = None) -> LlamaCacheStep:
        """Open a step of ``num_tokens`` (S) tokens per row; nothing is written yet.

        Raises :class:`~specdec_ext.errors.CacheFullError` (nothing changes) when a row
        would pass ``max_len``. The returned step holds ``positions`` Tensor [B, S] int64
        (``lengths[b] + arange(S)``, the ``position_ids``), ``kv_len`` (keys attention reads)
        and ``mask`` Tensor [B, 1, S, kv_len] of ``dtype`` (additive, for ``attention_mask``),
        or None for one token of one row whose host length is exact: it sees every key, and
        the causal mask transformers then builds from :meth:`get_mask_sizes` is the same
        (sdpa skips it, and GQA runs without repeating keys). ``tree``: the S tokens are tree
        nodes (:class:`~specdec_ext.cache.TreeNodes`): tree positions and mask (never None).
        """
        if self._step is not None:
            raise RuntimeError("SpecDecCache.begin_step: the previous step was not ended (call end_step())")
        step = self._kv.begin(check_int("num_tokens", num_tokens, 1), tree)
        self._step, self._implicit = step, False
        return step

    def end_step(self, commit: bool = True) -> None:
        """Close the open step: ``lengths += S`` (``commit=False``, e.g. after a failed
        forward: lengths unchanged, so the rows hold what they held before the step)."""
        step, self._step = self._step, None
        if step is None:
            raise RuntimeError("SpecDecCache.end_step: no step is open")
        if commit:
            self._kv.finish(step)

    # ---- the transformers Cache API ----------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args,
               **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's new keys / values at each row's length (``kv_append_``, in place).

        key_states, value_states : Tensor [B, H, S, D] of the cache dtype and device
        layer_idx : int in [0, num_layers)
        (further arguments, e.g. ``cache_kwargs`` / ``kwargs=``, are accepted and unused)

        Returns (keys, values), views [B, H, kv_len, D] of the cache: every row's tokens
        including this step's, then padding (stale but finite) that the step's mask hides.
        """
        check_int("layer_idx", layer_idx, 0, self.num_layers - 1)
        if key_states.dim() != 4 or key_states.shape != value_states.shape:
            raise ValueError(f"key_states / value_states must be [B, H, S, D] of one shape, got "
                             f"{tuple(key_states.shape)} / {tuple(value_states.shape)}")
        B, H, S, D = key_states.shape
        if (B, H, D) != (self._kv.batch_size, self.num_kv_heads, self.head_dim):
            raise ValueError(f"key_states [B, H, S, D] = {tuple(key_states.shape)} does not fit the cache "
                             f"(B={self._kv.batch_size}, H={self.num_kv_heads}, D={self.head_dim})")
        if key_states.dtype != self.dtype or value_states.dtype != self.dtype:
            raise TypeError(f"key_states / value_states must be {self.dtype} (the cache dtype), got "
                            f"{key_states.dtype} / {value_states.dtype}")
        if self._step is None:
            if layer_idx != 0:
                raise RuntimeError(f"SpecDecCache.update(layer_idx={layer_idx}) outside a step: a forward "
                                   "starts at layer 0 (or call begin_step(S) before it)")
            self.begin_step(S)
            self._implicit = True
        elif S != self._step.num_tokens:
            raise ValueError(f"key_states hold S={S} tokens but the open step has {self._step.num_tokens}")
        out = self._kv.append(layer_idx, key_states, value_states, self._step)
        if self._implicit and layer_idx == self.num_layers - 1:
            self.end_step()
        return out

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        """Tokens before the current step in the longest row (the keys attention reads
        before this step's). Outside a step this is the exact host length, which may wait
        for a pending device rollback (one sync); the engine path never calls it."""
        if self._step is not None:
            return self._step.kv_len - self._step.num_tokens
        return int(self._kv.host_lengths().max())

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0, *args) -> Tuple[int, int]:
        """(kv_length, kv_offset) of the keys :meth:`update` returns for ``query_length`` new tokens."""
        return self.get_seq_length(layer_idx) + query_length, 0

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return self.max_len

    def __len__(self) -> int:
        return self.num_layers

    @property
    def is_sliding(self) -> List[bool]:
        return [False] * self.num_layers

    @property
    def is_linear(self) -> List[bool]:
        return [False] * self.num_layers

    @property
    def is_dummy(self) -> List[bool]:
        return [False] * self.num_layers

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return self._kv.batch_size

    def reset(self) -> None:
        """Empty every row (and drop an open step)."""
        self._step = None
        self._kv.reset()

    def crop(self, *args, **kwargs):
        raise NotImplementedError("SpecDecCache keeps one length per row: use rollback(num_appended, num_kept)")

    def reorder_cache(self, *args, **kwargs):
        raise NotImplementedError("SpecDecCache does not reorder rows (no beam search)")

    def batch_repeat_interleave(self, *args, **kwargs):
        raise NotImplementedError("SpecDecCache has a fixed batch: make a new one")

    def batch_select_indices(self, *args, **kwargs):
        raise NotImplementedError("SpecDecCache has a fixed batch: make a new one")

    # ---- the package's side --------------------------------------------------------
    @property
    def lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on ``device``: tokens each row holds."""
        return self._kv.lengths

    def host_lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on the CPU (may wait for a pending device rollback)."""
        return self._kv.host_lengths()

    def reserve(self, row_lengths: Sequence[int]) -> None:
        """Raise ``CacheFullError`` if a row would need more than ``max_len`` positions."""
        self._kv.reserve(row_lengths)

    def rollback(self, num_appended: int, num_kept: Union[torch.Tensor, Sequence[int], int]) -> None:
        """``lengths[b] -= num_appended - num_kept[b]`` with ``kv_rollback_``.

        num_kept : Tensor [B] int32 | int64 on ``device`` (no host sync; invalid rows are
            flagged, see :meth:`check`) or on the CPU / a list / an int (validated here:
            ``ValueError``, nothing changes).
        """
        if self._step is not None:
            raise RuntimeError("SpecDecCache.rollback inside an open step (call end_step() first)")
        self._kv.rollback(num_appended, num_kept)

    def compact(self, num_appended: int, src_index: torch.Tensor, count: torch.Tensor) -> None:
        """:meth:`KVCache.compact <specdec_ext.cache.contiguous.KVCache.compact>`: of the last
        ``num_appended`` entries of each row, entry j < count[b] receives entry src_index[b, j]."""
        if self._step is not None:
            raise RuntimeError("SpecDecCache.compact inside an open step (call end_step() first)")
        self._kv.compact(num_appended, src_index, count)

    def check(self) -> None:
        """Raise :class:`~specdec_ext.errors.DeviceFlagError` if a CUDA kernel flagged a row (one sync)."""
        self._kv.kv.check()

    def layer_tensors(self, layer_idx: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Views (keys, values) [B, H, max_len, D] of ``dtype`` of one layer (valid up to each row's length)."""
        check_int("layer_idx", layer_idx, 0, self.num_layers - 1)
        return self._kv.layer_view(layer_idx)


class HFBatchedSpecModel(CacheBackedSpecModel):
    """A ``transformers`` decoder-only causal LM of a :data:`BATCHED_MODEL_TYPES` family
    (``eager`` or ``sdpa`` attention) on a :class:`SpecDecCache`: one forward per step.

    ``max_positions`` is ``config.max_position_embeddings``, capped at the model's sliding
    window when it has one: the one 4D mask every layer reads is plain causal, which equals
    the sliding-window mask only while a row holds at most ``sliding_window`` tokens. Longer
    requests raise :class:`~specdec_ext.errors.CacheFullError` (from the engine, or from
    :meth:`reset`).

    ``skinny_linears`` (default True): on a CPU, the eager forwards run the model's
    ``nn.Linear`` layers through :func:`~specdec_ext.ops.skinny_linear` (1 to
    :data:`~specdec_ext.models.cpu_linear.MAX_ROWS` float32 rows; ``F.linear`` otherwise): a
    K + 1-token verification pass then costs about what a one-token pass costs in its
    matmuls. Only for the duration of each forward (:func:`~specdec_ext.models.cpu_linear.fast_linears`):
    the model is a plain transformers model again outside it. Float32 layers with a multiple of
    16 outputs also get packed weight copies (:func:`~specdec_ext.models.cpu_linear.pack_linears_`:
    a few rows then cost little more than one; as much memory again as those weights, kept on
    the modules), when those weights hold at most
    :data:`~specdec_ext.models.cpu_linear.AUTO_PACK_BYTES`. False: ``F.linear`` throughout.

    Raises ``ValueError`` (naming the reason) for a model :func:`batched_support` refuses.
    """

    def __init__(self, model, skinny_linears: bool = True):
        reason = batched_support(model)
        if reason is not None:
            raise ValueError(f"HFBatchedSpecModel cannot serve this model: {reason}; use HFSpecModel")
        self.model = model.eval()
        self.vocab_size = int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        self.sliding_window = sliding_window(model.config)
        caps = [c for c in (getattr(model.config, "max_position_embeddings", None), self.sliding_window)
                if c is not None]
        self.max_positions = min(caps) if caps else None
        self.step_cost_hint = float(sum(p.numel() for p in model.parameters()))
        self._cache_kw = _cache_kwarg(model)
        self._run = model  # the model, or its torch.compile'd forward (compile_decode)
        # the exact nn.Linear modules the eager forwards give the skinny kernel (CPU models only)
        self._linears = plain_linears(model) if skinny_linears and self.device.type == "cpu" else []
        auto_pack_linears_(self._linears)  # float32 ones only; see the class docstring
        self.cache: Optional[SpecDecCache] = None

    def compile_decode(self, enable: bool = True, **options: Any) -> "HFBatchedSpecModel":
        """Run every decode step through ``torch.compile(model, dynamic=True, **options)``
        (``enable=False``: back to eager). Returns self. A prefill into empty rows stays
        eager (a one-off step whose sizes would otherwise specialise the graph).

        The whole transformers forward is traced, :meth:`SpecDecCache.update` included:
        ``kv_append_`` is a custom op with a fake kernel, and the step's ``kv_len`` and
        sizes stay symbolic (``dynamic=True``), so steps of any S, B and length reuse a few
        graphs (one token of one row without a mask, and the masked steps; B = 1 and B > 1
        compile apart; a first step whose sizes happen to coincide, e.g. S == B, may
        specialise on that and compile once more). The first steps of each kind compile
        (seconds to a minute on a CPU); warm up before timing. It pays where per-op Python
        overhead dominates the forward, e.g. small models on a CPU; measure with
        ``bench e2e --hf --compile``.
        float64 models raise ``ValueError``.

        Every model of a transformers class shares one forward code object (a target and a
        draft at two batch sizes need up to 12 graphs of it), so this raises dynamo's
        recompile limit, a process-wide setting (see :mod:`specdec_ext.models.compiling`).
        """
        if not enable:
            self._run = self.model
            return self
        if next(self.model.parameters()).dtype == torch.float64:
            raise ValueError("compile_decode: float64 models cannot be compiled (their cache stores each float64 "
                             "as two float32 words, a dtype-changing view that torch.compile cannot trace through "
                             "kv_append_'s write); use float32, bfloat16 or float16, or stay eager")
        self._run = compile_step(self.model, **options)
        return self

    @property
    def compiled(self) -> bool:
        """True after :meth:`compile_decode` (and until ``compile_decode(False)``)."""
        return self._run is not self.model

    def reset(self, batch_size: int, max_len: int) -> None:
        """B empty rows of up to ``max_len`` tokens (reuses the cache when B and max_len repeat)."""
        if self.sliding_window is not None and max_len > self.sliding_window:
            raise CacheFullError(f"max_len {max_len} exceeds the model's sliding window of {self.sliding_window} "
                                 "tokens, which the batched HF path's one causal mask cannot express")
        if self.max_positions is not None and max_len > self.max_positions:
            raise CacheFullError(f"max_len {max_len} exceeds the model's max_position_embeddings "
                                 f"{self.max_positions}")
        self._renew_cache(batch_size, max_len, lambda b, n: SpecDecCache.for_model(self.model, b, n))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, tree: Optional[TreeNodes] = None) -> torch.Tensor:
        """input_ids [B, S] int64 on ``device`` -> logits [B, S, V] of the model dtype; one
        forward for the batch, each row at its own positions; lengths advance by S. ``tree``:
        the tokens are tree nodes (see :meth:`forward_tree`)."""
        cache = self._cache()
        if input_ids.dim() != 2 or input_ids.shape[0] != cache.batch_size:
            raise ValueError(f"input_ids must be [B, S] with B = {cache.batch_size}, got {tuple(input_ids.shape)}")
        step = cache.begin_step(input_ids.shape[1], tree)
        # A prefill into empty rows (kv_len == S) stays eager: compiled first, it would pin
        # kv_len == S into the graph (duck sizing) and make the decode steps recompile.
        run = self._run if step.kv_len > step.num_tokens else self.model
        try:
            with fast_linears(self._linears if run is self.model else ()):
                out = run(input_ids=input_ids, attention_mask=step.mask, position_ids=step.positions,
                          use_cache=True, **{self._cache_kw: cache})
        except BaseException:
            cache.end_step(commit=False)
            raise
        cache.end_step()
        return out.logits

    def forward_tree(self, input_ids: torch.Tensor, tree: TreeNodes) -> torch.Tensor:
        """Tree nodes (see :meth:`SpecModel.forward_tree`): the model gets the tree's 4D mask
        as ``attention_mask`` and the nodes' depths as ``position_ids``, which every family
        of :data:`BATCHED_MODEL_TYPES` applies as given."""
        return self.forward(input_ids, tree)

    def cache_tensors(self, row: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """[(keys, values)] per layer of row ``row``'s valid cache prefix, each [1, H, length, D]."""
        cache = self._cache()
        n = int(cache.host_lengths()[row])
        return [tuple(t[row:row + 1, :, :n] for t in cache.layer_tensors(i)) for i in range(cache.num_layers)]


def _crop(cache, new_len: int) -> None:
    """Crop a DynamicCache to ``new_len`` tokens. A negative argument removes that many
    tokens in every transformers version (older ones read a non-negative one as the
    length to keep, newer ones refuse it)."""
    remove = cache.get_seq_length() - new_len
    if remove > 0:
        cache.crop(-remove)


class HFSpecModel(SpecModel):
    """Wraps any ``transformers`` causal LM (``PreTrainedModel``) for the engine, one row at
    a time: correct for any model with a cache, but a Python loop over rows, and a rollback
    reads ``num_kept`` on the host (pass a CPU tensor to avoid a device sync)."""

    def __init__(self, model):
        self.model = model.eval()
        self.vocab_size = int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.step_cost_hint = float(sum(p.numel() for p in model.parameters()))
        self._caches: List = []
        self._cache_kw = _cache_kwarg(model)
        self._lengths: List[int] = []

    def reset(self, batch_size: int, max_len: int) -> None:
        from transformers import DynamicCache

        if self.max_positions is not None and max_len > self.max_positions:
            raise CacheFullError(f"max_len {max_len} exceeds the model's max_position_embeddings "
                                 f"{self.max_positions}")
        try:
            self._caches = [DynamicCache(config=self.model.config) for _ in range(batch_size)]
        except TypeError:  # older transformers
            self._caches = [DynamicCache() for _ in range(batch_size)]
        self._lengths = [0] * batch_size

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, S] int64 -> logits [B, S, V]; appends S tokens to every row's cache."""
        B, S = input_ids.shape
        out = []
        for b in range(B):
            pos = torch.arange(self._lengths[b], self._lengths[b] + S, device=self.device).unsqueeze(0)
            res = self.model(input_ids=input_ids[b:b + 1], position_ids=pos, use_cache=True,
                             **{self._cache_kw: self._caches[b]})
            out.append(res.logits[0, -S:])
            self._lengths[b] += S
        return torch.stack(out)

    def rollback(self, num_appended: int, num_kept: torch.Tensor) -> None:
        kept = num_kept.tolist() if isinstance(num_kept, torch.Tensor) else list(num_kept)
        for b, k in enumerate(kept):
            if not 0 <= k <= num_appended:
                raise ValueError(f"num_kept[{b}] = {k} is outside [0, num_appended = {num_appended}]")
            self._lengths[b] -= num_appended - k
            _crop(self._caches[b], self._lengths[b])

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor(self._lengths, dtype=torch.int64)

    def cache_tensors(self, row: int):
        """[(key, value)] per layer of row ``row``'s cache, each [1, H, L, D] (for tests)."""
        c = self._caches[row]
        if hasattr(c, "layers"):
            return [(layer.keys, layer.values) for layer in c.layers]
        return list(zip(c.key_cache, c.value_cache))
