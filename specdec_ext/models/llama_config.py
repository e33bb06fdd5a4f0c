"""Configuration of the reference Llama decoder, read from a Hugging Face ``config.json``.

Pure Python: no dependency on ``transformers``. Accepts both spellings of the RoPE
settings that Hugging Face checkpoints use: the older top-level ``rope_theta`` +
``rope_scaling`` and the newer ``rope_parameters`` dict (``{"rope_type", "rope_theta", ...}``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional

import torch

from .._validate import check_int

__all__ = ["LlamaConfig", "SUPPORTED_ROPE_TYPES"]

#: RoPE variants implemented by :func:`LlamaConfig.inv_freq`.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass
class LlamaConfig:
    """Hyper-parameters of a Llama decoder (the subset of HF ``LlamaConfig`` it needs).

    ``head_dim`` defaults to ``hidden_size // num_attention_heads`` and
    ``num_key_value_heads`` to ``num_attention_heads`` (multi-head attention).
    ``rope_scaling`` is None or a dict with ``rope_type`` (or the legacy key ``type``)
    in :data:`SUPPORTED_ROPE_TYPES` plus that type's parameters.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            _check_positive_int(name, getattr(self, name))
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                                 f"{self.num_attention_heads}; give head_dim explicitly")
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_positive_int("num_key_value_heads", self.num_key_value_heads)
        _check_positive_int("head_dim", self.head_dim)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={self.hidden_act!r} is not supported (Llama uses 'silu')")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"rope_theta must be a finite number > 0, got {self.rope_theta!r}")
        self.rope_scaling = _normalise_rope_scaling(self.rope_scaling)

    # ---- construction ------------------------------------------------------------
    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "LlamaConfig":
        """Build from a ``config.json`` dict (unknown keys such as ``bos_token_id`` are ignored)."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        model_type = config.get("model_type", "llama")
        if model_type not in ("llama", None):
            raise ValueError(f"config model_type={model_type!r}: only Llama checkpoints are supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in config.items() if k in fields}
        # Newer transformers keep rope_theta and the scaling in one ``rope_parameters`` dict.
        params = config.get("rope_parameters")
        if params:
            params = dict(params)
            if "rope_theta" in params:
                kwargs["rope_theta"] = params.pop("rope_theta")
            rope_type = params.get("rope_type", params.get("type", "default"))
            kwargs["rope_scaling"] = None if rope_type == "default" else params
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in kwargs]
        if missing:
            raise ValueError(f"config is missing required keys {missing}")
        return cls(**kwargs)

    @classmethod
    def coerce(cls, config: Any) -> "LlamaConfig":
        """A :class:`LlamaConfig` from itself, a dict, or a ``transformers.LlamaConfig``."""
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        if hasattr(config, "to_dict"):  # transformers.PretrainedConfig, without importing it
            return cls.from_dict(config.to_dict())
        raise TypeError(f"config must be a LlamaConfig, a dict or a transformers config, got {type(config).__name__}")

    # ---- RoPE ----------------------------------------------------------------------
    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies, Tensor [head_dim // 2] float32 (CPU).

        Computed in float32 like the Hugging Face implementation, so that a float64 model
        reproduces its logits to float64 rounding. ``linear`` divides every frequency by
        ``factor``; ``llama3`` keeps high frequencies, divides low ones by ``factor`` and
        interpolates smoothly in between (Llama 3.1's long-context scheme).
        """
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d))
        scaling = self.rope_scaling
        if scaling is None:
            return inv
        kind = scaling["rope_type"]
        if kind == "linear":
            return inv / float(scaling["factor"])
        # llama3: wavelengths longer than original_ctx / low_freq_factor are fully scaled,
        # shorter than original_ctx / high_freq_factor untouched, linear blend in between.
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > ctx / low, inv / factor, inv)
        blend = (ctx / wavelen - low) / (high - low)
        smoothed = (1 - blend) * scaled / factor + blend * scaled
        medium = (wavelen >= ctx / high) & (wavelen <= ctx / low)
        return torch.where(medium, smoothed, scaled)


def _check_positive_int(name: str, value: Any) -> None:
    check_int(f"config {name}", value, 1)


_ROPE_KEYS = {"linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _normalise_rope_scaling(scaling: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """None for plain RoPE, else a dict with ``rope_type`` and that type's parameters."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ValueError(f"rope_scaling must be None or a dict, got {scaling!r}")
    scaling = dict(scaling)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in _ROPE_KEYS:
        raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)})")
    scaling["rope_type"] = kind
    missing = [k for k in _ROPE_KEYS[kind] if k not in scaling]
    if missing:
        raise ValueError(f"rope_scaling of type {kind!r} is missing {missing}")
    if not float(scaling["factor"]) > 0:
        raise ValueError(f"rope_scaling factor must be > 0, got {scaling['factor']!r}")
    if kind == "llama3" and not float(scaling["high_freq_factor"]) > float(scaling["low_freq_factor"]):
        raise ValueError("rope_scaling (llama3): high_freq_factor must be > low_freq_factor, got "
                         f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
    return scaling
