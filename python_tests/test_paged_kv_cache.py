"""Paged KV cache: specdec::paged_kv_append_, specdec::paged_kv_gather, BlockManager and
PagedKVCache. Op results are compared bit for bit with plain-PyTorch indexing references on
NaN-poisoned caches; the block manager is driven through a long random simulation."""
import random

import pytest
import torch

from specdec_ext import BlockManager, OutOfBlocksError, PagedKVCache, paged_kv_append_, paged_kv_gather

cuda = pytest.mark.cuda
from helpers import DEVICES  # noqa: E402
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
K = 5
_INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_same(actual, expected):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.equal(torch.isnan(actual), torch.isnan(expected)), "NaN (unwritten) positions differ"
    assert torch.equal(actual.view(_INT[actual.dtype]), expected.view(_INT[expected.dtype])), "values differ"


def poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def ref_paged_append(cache, new, slots):
    out = cache.clone()
    bs = cache.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            out[s // bs, s % bs] = new[t]
    return out


def ref_gather(cache, tables, lengths, max_len):
    NB, bs, H, D = cache.shape
    B = tables.shape[0]
    out = torch.zeros(B, H, max_len, D, dtype=cache.dtype, device=cache.device)
    for b in range(B):
        for p in range(int(lengths[b])):
            out[b, :, p] = cache[int(tables[b, p // bs]), p % bs]
    return out


# ---- paged_kv_append_ ------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("S", range(1, K + 2))
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_paged_append_matches_reference(device, dtype, S, slot_dtype):
    gen = torch.Generator().manual_seed(S)
    NB, BS, H, D, B = 6, 4, 3, 8, 3
    kc, vc = poisoned((NB, BS, H, D), dtype, device), poisoned((NB, BS, H, D), dtype, device)
    T = B * S
    slots = torch.randperm(NB * BS, generator=gen)[:T]
    slots[torch.randperm(T, generator=gen)[: T // 3]] = -1  # padding tokens
    slots = slots.to(slot_dtype).to(device)
    nk = torch.randn(T, H, D, generator=gen).to(dtype).to(device)
    nv = torch.randn(T, H, D, generator=gen).to(dtype).to(device)
    ek, ev = ref_paged_append(kc, nk, slots), ref_paged_append(vc, nv, slots)
    paged_kv_append_(kc, vc, nk, nv, slots)
    assert_same(kc, ek)
    assert_same(vc, ev)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [1, 3, 128])
def test_paged_append_strided(device, dtype, D):
    """new_k as a view of a fused qkv projection [T, 3, H, D]; cache as a layer slice."""
    gen = torch.Generator().manual_seed(D)
    L, NB, BS, H, T = 2, 4, 2, 2, 5
    big_k, big_v = poisoned((L, NB, BS, H, D), dtype, device), poisoned((L, NB, BS, H, D), dtype, device)
    qkv = torch.randn(T, 3, H, D, generator=gen).to(dtype).to(device)
    nk, nv = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([7, 0, -1, 3, 4], device=device)
    ek, ev = big_k.clone(), big_v.clone()
    ek[1], ev[1] = ref_paged_append(big_k[1], nk, slots), ref_paged_append(big_v[1], nv, slots)
    paged_kv_append_(big_k[1], big_v[1], nk, nv, slots)
    assert_same(big_k, ek)
    assert_same(big_v, ev)


@pytest.mark.parametrize("bad, msg", [([0, 24], "out of range"), ([-2, 1], "out of range"),
                                      ([5, 5], "more than once")])
def test_paged_append_refused_cpu(bad, msg):
    kc, vc = poisoned((6, 4, 2, 8), torch.float16, "cpu"), poisoned((6, 4, 2, 8), torch.float16, "cpu")
    kc[0] = 1.0
    ek, ev = kc.clone(), vc.clone()
    new = torch.ones(2, 2, 8, dtype=torch.float16)
    invalid = torch.zeros((), dtype=torch.bool)
    with pytest.raises(ValueError, match=msg):
        paged_kv_append_(kc, vc, new, new, torch.tensor(bad), invalid=invalid)
    assert_same(kc, ek)
    assert_same(vc, ev)
    assert not invalid


@cuda
def test_paged_append_invalid_slot_skipped_cuda():
    kc, vc = poisoned((6, 4, 2, 8), torch.float16, "cuda"), poisoned((6, 4, 2, 8), torch.float16, "cuda")
    new = torch.arange(4 * 16, dtype=torch.float16, device="cuda").view(4, 2, 8)
    slots = torch.tensor([3, 24, -5, 9], device="cuda")
    ek = ref_paged_append(kc, new, torch.tensor([3, -1, -1, 9]))
    invalid = torch.zeros((), dtype=torch.bool, device="cuda")
    paged_kv_append_(kc, vc, new, new, slots, invalid=invalid)
    assert_same(kc, ek)
    assert_same(vc, ek)
    assert bool(invalid)
    paged_kv_append_(kc, vc, new[:1], new[:1], slots[:1], invalid=invalid)
    assert bool(invalid)  # sticky


@pytest.mark.parametrize("device", DEVICES)
def test_paged_append_argument_errors(device):
    kc = torch.zeros(4, 2, 2, 8, device=device)
    vc = torch.zeros(4, 2, 2, 8, device=device)
    new = torch.zeros(3, 2, 8, device=device)
    slots = torch.tensor([0, 1, 2], device=device)
    op = torch.ops.specdec.paged_kv_append_
    with pytest.raises(TypeError, match="new_k has dtype"):
        op(kc, vc, new.bfloat16(), new, slots)
    with pytest.raises(ValueError, match=r"new_v must be \[T, H, D\]"):
        op(kc, vc, new, new[:, :1], slots)
    with pytest.raises(ValueError, match=r"slot_mapping must have shape \[T\]"):
        op(kc, vc, new, new, slots[:2])
    with pytest.raises(TypeError, match="slot_mapping must be int32 or int64"):
        op(kc, vc, new, new, slots.float())
    with pytest.raises(ValueError, match="invalid must have shape"):
        op(kc, vc, new, new, slots, torch.zeros(2, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="block_size >= 1"):
        op(kc[:, :0], vc[:, :0], new, new, slots)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_flag", [False, True])
def test_paged_append_opcheck(device, with_flag):
    kc = torch.zeros(4, 2, 2, 8, dtype=torch.bfloat16, device=device)
    vc = torch.zeros(4, 2, 2, 8, dtype=torch.bfloat16, device=device)
    new = torch.randn(3, 2, 8, device=device).bfloat16()
    slots = torch.tensor([5, -1, 2], device=device)
    flag = torch.zeros((), dtype=torch.bool, device=device) if with_flag else None
    torch.library.opcheck(torch.ops.specdec.paged_kv_append_.default, (kc, vc, new, new, slots, flag))


# ---- paged_kv_gather ---------------------------------------------------------------------

def gather_case(dtype, device, gen, table_dtype=torch.int32):
    NB, BS, H, D = 10, 4, 2, 8
    kc = torch.randn(NB, BS, H, D, generator=gen).to(dtype)
    vc = torch.randn(NB, BS, H, D, generator=gen).to(dtype)
    kc[7:], vc[7:] = float("nan"), float("nan")  # blocks no table uses
    lengths = torch.tensor([0, 4, 9, 12, 3])      # empty, one full block, ragged, block multiple
    tables = torch.full((5, 4), -1, dtype=table_dtype)
    perm = torch.randperm(7, generator=gen).tolist()
    for b, n in enumerate(lengths.tolist()):
        need = -(-n // BS)
        tables[b, :need] = torch.tensor([perm[(b + i) % 7] for i in range(need)], dtype=table_dtype)
    return kc.to(device), vc.to(device), tables.to(device), lengths.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("max_len", [12, 15])
def test_gather_matches_reference(device, dtype, table_dtype, max_len):
    gen = torch.Generator().manual_seed(max_len)
    kc, vc, tables, lengths = gather_case(dtype, device, gen, table_dtype)
    keys, values = paged_kv_gather(kc, vc, tables, lengths, max_len)
    assert keys.is_contiguous() and values.is_contiguous()
    assert_same(keys, ref_gather(kc, tables, lengths, max_len))
    assert_same(values, ref_gather(vc, tables, lengths, max_len))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_into_preallocated_buffers(device, dtype):
    """paged_kv_gather_into_ writes into caller buffers (here strided slices of a bigger,
    NaN-poisoned buffer) exactly what paged_kv_gather returns, and nothing else."""
    gen = torch.Generator().manual_seed(5)
    kc, vc, tables, lengths = gather_case(dtype, device, gen)
    buf = poisoned((2, 5, 2, 16, 8), dtype, device)
    keys_out, values_out = buf[0, :, :, 1:13], buf[1, :, :, 1:13]
    expected = buf.clone()
    expected[0, :, :, 1:13] = ref_gather(kc, tables, lengths, 12)
    expected[1, :, :, 1:13] = ref_gather(vc, tables, lengths, 12)
    got = paged_kv_gather(kc, vc, tables, lengths, out=(keys_out, values_out))
    assert got[0] is keys_out and got[1] is values_out
    assert_same(buf, expected)
    if device == "cpu":  # an invalid request writes nothing
        before = buf.clone()
        bad = lengths.clone()
        bad[2] = 13
        with pytest.raises(ValueError, match="must be in"):
            paged_kv_gather(kc, vc, tables, bad, out=(keys_out, values_out))
        assert_same(buf, before)
    op = torch.ops.specdec.paged_kv_gather_into_
    with pytest.raises(TypeError, match="keys_out has dtype"):
        op(kc, vc, tables, lengths, keys_out.float() if dtype != torch.float32 else keys_out.half(), values_out)
    with pytest.raises(ValueError, match=r"values_out must be \[B, H, max_len, D\]"):
        op(kc, vc, tables, lengths, keys_out, values_out[:, :, :5])
    with pytest.raises(ValueError, match="different tensors"):
        op(kc, vc, tables, lengths, keys_out, keys_out)
    kc2, vc2 = kc.nan_to_num(), vc.nan_to_num()
    torch.library.opcheck(op.default, (kc2, vc2, tables, lengths, torch.zeros_like(keys_out),
                                       torch.zeros_like(values_out)))


@pytest.mark.parametrize("device", DEVICES)
def test_gather_strided_cache_and_empty(device):
    gen = torch.Generator().manual_seed(0)
    kc, vc, tables, lengths = gather_case(torch.float16, device, gen)
    big = torch.stack([kc, vc], 0)  # [2, NB, BS, H, D]: layer-style slices
    keys, values = paged_kv_gather(big[0], big[1], tables, lengths, 12)
    assert_same(keys, ref_gather(kc, tables, lengths, 12))
    keys, values = paged_kv_gather(kc, vc, tables, lengths.zero_(), 0)
    assert keys.shape == (5, 2, 0, 8)
    keys, values = paged_kv_gather(kc, vc, tables[:0], lengths[:0], 4)
    assert keys.shape == (0, 2, 4, 8)


@pytest.mark.parametrize("mutate, msg", [
    (lambda t, l: l.__setitem__(2, 13), r"lengths\[2\] = 13 must be in \[0, max_len = 12\]"),
    (lambda t, l: l.__setitem__(1, -1), r"lengths\[1\] = -1"),
    (lambda t, l: t.__setitem__((2, 1), 10), r"block_tables\[2, 1\] is out of range"),
    (lambda t, l: t.__setitem__((3, 2), -1), r"block_tables\[3, 2\] is out of range"),
])
def test_gather_refused_cpu(mutate, msg):
    gen = torch.Generator().manual_seed(0)
    kc, vc, tables, lengths = gather_case(torch.float32, "cpu", gen)
    mutate(tables, lengths)
    with pytest.raises(ValueError, match=msg):
        paged_kv_gather(kc, vc, tables, lengths, 12)
    with pytest.raises(ValueError, match="exceeds what block_tables can address"):
        paged_kv_gather(kc, vc, tables[:, :2], torch.tensor([0, 4, 9, 0, 0]), 12)


@cuda
def test_gather_clamps_and_zero_fills_cuda():
    gen = torch.Generator().manual_seed(0)
    kc, vc, tables, lengths = gather_case(torch.float32, "cuda", gen)
    tables[2, 1] = 10      # out of range: positions 4..7 of row 2 read as zero
    lengths[3] = 40        # clamped to max_len (and to the table's capacity)
    lengths[1] = -3        # clamped to 0
    keys, _ = paged_kv_gather(kc, vc, tables, lengths, 12)
    ref_tables = tables.clone()
    ref_lengths = torch.tensor([0, 0, 9, 12, 3])
    ref_tables[2, 1] = 0
    expected = ref_gather(kc, ref_tables, ref_lengths, 12)
    expected[2, :, 4:8] = 0
    assert_same(keys, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_argument_errors(device):
    gen = torch.Generator().manual_seed(0)
    kc, vc, tables, lengths = gather_case(torch.float32, device, gen)
    op = torch.ops.specdec.paged_kv_gather
    with pytest.raises(TypeError, match="block_tables must be int32"):
        op(kc, vc, tables.float(), lengths, 12)
    with pytest.raises(ValueError, match=r"block_tables must be \[B, max_blocks_per_seq\]"):
        op(kc, vc, tables[0], lengths, 12)
    with pytest.raises(ValueError, match=r"lengths must have shape \[B"):
        op(kc, vc, tables, lengths[:2], 12)
    with pytest.raises(ValueError, match="max_len must be >= 0"):
        op(kc, vc, tables, lengths, -1)
    with pytest.raises(ValueError, match="value_cache has shape"):
        op(kc, vc[:3], tables, lengths, 12)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_opcheck(device):
    gen = torch.Generator().manual_seed(0)
    kc, vc, tables, lengths = gather_case(torch.float16, device, gen)
    kc, vc = kc.nan_to_num(), vc.nan_to_num()
    torch.library.opcheck(torch.ops.specdec.paged_kv_gather.default, (kc, vc, tables, lengths, 12))


# ---- BlockManager / PagedKVCache --------------------------------------------------------

def contents(cache, seq):
    """Values of a sequence read back with the gather op (key channel 0)."""
    n = cache.length(seq)
    keys, values = cache.gather(0, [seq])
    assert torch.equal(keys[0, 0, :, 0], -values[0, 0, :, 0])
    return keys[0, 0, :n, 0].tolist()


def write(cache, seqs, n, start):
    """Allocate n tokens per sequence and append values start, start+1, ... (keys) / negated (values)."""
    slots = cache.allocate(seqs, n)
    T = slots.numel()
    vals = torch.arange(start, start + T, dtype=torch.float32)
    new_k = vals.view(T, 1, 1).expand(T, 1, 2).contiguous().to(cache.device)
    for layer in range(cache.num_layers):
        cache.append(layer, new_k, -new_k, slots)
    return vals.view(len(seqs), -1).tolist() if seqs else []


def test_rollback_across_and_onto_block_boundaries():
    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate("a", 10)  # blocks for positions 0-3, 4-7, 8-9
    assert len(m.block_table("a")) == 3 and m.num_free_blocks == 5
    m.rollback("a", 9)   # inside the last block: nothing freed
    assert len(m.block_table("a")) == 3
    m.rollback("a", 7)   # across a boundary: the last block is freed
    assert len(m.block_table("a")) == 2 and m.num_free_blocks == 6
    m.rollback("a", 4)   # exactly onto a boundary: the block holding 4..7 is wholly beyond
    assert len(m.block_table("a")) == 1 and m.num_free_blocks == 7
    m.rollback("a", 4)   # no-op
    assert m.length("a") == 4
    m.rollback("a", 0)
    assert m.block_table("a") == [] and m.num_free_blocks == 8
    with pytest.raises(ValueError, match="no rolling forward"):
        m.rollback("a", 1)
    with pytest.raises(KeyError):
        m.rollback("zz", 0)
    m.check_invariants()


@pytest.mark.parametrize("device", DEVICES)
def test_fork_shares_blocks_and_copies_on_write(device):
    cache = PagedKVCache(2, 8, 4, 1, 2, torch.float32, device)
    m = cache.manager
    parent = write(cache, ["p"], 6, 100)[0]  # blocks: full, partial (2 of 4)
    child = cache.fork("p", "c")
    assert m.block_table("c") == m.block_table("p") and all(m.ref_count(b) == 2 for b in m.block_table("p"))
    shared_last = m.block_table("p")[-1]
    free_before = m.num_free_blocks
    c_new = write(cache, ["c"], 3, 200)[0]   # copy-on-write of the partial last block
    assert m.block_table("c")[0] == m.block_table("p")[0]
    assert m.block_table("c")[1] != shared_last and m.block_table("p")[1] == shared_last
    assert m.num_free_blocks == free_before - 2  # the copy + one new block
    assert m.ref_count(shared_last) == 1
    p_new = write(cache, ["p"], 1, 300)[0]   # now private again: written in place, no copy
    assert m.block_table("p")[1] == shared_last
    assert contents(cache, "p") == parent + p_new
    assert contents(cache, "c") == parent + c_new
    assert child == "c" and cache.fork("c") == 0  # auto id
    cache.free("p")
    assert contents(cache, "c") == parent + c_new  # shared block 0 survives its first owner
    cache.free("c")
    cache.free(0)
    assert sorted(m.free_blocks()) == list(range(8))
    m.check_invariants()


def test_fork_at_block_boundary_needs_no_copy():
    m = BlockManager(6, 4)
    m.allocate("a", 8)
    m.fork("a", "b")
    alloc = m.allocate("b", 1)
    assert alloc.copies == [] and m.block_table("b")[:2] == m.block_table("a")
    m.rollback("b", 6)  # back into the shared block 1: it stays shared ...
    assert m.ref_count(m.block_table("a")[1]) == 2
    alloc = m.allocate("b", 1)  # ... so the next write copies it
    assert len(alloc.copies) == 1 and alloc.copies[0][0] == m.block_table("a")[1]
    m.check_invariants()


def test_out_of_blocks_refused_tables_unchanged():
    m = BlockManager(5, 4, max_blocks_per_seq=3)
    m.allocate("a", 6)
    m.fork("a", "b")
    m.allocate("c", 4)

    def state():
        return ({s: m.block_table(s) for s in m.sequences}, {s: m.length(s) for s in m.sequences},
                m.free_blocks(), [m.ref_count(b) for b in range(5)])

    before = state()
    assert m.blocks_needed([("a", 1), ("c", 5), ("b", 1)]) == 3
    assert m.blocks_needed([("a", 1), ("b", 1)]) == 1
    with pytest.raises(OutOfBlocksError, match="needs 3 blocks but only 2"):
        m.allocate_many([("a", 1), ("c", 5), ("b", 1)])  # CoW of a (1) + c (2); b is then private (0)
    assert state() == before
    with pytest.raises(OutOfBlocksError, match="max_blocks_per_seq=3"):
        m.allocate("c", 9)
    assert state() == before
    with pytest.raises(OutOfBlocksError):
        m.allocate("new", 12)
    assert state() == before and "new" not in m
    # exact accounting: a block shared by a and b is copied by the first writer only
    m.allocate_many([("a", 1), ("b", 1)])
    assert m.num_free_blocks == 1
    m.check_invariants()


@pytest.mark.parametrize("device", DEVICES)
def test_rollback_many_after_a_step(device):
    cache = PagedKVCache(1, 16, 4, 1, 2, torch.float32, device)
    seqs = ["a", "b", "c"]
    write(cache, seqs, 5, 0)   # prefix
    write(cache, seqs, 6, 100)  # S = K+1 speculative tokens
    tables = {s: cache.manager.block_table(s) for s in seqs}
    with pytest.raises(ValueError, match="nothing changed"):
        cache.rollback_many(seqs, 6, torch.tensor([1, 7, 6], device=device))  # roll forward
    with pytest.raises(ValueError, match="nothing changed"):
        cache.rollback_many(seqs, 12, [0, 0, 0])  # below zero
    assert {s: cache.manager.block_table(s) for s in seqs} == tables
    cache.rollback_many(seqs, 6, torch.tensor([1, 6, 3], device=device))  # num_accepted + 1
    assert [cache.length(s) for s in seqs] == [6, 11, 8]
    assert [len(cache.manager.block_table(s)) for s in seqs] == [2, 3, 2]
    assert contents(cache, "b")[:5] == [5.0, 6.0, 7.0, 8.0, 9.0]
    cache.manager.check_invariants()


def test_manager_argument_errors():
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)
    m = BlockManager(4, 2)
    with pytest.raises(ValueError, match="n_tokens"):
        m.allocate("a", -1)
    with pytest.raises(ValueError, match="twice"):
        m.allocate_many([("a", 1), ("a", 1)])
    m.allocate("a", 1)
    with pytest.raises(ValueError, match="already exists"):
        m.fork("a", "a")
    with pytest.raises(KeyError):
        m.free("b")


@pytest.mark.parametrize("device", DEVICES)
def test_random_simulation_10000_steps(device):
    """allocate/append/rollback/fork/free against a Python model of every sequence's tokens;
    the cache content is read back with the gather op, and the manager's bookkeeping is
    checked; at the end every block is back on the free list exactly once."""
    rng = random.Random(20240611)
    NB, BS = 24, 4
    cache = PagedKVCache(1, NB, BS, 1, 2, torch.float32, device, max_blocks_per_seq=10)
    m = cache.manager
    model = {}
    next_val, next_id = 1.0, 0
    stats = dict(append=0, oob=0, cow=0, rollback=0, fork=0, free=0)
    for step in range(10_000):
        r = rng.random()
        live = list(model)
        if r < 0.45 or not live:
            seqs = rng.sample(live, rng.randint(1, min(3, len(live)))) if live and rng.random() < 0.9 else []
            if not seqs or rng.random() < 0.15:
                seqs.append(f"s{next_id}")
                next_id += 1
            n = rng.randint(1, K + 1)
            refs_before = [m.ref_count(b) for b in range(NB)]
            snapshot = ({s: m.block_table(s) for s in m.sequences}, m.free_blocks())
            try:
                slots = cache.allocate(seqs, n)
            except OutOfBlocksError:
                stats["oob"] += 1
                assert ({s: m.block_table(s) for s in m.sequences}, m.free_blocks()) == snapshot
                continue
            stats["append"] += 1
            stats["cow"] += sum(1 for s in seqs if s in snapshot[0] and snapshot[0][s] and
                                m.block_table(s)[len(snapshot[0][s]) - 1] != snapshot[0][s][-1])
            # never write a block that is shared (or was shared before a copy-on-write)
            for s in slots.tolist():
                assert m.ref_count(s // BS) == 1
            # padding tokens (slot -1) interleaved: must be skipped
            T = slots.numel()
            vals = torch.arange(next_val, next_val + T, dtype=torch.float32)
            pad = rng.randint(0, 2)
            slot_all = torch.cat([slots.cpu(), torch.full((pad,), -1, dtype=torch.int64)])
            val_all = torch.cat([vals, torch.full((pad,), float("nan"))])
            perm = torch.randperm(T + pad, generator=torch.Generator().manual_seed(step))
            new_k = val_all[perm].view(-1, 1, 1).expand(-1, 1, 2).contiguous().to(device)
            cache.append(0, new_k, -new_k, slot_all[perm].to(device))
            for i, s in enumerate(seqs):
                model.setdefault(s, []).extend(vals[i * n:(i + 1) * n].tolist())
            next_val += T
            del refs_before
        elif r < 0.70:
            s = rng.choice(live)
            new_len = max(0, len(model[s]) - rng.randint(0, 2 * BS + 1))
            cache.rollback(s, new_len)
            del model[s][new_len:]
            stats["rollback"] += 1
        elif r < 0.85:
            if len(live) >= 8:
                continue
            s = rng.choice(live)
            new = cache.fork(s, f"s{next_id}")
            next_id += 1
            model[new] = list(model[s])
            stats["fork"] += 1
        else:
            s = rng.choice(live)
            cache.free(s)
            del model[s]
            stats["free"] += 1
        if step % 40 == 0 or step == 9_999:
            m.check_invariants()
            assert {s: m.length(s) for s in m.sequences} == {s: len(v) for s, v in model.items()}
            seqs = list(model)
            if seqs:
                keys, values = cache.gather(0, seqs)
                for b, s in enumerate(seqs):
                    n = len(model[s])
                    assert keys[b, 0, :n, 0].tolist() == model[s], f"step {step}: contents of {s}"
                    assert keys[b, 0, :n, 1].tolist() == model[s]
                    assert values[b, 0, :n, 0].tolist() == [-x for x in model[s]]
                    assert not keys[b, :, n:].any() and not values[b, :, n:].any()
    assert all(v > 50 for v in stats.values()), stats
    for s in list(model):
        cache.free(s)
    m.check_invariants()
    assert sorted(m.free_blocks()) == list(range(NB)) and m.sequences == []
    assert all(m.ref_count(b) == 0 for b in range(NB))
    cache.check()


@pytest.mark.parametrize("device", DEVICES)
def test_paged_ops_under_torch_compile(device):
    """paged append + gather traced with fullgraph=True give the eager result."""
    def step(kc, vc, new, slots, tables, lengths):
        torch.ops.specdec.paged_kv_append_(kc, vc, new, -new, slots, None)
        keys, values = torch.ops.specdec.paged_kv_gather(kc, vc, tables, lengths, 12)
        return keys + 1, values

    gen = torch.Generator().manual_seed(3)
    kc, vc, tables, lengths = gather_case(torch.float32, device, gen)
    kc, vc = kc.nan_to_num(), vc.nan_to_num()
    new = torch.randn(3, 2, 8, generator=gen).to(device)
    slots = torch.tensor([int(tables[2, 0]) * 4 + 1, -1, int(tables[3, 2]) * 4 + 3], device=device)
    eager = (kc.clone(), vc.clone())
    out_eager = step(*eager, new, slots, tables, lengths)
    out = torch.compile(step, backend="aot_eager", fullgraph=True)(kc, vc, new, slots, tables, lengths)
    for a, b in zip((kc, vc) + tuple(out), eager + tuple(out_eager)):
        assert torch.equal(a, b)
