"""Vocabulary-parallel :func:`verify` and :func:`sample` over ``torch.distributed``: for a
tensor-parallel target whose LM head leaves each rank the logits of one contiguous vocabulary
shard, without gathering the logits.

Each call runs the fused kernel's local stages on this rank's shard (``torch.ops.specdec.
verify_shard``: local max, tile-sum covers, races; csrc/core/shard_math.h) and all-gathers
their small outputs: collectives of O(B * (K+1)) values per rank, never O(V): a fixed-size
header that checks the ranks agree, then one per step (3 steps; top-k, top-p and min-p add 4, 4
and 1 radix passes whose histograms are summed over the ranks). Every rank gets the same result.

Fail fast: every collective of a call waits at most ``timeout`` seconds (a keyword of
:func:`verify` and :func:`sample`; default :data:`DEFAULT_TIMEOUT` = 60 s, not gloo's 30
minutes). A rank that dies or stalls mid-call makes every other rank raise
:class:`CollectiveError` within about that time, naming the call and the step; ranks that call
different operations (one ``verify``, another ``sample``), disagree on their arguments, or hold
shards that do not tile [0, vocab_size) raise a ValueError on every rank at the header.

- Shard bounds that are multiples of 128 (the race tile): the tokens are IDENTICAL to
  :func:`specdec_ext.verify` / :func:`specdec_ext.sample` on the gathered logits.
- Other bounds: exact in law (every coarse-race entry keeps an independent exponential), but
  the float rounding of the row sums differs from one device, so individual tokens may too.

:func:`count_bytes` counts what this rank hands to the collectives. :class:`VocabParallelModel`
(with :class:`VocabShard` and :func:`split_lm_head`) lets :class:`~specdec_ext.SpeculativeEngine`
drive a target whose forward returns local logits; :mod:`.launch` runs a function on P local
gloo ranks.
"""
from ._comm import DEFAULT_TIMEOUT, CollectiveError, CommCounter, count_bytes
from .model import VocabParallelModel, VocabShard, even_bounds, split_lm_head
from .protocol import sample, verify

__all__ = ["DEFAULT_TIMEOUT", "CollectiveError", "CommCounter", "VocabParallelModel", "VocabShard", "count_bytes",
           "even_bounds", "sample", "split_lm_head", "verify"]
