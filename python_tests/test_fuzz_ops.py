"""Property-based fuzzing of every specdec op and its Python wrapper (hypothesis).

Property, for every generated call (random shapes incl. zero sizes, strides, views, storage
offsets, dtypes, meta tensors, extreme values, aliasing between pairs of arguments):

* either it raises ValueError / TypeError whose message names one of the op's arguments,
  and NOTHING was written (every argument's whole storage is bit-identical to before);
* or it returns and the result satisfies the documented contract, checked against a
  plain-torch reference (KV ops: bit-exact, including every byte outside the written
  region; sampling ops: ranges, -1 padding, validity rules, greedy rows exactly; with
  top_k / top_p / min_p: every emitted or accepted token and every probs_out entry > 0 inside
  the filtered set, computed in float64 (stats_reference.filtered_softmax64) with the slack
  of the kernels' float32 cutoff; num_drafts: positions after num_drafts[b] never read nor
  emitted; coupled verify: each row equals sample(..., offset + i) position by position;
  verify_tree: path[0] = 0 and each path[j] a child of path[j-1], tokens the accepted nodes'
  tokens then one with a finite logit at the last node, greedy rows the Python greedy walk
  exactly, a chain-shaped tree (parents [-1, 0, 1, ...]) verify's result token for token).

Which calls must be refused, may be refused, or must succeed (see ``Verdict``):

* refused: malformed metadata (shape, dtype, device mix incl. meta with CPU, stride rules;
  for a call on meta data, which only runs the fake kernel: dtypes and devices),
  a filter / num_drafts value out of range (Python value, or a CPU tensor's value), a CPU
  parents tensor / list that is malformed or deeper than ``depth``, a depth outside [0, N - 1],
  a Python value of the wrong type for the wrapper (``"0.5"``, ``2.7`` for an int, bools,
  a parents list holding a float or a ragged one),
  a value the CPU kernels document as an error (overflowing append, bad slot, ...), a written
  argument whose elements overlap each other, two written arguments that overlap;
* either: a written argument overlapping a read one -- refusing is fine, otherwise the result
  must be that of the same call on non-aliased copies of the inputs;
* anything else (e.g. ``paged_kv_gather(key_cache, key_cache, ...)``) must succeed.

Crash isolation: ``test_fuzz[target]`` runs ``python test_fuzz_ops.py <target>`` in a
subprocess (two at a time; one per worker under pytest-xdist), so a segfault is a test
failure naming the op, the signal and the last example tried. The subprocess is a fork of
cli_runner's helper, which imported torch and specdec_ext once (cli_runner.py).
Profiles: ``ci`` (default: 200 examples per target, derandomized), ``quick`` (the default
under ``SPECDEC_QUICK=1``, ``scripts/test.sh --quick``: ci with QUICK_EXAMPLES examples)
and ``long`` (``SPECDEC_FUZZ_PROFILE=long``: 5000 examples, random).

Run:  pytest python_tests/test_fuzz_ops.py -q
      SPECDEC_FUZZ_PROFILE=long pytest python_tests/test_fuzz_ops.py -q
      python python_tests/test_fuzz_ops.py verify      # one target in this process
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz_strategies as fz  # noqa: E402
from compact_reference import BITS, ref_compact, ref_paged_compact, row_error  # noqa: E402
from fuzz_strategies import (FLOAT_DTYPES, INT64_MAX, INT64_MIN, TEMPERATURES, Snapshot, alias_pair,  # noqa: E402
                             describe, float_dtype, float_values, index_dtype, index_value, internal_overlap,
                             overlaps, prob_values, size, tensors)
from helpers import QUICK  # noqa: E402

QUICK_EXAMPLES = 30
PROFILE = os.environ.get("SPECDEC_FUZZ_PROFILE", "quick" if QUICK else "ci")
_COMMON = dict(deadline=None, database=None, print_blob=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                      HealthCheck.large_base_example])
# ci: exactly 200 fixed examples per target; every kind of failure is reported with the shortest
#     example that showed it (no hypothesis shrinking, so a broken build stays fast).
# shrink: the same search with hypothesis' shrinking (minimal reproducers, slower).
# quick: ci with QUICK_EXAMPLES per target (the default under SPECDEC_QUICK=1: scripts/test.sh --quick).
# long: 5000 random examples per target, shrunk.
_NO_SHRINK = tuple(p for p in Phase if p not in (Phase.shrink, Phase.explain))  # explain needs shrink
settings.register_profile("ci", max_examples=200, derandomize=True, phases=_NO_SHRINK, **_COMMON)
settings.register_profile("quick", max_examples=QUICK_EXAMPLES, derandomize=True, phases=_NO_SHRINK, **_COMMON)
settings.register_profile("shrink", max_examples=200, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=5000, **_COMMON)
settings.load_profile(PROFILE)

ARG_NAMES = {
    "verify": ["target_logits", "draft_token_ids", "draft_probs", "temperature", "seed", "offset", "top_k", "top_p",
               "min_p", "num_drafts", "mode", "coupled"],
    "verify_tree": ["target_logits", "tree_token_ids", "parents", "draft_probs", "temperature", "seed", "offset",
                    "depth", "top_k", "top_p", "min_p"],
    "sample": ["logits", "temperature", "seed", "offset", "probs_out", "top_k", "top_p", "min_p"],
    "filtered": ["logits", "temperature", "top_k", "top_p", "min_p", "probs_input"],
    "logprobs": ["logits", "tokens", "temperature", "top_k", "top_p", "min_p", "num_top", "processed", "probs_input",
                 "logprobs", "logprobs_mode"],
    "kv_append_": ["key_cache", "value_cache", "new_k", "new_v", "lengths", "overflow"],
    "kv_rollback_": ["lengths", "num_appended", "num_kept", "invalid"],
    "paged_kv_append_": ["key_cache", "value_cache", "new_k", "new_v", "slot_mapping", "invalid"],
    "paged_kv_gather": ["key_cache", "value_cache", "block_tables", "lengths", "max_len", "keys_out", "values_out",
                        "out"],
    "kv_compact_": ["key_cache", "value_cache", "lengths", "src_index", "count", "invalid"],
    "paged_kv_compact_": ["key_cache", "value_cache", "block_tables", "lengths", "src_index", "count", "invalid"],
    "spec_attention_mask": ["past_lens", "q_len", "kv_len", "dtype", "device"],
}

_ops = None


def ops():
    global _ops
    if _ops is None:
        import specdec_ext  # noqa: F401  (registers torch.ops.specdec)
        _ops = torch.ops.specdec
    return _ops


def api():
    import specdec_ext
    return specdec_ext


# =============================================================================================
# The property
# =============================================================================================
_FAILURE_TYPES: Dict[str, type] = {}


def fail(kind: str, message: str):
    """Raise an AssertionError subclass named after `kind`, so that hypothesis reports each
    kind of failure separately (it tells bugs apart by exception type and location)."""
    cls = _FAILURE_TYPES.get(kind)
    if cls is None:
        name = "".join(c if c.isalnum() else "_" for c in kind)
        cls = _FAILURE_TYPES[kind] = type(name, (AssertionError,), {})
    raise cls(f"[{kind}] {message}")


@dataclass
class Verdict:
    """Why a call must be refused (`refuse`) or may be refused (`either`); empty = must succeed."""
    refuse: List[str] = field(default_factory=list)
    either: List[str] = field(default_factory=list)

    def must(self, tag: str, cond: bool = True):
        if cond:
            self.refuse.append(tag)

    def may(self, tag: str, cond: bool = True):
        if cond:
            self.either.append(tag)


@dataclass(repr=False)
class Case:
    op: str                    # key of ARG_NAMES
    via: str                   # "raw" / "wrapper" / ...
    args: Dict[str, Any]       # as passed, by argument name
    call: Callable[[], Any]
    verdict: Verdict
    check: Callable[[Any, Dict[str, torch.Tensor], Snapshot], None]  # (result, pre-call copies, snapshot)
    how: Optional[str] = None  # which arguments alias each other

    def __repr__(self):
        inner = ", ".join(f"{k}={describe(v)}" for k, v in self.args.items())
        func = self.via if self.via.startswith(self.op) else f"{self.via} {self.op}"
        return f"{func}({inner})" + (f"  [{self.how}]" if self.how else "")

    def _repr_pretty_(self, p, cycle):  # how hypothesis prints a falsifying example
        p.text(repr(self))


def run_case(case: Case) -> None:
    note(repr(case))
    last = os.environ.get("SPECDEC_FUZZ_LAST")
    if last:
        with open(last, "w") as f:
            f.write(repr(case))
    tensors_in = {k: v for k, v in case.args.items() if isinstance(v, torch.Tensor)}
    for k, v in case.args.items():  # the wrapper's out=(keys_out, values_out)
        if isinstance(v, tuple):
            tensors_in.update({f"{k}[{i}]": t for i, t in enumerate(v) if isinstance(t, torch.Tensor)})
    pre = {k: v.clone() for k, v in tensors_in.items() if v.device.type == "cpu"}
    snap = Snapshot(tensors_in)
    prefix = "meta: " if any(is_meta(t) for t in tensors_in.values()) else ""
    first = next((t for t in case.args.values() if isinstance(t, torch.Tensor)), None)
    if is_meta(first):
        # A call on meta data runs only the fake kernel (the other tensors are meta too, or CPU
        # host values of the sampling ops, or refused by the device check), which checks devices,
        # dtypes and ranks (specdec_ext/ops/_fake_checks.py); sizes and values are the real
        # kernels' job.
        v = case.verdict
        keep = [r for r in v.refuse if r.endswith(" dtype") or "device" in r]
        v.either += [r for r in v.refuse if r not in keep]
        v.refuse = keep

    def fail_kind(kind, msg):  # failures with meta tensors are reported apart (fake kernels, device checks)
        fail(prefix + kind, msg)

    try:
        out = case.call()
    except (ValueError, TypeError) as e:
        msg = str(e)
        if not case.verdict.refuse and not case.verdict.either:
            fail_kind(f"refused a valid call ({type(e).__name__})", msg)
        if not any(name in msg for name in ARG_NAMES[case.op]):
            fail_kind("error message names no argument", f"{type(e).__name__}: {msg}")
        changed = snap.changed()
        if changed:
            fail_kind("wrote on refusal", f"{changed} changed although the call raised {type(e).__name__}: {msg}")
        return
    except Exception as e:  # noqa: BLE001  (the property: nothing but ValueError / TypeError)
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        if not case.verdict.refuse and not case.verdict.either:
            fail_kind(f"refused a valid call ({type(e).__name__})", first)
        reasons = case.verdict.refuse or case.verdict.either
        fail_kind(f"raised {type(e).__name__} instead of ValueError/TypeError ({reasons[0].split()[0]}...)",
                  f"{first}  (refusal reasons: {reasons})")
    if case.verdict.refuse:
        fail_kind(f"accepted: {case.verdict.refuse[0]}",
                  f"should refuse ({case.verdict.refuse}); returned {describe_out(out)}")
    case.check(out, pre, snap)


def describe_out(out):
    if isinstance(out, (tuple, list)):
        return "(" + ", ".join(describe(o) for o in out) + ")"
    return describe(out)


def check_unchanged_except(snap: Snapshot, writes: Dict[str, torch.Tensor], what: str):
    diff = snap.differences(writes)
    if diff:
        fail(f"wrong memory after the call ({what})", f"storage of {diff} differs from the reference")


# =============================================================================================
# Shared argument helpers
# =============================================================================================
def is_meta(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def valid_temperature(t: float) -> bool:
    """csrc/core/verify_math.h: 0, or positive and finite with a finite float32 inverse."""
    if t != t:
        return False
    if t == 0:
        return True
    inv = float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(t, dtype=torch.float32))
    return 0 < t < math.inf and inv < math.inf


@st.composite
def mutated_shape(draw, shape, p: int = 12):
    """`shape`, or 1 time in p a wrong one (a dim more or less, or one size off by one)."""
    shape = list(shape)
    r = draw(st.integers(0, p - 1))
    if r != p - 1:
        return shape
    how = draw(st.sampled_from(["bump", "drop", "add"]))
    if how == "drop" and shape:
        return shape[:-1]
    if how == "add" or not shape:
        return shape + [1]
    d = draw(st.integers(0, len(shape) - 1))
    shape[d] = max(0, shape[d] + draw(st.sampled_from([1, -1])))
    return shape


class Chaos:
    """Per example: half the examples are clean (documented shapes, dtypes, CPU), the others
    get a wrong shape / dtype 1 time in ~10 per argument and meta tensors mixed in."""

    def __init__(self, draw, alias: bool):
        self.draw = draw
        self.clean = alias or draw(st.booleans())
        self.all_meta = not self.clean and draw(st.integers(0, 9)) == 9

    def shape(self, shape):
        return list(shape) if self.clean else self.draw(mutated_shape(shape))

    def fdtype(self):
        return self.draw(st.sampled_from(FLOAT_DTYPES) if self.clean else float_dtype())

    def idtype(self):
        return self.draw(st.sampled_from([torch.int64, torch.int32]) if self.clean else index_dtype())

    def meta(self) -> bool:
        return not self.clean and (self.all_meta or self.draw(st.integers(0, 14)) == 14)


@st.composite
def int_tensor(draw, shape, bound, dtype=None, *, meta=False, kinds=fz.LAYOUT_KINDS, values=None):
    shape = tuple(shape)
    n = math.prod(shape)
    if values is None or values.numel() != n:
        values = torch.tensor(draw(st.lists(index_value(bound), min_size=n, max_size=n)), dtype=torch.int64)
    values = values.reshape(shape)
    dtype = dtype or draw(index_dtype())
    return draw(tensors(values, dtype, meta=meta, kinds=kinds))


def check_index(v: Verdict, t, n: int, name: str, device: str, dtypes=(torch.int64, torch.int32)):
    """A [n] int32/int64 index vector on `device`."""
    if not isinstance(t, torch.Tensor):
        v.must(f"{name} not a tensor")
        return
    v.must(f"{name} dtype", t.dtype not in dtypes)
    v.must(f"{name} shape", tuple(t.shape) != (n,))
    v.must(f"{name} device (meta mixed with cpu)" if "meta" in (t.device.type, device) else f"{name} device",
           t.device.type != device)


def check_flag(v: Verdict, t, n: int, name: str, device: str):
    if t is None:
        return
    v.must(f"{name} dtype", t.dtype != torch.bool)
    v.must(f"{name} shape", t.numel() != n or t.dim() > 1)
    v.must(f"{name} device", t.device.type != device)


def check_written_overlaps(v: Verdict, args: Dict[str, Any], written: List[str], flags: List[str] = ()):
    """Written args: no element overlap inside one, no overlap between two; written vs read:
    may be refused (else the result must be as if the inputs were copies)."""
    for name in written:
        v.must(f"{name} has overlapping elements", internal_overlap(args.get(name)))
    for name in flags:
        v.may(f"{name} has overlapping elements", internal_overlap(args.get(name)))
    mutable = list(written) + list(flags)
    for i, a in enumerate(mutable):
        for b in mutable[i + 1:]:
            ta, tb = args.get(a), args.get(b)
            v.must(f"written {a} overlaps written {b}", overlaps(ta, tb))
            v.may(f"written {a} and {b} are one empty tensor", isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor)
                  and ta.device == tb.device and ta.device.type != "meta" and (ta.numel() == 0 or tb.numel() == 0)
                  and ta.untyped_storage().data_ptr() == tb.untyped_storage().data_ptr())
    for a in mutable:
        for b, t in args.items():
            if b not in mutable and isinstance(t, torch.Tensor):
                v.may(f"written {a} overlaps read {b}", overlaps(args.get(a), t))


@st.composite
def alias_some_pair(draw, args: Dict[str, Any], names: List[str], unit_last=(), values_for=None):
    """Replace two of the tensor args `names` by views of one buffer (see fz.alias_pair)."""
    cands = [n for n in names if isinstance(args.get(n), torch.Tensor) and args[n].device.type == "cpu"]
    if len(cands) < 2:
        return args, None
    a = draw(st.sampled_from(cands))
    b = draw(st.sampled_from([n for n in cands if n != a]))
    b_values = None if values_for is None else values_for(b, args)
    ta, tb, where = draw(alias_pair(args[a], args[b], b_values=b_values, unit_last_a=a in unit_last,
                                    unit_last_b=b in unit_last))
    args = dict(args)
    args[a], args[b] = ta, tb
    return args, f"{b} aliases {a} ({where})"


def rarely_zero(max_value: int, p: int = 10):
    """A size in [1, max_value], 0 one time in p (size() / st.one_of gave 0 in well over half of
    the ci examples of verify: K+1 == 0 is refused, so few calls got to the output checks)."""
    return st.integers(0, p - 1).flatmap(lambda r: st.just(0) if r == p - 1 else st.integers(1, max_value))


def vocab_size():
    """V: small mostly (ties, boundaries), 300 (several race tiles), 0 (refused) now and then."""
    return st.integers(0, 9).flatmap(lambda r: st.sampled_from([300, 0]) if r == 9 else st.integers(1, 40))


def temperature_draw():
    return st.sampled_from(TEMPERATURES)


@st.composite
def py_or_tensor_temperature(draw, B, via, c, values=None):
    """Raw op: a float tensor [] or [B]; wrapper: also a Python number, a bool or a str.
    `values`: the temperatures drawn (default: TEMPERATURES, many of them unusable)."""
    values = values if values is not None else temperature_draw()
    kinds = ["py", "scalar", "row"] + (["bad_py"] if not c.clean else [])
    kind = draw(st.sampled_from(kinds if via == "wrapper" else ["scalar", "row"]))
    if kind == "py":
        return draw(st.one_of(values, st.sampled_from([0, 1, 2])))
    if kind == "bad_py":
        return draw(st.sampled_from(["0.5", True, False, None, [1.0], complex(1, 0)]))
    shape = () if kind == "scalar" else c.shape([B])
    n = math.prod(shape)
    vals = torch.tensor(draw(st.lists(values, min_size=n, max_size=n)), dtype=torch.float64)
    dtype = torch.float32 if c.clean else draw(st.integers(0, 9).flatmap(lambda r: st.sampled_from(
        [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]) if r == 9 else st.just(torch.float32)))
    return draw(tensors(vals.reshape(shape), dtype, meta=c.meta()))


@st.composite
def py_or_tensor_int(draw, B, via, c, allow_none):
    kinds = ["py", "scalar", "row"] + (["bad_py"] if not c.clean else [])
    kind = draw(st.sampled_from(kinds if via == "wrapper" else ["scalar", "row"]))
    ints = st.one_of(st.integers(-5, 2**20), st.sampled_from([INT64_MAX, INT64_MIN, 2**64 - 1, 2**64, -(2**63) - 1]))
    if kind == "py":
        return draw(st.one_of(ints, st.just(None)) if allow_none else ints)
    if kind == "bad_py":
        return draw(st.sampled_from([2.5, 1.0, True, "7", None]))
    shape = () if kind == "scalar" else c.shape([B])
    n = math.prod(shape)
    vals = torch.tensor(draw(st.lists(st.one_of(st.integers(-5, 2**20), st.sampled_from([INT64_MAX, INT64_MIN])),
                                      min_size=n, max_size=n)), dtype=torch.int64)
    dtype = torch.int64 if c.clean else draw(st.integers(0, 9).flatmap(lambda r: st.sampled_from(
        [torch.int32, torch.float32, torch.uint8, torch.bool]) if r == 9 else st.just(torch.int64)))
    return draw(tensors(vals.reshape(shape), dtype, meta=c.meta()))


def classify_py_temperature(v: Verdict, t, B) -> Optional[float]:
    """Wrapper temperature given as a Python value; returns its float32 value (None if a tensor)."""
    if isinstance(t, torch.Tensor):
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        v.must(f"temperature of Python type {type(t).__name__}")
        return 1.0
    t = float(t)
    if not (t >= 0 and math.isfinite(t)):
        v.must("temperature negative / NaN / inf")
        return 1.0
    if not valid_temperature(f32(t)):  # finite in float64, unusable in float32 (1e39, 1e-40)
        v.may("temperature unusable once float32")
    # A positive T that float32 rounds to 0 (1e-300) would silently turn greedy: the wrapper
    # refuses it (specdec_ext/_validate.py valid_temperature)
    v.must("temperature > 0 rounds to 0 in float32", t > 0 and f32(t) == 0)
    return f32(t)


def classify_py_int(v: Verdict, x, name: str, allow_none: bool):
    if isinstance(x, torch.Tensor):
        return
    if x is None:
        if not allow_none:
            v.may(f"{name} None")
        return
    if isinstance(x, bool) or not isinstance(x, int):
        v.must(f"{name} of Python type {type(x).__name__}")
    elif not INT64_MIN <= x < 2**64:
        v.must(f"{name} outside 64 bits")


def classify_tensor_temperature(v: Verdict, t, B, device) -> Optional[torch.Tensor]:
    """Returns per-row float32 temperatures (CPU) when they can be read, else None."""
    if not isinstance(t, torch.Tensor):
        return None
    if not (t.dtype.is_floating_point):
        v.must("temperature dtype")
        return None
    v.may("temperature dtype not float32", t.dtype != torch.float32)
    if t.dim() != 0 and tuple(t.shape) != (B,):
        v.must("temperature shape")
        return None
    # a meta temperature with CPU data is refused; a CPU one with meta data is a host value
    v.must("temperature device (meta with cpu data)", t.device.type == "meta" and device == "cpu")
    if is_meta(t):
        return None
    return t.to(torch.float32).expand(B).clone() if t.dim() == 0 else t.to(torch.float32)


def classify_tensor_int(v: Verdict, x, name: str, B: int, device: str):
    if not isinstance(x, torch.Tensor):
        return
    v.must(f"{name} dtype", x.dtype not in (torch.int64, torch.int32))
    v.must(f"{name} shape", x.dim() != 0 and tuple(x.shape) != (B,))
    # a meta value with CPU data is refused; a CPU one with meta data is a host value (allowed,
    # csrc/args/common.h host_scalar_allowed)
    v.must(f"{name} device (meta with {device} data)", x.device.type == "meta" and device == "cpu")


# =============================================================================================
# Filters (top_k / top_p / min_p), num_drafts and mode: draws and rules
# =============================================================================================
NAN, INF = float("nan"), float("inf")
# Values drawn for each filter, ordinary first. "bad" ones are out of range once the kernels
# read them (top_p / min_p as float32: 1e-46 rounds to 0, 1 - 1e-12 to 1); whether a value is
# refused is decided from the value the call actually carries (classify_filters), so a list
# entry in the wrong bin would only skew the mix, not the verdict.
FILTER_VALUES = {
    "top_k": dict(good=[1, 2, 3, 2**31 - 1, 2**40, INT64_MAX], bad=[-1, -2, INT64_MIN],
                  py_bad_type=[2.0, 2.5, True, "3", [1]], py_extra=[2**63, 2**64 - 1]),  # extra: outside int64
    "top_p": dict(good=[0.9, 0.5, 1.0, 0.1, 1e-30, 1e-45, 0.999999, 1 - 2**-24, 1 + 1e-12, 0.3],
                  bad=[0.0, -0.0, -0.5, 1.5, 1.0000001, NAN, INF, -INF, 1e-46],
                  py_bad_type=["0.5", True, [0.5], complex(0.5, 0)], py_extra=[1, 0]),  # ints are numbers too
    "min_p": dict(good=[0.1, 0.0, 0.5, 0.05, 0.999999, 1e-30, 1e-45, 1e-46, -0.0, 1 - 2**-24],
                  bad=[1.0, -0.1, 1.5, NAN, INF, 1 - 1e-12, -1e-30],
                  py_bad_type=["0.1", False, [0.1], complex(0.1, 0)], py_extra=[0, 1]),
}
FILTER_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
FILTER_NAMES = ("top_k", "top_p", "min_p")
MAX_FILTER_VOCAB = 2**23  # csrc/core/filter_math.h kMaxFilterVocab


def filter_value_ok(name: str, x) -> bool:
    """The kernels' rule (valid_filter in csrc/core/filter_math.h) on the value they read:
    top_k as int64, top_p / min_p as float32."""
    if name == "top_k":
        return x >= 0
    if name == "top_p":
        return 0.0 < x <= 1.0
    return 0.0 <= x < 1.0


# "Focus" examples (a third of verify / sample): clean metadata, usable temperatures (greedy
# included), logits without NaN / +inf, filters on with in-range values, so that most rows
# reach the output checks (in the chaotic ones most calls or rows are refused / invalid).
# Hypothesis' generator favours the first / smallest choices (V = 1, the first list entry), so
# the focus values are spread by taking a drawn 16-bit integer modulo the number of choices.
def spread_from(choices):
    return st.integers(0, 2**16).map(lambda r: choices[r % len(choices)])


def spread_float(lo: float, hi: float):
    return st.integers(0, 2**16).map(lambda r: lo + (hi - lo) * ((r * 40503) % 65537) / 65537)


FOCUS_TEMPERATURES = spread_from([1.0, 0.7, 2.0, 0.5, 0.0, 1.0, 1e-5, 1e5, 1e-38, 3e38, 1.5])
FOCUS_REGIMES = ("peaky", "randn", "const", "mostly_neg_inf", "big", "tiny")
FOCUS_VOCAB = spread_from([2, 3, 5, 8, 13, 16, 40, 64, 300])


def focus_draw(draw, alias: bool) -> bool:
    return not alias and draw(st.integers(0, 2)) == 1


def focus_filter_value(name: str, V: int):
    """In-range values, spread: top_k over [0, V], top_p / min_p uniform or an extreme."""
    if name == "top_k":
        return st.integers(0, 2**16).map(lambda r: r % (V + 1))
    if name == "top_p":
        return st.one_of(spread_float(1e-3, 1.0), spread_from([0.9, 1e-30, 0.999999, 1.0, 1e-45, 0.5]))
    return st.one_of(spread_float(0.0, 0.6), spread_from([0.1, 0.999999, 1e-30, 0.0, 0.5]))


@st.composite
def filter_value(draw, name: str, V: int, bad_ok: bool):
    vals = FILTER_VALUES[name]
    if bad_ok and draw(st.integers(0, 7)) == 7:  # 1 in 8 out of range, so most calls still run
        return draw(st.sampled_from(vals["bad"]))
    if name == "top_k":
        return draw(st.one_of(st.integers(0, V + 1), st.sampled_from(vals["good"])))
    lo, hi = (1e-6, 1.0) if name == "top_p" else (0.0, 0.99)
    return draw(st.one_of(st.sampled_from(vals["good"]), st.floats(lo, hi)))


@st.composite
def filter_arg(draw, name: str, B: int, V: int, via: str, c: "Chaos", focus: bool = False):
    """One filter argument: None, a Python value (wrapper only; off values, good, out of range,
    of the wrong type, outside int64), or a 0-dim / [B] tensor (good or wrong dtype / shape /
    meta per Chaos; values as above, off values included). focus: in-range values only."""
    kinds = ["none", "scalar", "row"] + (["py", "py"] if via == "wrapper" else [])
    if focus:
        kinds = ["row", "scalar", "none"] + (["py"] if via == "wrapper" else [])
    kind = draw(st.sampled_from(kinds + (["bad_py"] if via == "wrapper" and not c.clean else [])))
    vals = FILTER_VALUES[name]
    if kind == "none":
        return None
    if focus:
        one = focus_filter_value(name, V)
    if kind == "py":
        if focus:
            return draw(one)
        if draw(st.integers(0, 9)) == 9:
            return draw(st.sampled_from(vals["py_extra"] + [FILTER_OFF[name]]))
        return draw(filter_value(name, V, bad_ok=True))
    if kind == "bad_py":
        return draw(st.sampled_from(vals["py_bad_type"]))
    shape = () if kind == "scalar" else c.shape([B])
    n = math.prod(shape)
    one = one if focus else filter_value(name, V, bad_ok=draw(st.integers(0, 1)) == 1)
    xs = draw(st.lists(one, min_size=n, max_size=n))
    if name == "top_k":
        values = torch.tensor(xs, dtype=torch.int64)
        dtype = c.idtype() if c.clean else draw(st.integers(0, 9).flatmap(lambda r: st.sampled_from(
            [torch.float32, torch.bool, torch.uint8, torch.int16]) if r == 9 else st.sampled_from(fz.INDEX_DTYPES)))
    else:
        values = torch.tensor(xs, dtype=torch.float64)
        dtype = torch.float32 if c.clean else draw(st.integers(0, 9).flatmap(lambda r: st.sampled_from(
            [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]) if r == 9
            else st.just(torch.float32)))
    return draw(tensors(values.reshape(shape), dtype, meta=c.meta()))


@st.composite
def filter_args_draw(draw, B: int, V: int, via: str, c: "Chaos", focus: bool = False) -> Dict[str, Any]:
    """top_k / top_p / min_p: all None in a third of the examples (the unfiltered kernels
    keep their share) unless focus, else each drawn by filter_arg."""
    if not focus and draw(st.integers(0, 2)) == 0:
        return dict(top_k=None, top_p=None, min_p=None)
    return {name: draw(filter_arg(name, B, V, via, c, focus)) for name in FILTER_NAMES}


@st.composite
def num_drafts_draw(draw, B: int, K: int, via: str, c: "Chaos", focus: bool = False):
    """None (half the time) or [B] counts in [0, K]; now and then one out of range (not when
    focus), and per Chaos a wrong dtype / shape / meta; the wrapper also gets a list or an int."""
    if draw(st.booleans()):
        return None
    if via == "wrapper" and not c.clean and draw(st.integers(0, 9)) == 9:
        return draw(st.sampled_from([[0] * B, K, 1.0]))
    # a 0-dim tensor is not a [B] one (unlike seed / filters): refused
    shape = [] if not c.clean and draw(st.integers(0, 9)) == 9 else c.shape([B])
    n = math.prod(shape)
    xs = draw(st.lists(st.integers(0, max(K, 0)), min_size=n, max_size=n))
    if n and not focus and draw(st.integers(0, 7)) == 7:
        xs[draw(st.integers(0, n - 1))] = draw(st.sampled_from([-1, K + 1, INT64_MAX, INT64_MIN]))
    return draw(int_tensor(shape, bound=K, dtype=c.idtype(), meta=c.meta(),
                           values=torch.tensor(xs, dtype=torch.int64)))


def mode_draw(via: str, c: "Chaos"):
    """wrapper: mode "exact" / "coupled" (or a bad one when not clean); raw: coupled bool."""
    if via == "raw":
        return st.booleans()
    good = st.sampled_from(["exact", "coupled"])
    if c.clean:
        return good
    return st.integers(0, 9).flatmap(lambda r: st.sampled_from(["Coupled", "", None, True, 1, "greedy"]) if r == 9
                                     else good)


@dataclass
class RowFilter:
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def on(self, V: int) -> bool:
        """filter_on in csrc/core/filter_math.h: whether any token can be removed."""
        return 0 < self.top_k < V or self.top_p < 1.0 or self.min_p > 0.0


def classify_filters(v: Verdict, args: Dict[str, Any], B: int, V: int, dev: str) -> Optional[List[RowFilter]]:
    """Verdict rules of top_k / top_p / min_p; returns each row's filter as the kernels read it
    (None when some value cannot be read: meta, or a refused argument)."""
    rows = [RowFilter() for _ in range(B)]
    readable, given = True, False
    for name in FILTER_NAMES:
        x = args.get(name)
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):  # the wrapper's Python value
            if name == "top_k":
                if isinstance(x, bool) or not isinstance(x, int):
                    v.must(f"top_k of Python type {type(x).__name__}")
                    readable = False
                    continue
                if x > INT64_MAX:  # an int >= 0, but no int64 holds it: refusing (ValueError) is fine
                    v.may("top_k outside int64")
                    readable = False
                    continue
                val = x
            else:
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    v.must(f"{name} of Python type {type(x).__name__}")
                    readable = False
                    continue
                val = f32(float(x))  # the wrapper rounds to float32 first (specdec_ext/_validate.py)
            if not filter_value_ok(name, val):
                v.must(f"{name} out of range")
                readable = False
                continue
            given = given or val != FILTER_OFF[name]  # the wrapper passes None for an off value
            for r in rows:
                setattr(r, name, val)
            continue
        given = True  # any tensor, even one holding the off value, is a filter for the V rule
        if name == "top_k":
            v.must("top_k dtype", x.dtype not in (torch.int64, torch.int32))
        else:
            v.must(f"{name} dtype", not x.dtype.is_floating_point)
        bad_shape = x.dim() != 0 and tuple(x.shape) != (B,)
        v.must(f"{name} shape", bad_shape)
        if x.device.type != dev and "meta" in (x.device.type, dev):
            # meta filter with CPU data: refused; a CPU filter with meta data is a host value (allowed)
            v.must(f"{name} device (meta mixed with cpu)", x.device.type == "meta")
        if is_meta(x) or v.refuse or bad_shape:
            readable = False
            continue
        vals = (x.to(torch.int64) if name == "top_k" else x.to(torch.float32)).reshape(-1).tolist()
        if not all(filter_value_ok(name, val) for val in vals):
            # Checked on the host by the CPU ops (csrc/sampling_args.cpp); with meta data only the
            # fake kernel runs, which sees no values.
            (v.may if dev == "meta" else v.must)(f"{name} out of range")
            readable = False
            continue
        for b, r in enumerate(rows):
            setattr(r, name, vals[b] if x.dim() else vals[0])
    v.must("filters with V >= 2^23", given and V >= MAX_FILTER_VOCAB and dev != "meta")
    return rows if readable else None


def classify_num_drafts(v: Verdict, nd, B: int, K: int, dev: str) -> Optional[List[int]]:
    """Verdict rules of num_drafts; returns the per-row counts (K each when None)."""
    if nd is None:
        return [K] * B
    if not isinstance(nd, torch.Tensor):
        v.must(f"num_drafts of Python type {type(nd).__name__}")
        return None
    v.must("num_drafts dtype", nd.dtype not in (torch.int64, torch.int32))
    v.must("num_drafts shape", tuple(nd.shape) != (B,))
    if nd.device.type != dev and "meta" in (nd.device.type, dev):
        v.must("num_drafts device (meta mixed with cpu)", nd.device.type == "meta")
    if is_meta(nd) or tuple(nd.shape) != (B,) or nd.dtype not in (torch.int64, torch.int32):
        return None
    vals = nd.long().tolist()
    if not all(0 <= n <= K for n in vals):
        (v.may if dev == "meta" else v.must)("num_drafts out of [0, K]")
        return None
    return vals


def raw_filter(args: Dict[str, Any], pre: Dict[str, torch.Tensor], name: str):
    """The filter as the raw op takes it (what the wrapper passes): a tensor (its pre-call
    copy), None for None / an off value, else a 0-dim tensor of the value."""
    x = args.get(name)
    if isinstance(x, torch.Tensor):
        return pre[name]
    if x is None or x == FILTER_OFF[name]:
        return None
    if name == "top_k":
        return torch.tensor(x, dtype=torch.int64)
    return torch.tensor(f32(float(x)), dtype=torch.float32)


# Slack of the float64 keep-set against the kernels' float32 cutoff (csrc/core/filter_math.h):
# * top-p compares fixed-point masses (each exp((l - m) / T) in float32, truncated to 2^-40 of
#   the max's mass) with top_p * total. A token's mass fraction above it is off by at most
#   ~2 * (|z| + 5) * 2^-23 relative (float32 subtraction, product with 1/T and exp, |z| <= 28
#   for any token weighing >= 2^-40) plus 2 * V * 2^-40 absolute: < 1e-5 for V <= 300.
# * min-p compares e = exp((l - m) / T) in float32 with min_p: relative error (|z| + 5) * 2^-23
#   with |z| <= 104 (below, float32 exp is 0) -> 2e-5, plus a subnormal's spacing (1.4e-45).
# * top-k compares the float32 logits themselves: exact, no slack.
# A token within that distance of a threshold may go either way; one beyond it may not.
TOP_P_SLACK = 1e-5
MIN_P_RTOL, MIN_P_ATOL = 2e-5, 1e-44


def filtered_laws(x32: torch.Tensor, T: float, f: RowFilter):
    """(loose, tight, exact): the filtered laws of one row position [V] in float64 (the
    reference stats_reference.filtered_softmax64) with the top-p / min-p thresholds moved by
    the slack above to keep more (loose) or fewer (tight) tokens. A token outside loose's
    support must never be drawn nor get probability; tight == loose support means no token is
    at a boundary and the kernels' law must be `exact`."""
    from stats_reference import filtered_softmax64  # scipy: only in the sampling targets
    p, mn = f.top_p, f.min_p
    loose = filtered_softmax64(x32, T, f.top_k, min(p + TOP_P_SLACK, 1.0) if p < 1 else 1.0,
                               max(mn * (1 - MIN_P_RTOL) - MIN_P_ATOL, 0.0))
    # top_p > 0 keeps the max (nothing is strictly above it); min_p = 1 keeps the ties at the max
    tight = filtered_softmax64(x32, T, f.top_k, max(p - TOP_P_SLACK, 1e-300) if p < 1 else 1.0,
                               min(mn * (1 + MIN_P_RTOL) + MIN_P_ATOL, 1.0) if mn > 0 else 0.0)
    exact = filtered_softmax64(x32, T, f.top_k, p, mn)
    return torch.from_numpy(loose), torch.from_numpy(tight), torch.from_numpy(exact)


# =============================================================================================
# verify
# =============================================================================================
@st.composite
def verify_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "wrapper"]))
    focus = focus_draw(draw, alias)
    B = draw(rarely_zero(4, p=1000 if focus else 10))
    K1 = draw(rarely_zero(4, p=1000 if focus else 10))
    V = draw(FOCUS_VOCAB if focus else vocab_size())
    K = max(K1 - 1, 0)
    c = Chaos(draw, alias or focus)
    meta = c.meta

    shape = c.shape([B, K1, V])
    lvals = float_values(shape, regimes=FOCUS_REGIMES, specials=False) if focus else float_values(shape)
    logits = draw(tensors(draw(lvals), c.fdtype(), meta=meta()))
    ids = draw(int_tensor(c.shape([B, K]), dtype=c.idtype(), bound=V, meta=meta()))
    probs = None
    if draw(st.booleans()):
        pshape = c.shape([B, K, V])
        probs = draw(tensors(draw(prob_values(pshape)), c.fdtype(), meta=meta()))
    temperature = draw(py_or_tensor_temperature(B, via, c, values=FOCUS_TEMPERATURES if focus else None))
    seed = draw(py_or_tensor_int(B, via, c, allow_none=True))
    offset = draw(py_or_tensor_int(B, via, c, allow_none=False))
    filters = draw(filter_args_draw(B, V, via, c, focus))
    num_drafts = draw(num_drafts_draw(B, K, via, c, focus))
    mode = draw(mode_draw(via, c))
    if via == "raw":  # the raw op takes tensors only
        temperature = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature))
    if mode in ("coupled", True) and seed is None and draw(st.integers(0, 3)):
        seed = draw(st.integers(0, 2**20))  # the coupled contract is checked by re-sampling: a known seed
    args = dict(target_logits=logits, draft_token_ids=ids, draft_probs=probs, temperature=temperature, seed=seed,
                offset=offset, **filters, num_drafts=num_drafts)
    args["coupled" if via == "raw" else "mode"] = mode
    args.update(logprobs_draw(draw, via))
    how = None
    if alias:
        if seed is None:
            args["seed"] = seed = 1  # the clone comparison needs a fixed seed
        args, how = draw(alias_some_pair(args, list(ARG_NAMES["verify"])))
    return make_verify_case(via, args, how)


def logprobs_draw(draw, via) -> Dict[str, Any]:
    """The wrappers' logprobs=0 (the kernel's own token_logprobs) in a third of the wrapper calls."""
    if via != "wrapper" or draw(st.integers(0, 2)):
        return {}
    return dict(logprobs=0, logprobs_mode=draw(st.sampled_from(["raw", "processed"])))


def logprobs_kwargs(a) -> Dict[str, Any]:
    return {k: a[k] for k in ("logprobs", "logprobs_mode") if k in a}


def check_token_logprobs(what, lp, tokens, pre, a, t_py, logits_name):
    """token_logprobs of a wrapper call with logprobs=0: NaN exactly where no token was emitted,
    and elsewhere bit for bit what the separate specdec::logprobs op gives for the same tokens
    (the CPU kernels share its formula and its sums)."""
    if lp.token_ranks is not None or lp.top_ids.shape[-1] != 0:
        fail(f"{what}: logprobs=0 returned ranks or a top-n", describe_out(lp))
    got = lp.token_logprobs
    if got.dtype != torch.float32 or got.shape != tokens.shape:
        fail(f"{what}: token_logprobs metadata", f"{describe(got)} for tokens {tuple(tokens.shape)}")
    x = pre[logits_name]
    x = x.float() if x.dtype == torch.float64 else x  # as the wrapper converts
    if x.dim() == 2:
        x, tok, got = x.unsqueeze(1), tokens.unsqueeze(1), got.unsqueeze(1)
    else:
        tok = tokens
    t = pre["temperature"] if "temperature" in pre else torch.tensor(float(t_py))
    ref = ops().logprobs(x, tok, t.float() if t.dtype == torch.float64 else t,
                         *(raw_filter_as_wrapper(a, pre, name) for name in FILTER_NAMES), 0,
                         a["logprobs_mode"] == "processed", False)[0]
    emitted = tok >= 0
    if not bool(torch.isnan(got[~emitted]).all()):
        fail(f"{what}: token_logprobs not NaN where no token was emitted", f"{got.tolist()} tokens {tok.tolist()}")
    a_, b_ = got[emitted], ref[emitted]
    if not (torch.equal(torch.isnan(a_), torch.isnan(b_)) and torch.equal(a_[~torch.isnan(a_)], b_[~torch.isnan(b_)])):
        fail(f"{what}: token_logprobs differ from the logprobs op",
             f"mode {a['logprobs_mode']}: {got.tolist()} vs {ref.tolist()}, tokens {tok.tolist()}")


def wrapper_floats(via):
    """Logit / probability dtypes accepted: the wrappers also take float64 (converted to
    float32, documented); the raw ops refuse it."""
    return tuple(FLOAT_DTYPES) + ((torch.float64,) if via == "wrapper" else ())


def classify_row_values(v: Verdict, a: Dict[str, Any], B: int, V: int, dev: str):
    """The verdict on a sampling call's per-row values (temperature, seed, offset, filters):
    (the Python temperature or None, the temperature of each row [B] or None, the filters of
    each row or None)."""
    temperature, seed, offset = a["temperature"], a["seed"], a["offset"]
    t_py = classify_py_temperature(v, temperature, B)
    t_rows = classify_tensor_temperature(v, temperature, B, dev)
    if t_py is not None:
        t_rows = torch.full((B,), t_py, dtype=torch.float32)
    for name, x in (("seed", seed), ("offset", offset)):
        classify_py_int(v, x, name, allow_none=name == "seed")
        classify_tensor_int(v, x, name, B, dev)
        if isinstance(x, torch.Tensor):
            v.may(f"{name} int32", x.dtype == torch.int32)
    scalar_t_bad = (isinstance(temperature, torch.Tensor) and temperature.dim() == 0 and not is_meta(temperature)
                    and temperature.dtype.is_floating_point and not valid_temperature(f32(float(temperature))))
    v.may("0-dim temperature tensor unusable", scalar_t_bad)
    return t_py, t_rows, classify_filters(v, a, B, V, dev)


def make_verify_case(via, args, how=None):
    a = args
    logits, ids, probs = a["target_logits"], a["draft_token_ids"], a["draft_probs"]
    temperature, seed, offset = a["temperature"], a["seed"], a["offset"]
    num_drafts = a.get("num_drafts")
    mode = a.get("mode", "exact") if via == "wrapper" else a.get("coupled", False)
    v = Verdict()
    dev = logits.device.type if isinstance(logits, torch.Tensor) else "cpu"
    ok_meta = logits.dim() == 3
    v.must("target_logits shape", logits.dim() != 3)
    v.must("target_logits dtype", logits.dtype not in wrapper_floats(via))
    B, K1, V = (tuple(logits.shape) + (0, 0, 0))[:3] if logits.dim() <= 3 else (0, 0, 0)
    K = K1 - 1
    v.must("target_logits K+1 == 0", ok_meta and K1 == 0)
    v.must("target_logits V == 0", ok_meta and V == 0)
    v.must("draft_token_ids dtype", ids.dtype not in (torch.int64, torch.int32))
    v.must("draft_token_ids shape", tuple(ids.shape) != (B, K))
    v.must("draft_token_ids device", ids.device.type != dev)
    if probs is not None:
        v.must("draft_probs dtype", probs.dtype not in wrapper_floats(via))
        v.must("draft_probs shape", tuple(probs.shape) != (B, K, V))
        v.must("draft_probs device", probs.device.type != dev)
    t_py, t_rows, row_filters = classify_row_values(v, a, B, V, dev)
    n_rows = classify_num_drafts(v, num_drafts, B, max(K, 0), dev)
    if via == "wrapper":
        v.must(f"mode {mode!r}", not isinstance(mode, str) or mode not in ("exact", "coupled"))
    coupled = mode is True or mode == "coupled"

    def call():
        if via == "raw":
            return ops().verify(logits, ids, probs, temperature, seed, offset, a.get("top_k"), a.get("top_p"),
                                a.get("min_p"), num_drafts, mode)
        return api().verify(logits, ids, probs, temperature, top_k=a.get("top_k"), top_p=a.get("top_p"),
                            min_p=a.get("min_p"), num_drafts=num_drafts, seed=seed, offset=offset, mode=mode,
                            **logprobs_kwargs(a))

    def check(out, pre, snap):
        lp = None
        if "logprobs" in a:
            out, lp = out
        tokens, num_acc, valid = out
        for name, t, dt, shp in (("tokens", tokens, torch.int64, (B, K1)), ("num_accepted", num_acc, torch.int64, (B,)),
                                 ("valid", valid, torch.bool, (B,))):
            if t.dtype != dt or tuple(t.shape) != shp or t.device.type != dev:
                fail("verify output metadata", f"{name}: {describe(t)}, expected {dt} {shp} on {dev}")
        check_unchanged_except(snap, {}, "verify writes no argument")
        if dev == "meta":
            return
        if lp is not None:
            check_token_logprobs("verify", lp, tokens, pre, a, t_py, "target_logits")
        l32 = pre["target_logits"].float()
        ids64 = pre["draft_token_ids"].long()
        q = pre["draft_probs"].float() if probs is not None else None
        T = t_rows if t_rows is not None else torch.ones(B)
        # coupled mode: the target's own sample at each position i (offset + i), per the contract
        samples = coupled_samples(via, a, pre, K1) if coupled and seed is not None else None
        for b in range(B):
            row, n, ok = tokens[b].tolist(), int(num_acc[b]), bool(valid[b])
            Tb = float(T[b])
            nb = n_rows[b]  # drafts this row tests; positions after nb are never read
            lb = l32[b, :nb + 1]
            must_invalid = (bool((lb != lb).any() | (lb == math.inf).any())
                            or bool(((ids64[b, :nb] < 0) | (ids64[b, :nb] >= V)).any())
                            or not valid_temperature(Tb)
                            or bool((lb[0] == -math.inf).all()))
            # the first tested draft's q(x) is always read (exact mode; greedy and coupled read no q)
            if q is not None and Tb != 0 and nb > 0 and not coupled and 0 <= int(ids64[b, 0]) < V:
                q0 = float(q[b, 0, ids64[b, 0]])
                must_invalid |= not (q0 >= 0) or q0 == math.inf
            finite_max = lb.abs().max().item() if lb.numel() else 0.0
            qb = q[b, :nb] if q is not None else None
            must_valid = (bool(torch.isfinite(lb).all()) and not must_invalid
                          and (Tb == 0 or finite_max / Tb <= 1e30)
                          and (qb is None or coupled or bool((torch.isfinite(qb) & (qb >= 0) & (qb <= 1e30)).all())))
            if ok and must_invalid:
                fail("verify: row with NaN/+inf logits, bad draft or bad temperature reported valid",
                     f"row {b}: tokens {row}, T={Tb}, num_drafts {nb}")
            if not ok and must_valid:
                fail("verify: usable row reported invalid", f"row {b}: T={Tb}, num_drafts {nb}")
            if not ok:
                if row != [-1] * K1 or n != 0:
                    fail("verify: invalid row not all -1 / num_accepted 0", f"row {b}: {row}, n={n}")
                continue
            if not 0 <= n <= nb:
                fail("verify: num_accepted out of [0, num_drafts]", f"row {b}: n={n}, num_drafts {nb}, K={K}")
            if row[:n] != ids64[b, :n].tolist():
                fail("verify: accepted tokens differ from the drafts", f"row {b}: {row} drafts {ids64[b].tolist()}")
            if not 0 <= row[n] < V:
                fail("verify: emitted token out of [0, V)", f"row {b}: {row}, V={V}")
            if row[n + 1:] != [-1] * (K - n):
                fail("verify: tokens after the emitted ones not -1", f"row {b}: {row}, n={n}")
            for i in range(n + 1):
                if lb[i, row[i]] == -math.inf:
                    fail("verify: emitted a token with -inf logit", f"row {b} pos {i}: {row}")
            if Tb == 0:  # greedy: argmax, whatever the filters and the mode
                am = [int(lb[i].argmax()) for i in range(nb + 1)]
                expect_n = next((i for i in range(nb) if int(ids64[b, i]) != am[i]), nb)
                if n != expect_n or row[n] != am[n]:
                    fail("verify: greedy row differs from argmax", f"row {b}: {row}, argmax {am}, drafts "
                         f"{ids64[b].tolist()}, num_drafts {nb}")
            elif (q is None or coupled) and n < nb and row[n] == int(ids64[b, n]):
                # exact mode, one-hot q: the residual max(0, p' - q) is 0 at the draft;
                # coupled: a draft is rejected only when it differs from the sampled token
                fail("verify: correction equals the rejected draft", f"row {b}: {row}, coupled={coupled}")
            if Tb != 0 and row_filters is not None and row_filters[b].on(V):
                # every token the row holds was drawn (or accepted) under p' at its position: a
                # draft outside p' has p'(x) = 0 and fails u * q(x) < p'(x)
                for i in range(n + 1):
                    loose = filtered_laws(lb[i], Tb, row_filters[b])[0]
                    if not loose[row[i]] > 0:
                        fail("verify: token outside the filtered set", f"row {b} pos {i}: {row}, "
                             f"{row_filters[b]}, T={Tb}, logits {lb[i].tolist()[:16]}")
            if samples is not None:
                s = [int(samples[i][b]) for i in range(nb + 1)]
                expect_n = next((i for i in range(nb) if int(ids64[b, i]) != s[i]), nb)
                if n != expect_n or row[:n + 1] != s[:n + 1]:
                    fail("verify: coupled row differs from sample at offset + i",
                         f"row {b}: {row} (n={n}), samples {s}, drafts {ids64[b].tolist()}, num_drafts {nb}")
        if how:  # aliased inputs: same result as the call on separate copies
            ref = ops().verify(pre["target_logits"], pre["draft_token_ids"], pre.get("draft_probs"),
                               pre["temperature"] if "temperature" in pre else torch.tensor(t_py),
                               pre["seed"] if "seed" in pre else torch.tensor(wrap64(seed)),
                               pre["offset"] if "offset" in pre else torch.tensor(wrap64(offset)),
                               *(raw_filter(a, pre, name) for name in FILTER_NAMES), pre.get("num_drafts"),
                               coupled)
            for name, x, y in zip(("tokens", "num_accepted", "valid"), out, ref):
                if not torch.equal(x, y):
                    fail("verify: aliased inputs change the result", f"{name}: {x.tolist()} vs copies {y.tolist()}")

    return Case("verify", via, args, call, v, check, how)


def coupled_samples(via, a, pre, K1) -> List[torch.Tensor]:
    """sample(target_logits[:, i], same temperature / filters / seed, offset + i) for every
    position i, called the way the verify call was (wrapper or raw op; pre-call copies)."""
    def same(name):
        x = a.get(name)
        return pre[name] if isinstance(x, torch.Tensor) else x

    out = []
    for i in range(K1):
        off = a["offset"]
        off_i = pre["offset"].long() + i if isinstance(off, torch.Tensor) else wrap64((off + i) % 2**64)
        logits_i = pre["target_logits"][:, i]
        try:
            if via == "raw":
                s = ops().sample(logits_i, pre["temperature"], pre["seed"], off_i, None,
                                 *(raw_filter(a, pre, name) for name in FILTER_NAMES))
            else:
                s = api().sample(logits_i, same("temperature"), top_k=same("top_k"), top_p=same("top_p"),
                                 min_p=same("min_p"), seed=same("seed"), offset=off_i)
        except (ValueError, TypeError) as e:
            fail("coupled: sample refused what verify accepted", f"position {i}: {type(e).__name__}: {e}")
        out.append(s)
    return out


def wrap64(x: int) -> int:
    return x - 2**64 if x >= 2**63 else x


# =============================================================================================
# verify_tree
# =============================================================================================
def chain_list(N: int) -> List[int]:
    return [-1] + list(range(N - 1))


def tree_well_formed(row: List[int]) -> bool:
    """csrc/core/tree_params.h valid_parent at every node: parents[0] = -1, 0 <= parents[n] < n."""
    return bool(row) and row[0] == -1 and all(0 <= p < n for n, p in enumerate(row) if n)


def tree_depth_of(row: List[int]) -> int:
    """Depth of a well-formed tree (root 0)."""
    d = [0] * len(row)
    for n in range(1, len(row)):
        d[n] = d[row[n]] + 1
    return max(d) if d else 0


def tree_children(row: List[int], node: int) -> List[int]:
    return [c for c in range(node + 1, len(row)) if row[c] == node]


@st.composite
def tree_values(draw, N: int, kind: str) -> List[int]:
    """One well-formed parents row of N nodes: a chain, a star, a BFS tree of width 2 / 3, or
    random (each parent drawn in [0, n); shrinks to the star)."""
    if N <= 0:
        return []
    if kind == "chain":
        return chain_list(N)
    if kind == "star":
        return [-1] + [0] * (N - 1)
    if kind == "bfs":
        w = draw(st.sampled_from([2, 3]))
        return [-1] + [(n - 1) // w for n in range(1, N)]
    return [-1] + [draw(st.integers(0, n - 1)) for n in range(1, N)]


TREE_KINDS = ["random", "chain", "star", "bfs"]
# Python values of parents the wrapper must refuse (list entries that are no ints, no int64
# holds, ragged nesting) -- built from the drawn list by bad_parents_list.
BAD_PARENTS_LIST = ["float entry", "half entry", "bool entry", "str entry", "huge entry", "ragged", "mixed", "empty"]


def bad_parents_list(p: list, how: str):
    """p (a list of ints, or nested) with one defect `how` (BAD_PARENTS_LIST)."""
    import copy
    p = copy.deepcopy(p) if isinstance(p, list) else [p]  # a 0-dim tensor's tolist() is an int
    row = p  # the first innermost list
    while row and isinstance(row[0], list):
        row = row[0]
    if how == "empty" or not row:
        return []
    i = len(row) - 1
    if how == "float entry":
        row[i] = float(row[i])
    elif how == "half entry":
        row[i] = row[i] + 0.5
    elif how == "bool entry":
        row[i] = bool(row[i] % 2)
    elif how == "str entry":
        row[i] = str(row[i])
    elif how == "huge entry":
        row[i] = 2**64 + row[i]
    elif how == "ragged":
        return [row, row[:-1]] if len(row) > 1 else [row, row + [0]]
    else:  # "mixed": a row and a bare int
        return [row, 0]
    return p


@st.composite
def parents_draw(draw, B: int, N: int, via: str, c: "Chaos"):
    """parents: [N] (one tree) or [B, N] (a tree per row: all of one kind, or mixed), well
    formed except 1 time in 6 when not clean (one entry broken); the wrapper also gets a
    (nested) list, and when not clean 1 time in 8 a list it must refuse. Returns
    (parents, the rows as drawn, kind)."""
    per_row = draw(st.booleans())
    kind = draw(st.sampled_from(TREE_KINDS + (["mixed"] if per_row else [])))
    n_rows = B if per_row else 1
    rows = [draw(tree_values(N, draw(st.sampled_from(TREE_KINDS)) if kind == "mixed" else kind))
            for _ in range(n_rows)]
    if not c.clean and N and n_rows and draw(st.integers(0, 5)) == 5:
        r, n = draw(st.integers(0, n_rows - 1)), draw(st.integers(0, N - 1))
        rows[r][n] = draw(st.sampled_from([n, n + 1, -1, -2, N, INT64_MAX, INT64_MIN, 2**31]) if n
                          else st.sampled_from([0, -2, 1, INT64_MIN]))
        kind = "malformed"
    values = torch.tensor(rows if per_row else (rows[0] if rows else []), dtype=torch.int64)
    if per_row and not rows:
        values = values.reshape(0, N)
    if via == "wrapper" and draw(st.integers(0, 2)) == 0:
        shape = c.shape(list(values.shape))
        if list(values.shape) != shape:  # a wrong shape: any values
            values = torch.tensor(draw(st.lists(index_value(N), min_size=math.prod(shape),
                                                max_size=math.prod(shape))), dtype=torch.int64).reshape(shape)
        p = values.tolist()
        if not c.clean and draw(st.integers(0, 7)) == 7:
            p = bad_parents_list(p, draw(st.sampled_from(BAD_PARENTS_LIST)))
        return p, rows, kind
    p = draw(int_tensor(c.shape(list(values.shape)), bound=N, dtype=c.idtype(), meta=c.meta(), values=values))
    return p, rows, kind


@st.composite
def depth_draw(draw, via: str, rows: List[List[int]], N: int, c: "Chaos"):
    """depth: the wrapper's None (half the time: computed), else the trees' depth d or wider
    (<= N - 1) mostly; when not clean also too small (d - 1), too large (N, INT64_MAX) or
    negative, and for the wrapper a value of the wrong type / outside int64."""
    if via == "wrapper" and draw(st.booleans()):
        return None
    d = max([tree_depth_of(r) for r in rows if tree_well_formed(r)] + [0])
    good = st.one_of(st.just(d), st.integers(d, max(N - 1, d)))
    if c.clean or draw(st.integers(0, 3)):
        return draw(good)
    bad = [d - 1, N, -1, INT64_MAX, INT64_MIN]
    if via == "wrapper":
        bad += [float(d), d + 0.5, True, str(d), 2**63, torch.tensor(d)]
    return draw(st.sampled_from(bad))


@st.composite
def tree_ids_values(draw, B: int, N: int, V: int, logits: torch.Tensor, rows: List[List[int]], focus: bool):
    """tree_token_ids values [B, N]: random tokens, each node's token the argmax of its parent's
    logits at a drawn rate (so greedy and sampled walks accept nodes); when not focus, 1 time
    in 5 a few entries out of [0, V); node 0's entry (never read) out of range 1 time in 3."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    ids = torch.randint(0, max(V, 1), (B, N), generator=g)
    rate = draw(st.sampled_from([0.5, 0.0, 0.9, 1.0]))
    if V and tuple(logits.shape) == (B, N, V):
        for b in range(B):
            row = rows[b] if len(rows) == B else rows[0]
            for n in range(1, N):
                if tree_well_formed(row) and float(torch.rand((), generator=g)) < rate:
                    ids[b, n] = int(logits[b, row[n]].argmax())
    if B and N and draw(st.integers(0, 2)) == 0:
        ids[:, 0] = draw(st.sampled_from([-1, V, INT64_MAX, INT64_MIN, 0]))
    if B and N > 1 and not focus and draw(st.integers(0, 4)) == 4:
        for i, x in draw(st.lists(st.tuples(st.integers(0, B * (N - 1) - 1), st.sampled_from(
                [-1, V, V + 1, INT64_MAX, INT64_MIN, 2**31, -(2**31)])), min_size=1, max_size=2)):
            ids[i // (N - 1), 1 + i % (N - 1)] = x
    return ids


@st.composite
def verify_tree_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "wrapper"]))
    focus = focus_draw(draw, alias)
    B = draw(rarely_zero(4, p=1000 if focus else 10))
    N = draw(rarely_zero(6, p=1000 if focus else 12))
    V = draw(FOCUS_VOCAB if focus else vocab_size())
    c = Chaos(draw, alias or focus)
    meta = c.meta

    parents, rows, kind = draw(parents_draw(B, N, via, c))
    depth = draw(depth_draw(via, rows, N, c))
    shape = c.shape([B, N, V])
    lvals = draw(float_values(shape, regimes=FOCUS_REGIMES, specials=False) if focus else float_values(shape))
    logits = draw(tensors(lvals, c.fdtype(), meta=meta()))
    ids_shape = c.shape([B, N])
    ids_vals = draw(tree_ids_values(B, N, V, lvals, rows, focus)) if ids_shape == [B, N] else None
    ids = draw(int_tensor(ids_shape, dtype=c.idtype(), bound=V, meta=meta(), values=ids_vals))
    probs = None
    if draw(st.booleans()):
        probs = draw(tensors(draw(prob_values(c.shape([B, N, V]))), c.fdtype(), meta=meta()))
    temperature = draw(py_or_tensor_temperature(B, via, c, values=FOCUS_TEMPERATURES if focus else None))
    seed = draw(py_or_tensor_int(B, via, c, allow_none=True))
    offset = draw(py_or_tensor_int(B, via, c, allow_none=False))
    filters = draw(filter_args_draw(B, V, via, c, focus))
    if via == "raw":  # the raw op takes tensors only
        temperature = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature))
    if kind == "chain" and seed is None and draw(st.integers(0, 3)):
        seed = draw(st.integers(0, 2**20))  # the chain == verify property needs a known seed
    args = dict(target_logits=logits, tree_token_ids=ids, parents=parents, draft_probs=probs,
                temperature=temperature, seed=seed, offset=offset, depth=depth, **filters)
    how = None
    if alias:
        if seed is None:
            args["seed"] = 1  # the clone comparison needs a fixed seed
        args, how = draw(alias_some_pair(args, list(ARG_NAMES["verify_tree"])))
    return make_verify_tree_case(via, args, how)


def list_shape(p) -> Optional[tuple]:
    """The shape torch.tensor would give a list of ints / of lists of ints; None if ragged."""
    if not isinstance(p, list):
        return ()
    if not p:
        return (0,)
    inner = [list_shape(x) for x in p]
    if any(s is None for s in inner) or len(set(inner)) != 1:
        return None
    return (len(p),) + inner[0]


def list_leaves(p) -> list:
    return [y for x in p for y in list_leaves(x)] if isinstance(p, list) else [p]


def classify_parents(v: Verdict, p, B: int, N: int, dev: str, via: str) -> Optional[List[List[int]]]:
    """Verdict rules of parents (dtype, shape, device; the values are judged by the caller);
    returns its rows as the host check reads them (one for [N], B for [B, N]) when their
    values can be read, else None."""
    if isinstance(p, list) and via == "wrapper":
        leaves = list_leaves(p)
        if any(isinstance(x, bool) or not isinstance(x, int) for x in leaves):
            v.must("parents list entry not an int")
            return None
        if list_shape(p) is None:
            v.must("parents ragged list")
            return None
        if any(not INT64_MIN <= x <= INT64_MAX for x in leaves):
            v.must("parents list entry outside int64")
            return None
        p = torch.tensor(p, dtype=torch.int64)
    if not isinstance(p, torch.Tensor):
        v.must(f"parents of Python type {type(p).__name__}")
        return None
    v.must("parents dtype", p.dtype not in (torch.int64, torch.int32))
    good_shape = (p.dim() == 1 and tuple(p.shape) == (N,)) or (p.dim() == 2 and tuple(p.shape) == (B, N))
    v.must("parents shape", not good_shape)
    if p.device.type != dev:
        # a CPU parents tensor with meta data is a host value (fake kernel: host_ok); meta with CPU data: refused
        v.must("parents device (meta with cpu data)", is_meta(p))
    if is_meta(p) or not good_shape or p.dtype not in (torch.int64, torch.int32):
        return None
    vals = p.long().tolist()
    return [vals] if p.dim() == 1 else vals


def parents_dim(p) -> int:
    return p.dim() if isinstance(p, torch.Tensor) else len(list_shape(p) or ())


def wrapper_tree_depth(p) -> Optional[int]:
    """What the wrapper's depth=None computes (specdec_ext.tree_depth, documented): the deepest
    row's depth, N - 1 for a malformed tree; None when the values cannot be read (meta)."""
    if isinstance(p, list):
        shp = list_shape(p)
        if shp is None or any(isinstance(x, bool) or not isinstance(x, int) for x in list_leaves(p)):
            return None
        p = torch.tensor(p, dtype=torch.int64) if all(INT64_MIN <= x <= INT64_MAX for x in list_leaves(p)) else None
    if not isinstance(p, torch.Tensor) or is_meta(p):
        return None
    if p.dim() == 0:
        p = p.reshape(1)
    rows = p.long().reshape(-1, p.shape[-1]).tolist() if p.shape[-1] else []
    if not rows:
        return None  # no tree (B = 0 rows, or N = 0): any width in [1, N] will do
    if any(not tree_well_formed(r) for r in rows):
        return max(p.shape[-1] - 1, 0)
    return max([tree_depth_of(r) for r in rows] + [0])


def classify_depth(v: Verdict, depth, via: str, N: int):
    if via == "wrapper" and depth is None:
        return
    if isinstance(depth, bool) or not isinstance(depth, int):
        v.must(f"depth of Python type {type(depth).__name__}")
    elif not INT64_MIN <= depth <= INT64_MAX:
        v.must("depth outside int64")
    else:
        v.must("depth outside [0, N - 1]", not 0 <= depth < N)


def tree_greedy_walk(lb: torch.Tensor, ids: List[int], row: List[int]):
    """The greedy walk (T = 0) of one row: (tokens, path), or None when a visited node's logits
    are all -inf. At each node the first child (index order) whose token is the argmax (first
    index of the max) is moved to, else the argmax is emitted."""
    node, tokens, path = 0, [], [0]
    while True:
        if bool((lb[node] == -math.inf).all()):
            return None
        arg = int(lb[node].argmax())
        tokens.append(arg)
        nxt = next((c for c in tree_children(row, node) if ids[c] == arg), None)
        if nxt is None:
            return tokens, path
        path.append(nxt)
        node = nxt


def raw_filter_as_wrapper(args, pre, name):
    """raw_filter, with a Python top_k no int64 holds as the wrapper passes it (off: k >= V)."""
    x = args.get(name)
    if name == "top_k" and isinstance(x, int) and not isinstance(x, bool) and x > INT64_MAX:
        return None
    return raw_filter(args, pre, name)


def make_verify_tree_case(via, args, how=None):
    a = args
    logits, ids, parents, probs = a["target_logits"], a["tree_token_ids"], a["parents"], a["draft_probs"]
    temperature, seed, offset, depth = a["temperature"], a["seed"], a["offset"], a["depth"]
    v = Verdict()
    dev = logits.device.type
    ok_meta = logits.dim() == 3
    v.must("target_logits shape", logits.dim() != 3)
    v.must("target_logits dtype", logits.dtype not in wrapper_floats(via))
    B, N, V = (tuple(logits.shape) + (0, 0, 0))[:3] if logits.dim() <= 3 else (0, 0, 0)
    v.must("target_logits N == 0", ok_meta and N == 0)
    v.must("target_logits V == 0", ok_meta and V == 0)
    v.must("tree_token_ids dtype", ids.dtype not in (torch.int64, torch.int32))
    v.must("tree_token_ids shape", tuple(ids.shape) != (B, N))
    v.must("tree_token_ids device", ids.device.type != dev)
    host_rows = classify_parents(v, parents, B, N, dev, via)
    # each batch row's tree (a [N] parents tensor is every row's)
    rows = None if host_rows is None else (host_rows * B if parents_dim(parents) == 1 else host_rows)
    classify_depth(v, depth, via, N)
    if via == "wrapper" and depth is None:
        D = wrapper_tree_depth(parents)
        # meta parents: the wrapper cannot compute the depth; refusing (naming depth /
        # parents) is fine, anything else must come with the fake kernel's shapes
        v.may("depth None with meta parents", is_meta(parents))
    else:
        D = depth if isinstance(depth, int) and not isinstance(depth, bool) else None
    if host_rows is not None:  # checked on the host even when B = 0
        wf = [tree_well_formed(r) for r in host_rows]
        v.must("parents malformed (host check)", not all(wf))
        if all(wf) and D is not None:
            v.must("parents deeper than depth (host check)", any(tree_depth_of(r) > D for r in host_rows))
    if probs is not None:
        v.must("draft_probs dtype", probs.dtype not in wrapper_floats(via))
        v.must("draft_probs shape", tuple(probs.shape) != (B, N, V))
        v.must("draft_probs device", probs.device.type != dev)
    t_py, t_rows, row_filters = classify_row_values(v, a, B, V, dev)
    chain = host_rows is not None and all(r == chain_list(N) for r in host_rows)

    def call():
        if via == "raw":
            return ops().verify_tree(logits, ids, parents, probs, temperature, seed, offset, depth, a.get("top_k"),
                                     a.get("top_p"), a.get("min_p"))
        return api().verify_tree(logits, ids, parents, probs, temperature, top_k=a.get("top_k"), top_p=a.get("top_p"),
                                 min_p=a.get("min_p"), seed=seed, offset=offset, depth=depth)

    def check(out, pre, snap):
        if not isinstance(out, tuple) or len(out) != 4:
            fail("verify_tree output not 4 tensors", describe_out(out))
        tokens, path, num_acc, valid = out
        width = tokens.shape[1] if tokens.dim() == 2 else -1
        if D is None and B == 0 and 1 <= width <= N:
            pass  # depth computed from [0, N] parents: no row, any width in [1, N]
        elif D is None and not is_meta(parents):
            fail("verify_tree output width", f"D not computable from parents, got width {width}")
        D1 = (D + 1) if D is not None else width
        for name, t, dt, shp in (("tokens", tokens, torch.int64, (B, D1)), ("path", path, torch.int64, (B, D1)),
                                 ("num_accepted", num_acc, torch.int64, (B,)), ("valid", valid, torch.bool, (B,))):
            if t.dtype != dt or tuple(t.shape) != shp or t.device.type != dev:
                fail("verify_tree output metadata", f"{name}: {describe(t)}, expected {dt} {shp} on {dev}")
        check_unchanged_except(snap, {}, "verify_tree writes no argument")
        if dev == "meta":
            return
        if rows is None:
            fail("verify_tree accepted unreadable parents", describe(parents))
        l32 = pre["target_logits"].float()
        ids64 = pre["tree_token_ids"].long()
        q = pre["draft_probs"].float() if probs is not None else None
        T = t_rows if t_rows is not None else torch.ones(B)
        for b in range(B):
            tok, pth, n, ok = tokens[b].tolist(), path[b].tolist(), int(num_acc[b]), bool(valid[b])
            Tb, lb, par, idb = float(T[b]), l32[b], rows[b], ids64[b].tolist()
            ids_bad = any(not 0 <= x < V for x in idb[1:])
            must_invalid = (bool((lb != lb).any() | (lb == math.inf).any()) or ids_bad
                            or not valid_temperature(Tb) or bool((lb[0] == -math.inf).all()))
            kids0 = tree_children(par, 0)
            # the root's first child is always tested; with q its q(x) is read
            if q is not None and Tb != 0 and kids0 and 0 <= idb[kids0[0]] < V:
                q0 = float(q[b, 0, idb[kids0[0]]])
                must_invalid |= not (q0 >= 0) or q0 == math.inf
            greedy = None
            if Tb == 0 and not must_invalid:
                greedy = tree_greedy_walk(lb, idb, par)
                must_invalid = greedy is None
                must_valid = not must_invalid  # greedy rows: validity exactly known
            else:
                finite_max = lb.abs().max().item() if lb.numel() else 0.0
                qb = q[b] if q is not None else None
                must_valid = (bool(torch.isfinite(lb).all()) and not must_invalid
                              and (Tb == 0 or finite_max / Tb <= 1e30)
                              and (qb is None or Tb == 0
                                   or bool((torch.isfinite(qb) & (qb >= 0) & (qb <= 1e30)).all())))
            where = f"row {b}: parents {par}, ids {idb}, T={Tb}"
            if ok and must_invalid:
                fail("verify_tree: row with NaN/+inf logits, bad token, bad temperature, bad q or all -inf at a "
                     "visited node reported valid", f"{where}, tokens {tok}, path {pth}")
            if not ok and must_valid:
                fail("verify_tree: usable row reported invalid", where)
            if not ok:
                if tok != [-1] * D1 or pth != [-1] * D1 or n != 0:
                    fail("verify_tree: invalid row not all -1 / num_accepted 0", f"{where}: {tok}, {pth}, n={n}")
                continue
            if not 0 <= n <= D1 - 1:
                fail("verify_tree: num_accepted out of [0, D]", f"{where}: n={n}, D={D1 - 1}")
            if pth[0] != 0 or any(not 0 < pth[j] < N or par[pth[j]] != pth[j - 1] for j in range(1, n + 1)):
                fail("verify_tree: path is not a walk down the tree", f"{where}: path {pth}, n={n}")
            if any(tok[j] != idb[pth[j + 1]] for j in range(n)):
                fail("verify_tree: accepted tokens differ from the path's node tokens", f"{where}: {tok}, {pth}")
            if not 0 <= tok[n] < V:
                fail("verify_tree: emitted token out of [0, V)", f"{where}: {tok}, V={V}")
            if tok[n + 1:] != [-1] * (D1 - 1 - n) or pth[n + 1:] != [-1] * (D1 - 1 - n):
                fail("verify_tree: entries after the emitted ones not -1", f"{where}: {tok}, {pth}, n={n}")
            for j in range(n + 1):
                if lb[pth[j], tok[j]] == -math.inf:
                    fail("verify_tree: token with a -inf logit at its node", f"{where}: {tok}, {pth}, j={j}")
            if greedy is not None:
                gt, gp = greedy
                if tok != gt + [-1] * (D1 - len(gt)) or pth != gp + [-1] * (D1 - len(gp)) or n != len(gt) - 1:
                    fail("verify_tree: greedy row differs from the greedy walk",
                         f"{where}: tokens {tok}, path {pth}; expected {gt}, {gp}")
                continue
            kids = tree_children(par, pth[n])
            if q is None and Tb != 0 and tok[n] in [idb[k] for k in kids]:
                # deterministic children: every rejected child's token is zeroed in r
                fail("verify_tree: correction equals a rejected child's token", f"{where}: {tok}, {pth}")
            if row_filters is not None and row_filters[b].on(V):
                for j in range(n + 1):
                    loose = filtered_laws(lb[pth[j]], Tb, row_filters[b])[0]
                    if not loose[tok[j]] > 0:
                        fail("verify_tree: token outside the filtered set", f"{where}: node {pth[j]}: {tok}, "
                             f"{row_filters[b]}, logits {lb[pth[j]].tolist()[:16]}")

        def raw(name, py=None):
            """The pre-call copy of an argument as the raw op takes it: float64 logits /
            probabilities converted to float32 (the wrapper's float_arg), a Python value as
            a 0-dim tensor (seed / offset wrapped to int64 as the wrapper does)."""
            if name not in pre:
                return torch.tensor(wrap64(py) if isinstance(py, int) else py)
            x = pre[name]
            return x.float() if x.dtype == torch.float64 and name in ("target_logits", "draft_probs") else x

        if (not chain or D != N - 1) and not how or seed is None:
            return  # (the wrapper's seed None: a random seed, no reference call)
        common = (raw("temperature", t_py), raw("seed", seed), raw("offset", offset))
        raw_filters = [raw_filter_as_wrapper(a, pre, name) for name in FILTER_NAMES]
        if chain and D == N - 1 and not how:
            # a chain-shaped tree is verify on the same inputs (node n's draft_probs = verify's position n)
            q_chain = None if probs is None else raw("draft_probs")[:, :N - 1]
            try:
                ref = ops().verify(raw("target_logits"), pre["tree_token_ids"][:, 1:], q_chain, *common, *raw_filters,
                                   None, False)
            except (ValueError, TypeError) as e:
                fail("verify_tree chain: verify refused the same inputs", f"{type(e).__name__}: {e}")
            for name, x, y in zip(("tokens", "num_accepted", "valid"), (tokens, num_acc, valid), ref):
                if not torch.equal(x, y):
                    fail("verify_tree: chain-shaped tree differs from verify",
                         f"{name}: {x.tolist()} vs verify {y.tolist()} (ids {ids64.tolist()}, T {T.tolist()})")
        if how:  # aliased inputs: same result as the call on separate copies
            p_ref = pre["parents"] if "parents" in pre else torch.tensor(parents, dtype=torch.int64)
            ref = ops().verify_tree(raw("target_logits"), pre["tree_token_ids"], p_ref,
                                    None if probs is None else raw("draft_probs"), *common, D1 - 1, *raw_filters)
            for name, x, y in zip(("tokens", "path", "num_accepted", "valid"), out, ref):
                if not torch.equal(x, y):
                    fail("verify_tree: aliased inputs change the result",
                         f"{name}: {x.tolist()} vs copies {y.tolist()}")

    return Case("verify_tree", via, args, call, v, check, how)


# =============================================================================================
# sample
# =============================================================================================
@st.composite
def sample_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "wrapper"]))
    focus = focus_draw(draw, alias)
    B = draw(rarely_zero(4, p=1000 if focus else 10))
    V = draw(FOCUS_VOCAB if focus else vocab_size())
    c = Chaos(draw, alias or focus)
    meta = c.meta

    shape = c.shape([B, V])
    lvals = float_values(shape, regimes=FOCUS_REGIMES, specials=False) if focus else float_values(shape)
    logits = draw(tensors(draw(lvals), c.fdtype(), meta=meta()))
    temperature = draw(py_or_tensor_temperature(B, via, c, values=FOCUS_TEMPERATURES if focus else None))
    seed = draw(py_or_tensor_int(B, via, c, allow_none=True))
    offset = draw(py_or_tensor_int(B, via, c, allow_none=False))
    probs_out = None
    if alias or draw(st.booleans()):
        pdtype = torch.float32 if draw(st.integers(0, 9)) != 9 else draw(st.sampled_from([torch.float16, torch.float64]))
        probs_out = draw(tensors(torch.full(c.shape([B, V]), 7.0), pdtype, meta=meta(), unit_last=True))
    filters = draw(filter_args_draw(B, V, via, c, focus))
    if via == "raw":
        temperature = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature))
    args = dict(logits=logits, temperature=temperature, seed=seed, offset=offset, probs_out=probs_out, **filters)
    args.update(logprobs_draw(draw, via))
    how = None
    if alias:
        if seed is None:
            args["seed"] = 1
        args, how = draw(alias_some_pair(args, ARG_NAMES["sample"], unit_last=("probs_out",)))
    return make_sample_case(via, args, how)


def make_sample_case(via, args, how=None):
    a = args
    logits, temperature, seed, offset, probs_out = (a["logits"], a["temperature"], a["seed"], a["offset"],
                                                    a["probs_out"])
    v = Verdict()
    dev = logits.device.type
    v.must("logits shape", logits.dim() != 2)
    v.must("logits dtype", logits.dtype not in wrapper_floats(via))
    B, V = (tuple(logits.shape) + (0, 0))[:2] if logits.dim() <= 2 else (0, 0)
    v.must("logits V == 0", logits.dim() == 2 and V == 0)
    t_py = classify_py_temperature(v, temperature, B)
    t_rows = classify_tensor_temperature(v, temperature, B, dev)
    if t_py is not None:
        t_rows = torch.full((B,), t_py, dtype=torch.float32)
    for name, x in (("seed", seed), ("offset", offset)):
        classify_py_int(v, x, name, allow_none=name == "seed")
        classify_tensor_int(v, x, name, B, dev)
        if isinstance(x, torch.Tensor):
            v.may(f"{name} int32", x.dtype == torch.int32)
    row_filters = classify_filters(v, a, B, V, dev)
    if probs_out is not None:
        v.must("probs_out dtype", probs_out.dtype != torch.float32)
        v.must("probs_out shape", tuple(probs_out.shape) != (B, V))
        v.must("probs_out device", probs_out.device.type != dev)
        v.must("probs_out stride along V", probs_out.dim() == 2 and V > 1 and probs_out.stride(-1) != 1)
        check_written_overlaps(v, a, ["probs_out"])  # incl. the filter tensors (read)
    scalar_t_bad = (isinstance(temperature, torch.Tensor) and temperature.dim() == 0 and not is_meta(temperature)
                    and temperature.dtype.is_floating_point and not valid_temperature(f32(float(temperature))))
    v.may("0-dim temperature tensor unusable", scalar_t_bad)

    def call():
        if via == "raw":
            return ops().sample(logits, temperature, seed, offset, probs_out, a.get("top_k"), a.get("top_p"),
                                a.get("min_p"))
        return api().sample(logits, temperature, top_k=a.get("top_k"), top_p=a.get("top_p"), min_p=a.get("min_p"),
                            seed=seed, offset=offset, probs_out=probs_out, **logprobs_kwargs(a))

    def check(tokens, pre, snap):
        lp = None
        if "logprobs" in a:
            tokens, lp = tokens
        if tokens.dtype != torch.int64 or tuple(tokens.shape) != (B,) or tokens.device.type != dev:
            fail("sample output metadata", f"{describe(tokens)}, expected int64 [{B}] on {dev}")
        if dev == "meta":
            return
        check_unchanged_except(snap, {"probs_out": probs_out} if probs_out is not None else {},
                               "only probs_out is written")
        if lp is not None:
            check_token_logprobs("sample", lp, tokens, pre, a, t_py, "logits")
        if how:
            ref_out = torch.empty(B, V) if probs_out is not None else None
            ref_tok = ops().sample(pre["logits"], pre["temperature"] if "temperature" in pre else torch.tensor(t_py),
                                   pre["seed"] if "seed" in pre else torch.tensor(wrap64(seed)),
                                   pre["offset"] if "offset" in pre else torch.tensor(wrap64(offset)), ref_out,
                                   *(raw_filter(a, pre, name) for name in FILTER_NAMES))
            if not torch.equal(ref_tok, tokens):
                fail("sample: aliased arguments change the result", f"{tokens.tolist()} vs copies {ref_tok.tolist()}")
            if probs_out is not None and not torch.allclose(probs_out, ref_out, atol=1e-6, equal_nan=True):
                fail("sample: aliased arguments change probs_out", how)
        l32 = pre["logits"].float()
        T = t_rows if t_rows is not None else torch.ones(B)
        P = probs_out.double() if probs_out is not None else None
        for b in range(B):
            tok, lb, Tb = int(tokens[b]), l32[b], float(T[b])
            invalid = bool((lb != lb).any() | (lb == math.inf).any() | (lb == -math.inf).all()) or not valid_temperature(Tb)
            if invalid:
                if tok != -1:
                    fail("sample: row with NaN/+inf/all -inf logits or bad temperature got a token",
                         f"row {b}: token {tok}, T={Tb}")
                if P is not None and bool((P[b] != 0).any()):
                    fail("sample: probs_out row of an invalid row not 0", f"row {b}: {P[b].tolist()[:8]}")
                continue
            if not 0 <= tok < V:
                fail("sample: token out of [0, V) for finite logits and a valid temperature",
                     f"row {b}: token {tok}, V={V}, T={Tb}, logits {describe(pre['logits'][b])}")
            if lb[tok] == -math.inf:
                fail("sample: drew a token with -inf logit", f"row {b}: token {tok}")
            if Tb == 0 and tok != int(lb.argmax()):  # filters never apply to greedy rows
                fail("sample: greedy token is not the argmax", f"row {b}: token {tok}, argmax {int(lb.argmax())}")
            filt = row_filters[b] if row_filters is not None and Tb != 0 else RowFilter()
            loose = tight = law = None
            if filt.on(V):
                loose, tight, law = filtered_laws(lb, Tb, filt)
                if not loose[tok] > 0:
                    fail("sample: token outside the filtered set",
                         f"row {b}: token {tok}, {filt}, T={Tb}, logits {lb.tolist()[:16]}")
            if P is None:
                continue
            pb = P[b]
            if not bool(torch.isfinite(pb).all()) or bool((pb < 0).any()) or abs(float(pb.sum()) - 1) > 1e-3:
                fail("sample: probs_out row not a distribution", f"row {b}: sum {float(pb.sum())}, {pb.tolist()[:8]}")
            if pb[tok] <= 0:
                fail("sample: drawn token has probability 0 in probs_out", f"row {b}: token {tok}")
            if bool((pb[lb == -math.inf] != 0).any()):
                fail("sample: probs_out > 0 at a -inf logit", f"row {b}")
            # The kernels compute exp((l - max) / T) in float32 (verify_math.h shifted_exp): with logits
            # spanning more than 3.4e38, l - max overflows to -inf and such a token gets probability 0
            # where float64 gives it some (only visible with T > ~1e37). The law comparisons below
            # assume that difference is finite; the support checks hold either way.
            finite = lb > -math.inf
            f32_exact = bool(torch.isfinite(lb[finite] - lb.max()).all())
            if loose is not None:
                out_set = (loose == 0) & (pb != 0)
                if bool(out_set.any()):
                    fail("sample: probs_out > 0 outside the filtered set",
                         f"row {b}: tokens {out_set.nonzero().view(-1).tolist()}, {filt}, T={Tb}")
                # a token kept with any margin and a float32-sized probability must get one
                missing = (tight > 1e-30) & (pb == 0)
                if f32_exact and bool(missing.any()):
                    fail("sample: probs_out 0 at a token the filters keep",
                         f"row {b}: tokens {missing.nonzero().view(-1).tolist()}, {filt}, T={Tb}")
                if not torch.equal(loose > 0, tight > 0):
                    continue  # a token at a threshold: which law the kernel used is open (sum checked)
            if Tb == 0:
                ref = torch.zeros(V, dtype=torch.float64)
                ref[int(lb.argmax())] = 1
            else:
                y = lb.double() / Tb
                ref = law if law is not None else torch.softmax(y, 0)
                ref = ref if bool(torch.isfinite(y[y > -math.inf]).all()) else None
                spread = float(y.max() - y[y > -math.inf].min()) if ref is not None else math.inf
                ref = ref if spread <= 80 and f32_exact else None
            if ref is not None and not torch.allclose(pb, ref, atol=1e-4, rtol=1e-3):
                fail("sample: probs_out differs from the (filtered) softmax(logits / T)",
                     f"row {b}: max abs err {float((pb - ref).abs().max())}, {filt}")
    return Case("sample", via, args, call, v, check, how)


@st.composite
def written_cache_pair(draw, c, cache_shape):
    """(key_cache, value_cache) an op writes: usually one float dtype, now and then a
    mismatched or a bad one; values, layouts, meta per Chaos."""
    dtype = c.fdtype()
    kc = draw(tensors(draw(float_values(c.shape(cache_shape))), dtype, unit_last=True, meta=c.meta()))
    vdt = dtype if draw(st.integers(0, 11)) else draw(float_dtype(p_bad=2))
    vc = draw(tensors(draw(float_values(c.shape(cache_shape))), vdt, unit_last=True, meta=c.meta()))
    return kc, vc


@st.composite
def cache_write_tensors(draw, c, cache_shape, new_shape):
    """(key_cache, value_cache, new_k, new_v) for a cache write (written_cache_pair, and new
    keys / values of the cache's dtype, now and then of value_cache's)."""
    kc, vc = draw(written_cache_pair(c, cache_shape))
    dtype, vdt = kc.dtype, vc.dtype
    nk = draw(tensors(draw(float_values(c.shape(new_shape))), dtype if draw(st.integers(0, 11)) else vdt,
                      meta=c.meta()))
    nv = draw(tensors(draw(float_values(c.shape(new_shape))), vdt, meta=c.meta()))
    return kc, vc, nk, nv


# =============================================================================================
# kv_append_
# =============================================================================================
@st.composite
def kv_append_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "wrapper"]))
    B, H, M, D, S = draw(size(3)), draw(size(2)), draw(size(6)), draw(size(8)), draw(size(3))
    c = Chaos(draw, alias)
    meta = c.meta

    kc, vc, nk, nv = draw(cache_write_tensors(c, [B, H, M, D], [B, H, S, D]))
    lvals = torch.tensor(draw(st.lists(st.one_of(st.integers(0, max(M - S, 0)), index_value(M)), min_size=B, max_size=B)),
                         dtype=torch.int64)
    lengths = draw(int_tensor(c.shape([B]), dtype=c.idtype(), bound=M, meta=meta(), values=None if draw(st.integers(0, 9)) == 9
                              else lvals))
    overflow = None
    if draw(st.booleans()):
        overflow = draw(tensors(torch.zeros(c.shape([B])), torch.bool if draw(st.integers(0, 9)) else
                                torch.int64, meta=meta()))
    args = dict(key_cache=kc, value_cache=vc, new_k=nk, new_v=nv, lengths=lengths, overflow=overflow)
    how = None
    if alias:
        # Keep the lengths valid when they are placed inside another tensor's memory.
        args, how = draw(alias_some_pair(args, ARG_NAMES["kv_append_"], unit_last=("key_cache", "value_cache"),
                                         values_for=lambda n, a: a[n].clone() if n != "lengths" else lvals[:a[n].numel()]
                                         .reshape(a[n].shape) if lvals.numel() == a[n].numel() else a[n].clone()))
    return make_kv_append_case(via, args, how)


def check_cache_pair(v: Verdict, kc, vc, writes: bool):
    v.must("key_cache shape", kc.dim() != 4)
    v.must("value_cache shape", vc.dim() != 4 or tuple(vc.shape) != tuple(kc.shape))
    v.must("key_cache dtype", kc.dtype not in FLOAT_DTYPES)
    v.must("value_cache dtype", vc.dtype != kc.dtype)
    v.must("value_cache device", vc.device != kc.device)
    for name, t in (("key_cache", kc), ("value_cache", vc)):
        v.must(f"{name} head dim stride != 1", t.dim() == 4 and t.shape[3] > 1 and t.stride(3) != 1)


def check_new(v: Verdict, t, cache, shape, name):
    v.must(f"{name} dtype", t.dtype != cache.dtype)
    v.must(f"{name} shape", tuple(t.shape) != tuple(shape))
    v.must(f"{name} device", t.device != cache.device)


def make_kv_append_case(via, args, how=None):
    a = args
    kc, vc, nk, nv, lengths, overflow = (a[k] for k in ARG_NAMES["kv_append_"])
    v = Verdict()
    dev = kc.device.type
    check_cache_pair(v, kc, vc, writes=True)
    B, H, M, D = (tuple(kc.shape) + (0,) * 4)[:4] if kc.dim() <= 4 else (0,) * 4
    S = nk.shape[2] if nk.dim() == 4 else 0
    v.must("new_k shape", nk.dim() != 4)
    check_new(v, nk, kc, (B, H, S, D), "new_k")
    check_new(v, nv, vc, (B, H, S, D), "new_v")
    check_index(v, lengths, B, "lengths", dev)
    check_flag(v, overflow, B, "overflow", dev)
    check_written_overlaps(v, a, ["key_cache", "value_cache"], flags=["overflow"])
    data_ok = not v.refuse and dev == "cpu"
    if data_ok:
        for n in lengths.tolist():
            v.must("kv_append_ lengths[b] < 0 (CPU raises)", n < 0)
            v.must("kv_append_ lengths[b] + S > max_len (CPU raises)", n + S > M)

    def call():
        if via == "raw":
            return ops().kv_append_(kc, vc, nk, nv, lengths, overflow)
        return api().kv_append_(kc, vc, nk, nv, lengths, overflow=overflow)

    def check(out, pre, snap):
        if out is not None:
            fail("kv_append_ returned a value", describe_out(out))
        if dev == "meta":
            return
        ek, ev = pre["key_cache"].clone(), pre["value_cache"].clone()
        for b, n in enumerate(pre["lengths"].tolist()):
            ek[b, :, n:n + S] = pre["new_k"][b]
            ev[b, :, n:n + S] = pre["new_v"][b]
        check_unchanged_except(snap, {"key_cache": ek, "value_cache": ev}, "kv_append_ reference")

    return Case("kv_append_", via, args, call, v, check, how)


# =============================================================================================
# kv_rollback_
# =============================================================================================
@st.composite
def kv_rollback_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "wrapper"]))
    B = draw(size(4))
    c = Chaos(draw, alias)
    num_appended = draw(st.one_of(st.integers(0, 5), st.sampled_from([INT64_MAX, -1, 2**62])))
    if via == "wrapper":
        num_appended = draw(st.one_of(st.just(num_appended),
                                      st.sampled_from([2.7, 3.0, True, "3", 2**63, 2**64, None])))
    lvals = torch.tensor(draw(st.lists(st.one_of(st.integers(0, 12), index_value(6)), min_size=B, max_size=B)))
    lengths = draw(int_tensor(c.shape([B]), dtype=c.idtype(), bound=6, values=lvals if draw(st.integers(0, 11)) else None,
                              meta=c.meta()))
    kvals = torch.tensor(draw(st.lists(st.one_of(st.integers(0, 5), index_value(5)), min_size=B, max_size=B)))
    num_kept = draw(int_tensor(c.shape([B]), dtype=c.idtype(), bound=5, values=kvals if draw(st.integers(0, 11)) else None,
                               meta=c.meta()))
    if via == "wrapper" and draw(st.integers(0, 3)) == 3:
        num_kept = draw(st.one_of(st.integers(-2, 6), st.sampled_from([2.5, 1.0, True, "1", 2**63, INT64_MIN])))
    invalid = None
    if draw(st.booleans()):
        invalid = draw(tensors(torch.zeros(c.shape([B])), torch.bool if draw(st.integers(0, 9)) else
                               torch.int32, meta=c.meta()))
    args = dict(lengths=lengths, num_appended=num_appended, num_kept=num_kept, invalid=invalid)
    how = None
    if alias:
        args, how = draw(alias_some_pair(args, ARG_NAMES["kv_rollback_"]))
    return make_kv_rollback_case(via, args, how)


def make_kv_rollback_case(via, args, how=None):
    lengths, num_appended, num_kept, invalid = (args[k] for k in ARG_NAMES["kv_rollback_"])
    v = Verdict()
    dev = lengths.device.type
    v.must("lengths shape", lengths.dim() != 1)
    B = lengths.shape[0] if lengths.dim() == 1 else 0
    v.must("lengths dtype", lengths.dtype not in (torch.int64, torch.int32))
    if isinstance(num_appended, bool) or not isinstance(num_appended, int):
        v.must(f"num_appended of Python type {type(num_appended).__name__}")
    elif num_appended < 0:
        v.must("num_appended < 0")
    elif num_appended > INT64_MAX:
        v.must("num_appended outside int64")
    if isinstance(num_kept, torch.Tensor):
        check_index(v, num_kept, B, "num_kept", dev)
    elif isinstance(num_kept, bool) or not isinstance(num_kept, int):
        v.must(f"num_kept of Python type {type(num_kept).__name__}")
    elif not INT64_MIN <= num_kept <= INT64_MAX:
        v.must("num_kept outside int64")
    check_flag(v, invalid, B, "invalid", dev)
    check_written_overlaps(v, args, ["lengths"], flags=["invalid"])
    if not v.refuse and dev == "cpu":
        kept = num_kept.tolist() if isinstance(num_kept, torch.Tensor) else [num_kept] * B
        for n, k in zip(lengths.tolist(), kept):
            v.must("kv_rollback_ num_kept outside [0, num_appended]", not 0 <= k <= num_appended)
            v.must("kv_rollback_ length would go negative (exact arithmetic)", n - (num_appended - k) < 0)

    def call():
        if via == "raw":
            return ops().kv_rollback_(lengths, num_appended, num_kept, invalid)
        return api().kv_rollback_(lengths, num_appended, num_kept, invalid=invalid)

    def check(out, pre, snap):
        if out is not None:
            fail("kv_rollback_ returned a value", describe_out(out))
        if dev == "meta":
            return
        kept = pre["num_kept"].tolist() if "num_kept" in pre else [num_kept] * B
        new = torch.tensor([n - (num_appended - k) for n, k in zip(pre["lengths"].tolist(), kept)],
                           dtype=torch.int64).to(lengths.dtype)
        check_unchanged_except(snap, {"lengths": new}, "kv_rollback_ reference")

    return Case("kv_rollback_", via, args, call, v, check, how)


# =============================================================================================
# paged_kv_append_
# =============================================================================================
@st.composite
def paged_append_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "wrapper"]))
    NB, BS, H, D, T = draw(size(3)), draw(size(4)), draw(size(2)), draw(size(8)), draw(size(5))
    c = Chaos(draw, alias)
    meta = c.meta

    kc, vc, nk, nv = draw(cache_write_tensors(c, [NB, BS, H, D], [T, H, D]))
    nslots = NB * BS
    # Mostly a permutation of distinct slots with some -1 padding; sometimes anything.
    perm = draw(st.permutations(list(range(nslots)) + [-1] * T))[:T] if nslots + T else []
    svals = torch.tensor(perm if draw(st.integers(0, 5)) else draw(st.lists(index_value(nslots), min_size=T, max_size=T)),
                         dtype=torch.int64)
    slots = draw(int_tensor(c.shape([T]), dtype=c.idtype(), bound=nslots, values=svals if svals.numel() else None, meta=meta()))
    invalid = None
    if draw(st.booleans()):
        ishape = draw(st.sampled_from([(), (1,), (2,), (1, 1)]))
        invalid = draw(tensors(torch.zeros(ishape), torch.bool if draw(st.integers(0, 9)) else torch.uint8,
                               meta=meta()))
    args = dict(key_cache=kc, value_cache=vc, new_k=nk, new_v=nv, slot_mapping=slots, invalid=invalid)
    how = None
    if alias:
        args, how = draw(alias_some_pair(args, ARG_NAMES["paged_kv_append_"], unit_last=("key_cache", "value_cache"),
                                         values_for=lambda n, a: svals.reshape(a[n].shape) if n == "slot_mapping"
                                         and svals.numel() == a[n].numel() else a[n].clone()))
    return make_paged_append_case(via, args, how)


def make_paged_append_case(via, args, how=None):
    kc, vc, nk, nv, slots, invalid = (args[k] for k in ARG_NAMES["paged_kv_append_"])
    v = Verdict()
    dev = kc.device.type
    check_cache_pair(v, kc, vc, writes=True)
    NB, BS, H, D = (tuple(kc.shape) + (0,) * 4)[:4] if kc.dim() <= 4 else (0,) * 4
    v.must("key_cache block_size 0", kc.dim() == 4 and BS == 0)
    v.must("new_k shape", nk.dim() != 3)
    T = nk.shape[0] if nk.dim() == 3 else 0
    check_new(v, nk, kc, (T, H, D), "new_k")
    check_new(v, nv, vc, (T, H, D), "new_v")
    check_index(v, slots, T, "slot_mapping", dev)
    check_flag(v, invalid, 1, "invalid", dev)
    check_written_overlaps(v, args, ["key_cache", "value_cache"], flags=["invalid"])
    if not v.refuse and dev == "cpu":
        used = [s for s in slots.tolist() if s != -1]
        v.must("paged_kv_append_ slot out of range (CPU raises)", any(not 0 <= s < NB * BS for s in used))
        v.must("paged_kv_append_ repeated slot (CPU raises)", len(set(used)) != len(used))

    def call():
        if via == "raw":
            return ops().paged_kv_append_(kc, vc, nk, nv, slots, invalid)
        return api().paged_kv_append_(kc, vc, nk, nv, slots, invalid=invalid)

    def check(out, pre, snap):
        if out is not None:
            fail("paged_kv_append_ returned a value", describe_out(out))
        if dev == "meta":
            return
        ek, ev = pre["key_cache"].clone(), pre["value_cache"].clone()
        for t, s in enumerate(pre["slot_mapping"].tolist()):
            if s >= 0:
                ek[s // BS, s % BS] = pre["new_k"][t]
                ev[s // BS, s % BS] = pre["new_v"][t]
        check_unchanged_except(snap, {"key_cache": ek, "value_cache": ev}, "paged_kv_append_ reference")

    return Case("paged_kv_append_", via, args, call, v, check, how)


# =============================================================================================
# kv_compact_ / paged_kv_compact_
# =============================================================================================
@st.composite
def compact_rows(draw, B: int, P: int, cap: int):
    """(lengths, src_index, count) values [B], [B, P], [B] (int64): mostly valid rows (a
    length in [0, cap], count in [0, P], a strictly increasing src row that fits, junk past
    count), now and then anything (index_value extremes)."""
    lengths, src, count = [], [], []
    for _ in range(B):
        n = draw(spread_from(list(range(cap + 1))) if draw(st.integers(0, 15)) != 15 else index_value(cap))
        room = cap - n if 0 <= n <= cap else 0
        k = min(P, room)  # count: mostly >= 1 when the row has room
        c = draw(spread_from(list(range(1, k + 1)) * 3 + [0]) if draw(st.integers(0, 15)) != 15 else index_value(P))
        pick = sorted(draw(st.permutations(list(range(room))))[:max(0, min(c, room, P))]) if room else []
        junk = draw(st.lists(index_value(cap), min_size=P, max_size=P))
        row = (pick + junk)[:P]
        if draw(st.integers(0, 15)) == 15:  # anything
            row = draw(st.lists(index_value(cap), min_size=P, max_size=P))
        lengths.append(n)
        src.append(row)
        count.append(c)
    return (torch.tensor(lengths, dtype=torch.int64), torch.tensor(src, dtype=torch.int64).reshape(B, P),
            torch.tensor(count, dtype=torch.int64))


@st.composite
def compact_cases(draw, paged: bool, alias: bool = False):
    op = "paged_kv_compact_" if paged else "kv_compact_"
    via = draw(st.sampled_from(["raw", "wrapper"]))
    # sizes spread (hypothesis favours the smallest), 0 one time in ~10: most calls move something
    B, H, D = draw(spread_from([2, 3, 1, 2, 3, 1, 2, 3, 1, 0])), draw(rarely_zero(2)), draw(rarely_zero(8))
    P = draw(spread_from([3, 4, 2, 1, 4, 3, 2, 1, 3, 0]))
    c = Chaos(draw, alias)
    meta = c.meta
    args = {}
    if paged:
        NB, BS, MB = draw(spread_from(list(range(1, 7)) * 2 + [0])), draw(rarely_zero(3)), draw(rarely_zero(3))
        kc, vc = draw(written_cache_pair(c, [NB, BS, H, D]))
        # Mostly each row its own blocks (a permutation); sometimes anything (shared / out of range).
        perm = draw(st.permutations(list(range(max(NB, B * MB)))))
        tvals = torch.tensor([[x if x < NB else -1 for x in perm[b * MB:(b + 1) * MB]] for b in range(B)],
                             dtype=torch.int64).reshape(B, MB)
        if draw(st.integers(0, 5)) == 5:
            tvals = torch.tensor(draw(st.lists(st.one_of(st.integers(0, max(NB - 1, 0)), index_value(NB)),
                                               min_size=B * MB, max_size=B * MB)), dtype=torch.int64).reshape(B, MB)
        args["block_tables"] = draw(int_tensor(c.shape([B, MB]), dtype=c.idtype(), bound=NB, values=tvals,
                                               meta=meta()))
        cap = MB * BS
    else:
        M = draw(spread_from(list(range(1, 9)) * 2 + [0]))
        kc, vc = draw(written_cache_pair(c, [B, H, M, D]))
        cap = M
    lvals, svals, cvals = draw(compact_rows(B, P, cap))
    lengths = draw(int_tensor(c.shape([B]), dtype=c.idtype(), bound=cap, meta=meta(), values=lvals))
    src = draw(int_tensor(c.shape([B, P]), dtype=c.idtype(), bound=cap, meta=meta(), values=svals))
    count = draw(int_tensor(c.shape([B]), dtype=c.idtype(), bound=P, meta=meta(), values=cvals))
    invalid = None
    if draw(st.booleans()):
        invalid = draw(tensors(torch.zeros(c.shape([B])), torch.bool if draw(st.integers(0, 9)) else torch.int64,
                               meta=meta()))
    args = dict(key_cache=kc, value_cache=vc, **args, lengths=lengths, src_index=src, count=count, invalid=invalid)
    how = None
    if alias:
        args, how = draw(alias_some_pair(args, ARG_NAMES[op], unit_last=("key_cache", "value_cache")))
    return make_compact_case(paged, via, args, how)


def compact_verdict(v: Verdict, paged: bool, a: Dict[str, Any]):
    """The rules of kv_compact_ / paged_kv_compact_ on the metadata, then (CPU, metadata fine)
    on the values; returns B."""
    kc, vc, src, tables = a["key_cache"], a["value_cache"], a["src_index"], a.get("block_tables")
    dev = kc.device.type
    check_cache_pair(v, kc, vc, writes=True)
    if paged:
        v.must("key_cache block_size 0", kc.dim() == 4 and kc.shape[1] == 0)
        v.must("block_tables shape", tables.dim() != 2)
        v.must("block_tables dtype", tables.dtype not in (torch.int32, torch.int64))
        v.must("block_tables device", tables.device != kc.device)
        B = tables.shape[0] if tables.dim() == 2 else 0
    else:
        B = kc.shape[0] if kc.dim() == 4 else 0
    check_index(v, a["lengths"], B, "lengths", dev)
    check_index(v, a["count"], B, "count", dev)
    v.must("src_index shape", src.dim() != 2 or src.shape[0] != B)
    v.must("src_index dtype", src.dtype not in (torch.int32, torch.int64))
    v.must("src_index device", src.device != kc.device)
    check_flag(v, a["invalid"], B, "invalid", dev)
    check_written_overlaps(v, a, ["key_cache", "value_cache"], flags=["invalid"])
    if v.refuse or dev != "cpu":
        return B
    P = src.shape[1]
    lengths, count, srcl = a["lengths"].tolist(), a["count"].tolist(), src.tolist()
    if paged:
        NB, BS = kc.shape[0], kc.shape[1]
        tl = tables.tolist()
        cap = tables.shape[1] * BS
        errors = [row_error(n, c, s, P, cap, t, BS, NB) for n, c, s, t in zip(lengths, count, srcl, tl)]
    else:
        errors = [row_error(n, c, s, P, kc.shape[2]) for n, c, s in zip(lengths, count, srcl)]
    for e in errors:
        v.must(f"compact row breaks the rules of {e} (CPU raises)", e is not None)
    if paged and not any(errors):
        uses = {}  # slot -> {(row, position)}, and the slots written
        written = set()
        for b, (n, c) in enumerate(zip(lengths, count)):
            for j in range(c):
                s = srcl[b][j]
                if s == j:
                    continue
                for p, w in ((n + j, True), (n + s, False)):
                    slot = (tl[b][p // BS], p % BS)
                    uses.setdefault(slot, set()).add((b, p))
                    if w:
                        written.add(slot)
        v.must("paged_kv_compact_ slot shared by two (row, position) pairs (CPU raises)",
               any(len(uses[s]) > 1 for s in written))
    return B


def make_compact_case(paged, via, args, how=None):
    op = "paged_kv_compact_" if paged else "kv_compact_"
    a = args
    v = Verdict()
    dev = a["key_cache"].device.type
    compact_verdict(v, paged, a)
    call_args = [a[k] for k in ARG_NAMES[op][:-1]]

    def call():
        if via == "raw":
            return getattr(ops(), op)(*call_args, a["invalid"])
        return getattr(api(), op)(*call_args, invalid=a["invalid"])

    def check(out, pre, snap):
        if out is not None:
            fail(f"{op} returned a value", describe_out(out))
        if dev == "meta":
            return
        rows = [pre[k] for k in ("lengths", "src_index", "count")]
        writes = {}
        for name in ("key_cache", "value_cache"):
            t = pre[name]
            b = t.view(BITS[t.dtype])
            e = ref_paged_compact(b, pre["block_tables"], *rows) if paged else ref_compact(b, *rows)
            writes[name] = e.view(t.dtype)
        check_unchanged_except(snap, writes, f"{op} reference")

    return Case(op, via, args, call, v, check, how)


def _pinned_compact():
    f = torch.tensor
    kc = torch.arange(2 * 1 * 6 * 2, dtype=torch.float32).view(2, 1, 6, 2)
    return [  # the documented overlap example; a bad last row
        make_compact_case(False, "wrapper", dict(key_cache=kc, value_cache=-kc, lengths=f([1, 0]),
                                                 src_index=f([[0, 2, 3], [1, 2, 9]]), count=f([3, 2]), invalid=None)),
        make_compact_case(False, "raw", dict(key_cache=kc.clone(), value_cache=-kc, lengths=f([1, 0]),
                                             src_index=f([[0, 2, 3], [2, 1, 9]]), count=f([3, 2]),
                                             invalid=torch.zeros(2, dtype=torch.bool)))]


def _pinned_paged_compact():
    f = torch.tensor
    kc = torch.arange(4 * 3 * 1 * 2, dtype=torch.float32).view(4, 3, 1, 2)
    return [  # two rows reading one slot (allowed); row 1 writing the slot row 0 reads (refused)
        make_compact_case(True, "raw", dict(key_cache=kc, value_cache=-kc, block_tables=f([[0, 1], [2, 1]]),
                                            lengths=f([2, 1]), src_index=f([[0, 2], [0, 3]]), count=f([2, 2]),
                                            invalid=None)),
        make_compact_case(True, "wrapper", dict(key_cache=kc.clone(), value_cache=-kc, block_tables=f([[0, 1], [2, 1]]),
                                                lengths=f([2, 3]), src_index=f([[0, 2], [0, 2]]), count=f([2, 2]),
                                                invalid=None))]


# =============================================================================================
# paged_kv_gather / paged_kv_gather_into_
# =============================================================================================
@st.composite
def paged_gather_cases(draw, alias: bool = False):
    via = draw(st.sampled_from(["raw", "raw_into", "wrapper", "wrapper_out"]))
    NB, BS, H, D = draw(size(3)), draw(size(4)), draw(size(2)), draw(size(8))
    B, MB, L = draw(size(3)), draw(size(3)), draw(size(8))
    c = Chaos(draw, alias)
    meta = c.meta

    dtype = c.fdtype()
    kc = draw(tensors(draw(float_values(c.shape([NB, BS, H, D]))), dtype, unit_last=True, meta=meta()))
    same = draw(st.integers(0, 5)) == 5  # the same tensor for keys and values (read-only: allowed)
    vc = kc if same else draw(tensors(draw(float_values(c.shape([NB, BS, H, D]))),
                                      dtype if draw(st.integers(0, 11)) else draw(float_dtype(p_bad=2)),
                                      unit_last=True, meta=meta()))
    tvals = torch.tensor(draw(st.lists(st.one_of(st.integers(0, max(NB - 1, 0)), index_value(NB)),
                                       min_size=B * MB, max_size=B * MB)), dtype=torch.int64).reshape(B, MB)
    tables = draw(int_tensor(c.shape([B, MB]), dtype=c.idtype(), bound=NB, values=tvals if draw(st.integers(0, 9)) else None,
                             meta=meta()))
    lvals = torch.tensor(draw(st.lists(st.one_of(st.integers(0, min(L, MB * BS)), index_value(L)), min_size=B, max_size=B)),
                         dtype=torch.int64)
    lengths = draw(int_tensor(c.shape([B]), dtype=c.idtype(), bound=L, values=lvals if draw(st.integers(0, 9)) else None,
                              meta=meta()))
    max_len = L if draw(st.integers(0, 7)) else draw(st.sampled_from([-1, L + 1, 0]))
    if via.startswith("wrapper") and draw(st.integers(0, 7)) == 7:
        max_len = draw(st.sampled_from([float(L), L + 0.5, True, str(L), None]))
    keys_out = values_out = None
    if via in ("raw_into", "wrapper_out"):
        keys_out = draw(tensors(torch.full(c.shape([B, H, L, D]), 5.0), dtype, unit_last=True, meta=meta()))
        values_out = draw(tensors(torch.full(c.shape([B, H, L, D]), 6.0),
                                  dtype if draw(st.integers(0, 11)) else draw(float_dtype(p_bad=2)), unit_last=True,
                                  meta=meta()))
    args = dict(key_cache=kc, value_cache=vc, block_tables=tables, lengths=lengths, max_len=max_len,
                keys_out=keys_out, values_out=values_out)
    how = None
    if alias:
        args, how = draw(alias_some_pair(
            args, ARG_NAMES["paged_kv_gather"], unit_last=("key_cache", "value_cache", "keys_out", "values_out"),
            values_for=lambda n, a: (lvals if n == "lengths" else tvals if n == "block_tables" else a[n]).clone()
            .reshape(a[n].shape) if (lvals if n == "lengths" else tvals if n == "block_tables" else a[n]).numel()
            == a[n].numel() else a[n].clone()))
    return make_paged_gather_case(via, args, how)


def make_paged_gather_case(via, args, how=None):
    kc, vc, tables, lengths, max_len, keys_out, values_out = (args[k] for k in ARG_NAMES["paged_kv_gather"][:7])
    v = Verdict()
    dev = kc.device.type
    into = via in ("raw_into", "wrapper_out")
    v.must("key_cache shape", kc.dim() != 4)
    v.must("value_cache shape", vc.dim() != 4 or tuple(vc.shape) != tuple(kc.shape))
    v.must("key_cache dtype", kc.dtype not in FLOAT_DTYPES)
    v.must("value_cache dtype", vc.dtype != kc.dtype)
    v.must("value_cache device", vc.device != kc.device)
    for name, t in (("key_cache", kc), ("value_cache", vc)):
        v.must(f"{name} head dim stride != 1", t.dim() == 4 and t.shape[3] > 1 and t.stride(3) != 1)
    NB, BS, H, D = (tuple(kc.shape) + (0,) * 4)[:4] if kc.dim() <= 4 else (0,) * 4
    v.must("key_cache block_size 0", kc.dim() == 4 and BS == 0)
    v.must("block_tables shape", tables.dim() != 2)
    v.must("block_tables dtype", tables.dtype not in (torch.int32, torch.int64))
    v.must("block_tables device", tables.device != kc.device)
    B, MB = (tuple(tables.shape) + (0, 0))[:2] if tables.dim() <= 2 else (0, 0)
    check_index(v, lengths, B, "lengths", dev)
    L = None
    if into:
        if via == "wrapper_out" and max_len is not None:
            if isinstance(max_len, bool) or not isinstance(max_len, int):
                v.must(f"max_len of Python type {type(max_len).__name__}")
            elif keys_out.dim() == 4 and keys_out.shape[2] != max_len:
                v.must("max_len differs from out's length")
        v.must("keys_out shape", keys_out.dim() != 4)
        L = keys_out.shape[2] if keys_out.dim() == 4 else 0
        for name, o in (("keys_out", keys_out), ("values_out", values_out)):
            v.must(f"{name} dtype", o.dtype != kc.dtype)
            v.must(f"{name} shape", tuple(o.shape) != (B, H, L, D))
            v.must(f"{name} device", o.device != kc.device)
            v.must(f"{name} head dim stride != 1", o.dim() == 4 and o.shape[3] > 1 and o.stride(3) != 1)
        check_written_overlaps(v, args, ["keys_out", "values_out"])
    else:
        if isinstance(max_len, bool) or not isinstance(max_len, int):
            v.must(f"max_len of Python type {type(max_len).__name__}")
            L = 0
        else:
            L = max_len
            v.must("max_len < 0", L < 0)
    if not v.refuse and dev == "cpu":
        tl = tables.tolist()
        for b, n in enumerate(lengths.tolist()):
            v.must("paged_kv_gather length outside [0, max_len] (CPU raises)", not 0 <= n <= L)
            v.must("paged_kv_gather length beyond the table (CPU raises)", n > MB * BS)
            if 0 <= n <= min(L, MB * BS):
                v.must("paged_kv_gather used table entry outside [0, NB) (CPU raises)",
                       any(not 0 <= tl[b][p // BS] < NB for p in range(0, n, BS)))
    kv_args = args

    def call():
        if via == "raw":
            return ops().paged_kv_gather(kc, vc, tables, lengths, max_len)
        if via == "raw_into":
            return ops().paged_kv_gather_into_(kc, vc, tables, lengths, keys_out, values_out)
        if via == "wrapper":
            return api().paged_kv_gather(kc, vc, tables, lengths, max_len)
        return api().paged_kv_gather(kc, vc, tables, lengths, max_len, out=(keys_out, values_out))

    def check(out, pre, snap):
        if via == "raw_into":
            if out is not None:
                fail("paged_kv_gather_into_ returned a value", describe_out(out))
            keys, values = keys_out, values_out
        else:
            keys, values = out
            if into and (keys is not keys_out or values is not values_out):
                fail("paged_kv_gather(out=) did not return the out tensors", describe_out(out))
        for name, o, c in (("keys", keys, kc), ("values", values, vc)):
            if o.dtype != c.dtype or tuple(o.shape) != (B, H, L, D) or o.device != c.device:
                fail("paged_kv_gather output metadata", f"{name}: {describe(o)}, expected [{B}, {H}, {L}, {D}]")
        if dev == "meta":
            return
        pk, pv = pre["key_cache"], pre["value_cache"]
        ek, ev = torch.zeros(B, H, L, D, dtype=kc.dtype), torch.zeros(B, H, L, D, dtype=kc.dtype)
        tl = pre["block_tables"].tolist()
        for b, n in enumerate(pre["lengths"].tolist()):
            for p in range(n):
                blk = tl[b][p // BS]
                ek[b, :, p] = pk[blk, p % BS]
                ev[b, :, p] = pv[blk, p % BS]
        if into:
            check_unchanged_except(snap, {"keys_out": ek, "values_out": ev}, "paged_kv_gather_into_ reference")
        else:
            check_unchanged_except(snap, {}, "paged_kv_gather writes no argument")
            for name, o, e in (("keys", keys, ek), ("values", values, ev)):
                if not torch.equal(o.contiguous().view(torch.uint8), e.view(torch.uint8)):
                    fail("paged_kv_gather differs from the reference", name)
                if not o.is_contiguous():
                    fail("paged_kv_gather output not contiguous", describe(o))

    # Snapshot the out tensors under their argument names.
    return Case("paged_kv_gather", via, kv_args, call, v, check, how)


# =============================================================================================
# spec_attention_mask / spec_attention_mask_bool (pure Python)
# =============================================================================================
@st.composite
def mask_cases(draw, alias: bool = False):
    additive = draw(st.booleans())
    B = draw(size(3))
    c = Chaos(draw, alias)
    kind = draw(st.sampled_from(["tensor", "list", "int"] + ([] if c.clean else ["bad"])))
    pvals = draw(st.lists(st.one_of(st.integers(0, 6), st.integers(-3, 6), st.sampled_from([INT64_MAX, INT64_MIN])),
                          min_size=B, max_size=B))
    if kind == "tensor":
        meta = c.meta()
        dt = c.idtype() if c.clean or draw(st.integers(0, 4)) else draw(st.sampled_from([torch.float32, torch.bool,
                                                                                         torch.uint8]))
        shp = c.shape([B])
        n = math.prod(shp)
        past = draw(tensors(torch.tensor((pvals + [1] * n)[:n], dtype=torch.int64).reshape(shp), dt, meta=meta))
    elif kind == "list":
        past = pvals
        if draw(st.integers(0, 3)) == 3 and B:
            past = list(pvals)
            past[draw(st.integers(0, B - 1))] = draw(st.sampled_from([1.5, 2.0, True, "1", 2**63, None]))
    elif kind == "int":
        past = pvals[0] if pvals else 0
    else:
        past = draw(st.sampled_from([True, 1.5, "3", None]))

    def maybe_bad(good, bad):
        return draw(good if c.clean or draw(st.integers(0, 4)) else st.sampled_from(bad))

    q_len = maybe_bad(st.integers(0, 4), [-1, 2.0, True, "1"])
    kv_len = maybe_bad(st.integers(0, 12), [-1, 3.0, False, None])
    dtype = maybe_bad(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
                      [torch.int64, torch.bool, "float32"])
    device = draw(st.sampled_from([None, "cpu"] + ([] if c.clean else ["meta"])))
    args = dict(past_lens=past, q_len=q_len, kv_len=kv_len, device=device)
    if additive:
        args["dtype"] = dtype
    return make_mask_case(additive, args)


def make_mask_case(additive, args):
    past, q_len, kv_len, device = args["past_lens"], args["q_len"], args["kv_len"], args["device"]
    dtype = args.get("dtype", torch.bool)
    v = Verdict()
    for name, x in (("q_len", q_len), ("kv_len", kv_len)):
        v.must(f"{name} not an int >= 0", isinstance(x, bool) or not isinstance(x, int) or x < 0)
    if additive:
        v.must("dtype not a floating torch.dtype", not isinstance(dtype, torch.dtype) or not dtype.is_floating_point)
    vals = None
    if isinstance(past, torch.Tensor):
        v.must("past_lens shape", past.dim() != 1)
        v.must("past_lens dtype", past.dtype.is_floating_point or past.dtype == torch.bool)
        v.may("past_lens uint8", past.dtype == torch.uint8)
        out_dev = device if device is not None else past.device.type
        if not is_meta(past):
            vals = past.tolist() if past.dim() == 1 else None
    elif isinstance(past, bool) or not isinstance(past, (int, list)):
        v.must(f"past_lens of Python type {type(past).__name__}")
        out_dev = "cpu"
    else:
        vals = [past] if isinstance(past, int) else past
        bad = [x for x in vals if isinstance(x, bool) or not isinstance(x, int)]
        v.must("past_lens entry not an int", bool(bad))
        v.must("past_lens entry outside int64", not bad and any(not INT64_MIN <= x <= INT64_MAX for x in vals))
        out_dev = device or "cpu"
    if vals is not None and not v.refuse and out_dev == "cpu" and vals:
        v.must("kv_len shorter than max(past_lens) + q_len", max(vals) + q_len > kv_len)
    # A tensor on CPU moved to meta by `device=` (or the reverse): either is fine.
    v.may("past_lens moved between devices", isinstance(past, torch.Tensor) and device not in (None, past.device.type))

    def call():
        kw = {"device": device} if device is not None else {}
        if additive:
            return api().spec_attention_mask(past, q_len, kv_len, dtype, **kw)
        return api().spec_attention_mask_bool(past, q_len, kv_len, **kw)

    def check(out, pre, snap):
        B = len(vals) if vals is not None else (past.shape[0] if isinstance(past, torch.Tensor) else 1)
        if tuple(out.shape) != (B, 1, q_len, kv_len) or out.dtype != dtype or out.device.type != out_dev:
            fail("mask metadata", f"{describe(out)}, expected {dtype} [{B}, 1, {q_len}, {kv_len}] on {out_dev}")
        if out.device.type == "meta" or vals is None:
            return
        allowed = torch.zeros(B, 1, q_len, kv_len, dtype=torch.bool)
        for b, p in enumerate(vals):
            for i in range(q_len):
                pos = p + i
                allowed[b, 0, i] = True if pos < 0 else torch.arange(kv_len) <= pos
        exp = allowed if not additive else torch.where(allowed, torch.zeros((), dtype=dtype),
                                                       torch.full((), torch.finfo(dtype).min, dtype=dtype))
        if not torch.equal(out.cpu(), exp):
            fail("mask differs from the reference", f"past {vals}, q_len {q_len}, kv_len {kv_len}")

    name = "spec_attention_mask" if additive else "spec_attention_mask_bool"
    return Case("spec_attention_mask", name, args, call, v, check)


# =============================================================================================
# filtered_probs / mask_logits (and probs_input)
# =============================================================================================
@st.composite
def filtered_cases(draw):
    """sample's arguments without the randomness, through filtered_probs or mask_logits, now
    and then with probs_input (filtered_probs): the result must be what sample writes to
    probs_out for the same call (bit for bit), and mask_logits must keep exactly its support."""
    via = draw(st.sampled_from(["raw", "wrapper"]))
    op = draw(st.sampled_from(["filtered_probs", "mask_logits"]))
    focus = focus_draw(draw, False)
    B = draw(rarely_zero(4, p=1000 if focus else 10))
    V = draw(FOCUS_VOCAB if focus else vocab_size())
    c = Chaos(draw, focus)
    shape = c.shape([B, V])
    probs_input = op == "filtered_probs" and draw(st.booleans())
    if probs_input:  # probabilities: mostly >= 0, some zeros; now and then a bad one
        vals = draw(float_values(shape, regimes=("randn", "const", "tiny", "big"))).abs()
        if vals.numel() and draw(st.integers(0, 4)) == 0:
            vals.view(-1)[draw(st.integers(0, vals.numel() - 1))] = draw(st.sampled_from([0.0, -1.0, math.nan, math.inf]))
        lvals = vals
    else:
        lvals = draw(float_values(shape, regimes=FOCUS_REGIMES, specials=False) if focus else float_values(shape))
    dtype = torch.float32 if probs_input and draw(st.integers(0, 5)) else c.fdtype()  # probabilities: float32
    logits = draw(tensors(lvals, dtype, meta=c.meta()))
    temperature = draw(py_or_tensor_temperature(B, via, c, values=FOCUS_TEMPERATURES if focus else None))
    filters = draw(filter_args_draw(B, V, via, c, focus))
    if via == "raw":
        temperature = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature))
    args = dict(logits=logits, temperature=temperature, **filters)
    if op == "filtered_probs":
        # a flag of the wrong type: the wrapper's TypeError (torch's own schema check judges the raw op)
        bad_flag = via == "wrapper" and draw(st.integers(0, 19)) == 0
        args["probs_input"] = draw(st.sampled_from([1, "yes", None])) if bad_flag else probs_input
    return make_filtered_case(via, op, args)


def make_filtered_case(via, op, args):
    a = args
    logits, temperature, probs_input = a["logits"], a["temperature"], a.get("probs_input", False)
    seed, offset = (torch.tensor(0), torch.tensor(0)) if via == "raw" else (0, 0)
    # the rules of sample's arguments (logits, temperature, filters) are the rules here
    v = make_sample_case(via, dict(a, seed=seed, offset=offset, probs_out=None)).verdict
    v.must("probs_input not a bool", not isinstance(probs_input, bool))
    float_in = logits.dtype == torch.float32 or (via == "wrapper" and logits.dtype == torch.float64)
    v.must("logits dtype with probs_input", probs_input is True and not float_in)
    dev = logits.device.type
    B, V = (tuple(logits.shape) + (0, 0))[:2] if logits.dim() <= 2 else (0, 0)
    filters = {name: a.get(name) for name in FILTER_NAMES}

    def call():
        if via == "raw":
            if op == "filtered_probs":
                return ops().filtered_probs(logits, temperature, *filters.values(), probs_input)
            return ops().mask_logits(logits, temperature, *filters.values())
        if op == "filtered_probs":
            return api().filtered_probs(logits, temperature, probs_input=probs_input, **filters)
        return api().mask_logits(logits, temperature, **filters)

    def check(out, pre, snap):
        out_dtype = torch.float32 if op == "filtered_probs" or logits.dtype == torch.float64 else logits.dtype
        if out.dtype != out_dtype or tuple(out.shape) != (B, V) or out.device.type != dev:
            fail(f"{op} output metadata", f"{describe(out)}, expected {out_dtype} [{B}, {V}] on {dev}")
        if dev == "meta":
            return
        check_unchanged_except(snap, {}, f"{op} writes only its output")
        ref = torch.full((B, V), 7.0)
        t_ref = pre["temperature"] if "temperature" in pre else torch.tensor(f32(float(temperature)))
        x = pre["logits"].float() if pre["logits"].dtype == torch.float64 else pre["logits"]
        ops().sample(x, t_ref, torch.tensor(0), torch.tensor(0), ref,
                     *(raw_filter(a, pre, name) for name in FILTER_NAMES), bool(probs_input))
        if op == "filtered_probs":
            if not torch.equal(out.view(torch.int32), ref.view(torch.int32)):
                bad = (out.view(torch.int32) != ref.view(torch.int32)).nonzero()[:4].tolist()
                fail("filtered_probs differs from sample's probs_out", f"at {bad}")
            return
        for b in range(B):
            row, r, xb = out[b].float(), ref[b], x[b]
            if bool((r == 0).all()):  # an invalid row (a valid one has mass)
                if not bool(torch.isnan(row).all()):
                    fail("mask_logits: invalid row not all NaN", f"row {b}: {row.tolist()[:8]}")
                continue
            kept = row != -math.inf
            if bool(((r > 0) & ~kept).any()):
                fail("mask_logits: a token with mass in probs_out is masked", f"row {b}")
            if not torch.equal(out[b][kept], xb.to(out.dtype)[kept]):
                fail("mask_logits: a kept logit is not the input's", f"row {b}")
            # a kept token without mass: only where its probability underflows float32
            under = kept & (r == 0) & (xb.float() > -math.inf)
            if bool(under.any()):
                T = float(t_ref if t_ref.dim() == 0 else t_ref[b])
                gap = float((xb.float().max() - xb.float()[under].max()) / max(T, 1e-30)) if T > 0 else math.inf
                if T == 0 or gap < 80:
                    fail("mask_logits keeps a token filtered_probs gives no mass", f"row {b}, T={T}")
    return Case("filtered", via, args, call, v, check)


# =============================================================================================
# logprobs (verify / sample's logprobs=)
# =============================================================================================
@st.composite
def logprobs_cases(draw):
    """The raw op over [B, P, V] logits and emitted tokens (-1 = none, some >= V), or the
    sample wrapper with logprobs=: top ids must be the n largest logits (ties by id), the
    rank the count of logits >= the token's, the logprobs the law's (float64 reference)."""
    via = draw(st.sampled_from(["raw", "wrapper"]))
    focus = focus_draw(draw, False)
    B = draw(rarely_zero(4, p=1000 if focus else 10))
    P = 1 if via == "wrapper" else draw(st.integers(1, 3))
    V = draw(FOCUS_VOCAB if focus else vocab_size())
    c = Chaos(draw, focus)
    shape = c.shape([B, P, V] if via == "raw" else [B, V])
    lvals = draw(float_values(shape, regimes=FOCUS_REGIMES, specials=False) if focus else float_values(shape))
    logits = draw(tensors(lvals, c.fdtype(), meta=c.meta()))
    temperature = draw(py_or_tensor_temperature(B, via, c, values=FOCUS_TEMPERATURES if focus else None))
    filters = draw(filter_args_draw(B, V, via, c, focus))
    processed = draw(st.booleans())
    # out of range, or (the wrapper's TypeError; torch's schema check judges the raw op) a float
    bad = [-1, 129] + ([2.0] if via == "wrapper" else [])
    num_top = draw(st.sampled_from([0, 1, 3, 8]) if draw(st.integers(0, 9)) else st.sampled_from(bad))
    args = dict(logits=logits, temperature=temperature, **filters)
    if via == "raw":
        temperature = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature))
        tok_vals = torch.tensor(draw(st.lists(st.integers(-1, V + 1), min_size=B * P, max_size=B * P)),
                                dtype=torch.int64).view(B, P)
        args.update(temperature=temperature, tokens=draw(tensors(tok_vals, c.idtype(), meta=c.meta())),
                    num_top=num_top, processed=processed)
    else:
        args.update(seed=1, logprobs=num_top, logprobs_mode="processed" if processed else "raw")
    return make_logprobs_case(via, args)


def make_logprobs_case(via, args):
    a = args
    logits, temperature = a["logits"], a["temperature"]
    n, processed = (a["num_top"], a["processed"]) if via == "raw" else (a["logprobs"], a["logprobs_mode"] == "processed")
    dev = logits.device.type
    if via == "raw":
        v = make_sample_case("raw", dict(logits=logits[:, 0] if logits.dim() == 3 else logits,
                                         temperature=temperature, seed=torch.tensor(0), offset=torch.tensor(0),
                                         probs_out=None, **{k: a.get(k) for k in FILTER_NAMES})).verdict
        v.refuse = [r for r in v.refuse if not r.startswith("logits shape")]
        v.must("logits shape", logits.dim() != 3 or logits.shape[2] == 0)
        tokens = a["tokens"]
        B, P = (tuple(logits.shape) + (0, 0))[:2] if logits.dim() == 3 else (0, 0)
        v.must("tokens dtype", tokens.dtype not in (torch.int64, torch.int32))
        v.must("tokens shape", tuple(tokens.shape) != (B, P))
        v.must("tokens device", tokens.device.type != dev)
    else:
        v = make_sample_case("wrapper", dict(logits=logits, temperature=temperature, seed=1, offset=0,
                                             probs_out=None, **{k: a.get(k) for k in FILTER_NAMES})).verdict
        B, P = (logits.shape[0] if logits.dim() == 2 else 0), 1
    v.must("num_top type", isinstance(n, float))
    v.must("num_top range", not isinstance(n, float) and not 0 <= n <= 128)
    filters = [a.get(name) for name in FILTER_NAMES]

    def call():
        if via == "raw":
            return ops().logprobs(logits, a["tokens"], temperature, *filters, n, processed, False)
        return api().sample(logits, temperature, seed=1, logprobs=n, logprobs_mode=a["logprobs_mode"],
                            **{k: a.get(k) for k in FILTER_NAMES})

    def check(out, pre, snap):
        if via == "raw":
            lp, ranks, ids, tops = out
            tok = pre["tokens"].long() if "tokens" in pre else None
            x_all = pre["logits"] if dev != "meta" else None
        else:
            tok1, res = out
            lp, ranks, ids, tops = (None if t is None else t.unsqueeze(1) for t in res)
            if (ranks is None) != (n == 0):  # n = 0: the kernel's own logprobs only, no ranks launch
                fail("logprobs: token_ranks present iff n > 0", f"n={n}, ranks {describe_out(ranks)}")
            tok = tok1.view(-1, 1) if dev != "meta" else None
            x_all = pre["logits"].unsqueeze(1) if dev != "meta" else None
        if tuple(lp.shape) != (B, P) or tuple(ids.shape) != (B, P, n) or ids.dtype != torch.int64 \
                or lp.dtype != torch.float32 or (ranks is not None and ranks.dtype != torch.int64):
            fail("logprobs output metadata", f"{describe(lp)} {describe(ids)}")
        if dev == "meta":
            return
        check_unchanged_except(snap, {}, "logprobs writes only its outputs")
        x_all = x_all.float()
        T = pre["temperature"] if "temperature" in pre else torch.tensor(f32(float(temperature)))
        for b in range(B):
            Tb = float(T if T.dim() == 0 else T[b])
            for i in range(P):
                t, x = int(tok[b, i]), x_all[b, i]
                bad = bool((x != x).any() | (x == math.inf).any() | (x == -math.inf).all())
                no_law = t < 0 or bad or (processed and not valid_temperature(Tb))
                if no_law or t >= x.shape[0]:
                    if not (bool(torch.isnan(lp[b, i])) and (ranks is None or int(ranks[b, i]) == -1)):
                        fail("logprobs: a position without a law / token has a logprob or rank",
                             f"({b}, {i}) token {t}: {float(lp[b, i])}, ranks {describe_out(ranks)}")
                if no_law:
                    if bool((ids[b, i] != -1).any()):
                        fail("logprobs: top ids at a position without a law", f"({b}, {i})")
                    continue
                order = np.lexsort((np.arange(x.shape[0]), -x.double().numpy()))[:n]
                want = torch.full((n,), -1, dtype=torch.int64)
                want[:len(order)] = torch.from_numpy(order)
                if not torch.equal(ids[b, i], want):
                    fail("logprobs: top ids are not the n largest logits (ties by id)",
                         f"({b}, {i}): {ids[b, i].tolist()} vs {want.tolist()}")
                if t >= x.shape[0]:
                    continue
                greedy = processed and Tb == 0
                if ranks is not None and int(ranks[b, i]) != (1 if greedy else int((x >= x[t]).sum())):
                    fail("logprobs: rank is not the count of logits >= the token's", f"({b}, {i})")
                if not processed and bool(torch.isfinite(x).all()) and float(x.max() - x.min()) < 80:
                    ref = float(torch.log_softmax(x.double(), 0)[t])
                    if abs(float(lp[b, i]) - ref) > 1e-4 + 1e-4 * abs(ref):
                        fail("logprobs: raw logprob differs from log_softmax", f"({b}, {i}): {float(lp[b, i])} vs {ref}")
    return Case("logprobs", via, args, call, v, check)


# =============================================================================================
# Targets: one hypothesis search each (run in a subprocess by test_fuzz)
# =============================================================================================
# Known-bug reproducers pinned as explicit examples (hypothesis runs them first).
def _pinned_sample():
    f = torch.tensor
    return [make_sample_case("wrapper", dict(logits=f([[6.34375, 6.0]]), temperature=1e-20, seed=1, offset=0,
                                             probs_out=None)),
            make_sample_case("wrapper", dict(logits=f([[3e38, 0.0]]), temperature=0.5, seed=1, offset=0,
                                             probs_out=None)),
            make_sample_case("wrapper", dict(logits=f([[1.0, 2.0]]), temperature="0.5", seed=1, offset=0,
                                             probs_out=None)),
            # top_k = 2**63 (an int >= 0 no int64 holds): the wrapper raised "ValueError: Overflow
            # when unpacking long long", naming no argument
            make_sample_case("wrapper", dict(logits=torch.zeros(1, 4), temperature=1.0, seed=0, offset=0,
                                             probs_out=None, top_k=2**63, top_p=None, min_p=None)),
            # filters need V < 2^23 (a row's fixed-point mass must fit in 63 bits); any filter
            # tensor counts, even one holding the off value (16 MB of float16 logits)
            make_sample_case("raw", dict(logits=torch.zeros(1, MAX_FILTER_VOCAB, dtype=torch.float16),
                                         temperature=torch.tensor(1.0), seed=torch.tensor(0), offset=torch.tensor(0),
                                         probs_out=None, top_k=torch.tensor(0), top_p=None, min_p=None))]


def _pinned_verify():
    f = torch.tensor
    return [make_verify_case("wrapper", dict(target_logits=f([[[1.5409960746765137]]]), draft_token_ids=torch.zeros(
                                             1, 0, dtype=torch.int64), draft_probs=None, temperature=1e-38, seed=0,
                                             offset=0)),
            make_verify_case("wrapper", dict(target_logits=torch.zeros(1, 2, 4), draft_token_ids=f([[1]]),
                                             draft_probs=None, temperature=1.0,
                                             seed=f([1], device="meta"), offset=0)),
            make_verify_case("wrapper", dict(target_logits=torch.zeros(1, 1, 4), draft_token_ids=torch.zeros(
                                             1, 0, dtype=torch.int64), draft_probs=None, temperature=1.0, seed=0,
                                             offset=0, top_k=2**63, top_p=None, min_p=None, num_drafts=None,
                                             mode="exact"))]


def _pinned_verify_tree():
    """Bugs of the wrapper specdec_ext.verify_tree (specdec_ext/ops/tree.py) found by this
    target; known, they fail until fixed."""
    logits, ids = torch.zeros(1, 3, 4), torch.zeros(1, 3, dtype=torch.int64)
    base = dict(target_logits=logits, tree_token_ids=ids, parents=[-1, 0, 0], draft_probs=None, temperature=1.0,
                seed=0, offset=0, depth=None, top_k=None, top_p=None, min_p=None)

    def case(**kw):
        return make_verify_tree_case("wrapper", dict(base, **kw))

    return [
        # depth=None, B = 0 with per-row parents [0, N]: tree_depth takes max() of an empty
        # tensor: RuntimeError on a valid call
        case(target_logits=torch.zeros(0, 3, 4), tree_token_ids=torch.zeros(0, 3, dtype=torch.int64),
             parents=torch.zeros(0, 3, dtype=torch.int64)),
        # N = 0, parents []: tree_depth's reshape(-1, 0) raises RuntimeError (not the op's ValueError)
        case(target_logits=torch.zeros(1, 0, 4), tree_token_ids=torch.zeros(1, 0, dtype=torch.int64), parents=[]),
        # meta parents, depth=None: tree_depth copies the meta tensor (NotImplementedError)
        case(target_logits=logits.to("meta"), tree_token_ids=ids.to("meta"),
             parents=torch.tensor([-1, 0, 0], device="meta")),
        # a parents list torch.tensor cannot convert: "ValueError: expected sequence of length 3 at
        # dim 1 (got 2)" / "Overflow when unpacking long long", naming no argument
        case(parents=[[-1, 0, 0], [-1, 0]]),
        case(parents=[-1, 0, 2**64]),
        # a float in a parents list is truncated (0.5 -> 0), not refused
        case(parents=[-1, 0, 0.5]),
        # depth of the wrong type goes through int(depth) (1.5 -> 1, "1" -> 1), not refused;
        # one outside int64: RuntimeError from the dispatcher
        case(depth=1.5),
        case(depth=2**63),
    ]


def _pinned_rollback():
    f = torch.tensor
    return [make_kv_rollback_case("wrapper", dict(lengths=f([-2]), num_appended=INT64_MAX, num_kept=f([0]),
                                                  invalid=None)),
            make_kv_rollback_case("wrapper", dict(lengths=f([3]), num_appended=2, num_kept=f([1], device="meta"),
                                                  invalid=None)),
            make_kv_rollback_case("wrapper", dict(lengths=f([5]).expand(3), num_appended=2, num_kept=f([1, 1, 1]),
                                                  invalid=None)),
            make_kv_rollback_case("wrapper", dict(lengths=f([5]), num_appended=2.7, num_kept=f([1]), invalid=None))]


def _pinned_kv_append():
    buf = torch.zeros(2 * 1 * 6 * 2)
    kc = buf.view(1, 2, 6, 2)  # lengths is kc[0, 0, 3]: the first position the append writes
    lengths = buf.view(torch.int64)[3:4]
    lengths[0] = 3
    return [make_kv_append_case("raw", dict(key_cache=kc, value_cache=torch.zeros(1, 2, 6, 2),
                                            new_k=torch.full((1, 2, 3, 2), 1e30), new_v=torch.ones(1, 2, 3, 2),
                                            lengths=lengths, overflow=None), "lengths aliases key_cache")]


def _pinned_paged_append():
    buf = torch.zeros(2 * 2 * 1 * 4)
    kc = buf.view(2, 2, 1, 4)
    slots = buf.view(torch.int64)[:2]
    slots[0], slots[1] = 0, 2  # token 0 goes to slot 0, where slot_mapping itself lives
    return [make_paged_append_case("raw", dict(key_cache=kc, value_cache=torch.zeros(2, 2, 1, 4),
                                               new_k=torch.full((2, 1, 4), 3e38), new_v=torch.ones(2, 1, 4),
                                               slot_mapping=slots, invalid=None), "slot_mapping aliases key_cache")]


def _pinned_gather():
    kc = torch.arange(2 * 2 * 1 * 2, dtype=torch.float32).view(2, 2, 1, 2)
    tables, lengths = torch.tensor([[1, 0]], dtype=torch.int32), torch.tensor([3])
    base = torch.zeros(32)
    # keys_out / values_out: non-dense as_strided views that overlap (elements 3p+d and 1+3p+d).
    keys_out = base.as_strided((1, 1, 4, 2), (16, 16, 3, 1), 0)
    values_out = base.as_strided((1, 1, 4, 2), (16, 16, 3, 1), 1)
    return [make_paged_gather_case("raw", dict(key_cache=kc, value_cache=kc, block_tables=tables, lengths=lengths,
                                               max_len=4, keys_out=None, values_out=None)),
            make_paged_gather_case("raw_into", dict(key_cache=kc, value_cache=kc.clone(), block_tables=tables,
                                                    lengths=lengths, max_len=None, keys_out=keys_out,
                                                    values_out=values_out))]


def _pinned_kv_append_caches():
    base = torch.zeros(64)
    # key_cache / value_cache: non-dense as_strided views that overlap.
    kc = base.as_strided((1, 1, 4, 2), (16, 16, 3, 1), 0)
    vc = base.as_strided((1, 1, 4, 2), (16, 16, 3, 1), 1)
    return [make_kv_append_case("raw", dict(key_cache=kc, value_cache=vc, new_k=torch.ones(1, 1, 2, 2),
                                            new_v=torch.full((1, 1, 2, 2), 2.0), lengths=torch.tensor([1]),
                                            overflow=None), "value_cache overlaps key_cache (non-dense)")]


def _pinned_mask():
    return [make_mask_case(False, dict(past_lens=[1.5], q_len=1, kv_len=4, device=None)),
            make_mask_case(True, dict(past_lens=[2, True], q_len=1, kv_len=4, device=None, dtype=torch.float32))]


# name -> (hypothesis search, pinned cases run after it: reproducers of known bugs)
def _build_targets():
    return {
        "verify": (verify_cases(), _pinned_verify),
        "verify_alias": (verify_cases(alias=True), None),
        "verify_tree": (verify_tree_cases(), _pinned_verify_tree),
        "verify_tree_alias": (verify_tree_cases(alias=True), None),
        "sample": (sample_cases(), _pinned_sample),
        "sample_alias": (sample_cases(alias=True), None),
        "filtered": (filtered_cases(), None),
        "logprobs": (logprobs_cases(), None),
        "kv_append_": (kv_append_cases(), _pinned_kv_append_caches),
        "kv_append_alias": (kv_append_cases(alias=True), _pinned_kv_append),
        "kv_rollback_": (kv_rollback_cases(), _pinned_rollback),
        "kv_rollback_alias": (kv_rollback_cases(alias=True), None),
        "paged_kv_append_": (paged_append_cases(), None),
        "paged_kv_append_alias": (paged_append_cases(alias=True), _pinned_paged_append),
        "paged_kv_gather": (paged_gather_cases(), _pinned_gather),
        "paged_kv_gather_alias": (paged_gather_cases(alias=True), None),
        "kv_compact_": (compact_cases(False), _pinned_compact),
        "kv_compact_alias": (compact_cases(False, alias=True), None),
        "paged_kv_compact_": (compact_cases(True), _pinned_paged_compact),
        "paged_kv_compact_alias": (compact_cases(True, alias=True), None),
        "spec_attention_mask": (mask_cases(), _pinned_mask),
    }


TARGET_NAMES = ["verify", "verify_alias", "verify_tree", "verify_tree_alias", "sample", "sample_alias", "filtered",
                "logprobs", "kv_append_",
                "kv_append_alias", "kv_rollback_", "kv_rollback_alias", "paged_kv_append_", "paged_kv_append_alias",
                "paged_kv_gather", "paged_kv_gather_alias", "kv_compact_", "kv_compact_alias", "paged_kv_compact_",
                "paged_kv_compact_alias", "spec_attention_mask"]


def run_target(name: str) -> int:
    """Child process: run one target's search; print each distinct failure; exit status 1 if any."""
    import faulthandler
    faulthandler.enable()
    torch.set_num_threads(1)
    strategy, pinned = _build_targets()[name]
    failures = []  # (exception, notes)
    if PROFILE in ("ci", "quick"):  # collect every kind of failure, keep the shortest example of each
        seen: Dict[type, tuple] = {}

        def collect(case):
            try:
                run_case(case)
            except AssertionError as err:
                text = repr(case)
                if type(err) not in seen or len(text) < len(seen[type(err)][1][0]):
                    seen[type(err)] = (err, [f"example: {text}"])

        given(case=strategy)(collect)()
        failures += list(seen.values())
    else:
        try:
            given(case=strategy)(run_case)()
        except BaseException as e:  # noqa: BLE001  (an ExceptionGroup when several bugs were found)
            errors = list(e.exceptions) if isinstance(e, BaseExceptionGroup) else [e]
            failures += [(err, getattr(err, "__notes__", [])) for err in errors]
    report(name, "search", failures)
    # Pinned reproducers of known bugs last: one of them may crash the process.
    pinned_failures = []
    for case in (pinned() if pinned else []):
        print(f"pinned example: {case!r}", flush=True)
        try:
            given(st.just(case))(run_case)()
        except AssertionError as e:
            pinned_failures.append((e, [f"example: {case!r}"]))
    report(name, "pinned examples", pinned_failures)
    return 1 if failures or pinned_failures else 0


def report(name, what, failures):
    if not failures:
        print(f"=== {name} [{PROFILE}] {what}: passed", flush=True)
        return
    print(f"=== {name} [{PROFILE}] {what}: {len(failures)} failure(s)")
    for err, notes in failures:
        print(f"--- {err}")
        for n in notes:
            print("    " + n.replace("\n", "\n    "))
    sys.stdout.flush()


# =============================================================================================
# pytest side: every target in a subprocess (crash isolation), two at a time
# =============================================================================================
_TIMEOUT_S = 1800 if PROFILE == "long" else 600


def _spawn(name: str):
    """Run ``python test_fuzz_ops.py name`` (in a fork of cli_runner's helper, which imported
    torch and specdec_ext once): (exit status or None on a timeout, its output, the last
    example it tried)."""
    import cli_runner

    with tempfile.NamedTemporaryFile("w+", suffix=".txt", delete=False) as f:
        last = f.name
    # OMP_NUM_THREADS and PYTHONFAULTHANDLER act at start-up, which a fork of cli_runner's helper
    # skips: run_target() does the same itself (torch.set_num_threads(1), faulthandler.enable())
    env = dict(SPECDEC_FUZZ_LAST=last, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    try:
        proc = cli_runner.run([os.path.abspath(__file__), name], extra_env=env, timeout=_TIMEOUT_S,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = None, f"timed out after {_TIMEOUT_S} s\n{e.stdout or ''}{e.stderr or ''}"
    with open(last) as f:
        last_case = f.read()
    os.unlink(last)
    return rc, out, last_case


class _Runs(dict):
    """target -> a Future of _spawn(target); a target not started ahead runs when asked for."""

    def __missing__(self, name):
        self[name] = concurrent.futures.Future()
        self[name].set_result(_spawn(name))
        return self[name]


@pytest.fixture(scope="module")
def fuzz_runs(request):
    """Start the selected targets' subprocesses (os.cpu_count() at a time, at most 4) on first
    use. A pytest-xdist worker runs a share of the tests it does not know ahead: there each
    target runs when its test does (the workers side by side are the parallelism)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        yield _Runs()
        return
    wanted = [item.callspec.params["target"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_fuzz" and hasattr(item, "callspec")]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
    futures = _Runs((name, pool.submit(_spawn, name)) for name in wanted)
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_fuzz(target, fuzz_runs):
    rc, out, last_case = fuzz_runs[target].result()
    if rc == 0:
        return
    if rc is None:
        pytest.fail(f"fuzz target {target} timed out; last example: {last_case}\n{out[-4000:]}", pytrace=False)
    if rc < 0:
        sig = signal.Signals(-rc).name
        pytest.fail(f"fuzz target {target} CRASHED with {sig}; last example:\n  {last_case}\n{out[-3000:]}",
                    pytrace=False)
    pytest.fail(f"fuzz target {target} found failures:\n{out[-12000:]}", pytrace=False)


if __name__ == "__main__":
    sys.exit(run_target(sys.argv[1]))
