""":func:`adapt`: the :class:`~specdec_ext.models.base.SpecModel` the engine drives for a
model it is given.

Wrappers shipped with the package, and which ``adapt`` picks:

- :class:`specdec_ext.models.llama.LlamaSpecModel`, for the package's reference Llama decoder
  (contiguous or paged cache, built on ``kv_append_`` / ``spec_attention_mask`` / SDPA);
- :class:`specdec_ext.models.hf.HFBatchedSpecModel`, for a Hugging Face ``transformers`` causal
  LM of a family whose attention takes a 4D mask (Llama, Mistral, Qwen2/3, Gemma/Gemma2,
  Phi-3; eager or sdpa attention), one forward per step on a ``SpecDecCache``;
- :class:`specdec_ext.models.hf.HFSpecModel`, for any other Hugging Face causal LM, with its
  own ``DynamicCache`` per row, rolled back with ``DynamicCache.crop`` (``adapt`` warns).

:mod:`.hf` is imported only when a Hugging Face model comes (it needs ``transformers``).
"""
from __future__ import annotations

import warnings

from .base import SpecModel
from .llama import LlamaModel, LlamaSpecModel

__all__ = ["adapt"]


def adapt(model) -> SpecModel:
    """A SpecModel as is; a :class:`specdec_ext.models.llama.LlamaModel` wrapped by
    ``LlamaSpecModel``; a Hugging Face ``PreTrainedModel`` wrapped by ``HFBatchedSpecModel``
    when :func:`specdec_ext.models.hf.batched_support` accepts it, else by ``HFSpecModel``
    with a one-line ``UserWarning`` saying why."""
    if isinstance(model, SpecModel):
        return model
    if isinstance(model, LlamaModel):
        return LlamaSpecModel(model)
    if hasattr(model, "config") and hasattr(model, "generate"):
        from .hf import HFBatchedSpecModel, HFSpecModel, batched_support  # needs transformers

        reason = batched_support(model)
        if reason is None:
            return HFBatchedSpecModel(model)
        warnings.warn(f"{type(model).__name__}: per-row HF path (one forward per row per step): {reason}",
                      stacklevel=3)
        return HFSpecModel(model)
    raise TypeError(f"target/draft must be a SpecModel, a specdec_ext LlamaModel or a transformers "
                    f"PreTrainedModel, got {type(model).__name__}")
