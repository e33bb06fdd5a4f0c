"""The CUDA compaction kernel (kv_compact_kernel, csrc/cuda/kv_kernels.cuh; launched by
kv_launch.cuh: launch_kv_compact) through the ``gpu`` fixture: in the SIMT emulation on
every machine (each call under several thread schedules, results bit-identical) and on the
GPU where there is one.

kv_compact_ and paged_kv_compact_ are checked bit for bit against plain indexing
(compact_reference.py) with the CUDA semantics of csrc/op_schemas.h: a row that breaks the
rules is skipped (nothing written to it) and reported through the sticky ``invalid`` flags
(set, never cleared) while the other rows are compacted. The caches live in poisoned byte
arenas (test_kv_gpu.py: Buf) compared whole after each call, so a stray write anywhere shows.
"""
from __future__ import annotations

import pytest
import torch

from compact_reference import patterns, ref_compact, ref_paged_compact, row_error
from test_kv_gpu import (DTYPES, INDEX_DTYPES, KV_THREADS, WIDTH_CASES, WIDTH_IDS, Buf, _name, assert_equal, esize,
                         plan_vector_bytes)

JUNK = [-7, 10**9, -(2**31), 2**31 - 1]  # src_index entries past count[b]: never read


def pattern_rows(P, N, M, gen):
    """One row per allowed source pattern (patterns(P, N)): (src [B, P] with junk past count,
    lengths spread over [0, M - N], count) as int64 CPU tensors."""
    pats = patterns(P, N)
    src = torch.tensor([list(p) + [JUNK[(b + k) % len(JUNK)] for k in range(P - len(p))] for b, p in enumerate(pats)])
    lengths = torch.randint(0, M - N + 1, (len(pats),), generator=gen)
    lengths[0], lengths[-1] = 0, M - N
    return src, lengths, torch.tensor([len(p) for p in pats])


def cache_pair(gpu, shape, dtype, gen, offset=0):
    """Key / value caches of random values in poisoned arenas (strided views)."""
    return (Buf(gpu, shape, dtype, offset, fill="randn", gen=gen),
            Buf(gpu, shape, dtype, offset, fill="randn", gen=gen))


def expect(kc, vc, ref, *args, ok=None):
    """Sets the expected caches: ref(original, *args, ok=ok) on the host copies."""
    for c in (kc, vc):
        c.expect.copy_(ref(c.expect.clone(), *args, ok=ok))


def on_device(gpu, *ts):
    """Device copies (CPU tensors: clones, so the host originals stay the expectation)."""
    return [gpu.to(t.clone()) for t in ts]


# ---- kv_compact_ ----------------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_compact_every_overlap_pattern(gpu, dtype, index_dtype):
    """Every allowed source set of [0, 6) with up to 4 entries (count 0 included), one per
    row, at ragged lengths; src_index a transposed view; flags given and untouched."""
    gen = torch.Generator().manual_seed(DTYPES.index(dtype) * 2 + INDEX_DTYPES.index(index_dtype))
    P, N, H, M, D = 4, 6, 2, 11, 8
    src, lengths, count = pattern_rows(P, N, M, gen)
    B = src.shape[0]
    kc, vc = cache_pair(gpu, (B, H, M, D), dtype, gen)
    expect(kc, vc, ref_compact, lengths, src, count)
    src_dev = gpu.to(src.t().contiguous().to(index_dtype)).t()
    lengths_dev, count_dev = on_device(gpu, lengths.to(index_dtype), count.to(torch.int32))
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    gpu.kv_compact_(kc.dev, vc.dev, lengths_dev, src_dev, count_dev, invalid=flags)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(src_dev, src.to(index_dtype), "src_index is read only")
    assert_equal(lengths_dev, lengths.to(index_dtype), "lengths are read only")
    assert_equal(count_dev, count.to(torch.int32), "count is read only")
    assert_equal(flags, torch.zeros(B, dtype=torch.bool), "flags of valid rows")


@pytest.mark.parametrize("dtype, D, offset, width", WIDTH_CASES, ids=WIDTH_IDS)
def test_compact_vector_widths(gpu, dtype, D, offset, width):
    gen = torch.Generator().manual_seed(D + offset)
    B, H, M = 3, 2, 8
    kc, vc = cache_pair(gpu, (B, H, M, D), dtype, gen, offset)
    assert plan_vector_bytes(D * esize(dtype), kc.dev, vc.dev) == width
    src = torch.tensor([[0, 2, 3], [1, 3, 4], [0, 1, 5]])
    lengths, count = torch.tensor([1, 4, 2]), torch.tensor([3, 2, 3])
    expect(kc, vc, ref_compact, lengths, src, count)
    gpu.kv_compact_(kc.dev, vc.dev, *on_device(gpu, lengths, src, count))
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")


def bad_rows(M, P, info):
    """(lengths[b], src_index row, count[b]) of every kind of invalid row (the extremes of
    the index dtype included) followed by valid ones."""
    bad = [
        (2, [0, 2, 2, 0], 3), (2, [0, 3, 1, 0], 3), (2, [-1, 0, 1, 0], 2), (4, [0, 1, 6, 0], 3),
        (0, [0, 1, 2, M], 4), (2, [0, 1, 2, 3], P + 1), (2, [0, 1, 2, 3], -1), (-1, [0, 1, 2, 3], 1),
        (M + 1, [0, 1, 2, 3], 0), (info.max, [0, 1, 2, 3], 0), (info.min, [0, 1, 2, 3], 2),
        (1, [0, 1, 2, info.max], 4), (1, [info.min, 1, 2, 3], 1), (1, [0, 1, 2, 3], info.max),
        (1, [0, 1, 2, 3], info.min), (M, [0, 1, 2, 3], 1),
    ]
    good = [(0, [0, 2, 3, 0], 3), (M, [5, 5, 5, 5], 0), (M - 4, [0, 1, 2, 3], 4), (3, [1, 2, 4, 6], 4),
            (1, [2, 5, 6, info.min], 3), (6, [3, info.max, 0, 0], 1)]
    return bad + good


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_name)
def test_compact_bad_rows_skipped_and_flagged(gpu, index_dtype):
    """Every kind of invalid row is skipped (its positions unchanged) and flagged; the valid
    rows are compacted; flags are sticky; lengths, count and the flags are strided views
    whose other elements stay untouched; without flags the bad rows are skipped silently."""
    gen = torch.Generator().manual_seed(12)
    info = torch.iinfo(index_dtype)
    M, P, H, D = 10, 4, 2, 4
    rows = bad_rows(M, P, info)
    B = len(rows)
    ok = [row_error(n, c, r, P, M) is None for n, r, c in rows]
    assert ok.count(False) == 16 and all(ok[16:])
    kc, vc = cache_pair(gpu, (B, H, M, D), torch.float32, gen)
    src = torch.tensor([r for _, r, _ in rows], dtype=index_dtype)
    lbuf = torch.full((2 * B,), 5, dtype=index_dtype)
    lbuf[::2] = torch.tensor([n for n, _, _ in rows], dtype=index_dtype)
    cbuf = torch.full((2 * B,), 9, dtype=index_dtype)
    cbuf[::2] = torch.tensor([c for _, _, c in rows], dtype=index_dtype)
    fbuf = torch.tensor([False, True] * B)
    fbuf[0], fbuf[2 * 16] = True, True  # preset: a bad row and a good row
    expected_flags = fbuf.clone()
    expected_flags[::2] |= ~torch.tensor(ok)
    expect(kc, vc, ref_compact, lbuf[::2], src, cbuf[::2], ok=ok)
    lbuf_dev, cbuf_dev, src_dev, fbuf_dev = on_device(gpu, lbuf, cbuf, src, fbuf)
    gpu.kv_compact_(kc.dev, vc.dev, lbuf_dev[::2], src_dev, cbuf_dev[::2], invalid=fbuf_dev[::2])
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(lbuf_dev, lbuf, "lengths (and the elements between them)")
    assert_equal(cbuf_dev, cbuf, "count (and the elements between them)")
    assert_equal(fbuf_dev, expected_flags, "invalid flags (and the elements between them)")

    # sticky: a call where every row is valid (count 0) clears nothing and writes nothing
    gpu.kv_compact_(kc.dev, vc.dev, gpu.to(torch.zeros(B, dtype=index_dtype)), src_dev,
                    gpu.to(torch.zeros(B, dtype=index_dtype)), invalid=fbuf_dev[::2])
    gpu.sync()
    kc.check("key_cache after a no-op call")
    assert_equal(fbuf_dev, expected_flags, "invalid flags after a valid call")

    # without a flag tensor the bad rows are skipped silently
    kc2, vc2 = cache_pair(gpu, (B, H, M, D), torch.float32, gen)
    expect(kc2, vc2, ref_compact, lbuf[::2], src, cbuf[::2], ok=ok)
    gpu.kv_compact_(kc2.dev, vc2.dev, lbuf_dev[::2], src_dev, cbuf_dev[::2])
    gpu.sync()
    kc2.check("key_cache, no flags")
    vc2.check("value_cache, no flags")


@pytest.mark.parametrize("shape", [(4, 0, 6, 8), (4, 2, 6, 0)], ids=["H0", "D0"])
def test_compact_flag_threads_only(gpu, shape):
    """No bytes to move (H = 0 or D = 0): only the flag threads run; bad rows are flagged."""
    kc, vc = cache_pair(gpu, shape, torch.float16, torch.Generator().manual_seed(2))
    src = torch.tensor([[0, 1], [1, 1], [0, 3], [0, 1]])
    lengths, count = torch.tensor([0, 0, 3, -1]), torch.tensor([2, 2, 2, 0])
    flags = gpu.to(torch.zeros(4, dtype=torch.bool))
    gpu.kv_compact_(kc.dev, vc.dev, *on_device(gpu, lengths, src, count), invalid=flags)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(flags, torch.tensor([False, True, True, True]), "invalid flags")


def test_compact_many_blocks(gpu):
    """Thousands of threads (several blocks), one invalid row among them."""
    gen = torch.Generator().manual_seed(13)
    B, H, M, D = gpu.size(64, 10), 4, 24, 128
    kc, vc = cache_pair(gpu, (B, H, M, D), torch.bfloat16, gen)
    vec = plan_vector_bytes(D * 2, kc.dev, vc.dev)
    assert vec == 16 and 2 * B * H * (D * 2 // vec) > 4 * KV_THREADS
    src = torch.stack([torch.sort(torch.randperm(8, generator=gen)[:5]).values for _ in range(B)])
    lengths = torch.randint(0, M - 8 + 1, (B,), generator=gen)
    count = torch.randint(0, 6, (B,), generator=gen)
    src[3, :2] = torch.tensor([4, 4])
    count[3] = 5
    ok = [b != 3 for b in range(B)]
    expect(kc, vc, ref_compact, lengths, src, count, ok=ok)
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    gpu.kv_compact_(kc.dev, vc.dev, *on_device(gpu, lengths, src, count), invalid=flags)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(flags, ~torch.tensor(ok), "invalid flags")


# ---- paged_kv_compact_ ----------------------------------------------------------------------

@pytest.mark.parametrize("BS", [1, 3])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_paged_compact_every_overlap_pattern(gpu, dtype, index_dtype, BS):
    """The patterns through block tables (each row its own blocks, in a random order; moves
    across block boundaries; junk entries past the blocks a row reaches)."""
    gen = torch.Generator().manual_seed(BS * 5 + DTYPES.index(dtype))
    P, N, H, D = 4, 6, 2, 4
    MB = -(-11 // BS)
    src, lengths, count = pattern_rows(P, N, MB * BS, gen)
    B = src.shape[0]
    NB = B * MB + 1
    kc, vc = cache_pair(gpu, (NB, BS, H, D), dtype, gen)
    tables = torch.randperm(NB, generator=gen)[:B * MB].view(B, MB).clone()
    for b in range(B):
        last = (int(lengths[b]) + (int(src[b, int(count[b]) - 1]) if count[b] else 0)) // BS
        tables[b, last + 1:] = NB + b
    expect(kc, vc, ref_paged_compact, tables, lengths, src, count)
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    gpu.paged_kv_compact_(kc.dev, vc.dev, *on_device(gpu, tables.to(index_dtype), lengths.to(index_dtype),
                                                    src.to(index_dtype), count), invalid=flags)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(flags, torch.zeros(B, dtype=torch.bool), "flags of valid rows")


def test_paged_compact_bad_rows_skipped_and_flagged(gpu):
    """Table entries outside [0, num_blocks) of a moved position (destination or source),
    positions past the table, lengths past it, bad counts and orders: flagged and skipped;
    entries of positions a row does not move are not read (row 0's junk)."""
    gen = torch.Generator().manual_seed(14)
    NB, BS, H, D, MB = 16, 3, 2, 8, 3
    rows = [  # (table row, lengths, src row, count), valid rows first
        ([0, 99, -5], 1, [0, 1, 9], 2),
        ([1, 2, 3], 2, [0, 2, 6], 3),
        ([4, 5, 6], 0, [1, 4, 8], 3),
        ([7, -1, 8], 2, [0, 3, 4], 3),      # destination 3: entry 1
        ([9, 10, 16], 2, [0, 1, 4], 3),     # source 6: entry 2
        ([-3, 11, 12], 2, [1, 2, 0], 2),    # destination 2: entry 0
        ([13, 14, 15], 2, [0, 1, 7], 3),    # 2 + 7 >= 9
        ([13, 14, 15], 10, [0, 1, 2], 0),   # lengths past the table
        ([13, 14, 15], 2, [0, 0, 1], 2),    # not increasing
        ([13, 14, 15], 2, [0, 1, 2], 4),    # count > P
        ([2**31 - 1, 14, 15], 0, [2, 3, 4], 1),
    ]
    B = len(rows)
    tables = torch.tensor([r[0] for r in rows], dtype=torch.int32)
    lengths = torch.tensor([r[1] for r in rows])
    src = torch.tensor([r[2] for r in rows])
    count = torch.tensor([r[3] for r in rows])
    errors = [row_error(n, c, s, 3, MB * BS, t, BS, NB) for t, n, s, c in rows]
    assert errors == [None] * 3 + ["block_tables"] * 3 + ["src_index", "lengths", "src_index", "count",
                                                          "block_tables"]
    ok = [e is None for e in errors]
    kc, vc = cache_pair(gpu, (NB, BS, H, D), torch.float16, gen)
    expect(kc, vc, ref_paged_compact, tables, lengths, src, count, ok=ok)
    flags = gpu.to(torch.zeros(B, dtype=torch.bool))
    gpu.paged_kv_compact_(kc.dev, vc.dev, *on_device(gpu, tables, lengths, src, count), invalid=flags)
    gpu.sync()
    kc.check("key_cache")
    vc.check("value_cache")
    assert_equal(flags, ~torch.tensor(ok), "invalid flags")
