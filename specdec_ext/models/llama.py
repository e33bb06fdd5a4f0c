"""The package's reference Llama decoder and its :class:`SpecModel` wrapper.

:class:`LlamaModel` is a plain Llama-architecture causal LM (token embedding, decoder layers
of RMSNorm -> grouped-query attention with RoPE -> RMSNorm -> SwiGLU MLP, final RMSNorm,
lm_head) whose attention runs on the package's KV caches (``kv_append_`` or
``paged_kv_append_`` + ``paged_kv_gather``), the speculative mask of
:func:`~specdec_ext.spec_attention_mask` and ``torch.nn.functional.scaled_dot_product_attention``.
Its state-dict key names are those of ``transformers.LlamaForCausalLM``, so a Hugging Face
checkpoint loads without renaming.

A step is kept cheap on the host (per-op overhead dominates small models): Q / K / V and
gate / up are each one fused ``nn.Linear`` built at load time (``state_dict`` / ``load_state_dict``
/ :meth:`LlamaModel.load_hf_state_dict` still speak HF's separate names), activations stay
2-D between layers (residual adds folded into ``addmm``), the RoPE cos / sin rows are looked up
once per step for every layer and applied without slicing or ``cat`` (:func:`_rope`), the
attention mask is built once per step (none for a single-token step of one row), RMSNorm is
``F.rms_norm``. :meth:`LlamaModel.compile_decode` optionally runs the layers through
``torch.compile``; :func:`specdec_ext.bench.step_profile.step_profile` measures a step.

Numerics follow ``LlamaForCausalLM``: RMSNorm statistics and the RoPE cos / sin tables are
computed in float32 and cast to the model dtype. A float64 model therefore reproduces the
Hugging Face float64 logits to float64 rounding (it is not more accurate than that).

:class:`LlamaSpecModel` wraps a model and one cache for the speculative engine.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..cache import TreeNodes
from .base import CacheBackedSpecModel
from .compiling import compile_step
from .cpu_linear import auto_pack_linears_, layer_linear, layer_residual_linear, pack_linears_, plain_linears
from .llama_cache import ContiguousLlamaCache, LlamaCacheStep, PagedLlamaCache
from .llama_config import LlamaConfig

__all__ = ["LlamaConfig", "LlamaModel", "LlamaSpecModel"]

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LlamaCache = Union[ContiguousLlamaCache, PagedLlamaCache]


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be torch.float32, float64, float16 or bfloat16, got {dtype}")
    return dtype


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))`` with HF's numerics: the statistics and the
    normalised value in float32, cast to the model dtype, then scaled by ``weight``.

    ``torch.nn.functional.rms_norm`` computes ``(x * rsqrt(mean(x^2) + eps)) * weight``: for a
    float32 model that is HF's formula bit for bit, so the weight goes into the one call.
    """
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, eps).to(x.dtype)


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim; statistics in float32 (as HF).

    x : Tensor [..., hidden] model dtype -> same shape and dtype.
    """

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight, self.eps)


def _linear(n_in: int, n_out: int, bias: bool, dtype, device) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias, dtype=dtype, device=device)
    layer.requires_grad_(False)
    return layer


class _Fused(nn.Module):
    """Base of the modules holding fused projections (one ``nn.Linear`` for several HF ones).

    ``_parts`` lists (fused linear name, [(HF linear name, rows), ...]): the fused weight is
    the HF weights stacked along the output dim, in that order (biases likewise). The
    state-dict hooks keep the HF key names outside: :meth:`state_dict` yields the parts
    (views of the fused tensors) and :meth:`load_state_dict` accepts them (and the fused keys).
    """

    _parts: Sequence = ()

    def __init__(self) -> None:
        super().__init__()
        self.register_state_dict_post_hook(_Fused._split_state)
        self.register_load_state_dict_pre_hook(_Fused._merge_state)

    @staticmethod
    def _split(t: torch.Tensor, parts, attr: str) -> Dict[str, torch.Tensor]:
        """HF-relative name (e.g. ``"q_proj.weight"``) -> the rows of fused tensor ``t`` it holds."""
        out, start = {}, 0
        for name, rows in parts:
            out[f"{name}.{attr}"] = t.narrow(0, start, rows)
            start += rows
        return out

    def hf_views(self) -> Dict[str, torch.Tensor]:
        """HF-relative name (e.g. ``"q_proj.weight"``) -> view of the fused tensor holding it."""
        out: Dict[str, torch.Tensor] = {}
        for fused_name, parts in self._parts:
            for attr in ("weight", "bias"):
                t = getattr(getattr(self, fused_name), attr)
                if t is not None:
                    out.update(_Fused._split(t, parts, attr))
        return out

    @staticmethod
    def _split_state(module, state_dict, prefix, local_metadata) -> None:
        for fused_name, parts in module._parts:
            for attr in ("weight", "bias"):
                t = state_dict.pop(f"{prefix}{fused_name}.{attr}", None)
                if t is not None:
                    state_dict.update({prefix + k: v for k, v in _Fused._split(t, parts, attr).items()})

    @staticmethod
    def _merge_state(module, state_dict, prefix, *args) -> None:
        for fused_name, parts in module._parts:
            for attr in ("weight", "bias"):
                keys = [f"{prefix}{name}.{attr}" for name, _ in parts]
                if all(k in state_dict for k in keys):
                    state_dict[f"{prefix}{fused_name}.{attr}"] = torch.cat([state_dict.pop(k) for k in keys], 0)


class LlamaAttention(_Fused):
    """Grouped-query self-attention with RoPE over a KV cache.

    Q, K and V come from one fused ``qkv_proj`` (rows: q, then k, then v); its state dict
    keeps HF's ``q_proj`` / ``k_proj`` / ``v_proj`` names.
    """

    def __init__(self, cfg: LlamaConfig, dtype, device) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = _linear(cfg.hidden_size, q_out + 2 * kv_out, cfg.attention_bias, dtype, device)
        self.o_proj = _linear(q_out, cfg.hidden_size, cfg.attention_bias, dtype, device)
        self._parts = (("qkv_proj", [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)]),)
        self.gqa = self.num_heads != self.num_kv_heads
        self.scale = self.head_dim ** -0.5

    def forward(self, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: Optional[LlamaCache], step: Optional[LlamaCacheStep]) -> torch.Tensor:
        """x [B * S, hidden] (rows in (b, s) order); cos, sin_signed [B, S, 1, D] model dtype (see
        :func:`_rope`) -> the attention output projected back, ``x + o_proj(attn)`` [B * S, hidden]."""
        B, S = cos.shape[0], cos.shape[1]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = layer_linear(h, self.qkv_proj)
        # RoPE on q and k together, in the projection's [B, S, heads, D] layout.
        qk = _rope(qkv.narrow(1, 0, (H + Hkv) * D).view(B, S, H + Hkv, D), cos, sin)
        q, k = qk.narrow(2, 0, H).transpose(1, 2), qk.narrow(2, H, Hkv).transpose(1, 2)
        v = qkv.narrow(1, (H + Hkv) * D, Hkv * D).view(B, S, Hkv, D).transpose(1, 2)
        if cache is None:  # whole sequences, no cache: plain causal attention
            keys, values, mask, causal = k, v, None, True
        else:
            keys, values = cache.append(layer, k, v, step)
            mask, causal = step.mask, False
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal,
                                             scale=self.scale, enable_gqa=self.gqa)
        return layer_residual_linear(x, out.transpose(1, 2).reshape(B * S, H * D), self.o_proj)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` without slicing or ``cat``, bit for bit.

    RoPE pairs dimension i with i + D/2 (the HF "rotate half" layout, not interleaved):
    ``rotate_half(x) = cat(-x2, x1)``, so ``rotate_half(x) * sin = cat(x2, x1) * sin_signed``
    with ``sin_signed = cat(-sin1, sin2)`` (a sign flip is exact), and ``cat(x2, x1)`` is one
    ``roll`` by D/2. x [..., D]; cos, sin_signed broadcast to it.
    """
    return x * cos + torch.roll(x, x.shape[-1] // 2, -1) * sin_signed


class LlamaMLP(_Fused):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, gate and up as one fused ``gate_up_proj``
    (state dict: HF's ``gate_proj`` / ``up_proj``)."""

    def __init__(self, cfg: LlamaConfig, dtype, device) -> None:
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = _linear(cfg.hidden_size, 2 * inter, cfg.mlp_bias, dtype, device)
        self.down_proj = _linear(inter, cfg.hidden_size, cfg.mlp_bias, dtype, device)
        self._parts = (("gate_up_proj", [("gate_proj", inter), ("up_proj", inter)]),)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] residual, h [N, hidden] its normalised value -> ``x + mlp(h)``."""
        gate, up = layer_linear(h, self.gate_up_proj).chunk(2, dim=-1)
        return layer_residual_linear(x, F.silu(gate) * up, self.down_proj)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: LlamaConfig, dtype, device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(cfg, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(cfg, dtype, device)

    def forward(self, x, cos, sin, layer, cache, step):
        """x [B * S, hidden] -> [B * S, hidden] (see :meth:`LlamaAttention.forward`)."""
        # Submodules' forward called directly: no nn.Module.__call__ bookkeeping per call.
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        x = self.self_attn.forward(x, _rms_norm(x, n1.weight, n1.eps), cos, sin, layer, cache, step)
        return self.mlp.forward(x, _rms_norm(x, n2.weight, n2.eps))


class _Backbone(nn.Module):
    # Named like transformers' LlamaModel so that state-dict keys match ("model.layers.0...").
    def __init__(self, cfg: LlamaConfig, dtype, device) -> None:
        super().__init__()
        # given its weight, nn.Embedding skips its N(0, 1) init (LlamaModel initialises every weight
        # anyway): on the meta device that init alone imports torch's prims (~2 s per new process)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype,
                                                             device=device))
        self.embed_tokens.requires_grad_(False)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, dtype, device) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)


class LlamaModel(nn.Module):
    """Llama causal LM on the package's KV caches.

    Parameters
    ----------
    config : LlamaConfig, a ``config.json`` dict, or a ``transformers.LlamaConfig``
    dtype : torch.float32 | float64 | float16 | bfloat16, of weights, activations and logits
    device : where the weights live

    Weights are initialised N(0, 0.02) (norms to one) from the current torch RNG; load real
    ones with :meth:`from_pretrained` / :meth:`from_state_dict` / :meth:`load_hf_state_dict`.
    Every parameter has ``requires_grad=False`` (inference only).

    ``keep_hidden = True``: every forward also leaves its final hidden states (after the final
    norm: the lm_head's input), Tensor [B, S, hidden_size], in ``last_hidden`` (a draft head
    reads them, :class:`~specdec_ext.models.draft_head.DraftHead`); such steps run eager.
    """

    def __init__(self, config: Any, dtype: torch.dtype = torch.float32,
                 device: Union[str, torch.device] = "cpu") -> None:
        super().__init__()
        self.config = cfg = LlamaConfig.coerce(config)
        _check_dtype(dtype)
        self.model = _Backbone(cfg, dtype, device)
        if cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta")
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.is_meta:  # from_state_dict: storage comes later, and a meta init imports torch's prims
                    break
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
        self._rope: Dict[Any, Any] = {}
        self._compiled = None
        self.keep_hidden = False
        self.last_hidden: Optional[torch.Tensor] = None  # [B, S, hidden] of the last forward (keep_hidden)

    # Read from the weights, so that they stay right after ``model.to(...)``.
    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return _check_dtype(self.model.embed_tokens.weight.dtype)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    # ---- caches ------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int, kind: str = "contiguous", *, block_size: int = 16,
                  num_blocks: Optional[int] = None) -> LlamaCache:
        """An empty cache for ``batch_size`` rows of up to ``max_len`` tokens.

        kind : "contiguous" (:class:`ContiguousLlamaCache`: ``KVCache``, sync-free rollback) or
            "paged" (:class:`PagedLlamaCache`: ``PagedKVCache`` with ``block_size``-token blocks,
            ``num_blocks`` defaulting to enough for every row to reach max_len).
        """
        cfg = self.config
        args = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, batch_size, max_len,
                self.dtype, self.device)
        if kind == "contiguous":
            if block_size != 16 or num_blocks is not None:
                raise ValueError("block_size / num_blocks apply to the paged cache only")
            return ContiguousLlamaCache(*args)
        if kind == "paged":
            return PagedLlamaCache(*args, block_size=block_size, num_blocks=num_blocks)
        raise ValueError(f"cache must be 'contiguous' or 'paged', got {kind!r}")

    # ---- forward -----------------------------------------------------------------
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache: Optional[LlamaCache] = None,
                tree: Optional[TreeNodes] = None) -> torch.Tensor:
        """Logits of S new tokens per row.

        Parameters
        ----------
        input_ids : Tensor [B, S] int64 on the model's device (ids in [0, vocab_size); not
            checked on the device)
        cache : from :meth:`new_cache`, or None
            With a cache, row b's tokens take positions ``cache.lengths[b] + arange(S)``
            (ragged rows), attend to the row's cached tokens and causally to each other,
            are appended, and the lengths advance by S. Without one, each row is a whole
            sequence starting at position 0.
        tree : TreeNodes, optional (needs a cache)
            The S tokens are tree nodes (tree speculation): each takes its tree position and
            attends to the row's cache before the tree root plus its own ancestors, not
            causally to the other new tokens (see :class:`~specdec_ext.cache.TreeNodes`).

        Returns
        -------
        Tensor [B, S, vocab_size] of the model dtype.
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a [B, S] tensor, got "
                             f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be int64 (or int32), got {input_ids.dtype}")
        if input_ids.device != self.device:
            raise ValueError(f"input_ids is on {input_ids.device} but the model is on {self.device}")
        B, S = input_ids.shape
        if S < 1:
            raise ValueError(f"input_ids must hold at least one token per row, got shape {tuple(input_ids.shape)}")
        if tree is not None and cache is None:
            raise ValueError("a tree step needs a cache (the tree's root is located by the cache lengths)")
        if cache is None:
            positions = torch.arange(S, device=self.device).expand(B, S)
            table_len, step = S, None
        else:
            if cache.batch_size != B:
                raise ValueError(f"input_ids has {B} rows but the cache has batch_size={cache.batch_size}")
            if cache.dtype != self.dtype or cache.device != self.device:
                raise ValueError(f"cache ({cache.dtype}, {cache.device}) does not match the model "
                                 f"({self.dtype}, {self.device})")
            step = cache.begin(S, tree)
            # Positions past max_len only occur in a step the cache will refuse; clamp so that
            # the table lookup cannot fault on the device before the refusal.
            positions = step.positions.clamp(max=cache.max_len - 1)
            table_len = cache.max_len
        # One lookup for every layer: [B, S, 2, D] (cos, signed sin), cast once to the model dtype.
        cs = self._rope_tables(table_len)[positions].to(self.dtype)
        cos, sin = cs[:, :, 0:1], cs[:, :, 1:2]  # [B, S, 1, D]: broadcast over the heads
        run = self._layers
        if self._compiled is not None and isinstance(cache, ContiguousLlamaCache) and not self.keep_hidden:
            run = self._compiled
        logits = run(input_ids, cos, sin, cache, step)
        if cache is not None:
            cache.finish(step)
        return logits

    def _layers(self, input_ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[LlamaCache], step: Optional[LlamaCacheStep]) -> torch.Tensor:
        """Embedding, decoder layers, final norm and lm_head: logits [B, S, V] (the part
        :meth:`compile_decode` compiles)."""
        B, S = input_ids.shape
        # Activations stay 2-D [B * S, hidden] between the layers: each linear is one BLAS call.
        x = F.embedding(input_ids.reshape(B * S), self.model.embed_tokens.weight)
        for i, layer in enumerate(self.model.layers):
            x = layer.forward(x, cos, sin, i, cache, step)
        norm = self.model.norm
        h = _rms_norm(x, norm.weight, norm.eps)
        if self.keep_hidden:
            self.last_hidden = h.view(B, S, -1)
        return layer_linear(h, self.lm_head).view(B, S, -1)

    def compile_decode(self, enable: bool = True, *, freeze: bool = False, **options: Any) -> "LlamaModel":
        """Run the layers of every step on a contiguous cache through
        ``torch.compile(dynamic=True, **options)`` (``enable=False``: back to eager). Returns self.

        Only the tensor work is compiled (:meth:`_layers`: embedding, layers with their
        ``kv_append_`` writes, lm_head); input checks, the cache's host bookkeeping, the RoPE
        lookup and the mask stay eager. Steps without a cache or on a paged cache stay eager.
        The first steps compile (seconds); ``dynamic=True`` keeps S, kv_len and B symbolic so
        that later steps reuse the graph. Whether it pays depends on the device and the
        model size: see :func:`~specdec_ext.bench.step_profile.step_profile` to measure.

        ``freeze=True``: Inductor's freezing, the weights become constants of the graphs, for
        a model whose weights are final (see :func:`~specdec_ext.models.compiling.compile_step`).
        On a CPU Inductor then pre-packs them for its GEMM kernels, and
        ``options={"max_autotune": True}`` adds its C++ micro-GEMMs (autotuning: tens of
        seconds more of compilation); the bundled target's step times for each are in
        benchmarks/HISTORY.md (2026-11-30). The dynamo recompile limit is raised as for
        :meth:`HFBatchedSpecModel.compile_decode <specdec_ext.models.hf.HFBatchedSpecModel.compile_decode>`
        (a target and a draft share this method's code object).
        """
        self._compiled = compile_step(self._layers, freeze, duck_shape=False, **options) if enable else None
        return self

    def _rope_tables(self, length: int) -> torch.Tensor:
        """Tensor [length', 2, head_dim] float32 on the model device (length' >= length):
        ``[:, 0]`` cos, ``[:, 1]`` the sign-flipped sin of :func:`_rope` (``cat(-sin1, sin2)``).

        Built as HF does (float32 ``position * inv_freq``, duplicated halves, then cos / sin),
        rows in position order from 0 so that every entry is computed exactly as in the HF
        table of a prompt starting at 0. Cached until a longer one is needed.
        """
        key = (self.device, self.config.head_dim)
        cached = self._rope.get(key)
        if cached is not None and cached.shape[0] >= length:
            return cached
        inv = self.config.inv_freq().to(self.device)
        pos = torch.arange(max(length, 1), device=self.device, dtype=torch.int64).to(torch.float32)
        freqs = pos[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        half = sin.shape[-1] // 2
        sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        table = torch.stack((emb.cos(), sin_signed), dim=1)
        self._rope[key] = table
        return table

    # ---- loading -----------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, config: Any, state_dict: Mapping[str, torch.Tensor],
                        dtype: torch.dtype = torch.float32,
                        device: Union[str, torch.device] = "cpu") -> "LlamaModel":
        """A model from a ``transformers.LlamaForCausalLM`` state dict (HF key names).

        config : LlamaConfig, ``config.json`` dict, or ``transformers.LlamaConfig``
        state_dict : name -> Tensor; cast to ``dtype`` and moved to ``device``.
        Raises ``ValueError`` naming the missing / unexpected keys or a mismatched shape.
        """
        # Build on the meta device and allocate uninitialised storage: every parameter is
        # overwritten by the (all-or-nothing) load, so a random init would only cost time.
        model = cls(config, dtype=dtype, device="meta")
        model.to_empty(device=device)
        if model.config.tie_word_embeddings:  # to_empty makes new Parameters: tie them again
            model.lm_head.weight = model.model.embed_tokens.weight
        model.load_hf_state_dict(state_dict)
        auto_pack_linears_(plain_linears(model))  # see pack_linears_
        return model

    def pack_linears_(self) -> int:
        """Give the projections and the lm_head packed weight copies for the skinny linear kernel
        (:func:`~specdec_ext.models.cpu_linear.pack_linears_`: float32 CPU models only; memory as
        much again as those weights), so a verification pass of a few tokens costs little more
        than a one-token step. :meth:`from_state_dict` / :meth:`from_pretrained` call it when
        they hold at most :data:`~specdec_ext.models.cpu_linear.AUTO_PACK_BYTES`. A later
        in-place change of a weight or ``.to()`` is followed (repacked or dropped); a change
        through ``.data``, or in place on a weight made under ``torch.inference_mode``, is not
        seen: call this again after one. Returns how many packed.
        """
        return pack_linears_(plain_linears(self))  # the projections and the lm_head

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike], dtype: torch.dtype = torch.float32,
                        device: Union[str, torch.device] = "cpu") -> "LlamaModel":
        """Load a Hugging Face Llama checkpoint directory, offline.

        Reads ``config.json`` and the weights of the first of: ``model.safetensors``,
        ``model.safetensors.index.json`` (shards), ``pytorch_model.bin``,
        ``pytorch_model.bin.index.json`` (``.bin`` files through ``torch.load(weights_only=True)``).
        safetensors files need the ``safetensors`` package.
        """
        path = os.fspath(path)
        config_file = os.path.join(path, "config.json")
        if not os.path.isfile(config_file):
            raise FileNotFoundError(f"{path!r} has no config.json (not a Hugging Face checkpoint directory)")
        with open(config_file, "r", encoding="utf-8") as f:
            config = json.load(f)
        return cls.from_state_dict(config, _read_weights(path), dtype=dtype, device=device)

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy HF-named weights in (cast to the model dtype); all or nothing.

        Ignored keys: RoPE buffers (``*rotary_emb.inv_freq``) and, with tied embeddings,
        ``lm_head.weight``. Raises ``ValueError`` listing missing / unexpected keys, or
        naming the first key whose shape differs.
        """
        params = self._hf_tensors()
        given = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
        if self.config.tie_word_embeddings:
            given.pop("lm_head.weight", None)
        missing = sorted(set(params) - set(given))
        unexpected = sorted(set(given) - set(params))
        if missing or unexpected:
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if unexpected:
                parts.append(f"unexpected keys {unexpected}")
            raise ValueError("state dict does not match the Llama config: " + "; ".join(parts))
        for name, p in params.items():
            t = given[name]
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"state dict entry {name!r} is a {type(t).__name__}, not a tensor")
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"state dict entry {name!r} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(given[name].to(dtype=self.dtype))

    def _hf_tensors(self) -> Dict[str, torch.Tensor]:
        """HF parameter name -> the tensor holding it (a row block of a fused projection's
        weight / bias, or a parameter itself); no ``lm_head.weight`` when tied."""
        out: Dict[str, torch.Tensor] = {}
        fused = set()
        for mod_name, mod in self.named_modules():
            if isinstance(mod, _Fused):
                out.update((f"{mod_name}.{k}", v) for k, v in mod.hf_views().items())
                fused.update(id(getattr(mod, name)) for name, _ in mod._parts)
        for mod_name, mod in self.named_modules():
            if id(mod) in fused:
                continue
            for name, p in mod.named_parameters(prefix=mod_name, recurse=False):
                out.setdefault(name, p)
        if self.config.tie_word_embeddings:
            out.pop("lm_head.weight", None)
        return out


_WEIGHT_FILES = (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json"))


def weights_file(path: str) -> Optional[str]:
    """The file of ``path`` that :meth:`LlamaModel.from_pretrained` reads the weights from (a
    single file or a shard index, first found of :data:`_WEIGHT_FILES`), or None."""
    for names in _WEIGHT_FILES:
        for name in names:
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
    return None


def _read_weights(path: str) -> Dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, on the CPU (see :meth:`LlamaModel.from_pretrained`)."""
    def load_safetensors(file):
        from safetensors.torch import load_file  # lazily: only safetensors checkpoints need it
        return load_file(file, device="cpu")

    def load_bin(file):
        return torch.load(file, map_location="cpu", weights_only=True)

    for (single, index), loader in zip(_WEIGHT_FILES, (load_safetensors, load_bin)):
        if os.path.isfile(os.path.join(path, single)):
            return dict(loader(os.path.join(path, single)))
        if os.path.isfile(os.path.join(path, index)):
            with open(os.path.join(path, index), "r", encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index} in {path!r} has no 'weight_map' dict")
            out: Dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                shard_file = os.path.join(path, shard)
                if not os.path.isfile(shard_file):
                    raise FileNotFoundError(f"shard {shard!r} listed in {index} is missing from {path!r}")
                out.update(loader(shard_file))
            return out
    raise FileNotFoundError(f"{path!r} has no model.safetensors, model.safetensors.index.json, "
                            "pytorch_model.bin or pytorch_model.bin.index.json")


class LlamaSpecModel(CacheBackedSpecModel):
    """:class:`SpecModel` over a :class:`LlamaModel` and one of its caches.

    Parameters
    ----------
    model : LlamaModel
    cache : "contiguous" | "paged"
        contiguous: ``rollback`` with a device ``num_kept`` never syncs with the host.
        paged: ``rollback`` with a device ``num_kept`` reads it once (one sync), because
        the block tables live on the host.
    block_size, num_blocks : paged cache only (num_blocks default: enough for every row to
        reach max_len)

    Call :meth:`reset` before the first :meth:`forward`.
    """

    def __init__(self, model: LlamaModel, cache: str = "contiguous", *, block_size: int = 16,
                 num_blocks: Optional[int] = None) -> None:
        if not isinstance(model, LlamaModel):
            raise TypeError(f"model must be a LlamaModel, got {type(model).__name__}")
        if cache not in ("contiguous", "paged"):
            raise ValueError(f"cache must be 'contiguous' or 'paged', got {cache!r}")
        if cache == "contiguous" and (block_size != 16 or num_blocks is not None):
            raise ValueError("block_size / num_blocks apply to the paged cache only")
        self.model, self.cache_kind = model, cache
        self.block_size, self.num_blocks = block_size, num_blocks
        self.vocab_size = model.vocab_size
        self.cache: Optional[LlamaCache] = None

    @property
    def device(self) -> torch.device:
        """Device of inputs, logits and lengths (the model's)."""
        return self.model.device

    @property
    def max_positions(self) -> int:
        """Longest sequence the model supports (config.max_position_embeddings)."""
        return int(self.model.config.max_position_embeddings)

    def reset(self, batch_size: int, max_len: int) -> None:
        """B empty rows of up to ``max_len`` tokens (reuses the cache when B and max_len repeat)."""
        self._renew_cache(batch_size, max_len, lambda b, n: self.model.new_cache(
            b, n, self.cache_kind, block_size=self.block_size, num_blocks=self.num_blocks))

    @property
    def step_cost_hint(self) -> float:
        """The parameter count (a deterministic stand-in for the cost of a step)."""
        return float(sum(p.numel() for p in self.model.parameters()))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, S] int64 -> logits [B, S, V] of the model dtype; appends and advances."""
        return self.model(input_ids, self._cache())

    def keep_hidden_states(self, enable: bool) -> None:
        """Keep each forward's final hidden states (``LlamaModel.keep_hidden``; steps run eager)."""
        self.model.keep_hidden = bool(enable)
        if not enable:
            self.model.last_hidden = None

    def hidden_states(self) -> torch.Tensor:
        """Tensor [B, S, hidden_size] of the model dtype: the last forward's final hidden states."""
        if self.model.last_hidden is None:
            raise RuntimeError("no hidden states kept: call keep_hidden_states(True) before the forward")
        return self.model.last_hidden

    def forward_tree(self, input_ids: torch.Tensor, tree: TreeNodes) -> torch.Tensor:
        """input_ids [B, S] int64 (tree nodes, see :meth:`SpecModel.forward_tree`) -> logits
        [B, S, V] of the model dtype; appends and advances."""
        return self.model(input_ids, self._cache(), tree)
