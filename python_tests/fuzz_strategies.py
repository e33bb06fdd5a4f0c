"""Hypothesis building blocks for the fuzz suite (python_tests/test_fuzz_ops.py).

A tensor argument is built in two steps: its logical *values* (a small contiguous tensor)
and a *layout* (sizes, strides, storage offset) on a storage that is larger than the view
and pre-filled with a sentinel byte, so that a read or a write outside the view is visible.
Every layout -- contiguous, permuted, sliced with a step, gapped ``as_strided`` with a
storage offset, expanded (stride 0), rows overlapping each other -- is expressed the same way,
and two arguments can be placed in ONE byte buffer (reinterpreted with ``.view(dtype)``) to
alias each other fully, partly or not at all.

Draw order is chosen so that hypothesis shrinks toward the plain case: the first entry of
every ``sampled_from`` is the ordinary one (contiguous, valid dtype, CPU).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from hypothesis import strategies as st

SENTINEL = 0xA5  # fills the unused bytes of every storage

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BAD_FLOAT_DTYPES = [torch.float64, torch.int64, torch.int32, torch.bool, torch.uint8, torch.complex64]
INDEX_DTYPES = [torch.int64, torch.int32]
BAD_INDEX_DTYPES = [torch.float32, torch.int16, torch.uint8, torch.bool, torch.float64]

# Extreme float values sprinkled into float tensors (converted to the tensor's dtype).
FLOAT_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 3e38, -3e38, 3.4028234663852886e38,
                  1e-45, -1e-45, 1e-40, 1.1754943508222875e-38, 65504.0, -65504.0, 1e30, -1e30]
# Temperatures: tiny, huge, zero, negative, NaN, inf, denormal.
TEMPERATURES = [1.0, 0.0, 0.5, 1e-38, 3e38, 1e-20, 1e-5, 1e5, -0.0, -1.0, float("nan"), float("inf"),
                float("-inf"), 1e-40, 1e-45, 1e-300, 1e39, 3.4028234663852886e38, 2.0]
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
# Extreme integers for index tensors (lengths, slots, tables, draft ids).
INT_SPECIALS = [-1, -2, 2**31 - 1, -(2**31), 2**32, INT64_MAX, INT64_MIN, INT64_MAX - 1]


def index_value(bound: int):
    """Small ints around [0, bound] (shrinking to 0) or an extreme one."""
    return st.one_of(st.integers(0, max(bound, 0) + 1), st.integers(-3, bound + 3), st.sampled_from(INT_SPECIALS))


def float_dtype(p_bad: int = 10):
    """A cache / logits dtype: float32|float16|bfloat16 mostly, a wrong one 1 time in p_bad."""
    return st.integers(0, p_bad - 1).flatmap(
        lambda r: st.sampled_from(BAD_FLOAT_DTYPES) if r == p_bad - 1 else st.sampled_from(FLOAT_DTYPES))


def index_dtype(p_bad: int = 10):
    return st.integers(0, p_bad - 1).flatmap(
        lambda r: st.sampled_from(BAD_INDEX_DTYPES) if r == p_bad - 1 else st.sampled_from(INDEX_DTYPES))


def size(max_value: int, *, zero: bool = True):
    """A dimension size, 0 allowed (shrinks toward 1: the ordinary case)."""
    lo = 0 if zero else 1
    return st.integers(1, max_value).flatmap(lambda n: st.sampled_from([n, lo]) if zero else st.just(n))


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------
@st.composite
def float_values(draw, shape: Sequence[int], *, regimes=("randn", "big", "huge", "const", "mostly_neg_inf", "tiny"),
                 specials: bool = True):
    """float64 values of the given shape: a random regime (from a drawn seed) plus a few
    extreme entries placed by hypothesis (so they shrink away; none when not `specials`)."""
    shape = tuple(shape)
    n = math.prod(shape)
    regime = draw(st.sampled_from(regimes))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if regime == "big":
        x = x * 1e30
    elif regime == "huge":
        x = torch.where(x > 0, 3e38, -3e38) * torch.rand(n, generator=g, dtype=torch.float64).clamp_min(0.5)
    elif regime == "const":
        x = torch.full((n,), float(torch.randint(-5, 6, (), generator=g)), dtype=torch.float64)
    elif regime == "mostly_neg_inf":
        x = torch.where(torch.rand(n, generator=g) < 0.8, float("-inf"), x)
    elif regime == "tiny":
        x = x * 1e-40
    elif regime == "peaky":  # a few tokens hold most of the mass: top-p / min-p cut deep
        x = x * 4
    if n and specials:
        for i, v in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(FLOAT_SPECIALS)), max_size=3)):
            x[i] = v
    return x.reshape(shape)


@st.composite
def prob_values(draw, shape):
    """Draft probabilities: normalised rows mostly, sometimes anything from float_values."""
    if draw(st.integers(0, 3)) == 3:
        return draw(float_values(shape))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(tuple(shape), generator=g, dtype=torch.float64) ** 4
    if x.numel():
        x = x / x.sum(-1, keepdim=True).clamp_min(1e-30)
        flat = x.view(-1)
        for i, v in draw(st.lists(st.tuples(st.integers(0, flat.numel() - 1),
                                            st.sampled_from([0.0, 1.0, float("nan"), float("inf"), -1e-3, 3e38, 1e-45])),
                                  max_size=2)):
            flat[i] = v
    return x


def cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values (float64 or int64) as dtype; non-finite values become extremes for integer dtypes."""
    if dtype == torch.bool:
        return values != 0
    if not dtype.is_floating_point and not dtype.is_complex and values.dtype.is_floating_point:
        values = torch.nan_to_num(values, nan=0.0, posinf=2**62, neginf=-(2**62)).clamp(-(2**62), 2**62).to(torch.int64)
    if values.dtype == torch.int64 and dtype != torch.int64 and not dtype.is_floating_point and not dtype.is_complex:
        info = torch.iinfo(dtype)
        values = values.clamp(info.min, info.max)  # keep the conversion defined
    return values.to(dtype)


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------
@dataclass
class Layout:
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]
    offset: int  # in elements
    kind: str

    @property
    def span(self) -> int:
        """Elements of storage needed (offset included)."""
        if any(s == 0 for s in self.sizes):
            return self.offset
        return self.offset + 1 + sum((s - 1) * abs(st_) for s, st_ in zip(self.sizes, self.strides))


def contiguous_strides(sizes: Sequence[int]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


LAYOUT_KINDS = ["contiguous", "permuted", "sliced", "as_strided", "expanded", "overlapping"]


@st.composite
def layouts(draw, sizes: Sequence[int], kinds: Sequence[str] = LAYOUT_KINDS, unit_last: bool = False):
    """A layout of the given sizes. unit_last keeps stride 1 in the last dim (most of the time:
    1 time in 8 it is broken on purpose, so the op's stride check is exercised)."""
    sizes = tuple(int(s) for s in sizes)
    nd = len(sizes)
    kind = draw(st.sampled_from(list(kinds)))
    offset = 0
    if kind == "contiguous" or nd == 0:
        strides = contiguous_strides(sizes)
    elif kind == "permuted":
        perm = draw(st.permutations(range(nd)))
        if unit_last and draw(st.integers(0, 7)) != 7:
            perm = [d for d in perm if d != nd - 1] + [nd - 1]
        inner = contiguous_strides([sizes[d] for d in perm])
        strides = [0] * nd
        for pos, d in enumerate(perm):
            strides[d] = inner[pos]
        strides = tuple(strides)
    elif kind == "sliced":  # big[o0::s0, o1::s1, ...]
        steps = [draw(st.integers(1, 3)) for _ in range(nd)]
        if unit_last and draw(st.integers(0, 7)) != 7:
            steps[-1] = 1
        pads = [draw(st.integers(0, 2)) for _ in range(nd)]
        big = [s * st_ + p for s, st_, p in zip(sizes, steps, pads)]
        big_strides = contiguous_strides(big)
        strides = tuple(b * st_ for b, st_ in zip(big_strides, steps))
        offset = sum(draw(st.integers(0, p)) * b for p, b in zip(pads, big_strides))
    elif kind == "as_strided":  # gaps between rows + a storage offset
        gaps = [draw(st.integers(0, 3)) for _ in range(nd)]
        if unit_last or draw(st.booleans()):
            gaps[-1] = 0
        strides = contiguous_strides([s + g for s, g in zip(sizes, gaps)])
        offset = draw(st.integers(0, 7))
    elif kind == "expanded":  # stride 0 along one dim
        d = draw(st.integers(0, nd - 1))
        if unit_last and nd > 1:
            d = min(d, nd - 2)
        strides = list(contiguous_strides(sizes))
        strides[d] = 0
        strides = tuple(strides)
        offset = draw(st.integers(0, 3))
    else:  # "overlapping": rows share elements (stride smaller than the row below)
        strides = list(contiguous_strides(sizes))
        if nd >= 2:
            d = draw(st.integers(0, nd - 2))
            strides[d] = draw(st.integers(1, max(1, strides[d])))
        strides = tuple(strides)
        offset = draw(st.integers(0, 3))
    return Layout(sizes, tuple(strides), offset, kind)


def _new_buffer(nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    nbytes = (max(nbytes, 0) + 7) // 8 * 8 + 8
    return torch.full((nbytes,), 1 if dtype == torch.bool else SENTINEL, dtype=torch.uint8)


def materialize(values: torch.Tensor, layout: Layout, dtype: torch.dtype, *, buffer: Optional[torch.Tensor] = None,
                byte_offset: int = 0) -> torch.Tensor:
    """A tensor of `dtype` with `layout`, holding `values` (for layouts with overlapping elements,
    one of the values that land on a shared element), in `buffer` (uint8, shared with other
    tensors) at `byte_offset`, or in a fresh sentinel-filled buffer."""
    item = torch.empty((), dtype=dtype).element_size()
    if buffer is None:
        buffer = _new_buffer(layout.span * item, dtype)
        byte_offset = 0
    assert byte_offset % 8 == 0 and byte_offset + layout.span * item <= buffer.numel()
    region = buffer[byte_offset:byte_offset + (layout.span * item + item - 1) // item * item]
    flat = region.view(dtype)
    out = flat.as_strided(layout.sizes, layout.strides, layout.offset)
    if out.numel():
        where = torch.arange(flat.numel()).as_strided(layout.sizes, layout.strides, layout.offset)
        flat[where.reshape(-1)] = cast(values, dtype).reshape(-1)
    return out


def meta_like(layout: Layout, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(layout.sizes, layout.strides, dtype=dtype, device="meta")


@st.composite
def tensors(draw, values: torch.Tensor, dtype: torch.dtype, *, unit_last: bool = False, meta: bool = False,
            kinds: Sequence[str] = LAYOUT_KINDS):
    """`values` as a `dtype` tensor with a random layout (on meta when `meta`)."""
    layout = draw(layouts(values.shape, kinds, unit_last))
    if meta:
        return meta_like(layout, dtype)
    return materialize(values, layout, dtype)


# ---------------------------------------------------------------------------------------------
# Aliasing: two arguments in one buffer
# ---------------------------------------------------------------------------------------------
@st.composite
def alias_pair(draw, a: torch.Tensor, b: torch.Tensor, *, b_values: Optional[torch.Tensor] = None,
               unit_last_a: bool = False, unit_last_b: bool = False):
    """Rebuild tensors a and b (same values / dtypes, new layouts) inside ONE byte buffer.

    b starts at a byte offset drawn from: a's start (full overlap when same shape), inside a,
    just past a (same storage, disjoint), or as a itself reinterpreted (b = a when the
    dtypes and shapes match). The tensor written last wins on the shared bytes; which one is
    drawn. b_values overrides the values written into b (e.g. valid lengths into a cache)."""
    la = draw(layouts(a.shape, unit_last=unit_last_a))
    lb = draw(layouts(b.shape, unit_last=unit_last_b))
    ia, ib = a.element_size(), b.element_size()
    bytes_a = la.span * ia
    where = draw(st.sampled_from(["same_start", "inside", "after", "identical"]))
    if where == "identical" and a.dtype == b.dtype and a.shape == b.shape:
        buf = _new_buffer(bytes_a, a.dtype)
        ta = materialize(a, la, a.dtype, buffer=buf)
        return ta, ta, "identical"
    if where == "after":
        off_b = (bytes_a + 7) // 8 * 8 + 8 * draw(st.integers(0, 1))
    elif where == "inside":
        off_b = 8 * draw(st.integers(0, max(0, bytes_a // 8)))
    else:
        off_b = 0
    buf = _new_buffer(max(bytes_a, off_b + lb.span * ib), a.dtype)
    b_vals = b if b_values is None else b_values
    if draw(st.booleans()):
        ta = materialize(a, la, a.dtype, buffer=buf)
        tb = materialize(b_vals, lb, b.dtype, buffer=buf, byte_offset=off_b)
    else:
        tb = materialize(b_vals, lb, b.dtype, buffer=buf, byte_offset=off_b)
        ta = materialize(a, la, a.dtype, buffer=buf)
    return ta, tb, where


# ---------------------------------------------------------------------------------------------
# Memory: exact overlap, snapshots
# ---------------------------------------------------------------------------------------------
def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def byte_set(t: torch.Tensor) -> set:
    """(storage ptr, byte) of every byte the tensor's elements cover (small tensors only)."""
    if t.device.type == "meta" or t.numel() == 0:
        return set()
    item = t.element_size()
    offs = torch.zeros((), dtype=torch.int64).as_strided(t.shape, [0] * t.dim()).clone()
    for d in range(t.dim()):
        shape = [1] * t.dim()
        shape[d] = t.shape[d]
        offs = offs + torch.arange(t.shape[d]).view(shape) * t.stride(d)
    offs = (offs.reshape(-1) + t.storage_offset()) * item
    base = t.untyped_storage().data_ptr()
    starts = torch.unique(offs)
    return {(base, int(s) + k) for s in starts for k in range(item)}


def internal_overlap(t: Optional[torch.Tensor]) -> bool:
    """True when two different elements of t share memory."""
    if t is None or t.device.type == "meta" or t.numel() <= 1:
        return False
    return len(byte_set(t)) < t.numel() * t.element_size()


def overlaps(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    if a is None or b is None or not is_tensor(a) or not is_tensor(b):
        return False
    if a.device.type == "meta" or b.device.type == "meta":
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return bool(byte_set(a) & byte_set(b))


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


class Snapshot:
    """Byte copies of the storages of the given CPU tensors."""

    def __init__(self, tensors: Dict[str, torch.Tensor]):
        self.tensors = {k: t for k, t in tensors.items() if is_tensor(t) and t.device.type == "cpu"}
        self.before: Dict[int, torch.Tensor] = {}
        for t in self.tensors.values():
            key = t.untyped_storage().data_ptr()
            if key not in self.before and t.untyped_storage().nbytes():
                self.before[key] = storage_bytes(t).clone()

    def changed(self) -> List[str]:
        """Names of the tensors whose storage changed since the snapshot."""
        out = []
        for name, t in self.tensors.items():
            key = t.untyped_storage().data_ptr()
            if key in self.before and not torch.equal(self.before[key], storage_bytes(t)):
                out.append(name)
        return out

    def expected_after(self, writes: Dict[str, torch.Tensor]) -> Dict[int, torch.Tensor]:
        """The storages as they should be after the op wrote `writes` (name -> values) into the
        tensors of those names (bit copies; the written tensors must not overlap each other)."""
        exp = {k: v.clone() for k, v in self.before.items()}
        for name, values in writes.items():
            t = self.tensors.get(name)
            if t is None or t.numel() == 0:
                continue
            view = torch.empty(0, dtype=t.dtype).set_(exp[t.untyped_storage().data_ptr()].untyped_storage(),
                                                     t.storage_offset(), t.shape, t.stride())
            view.copy_(values)
        return exp

    def differences(self, writes: Dict[str, torch.Tensor]) -> List[str]:
        """Names of tensors whose storage differs from the expected state after `writes`."""
        exp = self.expected_after(writes)
        out = []
        for name, t in self.tensors.items():
            key = t.untyped_storage().data_ptr()
            if key in exp and not torch.equal(exp[key], storage_bytes(t)):
                out.append(name)
        return out


def describe(x) -> str:
    """Short readable form of an argument, for hypothesis notes and crash reports."""
    if not is_tensor(x):
        return repr(x)
    head = f"Tensor({x.dtype}, {x.device.type}, shape={list(x.shape)}, stride={list(x.stride())}, off={x.storage_offset()}"
    if x.device.type == "meta":
        return head + ")"
    vals = x.tolist() if x.numel() <= 24 else f"[{x.numel()} values]"
    return head + f", {vals})"
