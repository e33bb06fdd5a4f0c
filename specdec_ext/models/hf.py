"""Any Hugging Face ``transformers`` causal LM as a :class:`SpecModel`.

Each row gets its own ``DynamicCache`` (rows may hold different numbers of tokens) and
runs its own forward; rollback crops the row's cache. This is the compatibility path:
correct for any ``PreTrainedModel`` with a cache, but a Python loop over rows, and a
rollback reads ``num_kept`` on the host (pass a CPU tensor to avoid a device sync).
The package's reference model (:mod:`specdec_ext.models.llama`) is the fast path.
"""
from __future__ import annotations

import inspect
from typing import List

import torch

from ..errors import CacheFullError
from .base import SpecModel


def _crop(cache, new_len: int) -> None:
    """Crop a DynamicCache to ``new_len`` tokens. A negative argument removes that many
    tokens in every transformers version (older ones read a non-negative one as the
    length to keep, newer ones refuse it)."""
    remove = cache.get_seq_length() - new_len
    if remove > 0:
        cache.crop(-remove)


class HFSpecModel(SpecModel):
    """Wraps a ``transformers`` causal LM (``PreTrainedModel``) for the engine."""

    def __init__(self, model):
        self.model = model.eval()
        self.vocab_size = int(model.config.vocab_size)
        self.device = next(model.parameters()).device
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.step_cost_hint = float(sum(p.numel() for p in model.parameters()))
        self._caches: List = []
        # newer transformers call the cache argument `cache`, older `past_key_values`
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
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
