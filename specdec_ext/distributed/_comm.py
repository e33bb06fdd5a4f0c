"""The collectives of :mod:`specdec_ext.distributed`: the one all-gather every call goes through
(bounded by the call's ``timeout`` on gloo groups), the one error it raises when a collective
fails (:class:`CollectiveError`), the one rule on ``timeout``, and the byte counter that sees
every collective."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import numbers
from typing import Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions

__all__ = ["DEFAULT_TIMEOUT", "CollectiveError", "CommCounter", "all_gather", "check_timeout", "count_bytes"]

#: seconds a rank waits in one collective of :func:`~specdec_ext.distributed.verify` /
#: :func:`~specdec_ext.distributed.sample` before it raises :class:`CollectiveError`: the
#: collectives move O(B * (K+1)) values, so a healthy group finishes each in milliseconds,
#: and gloo's own default (30 minutes) would leave every rank hanging after one died
DEFAULT_TIMEOUT = 60.0
_MAX_TIMEOUT = 1e7  # ~115 days: far past any use, and inside what timedelta / gloo's milliseconds hold


class CollectiveError(RuntimeError):
    """A collective of :func:`~specdec_ext.distributed.verify` / :func:`~specdec_ext.distributed.
    sample` failed on this rank: another rank of the group died (its connection closed), stalled
    for longer than ``timeout``, or is not in the same call. The message names the call, the
    collective, this rank and the timeout, and quotes the backend's error. The group's
    collectives are out of step afterwards: destroy the process group rather than reuse it."""


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


def check_timeout(timeout) -> float:
    """``timeout`` (seconds) as a float: a real number in (0, 1e7]; ``TypeError`` for a
    non-number (a bool, a tensor), ``ValueError`` outside the range (0, inf, NaN)."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    value = float(timeout)
    if not (0.0 < value <= _MAX_TIMEOUT) or math.isnan(value):
        raise ValueError(f"timeout must be a number of seconds in (0, {_MAX_TIMEOUT:g}], got {timeout!r}")
    return value


def all_gather(t: torch.Tensor, group, timeout: Optional[float] = None, what: str = "an all-gather") -> \
        List[torch.Tensor]:
    """Every rank's ``t`` (same shape and dtype on every rank), in rank order.

    timeout: seconds (None: the group's own); it bounds the wait of a gloo group on CPU tensors
    (gloo aborts the collective then), while a NCCL group keeps its own timeout and watchdog
    (a bounded wait on the host would be a device sync). what: the call and step, for :class:`CollectiveError`,
    raised when the backend fails (a peer's connection closed, the timeout passed).
    """
    t = t.contiguous()
    world = dist.get_world_size(group)
    out = [torch.empty_like(t) for _ in range(world)]
    pg = dist.group.WORLD if group is None else group
    # gloo serves CPU tensors (also in a "cpu:gloo,cuda:nccl" group): it takes the bound
    bounded = timeout is not None and t.device.type == "cpu" and "gloo" in str(dist.get_backend(pg))
    try:
        if bounded:
            opts = AllgatherOptions()
            opts.timeout = datetime.timedelta(seconds=timeout)
            pg.allgather([out], [t], opts).wait()
        else:
            dist.all_gather(out, t, group=group)
    except RuntimeError as e:  # DistBackendError and gloo's errors are RuntimeErrors
        limit = f"timeout = {timeout:g} s" if bounded else "the group's own timeout"
        raise CollectiveError(
            f"{what} failed on rank {dist.get_rank(group)} of {world} ({limit}): another rank of the group died, "
            f"stalled, or is not in the same call; destroy the process group (its collectives are out of step). "
            f"The backend said: {e}") from e
    for c in _active:
        c.calls += 1
        c.bytes += t.numel() * t.element_size()
    return out
