"""The CUDA KV-cache kernels (csrc/cuda/kv_kernels.cuh, launched by kv_launch.cuh) through
the ``gpu`` fixture: in the SIMT emulation on every machine (each call under several thread
schedules, results bit-identical) and on the GPU where there is one.

Every op is checked bit for bit against plain PyTorch indexing on CPU clones, with the
CUDA semantics of csrc/op_schemas.h: rows / slots that would write out of bounds are
skipped and reported through the sticky flag tensors (set, never cleared), gather clamps
lengths and zero-fills positions whose table entry is out of range.

Caches and output buffers live inside byte arenas pre-filled with 0xFF (NaN in float32,
float16 and bfloat16): the whole arena is compared after each op, so a stray or missing
write anywhere (the gaps of a strided view, bytes around a misaligned one) fails the test.
The arenas also give views at any byte offset, which selects the vector width of the copy
kernels (16 / 8 / 4 / 2 / 1 bytes, launch_plan.h: plan_copies); ``plan_vector_bytes``
mirrors that choice so each width case asserts it really runs the width it names.
"""
from __future__ import annotations

import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]
POISON = 0xFF  # an unwritten byte; 0xFF.. is NaN in every cache dtype
KV_THREADS = 256  # threads per block of the copy kernels (launch_plan.h: kKVThreads)

_TYPESTR = {torch.float16: "<f2", torch.float32: "<f4"}


def _name(x):
    """Test id of a dtype parameter (float16, int32, ...)."""
    return str(x).split(".")[-1] if isinstance(x, torch.dtype) else None


# ---- byte arenas and views into them ---------------------------------------------------

def esize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def gapped_strides(shape, pad=1):
    """Element strides of ``shape`` laid out row-major with ``pad`` spare rows (of
    shape[-1] elements) after every run of each outer dim: the head dim is contiguous,
    nothing else is, and every stride is a multiple of the row (so the byte strides never
    narrow the vector width below what the row size and the data pointer allow)."""
    D = shape[-1]
    strides = [1] * len(shape)
    if len(shape) >= 2:
        strides[-2] = D
    for i in range(len(shape) - 3, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1] + pad * D
    return tuple(strides)


def span_elems(shape, strides):
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0


def typed_view(arena, byte_offset, dtype, shape, strides):
    """A ``dtype`` tensor of ``shape`` / element ``strides`` whose data starts
    ``byte_offset`` bytes into the uint8 tensor ``arena`` (sharing its memory). Any byte
    offset works: an odd one gives an address only 1-byte vectors divide."""
    es = esize(dtype)
    n = (arena.numel() - byte_offset) // es
    if byte_offset % es == 0:
        flat = arena[byte_offset:byte_offset + n * es].view(dtype)
        return flat.as_strided(shape, strides)
    if arena.device.type == "cpu":
        flat = torch.frombuffer(arena.numpy(), dtype=dtype, offset=byte_offset, count=n)
        return flat.as_strided(shape, strides)
    # a device pointer that is not a multiple of the element size: through the CUDA array
    # interface (the arena must outlive the view; torch never touches the view's data)
    iface = {"data": (arena.data_ptr() + byte_offset, False), "shape": tuple(shape),
             "strides": tuple(s * es for s in strides), "typestr": _TYPESTR[dtype], "version": 2}
    holder = type("CudaArray", (), {"__cuda_array_interface__": iface})()
    return torch.as_tensor(holder, device=arena.device)


class Buf:
    """A poisoned byte arena holding one strided tensor view at a byte offset; kept on the
    CPU (``host``, the one the expected result is computed on) and on the backend's
    device (``dev``). ``expect`` is a clone of the host arena with the same view."""

    def __init__(self, gpu, shape, dtype, byte_offset=0, pad=1, fill=None, gen=None):
        self.shape, self.dtype, self.offset = tuple(shape), dtype, byte_offset
        self.strides = gapped_strides(self.shape, pad)
        nbytes = byte_offset + span_elems(self.shape, self.strides) * esize(dtype) + 48
        self.host = torch.full((nbytes,), POISON, dtype=torch.uint8)
        view = self.view(self.host)
        if fill == "randn":
            view.copy_(torch.randn(self.shape, generator=gen).to(dtype))
        elif fill is not None:
            view.copy_(fill)
        self.expect_arena = self.host.clone()  # before the device copy: on simt gpu.to() is the identity
        self.expect = self.view(self.expect_arena)
        self.arena = gpu.to(self.host.clone())
        self.dev = self.view(self.arena)

    def view(self, arena):
        return typed_view(arena, self.offset, self.dtype, self.shape, self.strides)

    def check(self, what=""):
        """The whole device arena (the view and every byte around it) equals the expected one."""
        got = self.arena.cpu()
        bad = (got != self.expect_arena).nonzero().flatten()
        assert bad.numel() == 0, (f"{what}: {bad.numel()} bytes differ, first at byte {int(bad[0])} "
                                  f"(view starts at byte {self.offset})")


def plan_vector_bytes(row_bytes, *tensors):
    """The vector width the launchers choose (kv_launch.cuh: pair_alignment, launch_plan.h:
    plan_copies): the lowest set bit of the row size, 16, every data pointer and every byte
    stride but the head dim's."""
    acc = row_bytes | 16
    for t in tensors:
        acc |= t.data_ptr() if t.numel() else 0
        for d in range(t.dim() - 1):
            acc |= t.stride(d) * t.element_size()
    return acc & -acc


def assert_equal(got, expected, what=""):
    """Same shape, dtype and bits (NaN-safe)."""
    got = got.cpu()
    assert got.shape == expected.shape and got.dtype == expected.dtype, (what, got.shape, got.dtype)
    if got.is_floating_point():
        got, expected = got.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    assert torch.equal(got, expected), f"{what}: got {got} expected {expected}"


def randn(shape, dtype, gen):
    return torch.randn(shape, generator=gen).to(dtype)


def index_tensor(values, dtype):
    """An int tensor of Python ints (extremes of the dtype allowed)."""
    return torch.tensor(values, dtype=dtype)


# (dtype, head dim, byte offset of the caches / outputs, vector width it selects)
WIDTH_CASES = [
    (torch.float32, 16, 0, 16),   # 64-byte rows
    (torch.float16, 32, 0, 16),
    (torch.bfloat16, 8, 0, 16),   # 16-byte rows: one vector
    (torch.float16, 12, 0, 8),    # 24-byte rows
    (torch.float32, 6, 0, 8),
    (torch.float32, 4, 8, 8),     # 16-byte rows, 8-byte aligned view
    (torch.float16, 6, 0, 4),     # 12-byte rows
    (torch.float32, 3, 0, 4),
    (torch.float32, 16, 4, 4),    # view at an odd float32 element
    (torch.float16, 3, 0, 2),     # 6-byte rows
    (torch.bfloat16, 1, 0, 2),    # D = 1
    (torch.float16, 32, 2, 2),    # view at an odd float16 element
    (torch.bfloat16, 8, 6, 2),
    (torch.float16, 32, 1, 1),    # odd byte address: byte copies
    (torch.float32, 4, 3, 1),
]
WIDTH_IDS = [f"{_name(d)}-D{D}-off{o}-v{w}" for d, D, o, w in WIDTH_CASES]


# ---- kv_append_ --------------------------------------------------------------------------

def ref_append(expect, new, lengths, ok=None):
    """expect[b, :, n:n+S] = new[b] for each row b (with ok[b], when given)."""
    S = new.shape[2]
    for b, n in enumerate(lengths.tolist()):
        if ok is None or ok[b]:
            expect[b, :, n:n + S] = new[b]


def new_pair(gpu, B, H, S, D, dtype, gen):
    """new_k / new_v as a [B, S, H, D] projection viewed [B, H, S, D] (transposed); CPU
    copies and the device views."""
    k_host, v_host = randn((B, S, H, D), dtype, gen), randn((B, S, H, D), dtype, gen)
    k_dev, v_dev = gpu.to(k_host, v_host)
    return k_host.transpose(1, 2), v_host.transpose(1, 2), k_dev.transpose(1, 2), v_dev.transpose(1, 2)


@pytest.mark.parametrize("lengths_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("S", [1, 4, 6])
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_append_matches_reference(gpu, dtype, S, lengths_dtype):
    """Ragged rows (one filled exactly to max_len, one empty), strided caches and sources,
    flags given but untouched when every row fits."""
    gen = torch.Generator().manual_seed(S * 10 + DTYPES.index(dtype))
    B, H, M, D = 5, 3, 16, 8
    kc, vc = Buf(gpu, (B, H, M, D), dtype), Buf(gpu, (B, H, M, D), dtype)
    nk, nv, nk_dev, nv_dev = new_pair(gpu, B, H, S, D, dtype, gen)
    lengths = torch.randint(0, M - S + 1, (B,), generator=gen).to(lengths_dtype)
    lengths[0], lengths[1] = M - S, 0
    flags = torch.tensor([False, True, False, False, True])
    ref_append(kc.expect, nk, lengths)
    ref_append(vc.expect, nv, lengths)
    lengths_dev, flags_dev = gpu.to(lengths.clone(), flags.clone())
    gpu.kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, lengths_dev, overflow=flags_dev)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(lengths_dev, lengths, "lengths must not be advanced")
    assert_equal(flags_dev, flags, "overflow flags of fitting rows")


@pytest.mark.parametrize("dtype, D, offset, width", WIDTH_CASES, ids=WIDTH_IDS)
def test_append_vector_widths(gpu, dtype, D, offset, width):
    gen = torch.Generator().manual_seed(D + offset)
    B, H, M, S = 2, 2, 8, 3
    kc, vc = Buf(gpu, (B, H, M, D), dtype, offset), Buf(gpu, (B, H, M, D), dtype, offset)
    nk, nv, nk_dev, nv_dev = new_pair(gpu, B, H, S, D, dtype, gen)
    assert plan_vector_bytes(D * esize(dtype), kc.dev, vc.dev, nk_dev, nv_dev) == width
    lengths = torch.tensor([5, 1])
    ref_append(kc.expect, nk, lengths)
    ref_append(vc.expect, nv, lengths)
    gpu.kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, gpu.to(lengths))
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")


@pytest.mark.parametrize("lengths_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=_name)
def test_append_overflow_rows_skipped_and_flagged(gpu, dtype, lengths_dtype):
    """Rows with lengths[b] < 0 or lengths[b] + S > max_len (extremes of the index dtype
    included) are skipped and flagged; the others are written; flags are sticky; lengths
    and the flag tensor are strided views whose other elements stay untouched."""
    gen = torch.Generator().manual_seed(7)
    info = torch.iinfo(lengths_dtype)
    B, H, M, D, S = 7, 2, 10, 8, 4
    values = [0, M - S + 1, info.min, M - S, info.max, 3, -1]
    ok = [True, False, False, True, False, True, False]
    kc, vc = Buf(gpu, (B, H, M, D), dtype), Buf(gpu, (B, H, M, D), dtype)
    nk, nv, nk_dev, nv_dev = new_pair(gpu, B, H, S, D, dtype, gen)
    lbuf = torch.full((2 * B,), 5, dtype=lengths_dtype)
    lbuf[::2] = index_tensor(values, lengths_dtype)
    fbuf = torch.tensor([False, True] * B)
    fbuf[::2] = torch.tensor([False, False, True, True, False, False, False])  # preset: one bad, one good row
    expected_flags = fbuf.clone()
    expected_flags[::2] |= ~torch.tensor(ok)
    ref_append(kc.expect, nk, lbuf[::2], ok)
    ref_append(vc.expect, nv, lbuf[::2], ok)
    lbuf_dev, fbuf_dev = gpu.to(lbuf.clone(), fbuf.clone())
    gpu.kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, lbuf_dev[::2], overflow=fbuf_dev[::2])
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(lbuf_dev, lbuf, "lengths (and the elements between them)")
    assert_equal(fbuf_dev, expected_flags, "overflow flags (and the elements between them)")

    # sticky: a later step where every row fits clears nothing
    good = gpu.to(torch.zeros(B, dtype=lengths_dtype))
    ref_append(kc.expect, nk, torch.zeros(B, dtype=torch.int64))
    ref_append(vc.expect, nv, torch.zeros(B, dtype=torch.int64))
    gpu.kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, good, overflow=fbuf_dev[::2])
    gpu.sync()
    kc.check("key_cache after a good step")
    assert_equal(fbuf_dev, expected_flags, "overflow flags after a good step")

    # without a flag tensor the bad rows are skipped silently
    kc2, vc2 = Buf(gpu, (B, H, M, D), dtype), Buf(gpu, (B, H, M, D), dtype)
    ref_append(kc2.expect, nk, lbuf[::2], ok)
    ref_append(vc2.expect, nv, lbuf[::2], ok)
    gpu.kv_append_(kc2.dev, vc2.dev, nk_dev, nv_dev, lbuf_dev[::2])
    gpu.sync()
    kc2.check("key_cache, no flags")
    vc2.check("value_cache, no flags")


def test_append_flag_threads_only_and_s_beyond_max_len(gpu):
    """S = 0 launches only the flag threads (a row is bad iff its length is outside
    [0, max_len]); S > max_len makes every row overflow; nothing is written either way."""
    gen = torch.Generator().manual_seed(3)
    B, H, M, D = 4, 2, 6, 8
    kc, vc = Buf(gpu, (B, H, M, D), torch.float16), Buf(gpu, (B, H, M, D), torch.float16)
    lengths = gpu.to(torch.tensor([-1, 0, M, M + 1]))
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    empty = gpu.to(torch.zeros(B, H, 0, D, dtype=torch.float16))
    gpu.kv_append_(kc.dev, vc.dev, empty, empty.clone(), lengths, overflow=flags)
    gpu.sync()
    kc.check("key_cache, S = 0")
    vc.check("value_cache, S = 0")
    assert_equal(flags, torch.tensor([True, False, False, True]), "overflow flags, S = 0")

    S = M + 1
    _, _, nk_dev, nv_dev = new_pair(gpu, B, H, S, D, torch.float16, gen)
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    gpu.kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, gpu.to(torch.zeros(B, dtype=torch.int32)), overflow=flags)
    gpu.sync()
    kc.check("key_cache, S > max_len")
    vc.check("value_cache, S > max_len")
    assert_equal(flags, torch.ones(B, dtype=torch.bool), "overflow flags, S > max_len")


def test_append_many_blocks(gpu):
    """Thousands of vector copies (several thread blocks), one overflowing row among them."""
    gen = torch.Generator().manual_seed(11)
    B, H, M, D, S = gpu.size(64, 6), 4, 24, 64, 5
    kc, vc = Buf(gpu, (B, H, M, D), torch.bfloat16), Buf(gpu, (B, H, M, D), torch.bfloat16)
    nk, nv, nk_dev, nv_dev = new_pair(gpu, B, H, S, D, torch.bfloat16, gen)
    vec = plan_vector_bytes(D * 2, kc.dev, vc.dev, nk_dev, nv_dev)
    assert vec == 16 and 2 * B * H * S * (D * 2 // vec) > 4 * KV_THREADS
    lengths = torch.randint(0, M - S + 1, (B,), generator=gen)
    lengths[2] = M - S + 1
    ok = [b != 2 for b in range(B)]
    ref_append(kc.expect, nk, lengths, ok)
    ref_append(vc.expect, nv, lengths, ok)
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    gpu.kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, gpu.to(lengths), overflow=flags)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(flags, ~torch.tensor(ok), "overflow flags")


# ---- kv_rollback_ ------------------------------------------------------------------------

def ref_rollback(lengths, num_appended, num_kept):
    """(new lengths, bad rows) with Python ints: invalid when num_kept is outside
    [0, num_appended], the length is negative or would become negative."""
    out, bad = [], []
    for n, k in zip(lengths, num_kept):
        invalid = n < 0 or k < 0 or k > num_appended or n - (num_appended - k) < 0
        out.append(n if invalid else n - (num_appended - k))
        bad.append(invalid)
    return out, bad


def rollback_case(B, A, lengths_dtype, kept_dtype, gen):
    """B rows (several thread blocks): random valid rows plus every kind of invalid one
    and the dtype extremes, at fixed places."""
    li, ki = torch.iinfo(lengths_dtype), torch.iinfo(kept_dtype)
    lengths = torch.randint(0, 100, (B,), generator=gen).tolist()
    kept = torch.randint(0, A + 1, (B,), generator=gen).tolist()
    special = [
        (10, A + 1), (10, -1), (-1, A), (2, 0), (A, 0), (A - 1, 0), (0, A), (0, A - 1),
        (li.max, 0), (li.max, A), (li.min, A), (li.min, 0), (50, ki.min), (50, ki.max), (0, 0),
    ]
    for i, (n, k) in enumerate(special):
        lengths[37 * i + 5], kept[37 * i + 5] = n, k
    return lengths, kept


@pytest.mark.parametrize("kept_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("lengths_dtype", INDEX_DTYPES, ids=_name)
def test_rollback_matches_reference(gpu, lengths_dtype, kept_dtype):
    gen = torch.Generator().manual_seed(5)
    B, A = 600, 6  # 3 blocks of 256 threads
    lengths, kept = rollback_case(B, A, lengths_dtype, kept_dtype, gen)
    expected, bad = ref_rollback(lengths, A, kept)
    assert 10 <= sum(bad) < B // 2
    preset = torch.rand(B, generator=gen) < 0.1
    expected_flags = preset | torch.tensor(bad)

    # lengths, num_kept and the flags as strided views; the elements between them stay untouched
    lbuf = torch.full((2 * B,), -7, dtype=lengths_dtype)
    lbuf[::2] = index_tensor(lengths, lengths_dtype)
    kbuf = torch.full((3 * B,), 99, dtype=kept_dtype)
    kbuf[1::3] = index_tensor(kept, kept_dtype)
    fbuf = torch.ones(2 * B, dtype=torch.bool)
    fbuf[1::2] = preset
    expected_lbuf, expected_fbuf = lbuf.clone(), fbuf.clone()
    expected_lbuf[::2] = index_tensor(expected, lengths_dtype)
    expected_fbuf[1::2] = expected_flags
    lbuf_dev, kbuf_dev, fbuf_dev = gpu.to(lbuf.clone(), kbuf.clone(), fbuf.clone())
    gpu.kv_rollback_(lbuf_dev[::2], A, kbuf_dev[1::3], invalid=fbuf_dev[1::2])
    gpu.sync()
    assert_equal(lbuf_dev, expected_lbuf, "lengths")
    assert_equal(fbuf_dev, expected_fbuf, "invalid flags")
    assert_equal(kbuf_dev, kbuf, "num_kept is read only")

    # the same without flags: invalid rows keep their length silently
    got = gpu.to(index_tensor(lengths, lengths_dtype))
    gpu.kv_rollback_(got, A, gpu.to(index_tensor(kept, kept_dtype)))
    gpu.sync()
    assert_equal(got, index_tensor(expected, lengths_dtype), "lengths, no flags")


@pytest.mark.parametrize("lengths_dtype", INDEX_DTYPES, ids=_name)
def test_rollback_int_num_kept_and_extreme_num_appended(gpu, lengths_dtype):
    base = [0, 1, 5, 6, 30, torch.iinfo(lengths_dtype).max, -2]
    cases = [  # (num_appended, num_kept as an int: the wrapper broadcasts it)
        (6, 2), (6, 6), (6, 0), (6, 7), (6, -1), (0, 0), (0, 1),
        (2**63 - 1, 2**63 - 1), (2**63 - 1, 0), (2**63 - 1, 2**63 - 31),
    ]
    for A, k in cases:
        expected, bad = ref_rollback(base, A, [k] * len(base))
        got = gpu.to(index_tensor(base, lengths_dtype))
        flags = gpu.to(torch.zeros(len(base), dtype=torch.bool))
        gpu.kv_rollback_(got, A, k, invalid=flags)
        gpu.sync()
        assert_equal(got, index_tensor(expected, lengths_dtype), f"lengths, num_appended={A} num_kept={k}")
        assert_equal(flags, torch.tensor(bad), f"invalid flags, num_appended={A} num_kept={k}")


# ---- paged_kv_append_ --------------------------------------------------------------------

def ref_paged_append(expect, new, slots):
    """expect[s // BS, s % BS] = new[t] for every slot s of the cache (others skipped)."""
    NB, BS = expect.shape[:2]
    for t, s in enumerate(slots.tolist()):
        if 0 <= s < NB * BS:
            expect[s // BS, s % BS] = new[t]


def fused_new(gpu, T, H, D, dtype, gen):
    """new_k / new_v as views of a fused [T, 3, H, D] qkv projection (CPU and device)."""
    qkv = randn((T, 3, H, D), dtype, gen)
    qkv_dev = gpu.to(qkv)
    return qkv[:, 1], qkv[:, 2], qkv_dev[:, 1], qkv_dev[:, 2]


@pytest.mark.parametrize("slot_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_paged_append_matches_reference(gpu, dtype, slot_dtype):
    """-1 padding interleaved with distinct valid slots in every block; strided caches and sources."""
    gen = torch.Generator().manual_seed(DTYPES.index(dtype) + 1)
    NB, BS, H, D, T = 7, 4, 3, 16, 20
    kc, vc = Buf(gpu, (NB, BS, H, D), dtype), Buf(gpu, (NB, BS, H, D), dtype)
    nk, nv, nk_dev, nv_dev = fused_new(gpu, T, H, D, dtype, gen)
    perm = torch.randperm(NB * BS, generator=gen)
    perm = perm[(perm != 0) & (perm != NB * BS - 1)]
    slots = torch.cat([torch.tensor([NB * BS - 1]), perm[:T - 2], torch.tensor([0])])  # distinct, with the
    slots[1 + torch.randperm(T - 2, generator=gen)[:6]] = -1  # first and last slot of the cache
    assert slots[slots >= 0].unique().numel() == int((slots >= 0).sum())
    ref_paged_append(kc.expect, nk, slots)
    ref_paged_append(vc.expect, nv, slots)
    flag = gpu.to(torch.zeros((), dtype=torch.bool))
    slots_dev = gpu.to(slots.to(slot_dtype))
    gpu.paged_kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, slots_dev, invalid=flag)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert not bool(flag.cpu()), "no slot is invalid"
    assert_equal(slots_dev, slots.to(slot_dtype), "slot_mapping is read only")


@pytest.mark.parametrize("slot_dtype", INDEX_DTYPES, ids=_name)
def test_paged_append_invalid_slots_skipped_and_flagged(gpu, slot_dtype):
    gen = torch.Generator().manual_seed(2)
    info = torch.iinfo(slot_dtype)
    NB, BS, H, D = 5, 4, 2, 8
    slots = index_tensor([3, NB * BS, -1, 9, -2, info.max, 19, info.min, 0, NB * BS + 1], slot_dtype)
    T = slots.numel()
    kc, vc = Buf(gpu, (NB, BS, H, D), torch.float16), Buf(gpu, (NB, BS, H, D), torch.float16)
    nk, nv, nk_dev, nv_dev = fused_new(gpu, T, H, D, torch.float16, gen)
    ref_paged_append(kc.expect, nk, slots)
    ref_paged_append(vc.expect, nv, slots)
    flag = gpu.to(torch.zeros((), dtype=torch.bool))
    slots_dev = gpu.to(slots)
    gpu.paged_kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, slots_dev, invalid=flag)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert bool(flag.cpu()), "an out-of-range slot sets invalid"

    # sticky: a step with only valid slots clears nothing
    good = index_tensor([1, -1, 2], slot_dtype)
    ref_paged_append(kc.expect, nk[:3], good)
    ref_paged_append(vc.expect, nv[:3], good)
    gpu.paged_kv_append_(kc.dev, vc.dev, nk_dev[:3], nv_dev[:3], gpu.to(good), invalid=flag)
    gpu.sync()
    kc.check("key_cache after a good step")
    assert bool(flag.cpu()), "invalid is sticky"

    # a one-element [1] flag tensor works too; without a flag the bad slots are skipped silently
    for flag2 in (gpu.to(torch.zeros(1, dtype=torch.bool)), None):
        kc2, vc2 = Buf(gpu, (NB, BS, H, D), torch.float16), Buf(gpu, (NB, BS, H, D), torch.float16)
        ref_paged_append(kc2.expect, nk, slots)
        ref_paged_append(vc2.expect, nv, slots)
        gpu.paged_kv_append_(kc2.dev, vc2.dev, nk_dev, nv_dev, slots_dev, invalid=flag2)
        gpu.sync()
        kc2.check("key_cache")
        vc2.check("value_cache")
        if flag2 is not None:
            assert_equal(flag2, torch.tensor([True]), "[1] invalid flag")


@pytest.mark.parametrize("dtype, D, offset, width", WIDTH_CASES, ids=WIDTH_IDS)
def test_paged_append_vector_widths(gpu, dtype, D, offset, width):
    gen = torch.Generator().manual_seed(D + offset)
    NB, BS, H = 3, 2, 2
    slots = torch.tensor([5, -1, 0, 2, 3])
    kc, vc = Buf(gpu, (NB, BS, H, D), dtype, offset), Buf(gpu, (NB, BS, H, D), dtype, offset)
    nk, nv, nk_dev, nv_dev = fused_new(gpu, slots.numel(), H, D, dtype, gen)
    assert plan_vector_bytes(D * esize(dtype), kc.dev, vc.dev, nk_dev, nv_dev) == width
    ref_paged_append(kc.expect, nk, slots)
    ref_paged_append(vc.expect, nv, slots)
    gpu.paged_kv_append_(kc.dev, vc.dev, nk_dev, nv_dev, gpu.to(slots))
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")


# ---- paged_kv_gather / paged_kv_gather_into_ ------------------------------------------------

def ref_gather(cache, tables, lengths, max_len):
    """Plain indexing through the block tables, with the CUDA semantics: each length
    clamped into [0, min(max_len, max_blocks * block_size)], zeros past it and at positions
    whose table entry is outside [0, num_blocks)."""
    NB, BS, H, D = cache.shape
    B, MB = tables.shape
    out = torch.zeros(B, H, max_len, D, dtype=cache.dtype)
    for b in range(B):
        n = min(max(int(lengths[b]), 0), max_len, MB * BS)
        for p in range(n):
            blk = int(tables[b, p // BS])
            if 0 <= blk < NB:
                out[b, :, p] = cache[blk, p % BS]
    return out


def gather_cache(gpu, NB, BS, H, D, dtype, gen, offset=0, unused=()):
    """Random key / value caches (strided, in poisoned arenas); blocks in ``unused`` hold NaN."""
    kc = Buf(gpu, (NB, BS, H, D), dtype, offset, fill="randn", gen=gen)
    vc = Buf(gpu, (NB, BS, H, D), dtype, offset, fill="randn", gen=gen)
    for c in (kc, vc):
        for blk in unused:
            c.expect[blk] = float("nan")
        c.host.copy_(c.expect_arena)
        c.arena.copy_(gpu.to(c.expect_arena))
    return kc, vc


def run_gather(gpu, kc, vc, tables_dev, lengths_dev, max_len, into, offset=0, pad=1):
    """paged_kv_gather, allocating or into poisoned strided buffers; returns (keys, values,
    out Bufs or None)."""
    B, H, D = tables_dev.shape[0], kc.shape[2], kc.shape[3]
    if not into:
        keys, values = gpu.paged_kv_gather(kc.dev, vc.dev, tables_dev, lengths_dev, max_len)
        gpu.sync()
        assert keys.shape == (B, H, max_len, D) and keys.is_contiguous() and values.is_contiguous()
        return keys, values, None
    ko = Buf(gpu, (B, H, max_len, D), kc.dtype, offset, pad)
    vo = Buf(gpu, (B, H, max_len, D), kc.dtype, offset, pad)
    got = gpu.paged_kv_gather(kc.dev, vc.dev, tables_dev, lengths_dev, out=(ko.dev, vo.dev))
    gpu.sync()
    assert got[0] is ko.dev and got[1] is vo.dev
    return ko.dev, vo.dev, (ko, vo)


def check_gather(got, expected_k, expected_v):
    keys, values, outs = got
    if outs is None:
        assert_equal(keys, expected_k, "keys")
        assert_equal(values, expected_v, "values")
        return
    ko, vo = outs
    ko.expect.copy_(expected_k)
    vo.expect.copy_(expected_v)
    ko.check("keys_out")
    vo.check("values_out")


def gather_tables(B, MB, BS, lengths, used_blocks, gen, table_dtype, junk=(-1, 10**6)):
    """Tables pointing each row's used entries at blocks of ``used_blocks``; entries past a
    row's last used block hold junk (never read)."""
    tables = torch.empty(B, MB, dtype=torch.int64)
    for b in range(B):
        perm = torch.tensor(used_blocks)[torch.randperm(len(used_blocks), generator=gen)]
        tables[b] = perm[:MB] if len(used_blocks) >= MB else perm.repeat(MB)[:MB]
        need = -(-max(lengths[b], 0) // BS)
        for i in range(need, MB):
            tables[b, i] = junk[(b + i) % len(junk)]
    return tables.to(table_dtype)


@pytest.mark.parametrize("into", [False, True], ids=["alloc", "into"])
@pytest.mark.parametrize("table_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_gather_matches_reference(gpu, dtype, table_dtype, into):
    """Ragged rows (empty, one full block, block multiples, max_len exactly); zeros past
    each row's length; several thread blocks of copies."""
    gen = torch.Generator().manual_seed(DTYPES.index(dtype) + 3)
    NB, BS, H, D, B, MB, L = 9, 4, 2, 8, 5, 4, 14
    kc, vc = gather_cache(gpu, NB, BS, H, D, dtype, gen, unused=(7, 8))
    lengths = [0, 4, 9, 14, 3]
    tables = gather_tables(B, MB, BS, lengths, list(range(7)), gen, table_dtype)
    rows = 2 * B * H * L * (D * esize(dtype) // plan_vector_bytes(D * esize(dtype), kc.dev, vc.dev))
    assert rows > KV_THREADS
    lengths_t = torch.tensor(lengths, dtype=torch.int32)
    expected_k = ref_gather(kc.expect, tables, lengths_t, L)
    expected_v = ref_gather(vc.expect, tables, lengths_t, L)
    assert not expected_k.isnan().any()  # no table entry in use points at a NaN block
    tables_dev, lengths_dev = gpu.to(tables.clone(), lengths_t.clone())
    got = run_gather(gpu, kc, vc, tables_dev, lengths_dev, L, into)
    check_gather(got, expected_k, expected_v)
    kc.check("key_cache is read only")
    vc.check("value_cache is read only")
    assert_equal(tables_dev, tables, "block_tables are read only")
    assert_equal(lengths_dev, lengths_t, "lengths are read only")


@pytest.mark.parametrize("into", [False, True], ids=["alloc", "into"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_name)
def test_gather_clamps_lengths_and_zero_fills_bad_entries(gpu, index_dtype, into):
    """Lengths outside [0, min(max_len, table capacity)] are clamped into it; used table
    entries outside [0, num_blocks) read as zeros (the other positions of the row are
    gathered)."""
    gen = torch.Generator().manual_seed(9)
    info = torch.iinfo(index_dtype)
    NB, BS, H, D, MB, L = 6, 4, 2, 4, 3, 14  # capacity 12 < max_len 14
    lengths = [-3, 40, 9, 13, info.max, info.min, 12, 10, 11]
    B = len(lengths)
    kc, vc = gather_cache(gpu, NB, BS, H, D, torch.float32, gen)
    tables = gather_tables(B, MB, BS, [min(max(n, 0), 12) for n in lengths], list(range(NB)), gen, index_dtype)
    tables[2, 1] = NB          # positions 4..7 of row 2: zeros
    tables[3, 0] = -1          # positions 0..3 of row 3
    tables[6, 2] = info.max    # positions 8..11 of row 6
    tables[7, 1] = info.min    # positions 4..7 of row 7
    tables[8, 2] = -5          # positions 8..10 of row 8
    lengths_t = index_tensor(lengths, index_dtype)
    expected_k = ref_gather(kc.expect, tables, lengths_t, L)
    expected_v = ref_gather(vc.expect, tables, lengths_t, L)
    assert expected_k[2, :, 4:8].eq(0).all() and expected_k[2, :, :4].ne(0).all()  # the reference does it
    got = run_gather(gpu, kc, vc, *gpu.to(tables, lengths_t), L, into)
    check_gather(got, expected_k, expected_v)


@pytest.mark.parametrize("into", [False, True], ids=["alloc", "into"])
def test_gather_block_size_beyond_max_len(gpu, into):
    gen = torch.Generator().manual_seed(4)
    NB, BS, H, D, L = 3, 8, 2, 8, 5
    kc, vc = gather_cache(gpu, NB, BS, H, D, torch.float16, gen)
    tables = torch.tensor([[2, -1], [0, 1], [1, 7], [9, 0]], dtype=torch.int32)
    lengths = torch.tensor([3, 5, 16, 4], dtype=torch.int32)  # 16: clamped to max_len; row 3: bad entry
    expected_k = ref_gather(kc.expect, tables, lengths, L)
    expected_v = ref_gather(vc.expect, tables, lengths, L)
    got = run_gather(gpu, kc, vc, *gpu.to(tables, lengths), L, into)
    check_gather(got, expected_k, expected_v)


def test_gather_strided_tables_shared_and_expanded_caches(gpu):
    """int32 block tables as a transposed view; key_cache and value_cache the same tensor
    (read only: allowed), then an expanded (stride 0 over heads) cache."""
    gen = torch.Generator().manual_seed(6)
    NB, BS, H, D, B, MB, L = 6, 2, 3, 8, 4, 5, 9
    kc, _ = gather_cache(gpu, NB, BS, H, D, torch.bfloat16, gen)
    lengths = [9, 0, 5, 10]
    tables_t = gather_tables(B, MB, BS, lengths, list(range(NB)), gen, torch.int32).t().contiguous()  # [MB, B]
    tables = tables_t.t()
    assert tables.stride() == (1, B)
    lengths_t = torch.tensor(lengths)
    expected = ref_gather(kc.expect, tables, lengths_t, L)
    tables_dev = gpu.to(tables_t).t()
    keys, values = gpu.paged_kv_gather(kc.dev, kc.dev, tables_dev, gpu.to(lengths_t), L)
    gpu.sync()
    assert_equal(keys, expected, "keys (shared cache)")
    assert_equal(values, expected, "values (shared cache)")

    one_head = randn((NB, BS, 1, D), torch.bfloat16, gen)
    cache = one_head.expand(NB, BS, H, D)
    expected = ref_gather(cache, tables, lengths_t, L)
    cache_dev = gpu.to(one_head).expand(NB, BS, H, D)
    keys, values = gpu.paged_kv_gather(cache_dev, cache_dev, tables_dev, gpu.to(lengths_t), L)
    gpu.sync()
    assert_equal(keys, expected, "keys (expanded cache)")
    assert_equal(values, expected, "values (expanded cache)")


@pytest.mark.parametrize("dtype, D, offset, width", WIDTH_CASES, ids=WIDTH_IDS)
def test_gather_vector_widths(gpu, dtype, D, offset, width):
    """The cache and the output buffers at the case's byte offset (paged_kv_gather_into_)."""
    gen = torch.Generator().manual_seed(D + offset)
    NB, BS, H, B, L = 4, 2, 2, 3, 5
    kc, vc = gather_cache(gpu, NB, BS, H, D, dtype, gen, offset)
    lengths = torch.tensor([5, 2, 0])
    tables = torch.tensor([[3, 0, 2], [1, -1, -1], [-1, -1, -1]], dtype=torch.int32)
    ko = Buf(gpu, (B, H, L, D), dtype, offset)
    vo = Buf(gpu, (B, H, L, D), dtype, offset)
    assert plan_vector_bytes(D * esize(dtype), kc.dev, vc.dev, ko.dev, vo.dev) == width
    ko.expect.copy_(ref_gather(kc.expect, tables, lengths, L))
    vo.expect.copy_(ref_gather(vc.expect, tables, lengths, L))
    gpu.paged_kv_gather(kc.dev, vc.dev, *gpu.to(tables, lengths), out=(ko.dev, vo.dev))
    gpu.sync()
    ko.check("keys_out")
    vo.check("values_out")
    kc.check("key_cache is read only")
