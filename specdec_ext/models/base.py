"""The model protocol the speculative engine drives: :class:`SpecModel`, and
:class:`CacheBackedSpecModel` for a model whose rows live in one cache object.

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

The wrappers shipped with the package, and :func:`~specdec_ext.models.adapt.adapt` that picks
one for a raw model, are listed in :mod:`specdec_ext.models.adapt`.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

if TYPE_CHECKING:
    from ..cache import TreeNodes

__all__ = ["CacheBackedSpecModel", "SpecModel"]


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

    # ---- hidden states (optional: a draft head reads them) ---------------------
    def keep_hidden_states(self, enable: bool) -> None:
        """While enabled, every forward keeps its final hidden states for :meth:`hidden_states`
        (the engine's ``drafter='head'``). Default: ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its hidden states (no keep_hidden_states)")

    def hidden_states(self) -> torch.Tensor:
        """Tensor [B, S, H]: the final hidden states (after the final norm, the lm_head's
        input) of the last forward, while :meth:`keep_hidden_states` is enabled."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its hidden states (no hidden_states)")

    @property
    def supports_hidden(self) -> bool:
        """True when the model overrides :meth:`keep_hidden_states` and :meth:`hidden_states`."""
        cls = type(self)
        return (cls.keep_hidden_states is not SpecModel.keep_hidden_states
                and cls.hidden_states is not SpecModel.hidden_states)

    @property
    def supports_tree(self) -> bool:
        """True when the model overrides both :meth:`forward_tree` and :meth:`compact`."""
        cls = type(self)
        return cls.forward_tree is not SpecModel.forward_tree and cls.compact is not SpecModel.compact


class CacheBackedSpecModel(SpecModel):
    """A :class:`SpecModel` whose rows all live in one cache object, ``self.cache`` (None until
    :meth:`reset`), that keeps the row lengths itself: :meth:`reserve`, :meth:`rollback`,
    :meth:`compact` and :attr:`lengths` are the cache's. A subclass makes the cache in its
    ``reset`` with :meth:`_renew_cache` and reads it with :meth:`_cache`."""

    cache: Any = None

    def reserve(self, row_lengths: Sequence[int]) -> None:
        """Raise the cache's ``CacheFullError`` (a row would pass max_len) or ``OutOfBlocksError``
        (a paged cache's block pool cannot hold every row at ``row_lengths[b]`` tokens at once)
        before anything runs."""
        self._cache().reserve(row_lengths)

    def rollback(self, num_appended: int, num_kept: torch.Tensor) -> None:
        """lengths[b] -= num_appended - num_kept[b]; num_kept [B] int64, device or CPU (whether a
        device tensor is read on the host is the cache's: see the subclass)."""
        self._cache().rollback(num_appended, num_kept)

    def compact(self, num_appended: int, src_index: torch.Tensor, count: torch.Tensor) -> None:
        """Move kept entries to the front of the last ``num_appended`` (see :meth:`SpecModel.compact`)."""
        self._cache().compact(num_appended, src_index, count)

    @property
    def lengths(self) -> torch.Tensor:
        """Tensor [B] int64 on ``device``: tokens each row holds."""
        return self._cache().lengths

    def _renew_cache(self, batch_size: int, max_len: int, make: Callable[[int, int], Any]) -> None:
        """B empty rows of up to ``max_len`` tokens: the cache is emptied in place when B and
        max_len repeat, else freed first and made anew by ``make(batch_size, max_len)``."""
        c = self.cache
        if c is not None and c.batch_size == batch_size and c.max_len == max_len:
            c.reset()
            return
        self.cache = None  # free the old cache before allocating the new one
        self.cache = make(batch_size, max_len)

    def _cache(self):
        if self.cache is None:
            raise RuntimeError(f"{type(self).__name__}: call reset(batch_size, max_len) first")
        return self.cache

