"""specdec_ext.distributed.verify / sample: the steps of ``torch.ops.specdec.verify_shard``
with an all-gather after each (csrc/core/shard_math.h says what each step computes), after a
header that checks the ranks agree; every all-gather is bounded by the call's ``timeout``."""
from __future__ import annotations

import zlib
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from .._validate import check_int
from ..ops._args import (FloatOrTensor, IntOrTensor, Temperature, filter_args, float_arg, int64_arg, mode_arg,
                         seed_arg, temperature_arg)
from ..ops.sampling import VerifyResult
from ._comm import DEFAULT_TIMEOUT, all_gather, check_timeout

__all__ = ["sample", "verify"]

_OPS = torch.ops.specdec

# The header every rank sends first: what the ranks must agree on, so that a disagreement is an
# error on every rank instead of a hang in a later collective of another size.
_MAGIC = 0x5EC0DE
_H_MAGIC, _H_KIND, _H_B, _H_K, _H_V_LOCAL, _H_START, _H_VOCAB, _H_DTYPE, _H_PROBS, _H_COUPLED, _H_ERROR, \
    _H_SEED, _H_ARGS_CRC, _H_SIZE = range(14)
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_KINDS = ("verify", "sample")


def _dtype_code(t: Optional[torch.Tensor]) -> int:
    """The dtype, and whether the CUDA kernels run the steps (their step widths differ from
    the CPU kernels': the ranks must agree on it too)."""
    if t is None:
        return -1
    return _DTYPES.get(t.dtype, 99) + (1000 if t.device.type == "cuda" else 0)


def _crc(values: Sequence) -> int:
    """A checksum of the arguments every rank must pass identically: host tensors by value,
    device tensors by shape and dtype only (reading them would be a host sync; a bad per-row
    device value makes its row invalid, as in the single-device ops)."""
    crc = 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            crc = zlib.crc32(repr((tuple(v.shape), str(v.dtype), "device")).encode(), crc)
        elif isinstance(v, torch.Tensor):
            c = v.detach()
            c = c.double() if c.is_floating_point() else c.long()  # numpy has no bfloat16
            crc = zlib.crc32(repr((tuple(c.shape), str(v.dtype))).encode(), crc)
            crc = zlib.crc32(c.numpy().tobytes(), crc)
        else:
            crc = zlib.crc32(repr(v).encode(), crc)
    return crc


_HOST_GROUPS: dict = {}


def _host_group(group, host_group, logits):
    """The group the header travels on: a CPU (gloo) group, so that reading the gathered
    headers is no device sync. CPU tensors: ``group`` itself. CUDA tensors: ``host_group`` if
    given, else for the default group a gloo group over the world, created once (every rank is
    in this call, so creating it here is safe); a subgroup needs ``host_group`` (creating one
    is collective over the whole world)."""
    if host_group is not None:
        return host_group
    if not isinstance(logits, torch.Tensor) or logits.device.type == "cpu":
        return group
    if group is not None and group is not dist.group.WORLD:
        if dist.get_backend(group) == "gloo":
            return group
        raise ValueError("specdec_ext.distributed on device tensors with a subgroup needs host_group: a gloo group "
                         "of the same ranks (dist.new_group(ranks, backend='gloo'), created on every rank of the "
                         "world), over which the ranks check their arguments without a device sync")
    if dist.get_backend() == "gloo":
        return None
    if "world" not in _HOST_GROUPS:
        _HOST_GROUPS["world"] = dist.new_group(backend="gloo")
    return _HOST_GROUPS["world"]


class _Call:
    """One distributed call: this rank's arguments, checked against every other rank's."""

    def __init__(self, kind: str, logits, draft_ids, draft_probs, temperature, vocab_start, vocab_size, group,
                 filters, num_drafts, seed, offset, mode, host_group=None, timeout=DEFAULT_TIMEOUT):
        self.kind, self.group = kind, group
        self.name = f"specdec_ext.distributed.{kind}"
        # a bad timeout on this rank is refused like any argument: after the header (sent with
        # the default timeout), so that the other ranks raise too instead of waiting for it
        self.timeout = DEFAULT_TIMEOUT
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        error: Optional[BaseException] = None
        header = [0] * _H_SIZE  # filled as plain ints, sent as one int64 tensor
        header[_H_MAGIC], header[_H_KIND] = _MAGIC, _KINDS.index(kind)
        seed_given = seed is not None
        try:
            self.timeout = check_timeout(timeout)
            self.filters = filter_args(*filters)
            self.coupled = coupled = mode_arg(mode)
            if kind == "sample":  # sample = the target's own draw of coupled verify with K = 0
                if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
                    got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                    raise ValueError(f"local_logits must be a tensor [B, V_local], got {got}")
                draft_ids = torch.empty((logits.shape[0], 0), dtype=torch.int64, device=logits.device)
                logits = logits.unsqueeze(1)
            self.vocab_start = check_int("vocab_start", vocab_start, 0, 2**62)
            self.vocab_size = check_int("vocab_size", vocab_size, 1, 2**62)
            self.logits, self.draft_probs = float_arg(logits), float_arg(draft_probs)
            self.draft_ids, self.num_drafts = draft_ids, num_drafts
            self.t, self.seed, self.offset = temperature_arg(temperature), seed_arg(seed), int64_arg(offset, "offset")
            if not isinstance(self.logits, torch.Tensor) or self.logits.dim() != 3:
                raise ValueError("local_target_logits must be a tensor [B, K+1, V_local]")
            B, K1, v_local = self.logits.shape
            if self.vocab_start + v_local > self.vocab_size:
                raise ValueError(f"vocab_start + V_local = {self.vocab_start} + {v_local} exceeds vocab_size = "
                                 f"{self.vocab_size}")
            # the op's own argument checks on this shard alone (stage 0: nothing computed), and the
            # number of steps
            bounds = [0, v_local] if self.vocab_start == 0 else [0, self.vocab_start, self.vocab_start + v_local]
            self.steps = int(self._op(bounds, len(bounds) - 2, 0, [])[0])
            header[_H_B], header[_H_K], header[_H_V_LOCAL] = B, K1 - 1, v_local
            header[_H_START], header[_H_VOCAB] = self.vocab_start, self.vocab_size
            header[_H_DTYPE], header[_H_PROBS] = _dtype_code(self.logits), _dtype_code(self.draft_probs)
            header[_H_COUPLED] = int(coupled)
            header[_H_SEED] = int(self.seed) if self.seed.dim() == 0 and self.seed.device.type == "cpu" else 0
            header[_H_ARGS_CRC] = _crc([draft_ids, self.t, self.seed if seed_given else None, self.offset,
                                        num_drafts] + self.filters)
        except Exception as e:  # noqa: BLE001  (any refusal must reach the other ranks, or they hang)
            error = e
            header[_H_ERROR] = 1
        headers = all_gather(torch.tensor(header, dtype=torch.int64), _host_group(group, host_group, logits),
                             self.timeout, f"{self.name}: the header all-gather (the argument check)")
        self._agree(headers, error, seed_given)

    def _agree(self, headers: List[torch.Tensor], error, seed_given: bool) -> None:
        """The same verdict on every rank, from the same gathered headers."""
        h = [t.tolist() for t in headers]  # plain ints: a handful of Python checks, no tensor ops
        col = lambda c: [row[c] for row in h]  # noqa: E731
        name = self.name
        refused = [r for r in range(self.world) if h[r][_H_ERROR]]
        if error is not None:
            raise error
        if refused:
            raise ValueError(f"{name}: rank(s) {refused} refused their arguments (the error on those ranks says why)")
        if any(m != _MAGIC for m in col(_H_MAGIC)) or len(set(col(_H_KIND))) > 1:
            kinds = [_KINDS[k] if 0 <= k < len(_KINDS) else "?" for k in col(_H_KIND)]
            raise ValueError(f"{name}: the ranks called different ops (rank order): {kinds}")
        for c, what in ((_H_B, "batch sizes B"), (_H_K, "numbers of drafts K"), (_H_VOCAB, "vocab_size"),
                        (_H_DTYPE, "logits dtypes or devices (+1000: CUDA)"),
                        (_H_PROBS, "draft_probs (dtype or None)"), (_H_COUPLED, "modes")):
            if len(set(col(c))) > 1:
                raise ValueError(f"{name}: the ranks disagree on their {what}: {col(c)} (rank order)")
        if len(set(col(_H_ARGS_CRC))) > 1:
            raise ValueError(f"{name}: draft_token_ids, temperature, seed, offset, num_drafts, top_k, top_p and "
                             "min_p must be the same on every rank; they differ")
        starts, sizes = col(_H_START), col(_H_V_LOCAL)
        bounds = [0]
        for s, n in zip(starts, sizes):
            if s != bounds[-1]:
                break
            bounds.append(s + n)
        vocab = h[0][_H_VOCAB]
        if len(bounds) != self.world + 1 or bounds[-1] != vocab:
            shards = ", ".join(f"rank {r}: [{s}, {s + n})" for r, (s, n) in enumerate(zip(starts, sizes)))
            raise ValueError(f"{name}: vocab_start / vocab_size: the shards must tile [0, vocab_size = {vocab}) in "
                             f"rank order without gaps or overlaps; got {shards}")
        self.bounds = bounds
        if not seed_given:  # every rank drew its own: use rank 0's
            self.seed = torch.tensor(h[0][_H_SEED], dtype=torch.int64)

    def _op(self, bounds, rank, stage, gathered):
        args = (self.logits, self.draft_ids, self.draft_probs, self.t, self.seed, self.offset, *self.filters,
                self.num_drafts, self.coupled, bounds, rank)
        if stage is None:
            return _OPS.verify_shard_finish(*args, gathered)
        return _OPS.verify_shard(*args, stage, gathered)

    def run(self) -> VerifyResult:
        gathered: List[torch.Tensor] = []
        for stage in range(1, self.steps + 1):
            gathered += all_gather(self._op(self.bounds, self.rank, stage, gathered), self.group, self.timeout,
                                   f"{self.name}: the all-gather of step {stage} of {self.steps}")
        return VerifyResult(*self._op(self.bounds, self.rank, None, gathered))


def verify(
    local_target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    local_draft_probs: Optional[torch.Tensor] = None,
    temperature: Temperature = 1.0,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
    num_drafts: Optional[torch.Tensor] = None,
    mode: str = "exact",
    seed: Optional[IntOrTensor] = None,
    offset: IntOrTensor = 0,
    host_group=None,
    timeout: float = DEFAULT_TIMEOUT,
) -> VerifyResult:
    """:func:`specdec_ext.verify` on logits split over the ranks of ``group`` by vocabulary.

    Parameters
    ----------
    local_target_logits : Tensor [B, K+1, V_local] float32 | float16 | bfloat16 (| float64)
        This rank's logits: tokens [vocab_start, vocab_start + V_local). The shards of the ranks,
        in rank order, must tile [0, vocab_size) (uneven sizes are fine).
    draft_token_ids : Tensor [B, K] int64 | int32
        GLOBAL token ids; the same on every rank.
    local_draft_probs : Tensor [B, K, V_local], optional
        This rank's shard of the draft distributions (None: one-hot drafts).
    temperature, num_drafts, mode, seed, offset
        As in :func:`specdec_ext.verify`, the same on every rank (checked). ``seed=None``: every
        rank uses the seed that the group's first rank draws from its torch generator (it
        travels in the header), so the ranks' own generator states do not matter.
    vocab_start, vocab_size : int
        This rank's first token and the full vocabulary size.
    group : torch.distributed process group, optional
        The ranks that hold the shards (default: the world): gloo for CPU tensors, NCCL for CUDA
        tensors (the CUDA kernels run the steps; no host sync: the step outputs are gathered on
        the device and the kernels read them there).
    host_group : torch.distributed process group, optional
        CUDA tensors only: a gloo group of the same ranks for the argument check (a small int64
        header per call, read on the host without a device sync). Default: ``group`` when it is
        gloo; for the default group a gloo group over the world, created on first use; a NCCL
        subgroup must pass one (``dist.new_group(ranks, backend="gloo")``). On device tensors
        the ranks' per-row values (draft ids, temperatures, seeds, filters) are compared by shape
        and dtype, not by value.
    top_k, top_p, min_p
        As in :func:`specdec_ext.verify`, over the WHOLE vocabulary: the cutoffs are found by the
        same radix passes (csrc/core/filter_math.h), each pass's histogram gathered and summed
        over the ranks (integer sums), so they are the single-device cutoffs; each filter given
        adds its passes as collectives (top-k 4, top-p 4, min-p 1).
    timeout : float, default 60
        Seconds this rank waits in each collective of the call (a number in (0, 1e7]). When a
        rank dies or stalls mid-call, every other rank raises
        :class:`~specdec_ext.distributed.CollectiveError` within about this time (a dead peer's
        closed connection usually sooner); destroy the process group then. It bounds the header
        and, on gloo groups, every step; a NCCL group's steps run under that group's own timeout
        and watchdog (a bounded wait on the host would be a device sync).

    Returns
    -------
    VerifyResult(tokens [B, K+1] int64, num_accepted [B] int64, valid [B] bool), the same on
    every rank: with shard bounds at multiples of 128, exactly verify's on the gathered logits
    on the same kind of device (CPU shards: the CPU kernels' tokens; CUDA shards: the CUDA
    kernels', whose sums take another order than the CPU's). Otherwise exact in law.

    A bad argument on any rank, or ranks that disagree (shapes, dtypes, modes, draft ids,
    temperature, seed, offset, num_drafts, shards that do not tile the vocabulary), raises on
    EVERY rank after the first collective (ValueError / TypeError; the refusing rank's own
    message there, a message naming it elsewhere), never a hang; so do ranks that call different
    operations (one ``verify``, another ``sample``: the message lists each rank's).
    """
    return _Call("verify", local_target_logits, draft_token_ids, local_draft_probs, temperature, vocab_start,
                 vocab_size, group, (top_k, top_p, min_p), num_drafts, seed, offset, mode, host_group, timeout).run()


def sample(
    local_logits: torch.Tensor,
    temperature: Temperature = 1.0,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
    seed: Optional[IntOrTensor] = None,
    offset: IntOrTensor = 0,
    host_group=None,
    timeout: float = DEFAULT_TIMEOUT,
) -> torch.Tensor:
    """:func:`specdec_ext.sample` on logits split over the ranks of ``group`` by vocabulary.

    local_logits : Tensor [B, V_local] float32 | float16 | bfloat16 (| float64), this rank's
    tokens [vocab_start, vocab_start + V_local); the other arguments (``timeout`` included: 60 s
    by default, :class:`~specdec_ext.distributed.CollectiveError` on every live rank when one
    dies or stalls) as in :func:`verify`.

    Returns tokens [B] int64 (-1 for an invalid row), the same on every rank: with shard bounds
    at multiples of 128, exactly :func:`specdec_ext.sample`'s on the gathered logits (the
    target's own draw of coupled verify with K = 0, which is that).
    """
    result = _Call("sample", local_logits, None, None, temperature, vocab_start, vocab_size, group,
                   (top_k, top_p, min_p), None, seed, offset, "coupled", host_group, timeout).run()
    return result.tokens[:, 0]
