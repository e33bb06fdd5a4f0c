"""A target model whose LM head is split over the ranks by vocabulary (tensor parallelism's
vocab-parallel head): :class:`VocabShard` says which tokens this rank's logits hold,
:class:`VocabParallelModel` marks a :class:`~specdec_ext.models.SpecModel` as returning those
local logits (the engine then verifies with :func:`specdec_ext.distributed.verify`), and
:func:`split_lm_head` keeps only this rank's rows of a reference Llama's head."""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .._validate import check_int
from ..models.adapt import adapt
from ..models.base import SpecModel
from ..ops.shard import RACE_TILE

__all__ = ["VocabParallelModel", "VocabShard", "split_lm_head"]


@dataclasses.dataclass(frozen=True)
class VocabShard:
    """This rank's contiguous vocabulary shard [start, end) of a ``vocab_size``-token
    vocabulary, and the process group whose ranks hold the shards (None = the world)."""

    start: int
    end: int
    vocab_size: int
    group: Optional[dist.ProcessGroup] = None

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, 1)
        check_int("start", self.start, 0, self.vocab_size - 1)
        check_int("end", self.end, self.start + 1, self.vocab_size)

    @property
    def size(self) -> int:
        return self.end - self.start

    @classmethod
    def even(cls, vocab_size: int, group=None, rank: Optional[int] = None,
             world: Optional[int] = None) -> "VocabShard":
        """The shard of ``rank`` (default: this process's rank in ``group``) when the vocabulary
        is split into ``world`` (default: the group's size) contiguous shards of whole 128-token
        race tiles, as even as that allows (the last one takes the partial tile): bounds at
        multiples of 128, so the tokens are those of one device bit for bit."""
        rank = dist.get_rank(group) if rank is None else rank
        world = dist.get_world_size(group) if world is None else world
        bounds = even_bounds(vocab_size, world)
        return cls(bounds[rank], bounds[rank + 1], vocab_size, group)


def even_bounds(vocab_size: int, world: int) -> Sequence[int]:
    """Bounds [0, b_1, ..., vocab_size] of ``world`` shards of whole race tiles, as even as
    possible (ValueError when there are fewer tiles than shards)."""
    tiles = -(-vocab_size // RACE_TILE)
    if world < 1 or tiles < world:
        raise ValueError(f"cannot split {vocab_size} tokens ({tiles} tiles of {RACE_TILE}) into {world} shards of "
                         "whole tiles")
    return [min(vocab_size, RACE_TILE * (tiles * r // world)) for r in range(world)] + [vocab_size]


class VocabParallelModel(SpecModel):
    """A :class:`SpecModel` whose :meth:`forward` returns this rank's vocabulary shard of the
    logits, [B, S, shard.size]; everything else is the wrapped model's. Give it as the
    ``target`` of :class:`~specdec_ext.SpeculativeEngine` on every rank of ``shard.group``
    (the same prompts, seed and arguments everywhere): verify then runs through
    :func:`specdec_ext.distributed.verify` and every rank generates the same text. The draft
    (if any) runs whole on every rank."""

    def __init__(self, model, shard: VocabShard) -> None:
        if not isinstance(shard, VocabShard):
            raise TypeError(f"shard must be a VocabShard, got {type(shard).__name__}")
        self.inner = adapt(model)
        self.vocab_shard = shard
        self.vocab_size = shard.vocab_size

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @property
    def max_positions(self):
        return self.inner.max_positions

    @property
    def step_cost_hint(self):
        return self.inner.step_cost_hint

    def reset(self, batch_size: int, max_len: int) -> None:
        self.inner.reset(batch_size, max_len)

    def reserve(self, row_lengths: Sequence[int]) -> None:
        self.inner.reserve(row_lengths)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, S] int64 -> this rank's logits [B, S, shard.size]."""
        logits = self.inner.forward(input_ids)
        if logits.shape[-1] != self.vocab_shard.size:
            raise ValueError(f"the wrapped model returned {logits.shape[-1]} logits per token, but the shard "
                             f"[{self.vocab_shard.start}, {self.vocab_shard.end}) holds {self.vocab_shard.size} "
                             "(split its LM head, e.g. with split_lm_head)")
        return logits

    def rollback(self, num_appended: int, num_kept: torch.Tensor) -> None:
        self.inner.rollback(num_appended, num_kept)


def split_lm_head(model, shard: VocabShard):
    """Keep only the rows [shard.start, shard.end) of a reference :class:`~specdec_ext.models.
    llama.LlamaModel`'s LM head (untied from the embedding if it was tied): its logits become
    this rank's shard. Returns the model (changed in place)."""
    weight = model.lm_head.weight
    if weight.shape[0] != shard.vocab_size:
        raise ValueError(f"the LM head has {weight.shape[0]} rows, the shard's vocabulary {shard.vocab_size}")
    head = nn.Linear(weight.shape[1], shard.size, bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight[shard.start:shard.end])
    model.lm_head = head
    return model
