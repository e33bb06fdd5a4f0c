"""The model protocol the speculative engine drives.

A :class:`SpecModel` is a causal LM that owns a per-row KV cache. The engine only ever
(1) resets it for a batch, (2) feeds S new tokens per row and reads their logits, and
(3) rolls rows back on the device. Rows may hold different numbers of tokens (ragged
prompts, different acceptance counts): the model keeps one length per row.

Wrappers shipped with the package:

- :class:`specdec_ext.models.llama.LlamaSpecModel`: the package's reference Llama decoder
  (contiguous or paged cache, built on ``kv_append_`` / ``spec_attention_mask`` / SDPA);
- :class:`specdec_ext.models.hf.HFSpecModel`: any Hugging Face ``transformers`` causal LM,
  with its own ``DynamicCache`` per row, rolled back with ``DynamicCache.crop``.
"""
from __future__ import annotations

import abc

import torch


class SpecModel(abc.ABC):
    """A causal LM with a per-row KV cache, as :class:`~specdec_ext.SpeculativeEngine` uses it."""

    #: vocabulary size V of the logits
    vocab_size: int
    #: device of inputs, logits and lengths
    device: torch.device

    @abc.abstractmethod
    def reset(self, batch_size: int, max_len: int) -> None:
        """Start a new batch: B rows, each holding up to ``max_len`` tokens, all empty."""

    @abc.abstractmethod
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Process S new tokens per row and return their logits.

        input_ids : Tensor [B, S] int64 on ``device``; row b's tokens take positions
            ``lengths[b] .. lengths[b] + S - 1`` (RoPE positions and cache slots), attend to
            the row's cache plus themselves causally, are appended to the cache, and
            ``lengths`` advances by S.
        returns   : Tensor [B, S, V] float32 | float16 | bfloat16 | float64 logits
        """

    @abc.abstractmethod
    def rollback(self, num_appended: int, num_kept: torch.Tensor) -> None:
        """Drop rejected entries: ``lengths[b] -= num_appended - num_kept[b]``.

        num_kept : Tensor [B] int64 (device or CPU), each in [0, num_appended]
        """

    @property
    @abc.abstractmethod
    def lengths(self) -> torch.Tensor:
        """Tensor [B] int64: tokens currently held per row."""
