"""The collectives of :mod:`specdec_ext.distributed`, and the byte counter that sees them."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, List

import torch
import torch.distributed as dist

__all__ = ["CommCounter", "all_gather", "count_bytes"]


@dataclasses.dataclass
class CommCounter:
    """What this rank handed to collectives inside :func:`count_bytes`.

    calls  number of collectives
    bytes  bytes this rank contributed (an all-gather of an n-byte tensor moves n bytes from
           every rank to every other rank: P * n received per rank)
    """

    calls: int = 0
    bytes: int = 0


_active: List[CommCounter] = []


@contextlib.contextmanager
def count_bytes() -> Iterator[CommCounter]:
    """Count the collectives of the distributed ops called inside the block (this rank only)::

        with specdec_ext.distributed.count_bytes() as c:
            specdec_ext.distributed.verify(...)
        print(c.calls, c.bytes)
    """
    counter = CommCounter()
    _active.append(counter)
    try:
        yield counter
    finally:
        _active.remove(counter)


def all_gather(t: torch.Tensor, group) -> List[torch.Tensor]:
    """Every rank's ``t`` (same shape and dtype on every rank), in rank order."""
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    for c in _active:
        c.calls += 1
        c.bytes += t.numel() * t.element_size()
    return out
