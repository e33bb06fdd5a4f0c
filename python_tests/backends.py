"""Where the CUDA kernels run in the test suite.

* :class:`CudaBackend`: the public ops on CUDA tensors (a GPU and a CUDA build);
* :class:`SimtBackend`: the same kernel source in the SIMT emulation
  (:mod:`specdec_ext.testing.simt`) on CPU tensors, on every machine. Every call runs
  under several thread schedules (``SPECDEC_SIMT_SCHEDULES``, default three random
  ones) and fails unless every output, and every tensor the op writes, is bit-identical
  across them.

Tests take them through the ``gpu`` fixture of conftest.py (simt, and cuda where there is
a GPU). ``.size(gpu_value, emulated_value)`` picks a problem size: the emulator runs every
CUDA thread as a fiber, thousands of times slower than a GPU.
"""
from __future__ import annotations

import contextlib
import inspect
import os

import torch

import specdec_ext

#: the schedules every emulated call runs under (in order, reversed, or a random seed)
SIMT_SCHEDULES = tuple(os.environ.get("SPECDEC_SIMT_SCHEDULES", "1,2,3").split(","))

# the arguments each op writes (restored before each schedule, compared after)
_MUTATED = {"verify": ("token_logprobs",), "sample": ("probs_out", "token_logprobs"), "filtered_probs": (), "mask_logits": (), "verify_tree": (),
            "verify_shard": (), "verify_shard_finish": (), "kv_append_": ("key_cache", "value_cache", "overflow"),
            "kv_rollback_": ("lengths", "invalid"), "paged_kv_append_": ("key_cache", "value_cache", "invalid"),
            "paged_kv_gather": ("out",), "kv_compact_": ("key_cache", "value_cache", "invalid"),
            "paged_kv_compact_": ("key_cache", "value_cache", "invalid")}


def _flatten(out):
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for x in out for t in _flatten(x)]


def _written_names(bound, names):
    """The names of the tensors _flatten gives for the written arguments ``names`` (an
    argument holding several tensors, e.g. ``out=(keys, values)``, gives ``out[0]``, ...)."""
    out = []
    for n in names:
        ts = _flatten(bound.arguments.get(n))
        out += [n] if len(ts) == 1 else [f"{n}[{i}]" for i in range(len(ts))]
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (NaN-safe bitwise comparison)."""
    return t.detach().contiguous().view(torch.uint8) if t.numel() else t


class _Backend:
    name = ""
    device = "cpu"
    emulated = False

    def to(self, *ts):
        """The tensors on this backend's device (None stays None); one tensor -> one tensor."""
        out = [None if t is None else t.to(self.device) for t in ts]
        return out[0] if len(out) == 1 else out

    def size(self, gpu_value, emulated_value):
        return emulated_value if self.emulated else gpu_value

    def sync(self):
        pass

    def emulated_device(self, **device):
        """The emulated device (simt.options: sms, blocks_per_sm, cooperative, capturing) for
        the calls inside the ``with`` block; on a GPU, nothing changes (its own device)."""
        return contextlib.nullcontext()

    def one_schedule(self):
        """This backend, running each emulated call once (under the first schedule): for the
        chi-square law tests, whose draws are the result."""
        return self

    def options(self, *, launch=None, loads=None):
        """The launch path ("cooperative" | "stages") and load path ("scalar") of the CUDA
        launchers (the environment variables they read, on a GPU as in the emulation)."""
        from specdec_ext.testing import simt

        return simt.options(launch=launch, loads=loads)


class CudaBackend(_Backend):
    name = "cuda"
    device = "cuda"
    verify = staticmethod(specdec_ext.verify)
    sample = staticmethod(specdec_ext.sample)
    filtered_probs = staticmethod(specdec_ext.filtered_probs)
    mask_logits = staticmethod(specdec_ext.mask_logits)
    verify_tree = staticmethod(specdec_ext.verify_tree)
    kv_append_ = staticmethod(specdec_ext.kv_append_)
    kv_rollback_ = staticmethod(specdec_ext.kv_rollback_)
    paged_kv_append_ = staticmethod(specdec_ext.paged_kv_append_)
    paged_kv_gather = staticmethod(specdec_ext.paged_kv_gather)
    kv_compact_ = staticmethod(specdec_ext.kv_compact_)
    paged_kv_compact_ = staticmethod(specdec_ext.paged_kv_compact_)

    @staticmethod
    def verify_shard(*args):
        return torch.ops.specdec.verify_shard(*args)

    @staticmethod
    def verify_shard_finish(*args):
        return torch.ops.specdec.verify_shard_finish(*args)

    def sync(self):
        torch.cuda.synchronize()


class SimtBackend(_Backend):
    name = "simt"
    device = "cpu"
    emulated = True

    def __init__(self, schedules=SIMT_SCHEDULES):
        from specdec_ext.testing import simt

        self.simt = simt
        self.schedules = tuple(schedules)
        for op in _MUTATED:
            setattr(self, op, self._checked(op))

    def _checked(self, op):
        fn = getattr(self.simt, op)
        sig = inspect.signature(fn)

        def call(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            if "seed" in sig.parameters and bound.arguments.get("seed") is None:
                # a drawn seed would differ between schedules: draw it once
                kwargs = dict(kwargs, seed=int(torch.randint(0, 2**62, ()).item()))
            written = _flatten([bound.arguments.get(n) for n in _MUTATED[op]])
            start = [w.clone() for w in written]
            first, out = None, None
            for schedule in self.schedules:
                if first is not None:  # the next schedule starts from the arguments as they were
                    for name, w, s in zip(_written_names(bound, _MUTATED[op]), written, start):
                        try:
                            w.copy_(s)
                        except RuntimeError as e:  # e.g. an expanded view: the check cannot run
                            raise AssertionError(
                                f"simt {op}: {name} was written but cannot be restored between schedules "
                                f"({str(e).splitlines()[0]}); pass a writable tensor, or run one schedule "
                                "(gpu.one_schedule())") from None
                with self.simt.options(schedule=schedule):
                    out = fn(*args, **kwargs)
                snap = [_bits(t).clone() for t in _flatten(out) + written]
                if first is None:
                    first = (schedule, snap)
                    continue
                assert len(snap) == len(first[1]) and all(torch.equal(a, b) for a, b in zip(first[1], snap)), (
                    f"simt {op}: schedule {schedule} gives a different result than schedule {first[0]}")
            return out

        call.__name__ = op
        call.__doc__ = fn.__doc__
        return call

    def one_schedule(self):
        return SimtBackend(self.schedules[:1])

    def emulated_device(self, **device):
        return self.simt.options(**device)

    def options(self, *, launch=None, loads=None, **emulated):
        """As the CUDA backend's, plus the emulated device (simt.options: sms, blocks_per_sm,
        cooperative, capturing)."""
        return self.simt.options(launch=launch, loads=loads, **emulated)


def make(name: str) -> _Backend:
    return {"cuda": CudaBackend, "simt": SimtBackend}[name]()
