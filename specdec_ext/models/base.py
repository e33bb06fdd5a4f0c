"""The model protocol the speculative engine drives, and :func:`adapt`.

A :class:`SpecModel` is a causal LM that owns a per-row KV cache. The engine only ever
(1) resets it for a batch and checks that the rows will fit, (2) feeds S new tokens per
row and reads their logits, and (3) rolls rows back on the device. Rows may hold
different numbers of tokens (ragged prompts, different acceptance counts): the model
keeps one length per row.

Tree speculation (``SpeculativeEngine(tree=...)``) needs two more methods, optional for
other uses: :meth:`SpecModel.forward_tree` (feed tree nodes with a tree mask and tree
positions) and :meth:`SpecModel.compact` (move the accepted path's entries to the front
of the step's); :attr:`SpecModel.supports_tree` says whether a model has both. The shipped
``LlamaSpecModel`` and ``HFBatchedSpecModel`` do; ``HFSpecModel`` does not.

Wrappers shipped with the package (``adapt`` picks one for a raw model):

- :class:`specdec_ext.models.llama.LlamaSpecModel`: the package's reference Llama decoder
  (contiguous or paged cache, built on ``kv_append_`` / ``spec_attention_mask`` / SDPA);
- :class:`specdec_ext.models.hf.HFBatchedSpecModel`: a Hugging Face ``transformers`` causal
  LM of a family whose attention takes a 4D mask (Llama, Mistral, Qwen2/3, Gemma/Gemma2,
  Phi-3; eager or sdpa attention), one forward per step on a ``SpecDecCache``;
- :class:`specdec_ext.models.hf.HFSpecModel`: any other Hugging Face causal LM, with its own
  ``DynamicCache`` per row, rolled back with ``DynamicCache.crop`` (``adapt`` warns).
"""
from __future__ import annotations

import abc
import warnings
from typing import TYPE_CHECKING, Optional, Sequence

import torch

if TYPE_CHECKING:
    from ..cache import TreeNodes

__all__ = ["SpecModel", "adapt"]


class SpecModel(abc.ABC):
    """A causal LM with a per-row KV cache, as :class:`~specdec_ext.SpeculativeEngine` uses it."""

    #: vocabulary size V of the logits
    vocab_size: int
    #: device of inputs and logits
    device: torch.device
    #: the most positions a row may hold (e.g. config.max_position_embeddings), None = no limit
    max_positions: Optional[int] = None
    #: a number proportional to the cost of one forward step (e.g. the parameter count), used
    #: by adaptive K for a deterministic cost ratio when a run is seeded; None = unknown
    step_cost_hint: Optional[float] = None
    #: None: :meth:`forward` returns logits over the whole vocabulary. A
    #: :class:`specdec_ext.distributed.VocabShard`: it returns this rank's contiguous vocabulary
    #: shard only, [B, S, shard.size] (a vocab-parallel LM head), and the engine verifies with
    #: :func:`specdec_ext.distributed.verify` (see :class:`specdec_ext.distributed.VocabParallelModel`)
    vocab_shard = None

    @abc.abstractmethod
    def reset(self, batch_size: int, max_len: int) -> None:
        """Start a new batch: B rows, each holding up to ``max_len`` tokens, all empty."""

    def reserve(self, row_lengths: Sequence[int]) -> None:
        """Check, before anything runs, that row b can reach ``row_lengths[b]`` tokens; raise
        :class:`~specdec_ext.errors.CacheFullError` or
        :class:`~specdec_ext.errors.OutOfBlocksError` if not. Default: nothing to check."""

    @abc.abstractmethod
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Process S new tokens per row and return their logits.

        input_ids : Tensor [B, S] int64 on ``device``, ids in [0, V); row b's tokens take
            positions ``length[b] .. length[b] + S - 1`` (RoPE positions and cache slots),
            attend to the row's cache plus themselves causally, and are appended to the
            cache (each row's length advances by S).
        returns   : Tensor [B, S, V] float32 | float16 | bfloat16 | float64 logits
        """

    @abc.abstractmethod
    def rollback(self, num_appended: int, num_kept: torch.Tensor) -> None:
        """Drop rejected entries: ``length[b] -= num_appended - num_kept[b]``.

        num_kept : Tensor [B] int64 (device or CPU), each in [0, num_appended]
        """

    # ---- tree speculation (optional) ---------------------------------------------
    def forward_tree(self, input_ids: torch.Tensor, tree: "TreeNodes") -> torch.Tensor:
        """Process S tree nodes per row and return their logits (tree speculation).

        input_ids : Tensor [B, S] int64 on ``device``: nodes ``tree.start .. tree.start + S - 1``
            of the tree ``tree.parents`` (int64 [P] or [B, P] on ``device``, parents[0] = -1,
            0 <= parents[n] < n). The tree's node 0 sits at slot ``length[b] - tree.start``
            and node n at that slot + n (the new tokens are appended as in :meth:`forward`);
            node n takes position ``length[b] - tree.start + depth(n)`` and attends to the
            row's entries before node 0 plus its own ancestors and itself
            (:func:`~specdec_ext.tree_attention_mask`).
        returns   : Tensor [B, S, V] logits; each row's length advances by S.

        Default: ``NotImplementedError`` (the model does not support tree speculation).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support tree speculation (no forward_tree)")

    def compact(self, num_appended: int, src_index: torch.Tensor, count: torch.Tensor) -> None:
        """Of the last ``num_appended`` entries of each row, entry j (j < count[b]) receives
        entry ``src_index[b, j]`` as it was before the call; lengths do not change (a
        :meth:`rollback` follows). Tree speculation moves the accepted path's entries to the
        front this way.

        src_index : Tensor [B, M] int64 on ``device``, ``src_index[b, :count[b]]`` strictly
            increasing in [0, num_appended) (the accepted path: the root 0, then its nodes);
        count : Tensor [B] int64 on ``device``, in [0, M].
        Default: ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support tree speculation (no compact)")

    @property
    def supports_tree(self) -> bool:
        """True when the model overrides both :meth:`forward_tree` and :meth:`compact`."""
        cls = type(self)
        return cls.forward_tree is not SpecModel.forward_tree and cls.compact is not SpecModel.compact


def adapt(model) -> SpecModel:
    """A SpecModel as is; a :class:`specdec_ext.models.llama.LlamaModel` wrapped by
    ``LlamaSpecModel``; a Hugging Face ``PreTrainedModel`` wrapped by ``HFBatchedSpecModel``
    when :func:`specdec_ext.models.hf.batched_support` accepts it, else by ``HFSpecModel``
    with a one-line ``UserWarning`` saying why."""
    if isinstance(model, SpecModel):
        return model
    from .llama import LlamaModel, LlamaSpecModel

    if isinstance(model, LlamaModel):
        return LlamaSpecModel(model)
    if hasattr(model, "config") and hasattr(model, "generate"):
        from .hf import HFBatchedSpecModel, HFSpecModel, batched_support

        reason = batched_support(model)
        if reason is None:
            return HFBatchedSpecModel(model)
        warnings.warn(f"{type(model).__name__}: per-row HF path (one forward per row per step): {reason}",
                      stacklevel=3)
        return HFSpecModel(model)
    raise TypeError(f"target/draft must be a SpecModel, a specdec_ext LlamaModel or a transformers "
                    f"PreTrainedModel, got {type(model).__name__}")
