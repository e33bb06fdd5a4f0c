"""In-place KV compaction: specdec::kv_compact_ and specdec::paged_kv_compact_ (CPU, and the
GPU where there is one; the CUDA kernel's emulated families are test_kv_compact_gpu.py).

Every result is compared bit for bit with plain indexing on a clone (compact_reference.py),
on caches of random bit patterns (NaN payloads included), for every overlap pattern of
sources and destinations with up to 4 kept positions; refused calls must leave every
byte of the caches (and the flags) unchanged.
"""
import pytest
import torch

import specdec_ext
from compact_reference import (bits, patterns, random_bits, ref_compact, ref_in_place, ref_paged_compact,
                               row_error)
from helpers import DEVICES, capture_graph
from specdec_ext import kv_append_, kv_compact_, paged_kv_compact_

cuda = pytest.mark.cuda
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]
JUNK = [-7, 10**9, -(2**31), 2**31 - 1]  # entries past count[b]: never read


def _name(x):
    return str(x).split(".")[-1] if isinstance(x, torch.dtype) else None


def assert_bits(got, expected, what=""):
    got = got.cpu()
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    bad = (bits(got) != bits(expected)).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} elements differ, first at {bad[0].tolist()}"


def pattern_rows(P, N, M, gen, index_dtype, len_dtype):
    """One row per pattern of patterns(P, N): lengths spread over [0, M - N], src_index [B, P]
    (junk past count), count."""
    pats = patterns(P, N)
    B = len(pats)
    src = torch.empty(B, P, dtype=torch.int64)
    for b, p in enumerate(pats):
        src[b] = torch.tensor(list(p) + [JUNK[(b + k) % len(JUNK)] for k in range(P - len(p))], dtype=torch.int64)
    lengths = torch.randint(0, M - N + 1, (B,), generator=gen)
    lengths[0], lengths[-1] = 0, M - N
    count = torch.tensor([len(p) for p in pats])
    return src.to(index_dtype), lengths.to(len_dtype), count.to(len_dtype)


# ---- kv_compact_: semantics ------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("P", [1, 2, 3, 4])
@pytest.mark.parametrize("len_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_every_overlap_pattern(device, dtype, index_dtype, len_dtype, P):
    """Every strictly increasing source set of [0, P + 2) with up to P entries (count 0
    included), one per row, at ragged lengths (0 and M - N among them)."""
    gen = torch.Generator().manual_seed(P * 7 + DTYPES.index(dtype))
    N, H, M, D = P + 2, 2, 11, 3
    src, lengths, count = pattern_rows(P, N, M, gen, index_dtype, len_dtype)
    B = src.shape[0]
    kc, vc = random_bits((B, H, M, D), dtype, gen), random_bits((B, H, M, D), dtype, gen)
    ek, ev = ref_compact(bits(kc), lengths, src, count), ref_compact(bits(vc), lengths, src, count)
    kd, vd = kc.to(device), vc.to(device)
    args = [t.to(device) for t in (lengths, src, count)]
    flags = torch.zeros(B, dtype=torch.bool, device=device)
    kv_compact_(kd, vd, *args, invalid=flags)
    assert_bits(kd, ek.view(dtype), "key_cache")
    assert_bits(vd, ev.view(dtype), "value_cache")
    for got, before in zip(args, (lengths, src, count)):
        assert torch.equal(got.cpu(), before), "lengths / src_index / count are read only"
    assert not flags.any()


def test_patterns_tell_the_move_order_apart():
    """The pattern rows above are a real test of the order: moving j downwards (or reading
    already-moved positions) gives a different result for some of them."""
    gen = torch.Generator().manual_seed(0)
    src, lengths, count = pattern_rows(4, 6, 11, gen, torch.int64, torch.int64)
    cache = torch.arange(src.shape[0] * 11, dtype=torch.int64).view(-1, 1, 11, 1)
    expected = ref_compact(cache, lengths, src, count)
    assert torch.equal(ref_in_place(cache, lengths, src, count, reverse=False), expected)
    wrong = ref_in_place(cache, lengths, src, count, reverse=True)
    differ = [b for b in range(src.shape[0]) if not torch.equal(wrong[b], expected[b])]
    assert len(differ) > 10, differ
    assert any(src[b, :3].tolist() == [0, 2, 3] and count[b] == 3 for b in differ)  # the documented example


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("D", [1, 3, 64])
def test_strided_caches_and_indices(device, dtype, D):
    """Caches as per-layer slices of a [layers, B, H, M, D] tensor and sliced along max_len;
    src_index transposed, count and lengths strided: nothing outside the moved positions of
    the slice changes."""
    gen = torch.Generator().manual_seed(D)
    layers, B, H, M = 3, 4, 2, 12
    big_k = random_bits((layers, B, H, M, D), dtype, gen).to(device)
    big_v = random_bits((layers, B, H, M, D), dtype, gen).to(device)
    src_t = torch.tensor([[0, 1, 0, 2], [2, 3, 4, 3], [3, 5, 5, 6], [9, -1, 7, 8]], device=device)  # [P, B]
    src = src_t.t()  # [B, P], strides (1, B)
    count_buf = torch.tensor([3, 0, 2, 9, 0, 1, 4, 9], dtype=torch.int32, device=device)
    count = count_buf[::2]  # [3, 2, 0, 4]
    len_buf = torch.tensor([[1, 99], [0, 99], [5, 99], [2, 99]], device=device)
    lengths = len_buf[:, 0]
    ek, ev = bits(big_k).cpu().clone(), bits(big_v).cpu().clone()
    ek[1] = ref_compact(ek[1], lengths.cpu(), src.cpu(), count.cpu())
    ev[1] = ref_compact(ev[1], lengths.cpu(), src.cpu(), count.cpu())
    kv_compact_(big_k[1], big_v[1], lengths, src, count)
    assert_bits(big_k, ek.view(dtype), "key layers")
    assert_bits(big_v, ev.view(dtype), "value layers")
    # a slice along max_len (M - 2 positions starting at 2)
    lengths2 = torch.tensor([0, 3, 1, 1], device=device)
    sk, sv = big_k[2, :, :, 2:], big_v[2, :, :, 2:]
    ek[2, :, :, 2:] = ref_compact(ek[2, :, :, 2:], lengths2.cpu(), src.cpu(), count.cpu())
    ev[2, :, :, 2:] = ref_compact(ev[2, :, :, 2:], lengths2.cpu(), src.cpu(), count.cpu())
    kv_compact_(sk, sv, lengths2, src, count)
    assert_bits(big_k, ek.view(dtype), "key layers, max_len slice")
    assert_bits(big_v, ev.view(dtype), "value layers, max_len slice")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_shapes_and_counts(device):
    """count 0 everywhere, P = 0, B = 0, H = 0, D = 0, max_len = 0: nothing moves."""
    gen = torch.Generator().manual_seed(1)
    z = dict(dtype=torch.int64, device=device)
    for shape, P in [((3, 2, 5, 4), 2), ((3, 2, 5, 4), 0), ((0, 2, 5, 4), 3), ((3, 0, 5, 4), 2), ((3, 2, 5, 0), 2),
                     ((3, 2, 0, 4), 2)]:
        kc = random_bits(shape, torch.float16, gen).to(device)
        vc = random_bits(shape, torch.float16, gen).to(device)
        ek, ev = kc.clone(), vc.clone()
        B = shape[0]
        kv_compact_(kc, vc, torch.zeros(B, **z), torch.zeros(B, P, **z), torch.zeros(B, **z))
        assert_bits(kc, ek.cpu(), f"key_cache {shape}")
        assert_bits(vc, ev.cpu(), f"value_cache {shape}")
    # H = 0 / D = 0 still check the rows
    kc = torch.zeros(2, 0, 5, 4, device=device)
    with pytest.raises(ValueError, match="src_index"):
        kv_compact_(kc, kc.clone(), torch.zeros(2, **z), torch.tensor([[0, 0], [0, 1]], device=device),
                    torch.tensor([2, 2], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_after_tree_verification(device):
    """The intended use: a tree of N nodes appended at lengths[b] .. lengths[b]+N-1, the
    accepted path (root first) kept with count = num_accepted + 1, lengths advanced: the
    cache then equals appending the path's tokens one after the other."""
    gen = torch.Generator().manual_seed(4)
    B, H, M, D, N = 3, 2, 20, 8, 6
    lengths = torch.tensor([0, 7, 14], device=device)
    kc = torch.zeros(B, H, M, D, device=device)
    vc = torch.zeros(B, H, M, D, device=device)
    tree_k = torch.randn(B, H, N, D, generator=gen).to(device)
    tree_v = torch.randn(B, H, N, D, generator=gen).to(device)
    kv_append_(kc, vc, tree_k, tree_v, lengths)
    path = torch.tensor([[0, 2, 3, 5], [0, 1, 4, -1], [0, -1, -1, -1]], device=device)
    count = torch.tensor([4, 3, 1], device=device)
    kv_compact_(kc, vc, lengths, path, count)
    lengths += count
    for b in range(B):
        n0, c = int(lengths[b] - count[b]), int(count[b])
        kept = path[b, :c]
        assert torch.equal(kc[b, :, n0:n0 + c], tree_k[b][:, kept])
        assert torch.equal(vc[b, :, n0:n0 + c], tree_v[b][:, kept])
        assert torch.equal(kc[b, :, :n0], torch.zeros(H, n0, D, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_paged_cache_after_tree_verification(device):
    """The same step through PagedKVCache (2 layers, 4-slot blocks): prefixes of 0, 7 and 14
    entries, a 6-node tree allocated and appended (across block borders), compact(seqs, 6,
    path, count) then rollback_many(seqs, 6, count): each sequence then holds its prefix
    unchanged followed by the path's entries, in every layer (the cache class's own step base
    n - num_appended, which the op tests above pass in themselves)."""
    from specdec_ext import PagedKVCache

    gen = torch.Generator().manual_seed(5)
    L, H, D, N, seqs, prefix = 2, 2, 8, 6, ["a", "b", "c"], [0, 7, 14]
    cache = PagedKVCache(L, 24, 4, H, D, torch.float32, device=device, max_blocks_per_seq=6)
    for s, n in zip(seqs, prefix):
        cache.manager.add(s)
        cache.allocate([s], n)
    cache.key_cache.copy_(torch.randn(cache.key_cache.shape, generator=gen))
    cache.value_cache.copy_(torch.randn(cache.value_cache.shape, generator=gen))
    before = [cache.gather(layer, seqs) for layer in range(L)]
    slots = cache.allocate(seqs, N)
    tree = torch.randn(L, 2, len(seqs), N, H, D, generator=gen).to(device)  # [layer, k|v, B, N, H, D]
    for layer in range(L):
        cache.append(layer, tree[layer, 0].flatten(0, 1), tree[layer, 1].flatten(0, 1), slots)
    path = torch.tensor([[0, 2, 3, 5], [0, 1, 4, -1], [0, -1, -1, -1]], device=device)
    count = torch.tensor([4, 3, 1], device=device)
    cache.compact(seqs, N, path, count)
    cache.rollback_many(seqs, N, count)
    assert [cache.length(s) for s in seqs] == [n + int(c) for n, c in zip(prefix, count)]
    for layer in range(L):
        for which, got in enumerate(cache.gather(layer, seqs)):
            for b, n0 in enumerate(prefix):
                c = int(count[b])
                assert torch.equal(got[b, :, :n0], before[layer][which][b, :, :n0]), (layer, which, b)
                assert torch.equal(got[b, :, n0:n0 + c], tree[layer, which, b][path[b, :c]].transpose(0, 1)), \
                    (layer, which, b)


# ---- kv_compact_: refused requests (CPU) ----------------------------------------------------

BAD_ROWS = [  # (lengths, src_index row, count) of row B-1, the argument named
    (2, [0, 2, 2, 0], 3, r"src_index\[3, 2\] = 2 must be greater than src_index\[3, 1\] = 2"),
    (2, [0, 3, 1, 0], 3, r"src_index\[3, 2\] = 1 must be greater"),
    (2, [-1, 0, 1, 0], 2, r"src_index\[3, 0\] = -1 is negative"),
    (4, [0, 1, 6, 0], 3, r"lengths\[3\] \+ src_index\[3, 2\] = 4 \+ 6 is out of range: it must be < max_len = 10"),
    (0, [0, 1, 2, 10], 4, r"lengths\[3\] \+ src_index\[3, 3\] = 0 \+ 10 is out of range"),
    (2, [0, 1, 2, 3], 5, r"count\[3\] = 5 must be in \[0, P = 4\]"),
    (2, [0, 1, 2, 3], -1, r"count\[3\] = -1 must be in \[0, P = 4\]"),
    (-1, [0, 1, 2, 3], 1, r"lengths\[3\] = -1 must be in \[0, max_len = 10\]"),
    (11, [0, 1, 2, 3], 0, r"lengths\[3\] = 11 must be in \[0, max_len = 10\]"),
    (2**62, [0, 1, 2, 3], 0, r"lengths\[3\] = 4611686018427387904 must be in"),
    (2, [0, 1, 2, 2**62], 4, r"lengths\[3\] \+ src_index\[3, 3\] = 2 \+ 4611686018427387904 is out of range"),
]


@pytest.mark.parametrize("n, row, c, msg", BAD_ROWS, ids=[f"bad{i}" for i in range(len(BAD_ROWS))])
def test_bad_rows_refused_cpu(n, row, c, msg):
    """A bad LAST row refuses the whole call before anything is written (the good rows
    before it included); the flags are untouched."""
    gen = torch.Generator().manual_seed(2)
    B, H, M, D = 4, 2, 10, 4
    kc, vc = random_bits((B, H, M, D), torch.bfloat16, gen), random_bits((B, H, M, D), torch.bfloat16, gen)
    src = torch.tensor([[0, 2, 3, 0], [1, 2, 0, 0], [0, 1, 5, 0], row])
    lengths, count = torch.tensor([0, 3, 1, n]), torch.tensor([3, 2, 3, c])
    assert row_error(n, c, row, 4, M) is not None
    ek, ev = kc.clone(), vc.clone()
    flags = torch.tensor([False, True, False, False])
    with pytest.raises(ValueError, match=msg) as e:
        kv_compact_(kc, vc, lengths, src, count, invalid=flags)
    assert "nothing was written" in str(e.value) and str(e.value).startswith("kv_compact_: ")
    assert_bits(kc, ek, "key_cache")
    assert_bits(vc, ev, "value_cache")
    assert flags.tolist() == [False, True, False, False]


@pytest.mark.parametrize("device", DEVICES)
def test_argument_errors(device):
    B, H, M, D, P = 2, 2, 8, 4, 3
    kc = torch.zeros(B, H, M, D, device=device)
    vc = torch.zeros(B, H, M, D, device=device)
    lengths = torch.zeros(B, dtype=torch.int64, device=device)
    src = torch.zeros(B, P, dtype=torch.int64, device=device)
    count = torch.zeros(B, dtype=torch.int32, device=device)
    op = torch.ops.specdec.kv_compact_
    cases = [
        ((kc, vc.half(), lengths, src, count), TypeError, "value_cache has dtype"),
        ((kc.double(), vc.double(), lengths, src, count), TypeError, "key_cache must be float32"),
        ((kc[0], vc[0], lengths, src, count), ValueError, "key_cache must be"),
        ((kc, vc, lengths.float(), src, count), TypeError, "lengths must be int32 or int64"),
        ((kc, vc, lengths[:1], src, count), ValueError, r"lengths must have shape \[B\]"),
        ((kc, vc, lengths, src.float(), count), TypeError, "src_index must be int32 or int64"),
        ((kc, vc, lengths, src[0], count), ValueError, r"src_index must be \[B, P\], got shape"),
        ((kc, vc, lengths, src[:1], count), ValueError, r"src_index must be \[B, P\] with B = 2 rows"),
        ((kc, vc, lengths, src, count[:1]), ValueError, r"count must have shape \[B\]"),
        ((kc, vc, lengths, src, count.bool()), TypeError, "count must be int32 or int64"),
        ((kc, vc, lengths, src, count, torch.zeros(B, dtype=torch.int64, device=device)), TypeError,
         "invalid must be a bool"),
        ((kc, vc, lengths, src, count, torch.zeros(B + 1, dtype=torch.bool, device=device)), ValueError,
         r"invalid must have shape \[B\]"),
        ((kc.transpose(2, 3), vc.transpose(2, 3), lengths, src, count), ValueError, "stride 1 in its last"),
        ((kc, kc, lengths, src, count), ValueError, "key_cache and value_cache overlap"),
        ((kc, vc[:, :1].expand(B, H, M, D), lengths, src, count), ValueError, "value_cache has overlapping elements"),
        ((kc, vc, lengths, src, count, torch.zeros(B, dtype=torch.bool, device="meta")), ValueError,
         "invalid is on meta"),
    ]
    for args, err, msg in cases:
        with pytest.raises(err, match=msg):
            op(*args)
    # the flags (or an index tensor) inside a cache: refused, the cache unchanged
    flat = torch.zeros(B * H * M * D, device=device)
    with pytest.raises(ValueError, match="key_cache and invalid overlap"):
        op(flat.view(B, H, M, D), vc, lengths, src, count, flat.view(torch.bool)[:B])
    with pytest.raises(ValueError, match="key_cache and src_index overlap"):
        op(flat.view(B, H, M, D), vc, lengths, flat.view(torch.int64)[:B * P].view(B, P), count)
    assert not kc.any() and not vc.any() and not flat.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_flag", [False, True])
def test_opcheck(device, with_flag):
    gen = torch.Generator().manual_seed(3)
    kc = torch.randn(3, 2, 10, 16, generator=gen).half().to(device)
    vc = torch.randn(3, 2, 10, 16, generator=gen).half().to(device)
    src = torch.tensor([[0, 2, 3], [1, 2, 5], [0, 1, 2]], device=device)
    lengths, count = torch.tensor([2, 0, 7], device=device), torch.tensor([3, 2, 1], device=device)
    flag = torch.zeros(3, dtype=torch.bool, device=device) if with_flag else None
    torch.library.opcheck(torch.ops.specdec.kv_compact_.default, (kc, vc, lengths, src, count, flag))


# ---- paged_kv_compact_ --------------------------------------------------------------------------

def paged_case(B, BS, MB, NB, dtype, gen):
    """Caches of random bits and block tables [B, MB] mapping each row to distinct blocks of a
    random permutation (every row its own blocks when NB >= B * MB)."""
    kc, vc = random_bits((NB, BS, 2, 3), dtype, gen), random_bits((NB, BS, 2, 3), dtype, gen)
    perm = torch.randperm(NB, generator=gen)
    tables = torch.stack([perm[(b * MB + torch.arange(MB)) % NB] for b in range(B)])
    return kc, vc, tables


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("BS", [1, 2, 3, 8])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_paged_every_overlap_pattern(device, dtype, index_dtype, BS):
    """The patterns of test_every_overlap_pattern through block tables (moves across block
    boundaries, int32 / int64 tables, junk table entries past the positions a row moves)."""
    gen = torch.Generator().manual_seed(BS * 3 + DTYPES.index(dtype))
    P, N = 4, 6
    MB = -(-11 // BS)
    src, lengths, count = pattern_rows(P, N, MB * BS, gen, index_dtype, index_dtype)
    B = src.shape[0]
    kc, vc, tables = paged_case(B, BS, MB, B * MB, dtype, gen)
    for b in range(B):  # junk past the last block a row reaches
        last = (int(lengths[b]) + (int(src[b, int(count[b]) - 1]) if count[b] else 0)) // BS
        tables[b, last + 1:] = -1 - b
    tables = tables.to(index_dtype)
    ek = ref_paged_compact(bits(kc), tables, lengths, src, count)
    ev = ref_paged_compact(bits(vc), tables, lengths, src, count)
    kd, vd = kc.to(device), vc.to(device)
    flags = torch.zeros(B, dtype=torch.bool, device=device)
    paged_kv_compact_(kd, vd, *[t.to(device) for t in (tables, lengths, src, count)], invalid=flags)
    assert_bits(kd, ek.view(dtype), "key_cache")
    assert_bits(vd, ev.view(dtype), "value_cache")
    assert not flags.any()


@pytest.mark.parametrize("device", DEVICES)
def test_paged_rows_may_read_a_shared_slot(device):
    """Two rows read one slot of a block they share (reads may be shared, only written slots
    may not); the tables are a transposed view."""
    gen = torch.Generator().manual_seed(5)
    kc, vc = random_bits((5, 4, 2, 8), torch.float32, gen), random_bits((5, 4, 2, 8), torch.float32, gen)
    tables = torch.tensor([[1, 0, 3], [2, 0, 4]]).t().contiguous().t()  # positions 4..7 of both rows: block 0
    assert tables.stride() == (1, 2)
    lengths, count = torch.tensor([2, 2]), torch.tensor([2, 2])
    src = torch.tensor([[1, 5], [0, 5]])  # both rows read position 7 = block 0, offset 3
    ek = ref_paged_compact(bits(kc), tables, lengths, src, count)
    ev = ref_paged_compact(bits(vc), tables, lengths, src, count)
    assert torch.equal(ek[1, 3], bits(kc)[0, 3]) and torch.equal(ek[2, 3], bits(kc)[0, 3])
    kd, vd = kc.to(device), vc.to(device)
    paged_kv_compact_(kd, vd, *[t.to(device) for t in (tables, lengths, src, count)])
    assert_bits(kd, ek.view(torch.float32), "key_cache")
    assert_bits(vd, ev.view(torch.float32), "value_cache")


PAGED_BAD = [  # (tables row 2, lengths[2], src row 2, count[2], message)
    ([4, -1, 5], 2, [0, 3, 4], 3, r"block_tables\[2, 1\] = -1 is out of range \[0, num_blocks = 6\) but row 2 "
                                  r"moves position 3 \(src_index\[2, 1\] = 3\)"),
    ([4, 5, 6], 2, [0, 1, 4], 3, r"block_tables\[2, 2\] = 6 is out of range"),   # a source position
    ([-3, 5, 4], 2, [1, 2, 0], 2, r"block_tables\[2, 0\] = -3 is out of range"),  # a destination position
    ([4, 5, 1], 2, [0, 1, 7], 3, r"lengths\[2\] \+ src_index\[2, 2\] = 2 \+ 7 is out of range: it must be < "
                                 r"max_blocks_per_seq \* block_size = 9"),
    ([4, 5, 1], 10, [0, 1, 2], 0, r"lengths\[2\] = 10 must be in \[0, max_blocks_per_seq \* block_size = 9\]"),
    ([4, 5, 1], 2, [0, 0, 1], 2, r"src_index\[2, 1\] = 0 must be greater"),
    ([4, 5, 1], 2, [0, 1, 2], 4, r"count\[2\] = 4 must be in \[0, P = 3\]"),
    ([4, 2, 1], 2, [0, 3, 4], 3, r"block_tables map position 3 of row 1 and position 3 of row 2 to one slot"),
    ([4, 4, 1], 1, [0, 3, 4], 3, r"block_tables map position 2 of row 2 and position 5 of row 2 to one slot"),
]


@pytest.mark.parametrize("row, n, src_row, c, msg", PAGED_BAD, ids=[f"bad{i}" for i in range(len(PAGED_BAD))])
def test_paged_bad_rows_refused_cpu(row, n, src_row, c, msg):
    """Out-of-range table entries of moved positions, positions past the table, bad counts
    and orders, and slots two (row, position) pairs would share: ValueError naming the
    argument, nothing written. Entries of positions a row does not move are not read (row
    0's junk)."""
    gen = torch.Generator().manual_seed(6)
    kc, vc = random_bits((6, 3, 2, 4), torch.float16, gen), random_bits((6, 3, 2, 4), torch.float16, gen)
    tables = torch.tensor([[0, 99, -5], [1, 2, 3], row])
    lengths, count = torch.tensor([1, 2, n]), torch.tensor([2, 2, c])
    src = torch.tensor([[0, 1, 9], [0, 2, 9], src_row])
    ek, ev = kc.clone(), vc.clone()
    flags = torch.zeros(3, dtype=torch.bool)
    with pytest.raises(ValueError, match=msg) as e:
        paged_kv_compact_(kc, vc, tables, lengths, src, count, invalid=flags)
    assert str(e.value).startswith("paged_kv_compact_: ") and "nothing was written" in str(e.value)
    assert_bits(kc, ek, "key_cache")
    assert_bits(vc, ev, "value_cache")
    assert not flags.any()


@pytest.mark.parametrize("device", DEVICES)
def test_paged_argument_errors(device):
    kc = torch.zeros(4, 2, 2, 4, device=device)
    vc = torch.zeros(4, 2, 2, 4, device=device)
    tables = torch.zeros(2, 3, dtype=torch.int32, device=device)
    lengths = torch.zeros(2, dtype=torch.int64, device=device)
    src = torch.zeros(2, 3, dtype=torch.int64, device=device)
    count = torch.zeros(2, dtype=torch.int64, device=device)
    op = torch.ops.specdec.paged_kv_compact_
    cases = [
        ((kc, vc, tables.float(), lengths, src, count), TypeError, "block_tables must be int32"),
        ((kc, vc, tables[0], lengths, src, count), ValueError, r"block_tables must be \[B, max_blocks_per_seq\]"),
        ((kc, vc, tables, lengths[:1], src, count), ValueError, r"lengths must have shape \[B \(rows of block_tables"),
        ((kc, vc, tables, lengths, src[:1], count), ValueError, r"src_index must be \[B, P\] with B = 2 rows"),
        ((kc, vc, tables, lengths, src, count[:1]), ValueError, r"count must have shape \[B \(rows of block_tables"),
        ((kc[:, :0], vc[:, :0], tables, lengths, src, count), ValueError, "block_size >= 1"),
        ((kc, vc[:3], tables, lengths, src, count), ValueError, "value_cache has shape"),
        ((kc, kc, tables, lengths, src, count), ValueError, "key_cache and value_cache overlap"),
        ((kc, vc, tables.cpu() if device != "cpu" else tables.to("meta"), lengths, src, count), ValueError,
         "block_tables is on"),
    ]
    for args, err, msg in cases:
        with pytest.raises(err, match=msg):
            op(*args)
    flat = torch.zeros(4 * 2 * 2 * 4, device=device)
    with pytest.raises(ValueError, match="key_cache and block_tables overlap"):
        op(flat.view(4, 2, 2, 4), vc, flat.view(torch.int32)[:6].view(2, 3), lengths, src, count)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_flag", [False, True])
def test_paged_opcheck(device, with_flag):
    gen = torch.Generator().manual_seed(8)
    kc, vc = torch.randn(6, 4, 2, 8, generator=gen).to(device), torch.randn(6, 4, 2, 8, generator=gen).to(device)
    tables = torch.tensor([[5, 1, 0], [2, 3, 4]], dtype=torch.int32, device=device)
    lengths, count = torch.tensor([3, 1], device=device), torch.tensor([3, 2], device=device)
    src = torch.tensor([[0, 4, 6], [1, 5, 0]], device=device)
    flag = torch.zeros(2, dtype=torch.bool, device=device) if with_flag else None
    torch.library.opcheck(torch.ops.specdec.paged_kv_compact_.default, (kc, vc, tables, lengths, src, count, flag))


# ---- torch.compile --------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_compact_steps_under_torch_compile(device):
    """append + compact + lengths += count (contiguous) and a paged compact, traced with
    fullgraph=True (fake kernels, functionalised mutations), give the eager result."""
    def step(kc, vc, nk, nv, lengths, src, count, pk, pv, tables, plen):
        torch.ops.specdec.kv_append_(kc, vc, nk, nv, lengths, None)
        torch.ops.specdec.kv_compact_(kc, vc, lengths, src, count, None)
        lengths.add_(count)
        torch.ops.specdec.paged_kv_compact_(pk, pv, tables, plen, src, count, None)
        return kc[:, :, :8].float().sum(), lengths * 2, pk.sum()

    gen = torch.Generator().manual_seed(9)
    B, H, M, D, N = 2, 2, 12, 4, 4
    kc, vc = torch.randn(B, H, M, D, generator=gen).to(device), torch.randn(B, H, M, D, generator=gen).to(device)
    nk, nv = torch.randn(B, H, N, D, generator=gen).to(device), torch.randn(B, H, N, D, generator=gen).to(device)
    lengths, count = torch.tensor([1, 5], device=device), torch.tensor([3, 1], device=device)
    src = torch.tensor([[0, 2, 3], [0, 7, 7]], device=device)
    pk, pv = torch.randn(5, 4, H, D, generator=gen).to(device), torch.randn(5, 4, H, D, generator=gen).to(device)
    tables, plen = torch.tensor([[0, 1], [2, 3]], device=device), torch.tensor([2, 4], device=device)
    args = [kc, vc, nk, nv, lengths, src, count, pk, pv, tables, plen]
    eager = [a.clone() for a in args]
    out_eager = step(*eager)
    out = torch.compile(step, backend="aot_eager", fullgraph=True)(*args)
    for a, b in zip(args + list(out), eager + list(out_eager)):
        assert torch.equal(a, b)


@cuda
def test_compact_step_replayed_in_cuda_graph_cuda():
    """append of a tree + kv_compact_ + lengths += count captured once (no host sync inside:
    a sync would break the capture) and replayed with new trees and paths; matches a host
    reference step by step."""
    B, H, M, D, N, P = 3, 2, 64, 16, 4, 3
    dev = "cuda"
    kc = torch.zeros(B, H, M, D, dtype=torch.float16, device=dev)
    vc = torch.zeros_like(kc)
    init = torch.tensor([0, 5, 9])
    lengths = init.to(dev)
    nk = torch.zeros(B, H, N, D, dtype=torch.float16, device=dev)
    nv = torch.zeros_like(nk)
    path = torch.zeros(B, P, dtype=torch.int64, device=dev)
    count = torch.ones(B, dtype=torch.int64, device=dev)
    invalid = torch.zeros(B, dtype=torch.bool, device=dev)

    def step():
        kv_append_(kc, vc, nk, nv, lengths)
        kv_compact_(kc, vc, lengths, path, count, invalid=invalid)
        lengths.add_(count)

    graph = capture_graph(step)
    kc.zero_()
    vc.zero_()
    lengths.copy_(init)
    ref_k, ref_len = torch.zeros(B, H, M, D, dtype=torch.float16), init.clone()
    gen = torch.Generator().manual_seed(6)
    for _ in range(6):
        k = torch.randn(B, H, N, D, generator=gen).half()
        c = torch.randint(1, P + 1, (B,), generator=gen)
        # root 0, then P - 1 of the nodes 1 .. N-1 in order
        p = torch.stack([torch.cat([torch.zeros(1, dtype=torch.int64),
                                    torch.sort(torch.randperm(N - 1, generator=gen)[:P - 1] + 1).values])
                         for _ in range(B)])
        nk.copy_(k)
        nv.copy_(-k)
        path.copy_(p)
        count.copy_(c)
        graph.replay()
        for b in range(B):
            n = int(ref_len[b])
            ref_k[b, :, n:n + int(c[b])] = k[b][:, p[b, :int(c[b])]]
        ref_len += c
    torch.cuda.synchronize()
    assert lengths.cpu().tolist() == ref_len.tolist()
    for b in range(B):
        n = int(ref_len[b])
        assert torch.equal(kc[b, :, :n].cpu(), ref_k[b, :, :n])
        assert torch.equal(vc[b, :, :n].cpu(), -ref_k[b, :, :n])
    assert not invalid.any()


def test_exports():
    assert specdec_ext.kv_compact_ is kv_compact_ and "kv_compact_" in specdec_ext.__all__
    assert specdec_ext.paged_kv_compact_ is paged_kv_compact_ and "paged_kv_compact_" in specdec_ext.__all__
    for fn in (kv_compact_, paged_kv_compact_):
        doc = fn.__doc__
        assert "Parameters" in doc and "src_index" in doc and "int32" in doc and "invalid" in doc
