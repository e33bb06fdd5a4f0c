"""Contiguous KV cache: specdec::kv_append_, specdec::kv_rollback_ and specdec_ext.KVCache.

Every write is compared bit for bit with a plain-PyTorch indexing reference, on caches
pre-filled with NaN so that a missed or stray write shows up.
"""
import pytest
import torch

import specdec_ext
from specdec_ext import KVCache, kv_append_, kv_rollback_

cuda = pytest.mark.cuda
from helpers import DEVICES, capture_graph  # noqa: E402
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
K = 5  # drafts per step: S = 1 .. K+1
_INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def bits(t):
    return t.view(_INT[t.dtype])


def assert_same(actual, expected):
    """Bit-for-bit equality, NaN-aware (NaN in the same places, same bits everywhere)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.equal(torch.isnan(actual), torch.isnan(expected)), "NaN (unwritten) positions differ"
    assert torch.equal(bits(actual), bits(expected)), "values differ"


def poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def ref_append(cache, new, lengths):
    out = cache.clone()
    S = new.shape[2]
    for b, n in enumerate(lengths.tolist()):
        out[b, :, n:n + S] = new[b]
    return out


def make_case(B, H, M, D, S, dtype, device, gen, lengths_dtype=torch.int64):
    kc, vc = poisoned((B, H, M, D), dtype, device), poisoned((B, H, M, D), dtype, device)
    nk = torch.randn(B, H, S, D, generator=gen).to(dtype).to(device)
    nv = torch.randn(B, H, S, D, generator=gen).to(dtype).to(device)
    lengths = torch.randint(0, M - S + 1, (B,), generator=gen)
    lengths[0] = M - S  # a row filled exactly to capacity
    if B > 1:
        lengths[1] = 0
    return kc, vc, nk, nv, lengths.to(lengths_dtype).to(device)


# ---- kv_append_ -------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("S", range(1, K + 2))
@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
def test_append_matches_reference(device, dtype, S, lengths_dtype):
    gen = torch.Generator().manual_seed(S)
    kc, vc, nk, nv, lengths = make_case(5, 3, 16, 8, S, dtype, device, gen, lengths_dtype)
    ek, ev = ref_append(kc, nk, lengths), ref_append(vc, nv, lengths)
    before = lengths.clone()
    kv_append_(kc, vc, nk, nv, lengths)
    assert_same(kc, ek)
    assert_same(vc, ev)
    assert torch.equal(lengths, before), "kv_append_ must not advance lengths"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [1, 3, 64, 128])
def test_append_strided_inputs_and_layer_views(device, dtype, D):
    """new_k from a [B, S, H, D] projection (transposed view), caches as slices of a
    [layers, B, H, M, D] tensor; odd D exercises the narrow (non 16-byte) copies."""
    gen = torch.Generator().manual_seed(D)
    B, H, M, S, layers = 3, 2, 12, 4, 3
    big_k = poisoned((layers, B, H, M, D), dtype, device)
    big_v = poisoned((layers, B, H, M, D), dtype, device)
    k_bshd = torch.randn(B, S, H, D, generator=gen).to(dtype).to(device)
    v_bshd = torch.randn(B, S, H, D, generator=gen).to(dtype).to(device)
    nk, nv = k_bshd.transpose(1, 2), v_bshd.transpose(1, 2)
    lengths = torch.tensor([0, 5, M - S], device=device)
    ek, ev = big_k.clone(), big_v.clone()
    ek[1], ev[1] = ref_append(big_k[1], nk, lengths), ref_append(big_v[1], nv, lengths)
    kv_append_(big_k[1], big_v[1], nk, nv, lengths)
    assert_same(big_k, ek)
    assert_same(big_v, ev)
    # a cache slice along max_len (stride != contiguous) is fine too
    sk, sv = big_k[2, :, :, 2:], big_v[2, :, :, 2:]
    ek2, ev2 = big_k.clone(), big_v.clone()
    lengths2 = torch.tensor([1, 0, M - 2 - S], device=device)
    ek2[2, :, :, 2:] = ref_append(sk, nk, lengths2)
    ev2[2, :, :, 2:] = ref_append(sv, nv, lengths2)
    kv_append_(sk, sv, nk, nv, lengths2)
    assert_same(big_k, ek2)
    assert_same(big_v, ev2)


@pytest.mark.parametrize("device", DEVICES)
def test_append_empty(device):
    kc, vc = poisoned((0, 2, 4, 8), torch.float16, device), poisoned((0, 2, 4, 8), torch.float16, device)
    kv_append_(kc, vc, kc[:, :, :1], vc[:, :, :1], torch.zeros(0, dtype=torch.int64, device=device))
    kc, vc = poisoned((2, 2, 4, 8), torch.float16, device), poisoned((2, 2, 4, 8), torch.float16, device)
    ek, ev = kc.clone(), vc.clone()
    kv_append_(kc, vc, kc[:, :, :0].clone(), vc[:, :, :0].clone(), torch.tensor([4, 0], device=device))
    assert_same(kc, ek)
    assert_same(vc, ev)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [[0, 12, 3], [0, -1, 3], [13, 0, 0]])
def test_append_overflow_refused_cpu(dtype, bad):
    gen = torch.Generator().manual_seed(0)
    kc, vc, nk, nv, _ = make_case(3, 2, 16, 8, 5, dtype, "cpu", gen)
    kc[:, :, :4] = 1.0  # some real content besides the poison
    lengths = torch.tensor(bad)
    ek, ev, el = kc.clone(), vc.clone(), lengths.clone()
    overflow = torch.zeros(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="nothing was written"):
        kv_append_(kc, vc, nk, nv, lengths, overflow=overflow)
    assert_same(kc, ek)
    assert_same(vc, ev)
    assert torch.equal(lengths, el)
    assert not overflow.any()


@cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_append_overflow_skipped_and_flagged_cuda(dtype):
    gen = torch.Generator().manual_seed(0)
    kc, vc, nk, nv, _ = make_case(4, 2, 16, 8, 5, dtype, "cuda", gen)
    lengths = torch.tensor([0, 12, -1, 11], device="cuda")  # rows 1, 2 would write out of bounds
    ek, ev = kc.clone(), vc.clone()
    ok = torch.tensor([True, False, False, True])
    for b in (0, 3):
        n = int(lengths[b])
        ek[b, :, n:n + 5], ev[b, :, n:n + 5] = nk[b], nv[b]
    overflow = torch.zeros(4, dtype=torch.bool, device="cuda")
    kv_append_(kc, vc, nk, nv, lengths, overflow=overflow)
    assert_same(kc, ek)
    assert_same(vc, ev)
    assert torch.equal(overflow.cpu(), ~ok)
    # sticky: a later good step does not clear the flags
    kv_append_(kc, vc, nk, nv, torch.zeros(4, dtype=torch.int64, device="cuda"), overflow=overflow)
    assert torch.equal(overflow.cpu(), ~ok)
    # without a flag tensor the bad rows are skipped silently
    kc2, vc2 = poisoned(kc.shape, dtype, "cuda"), poisoned(vc.shape, dtype, "cuda")
    kv_append_(kc2, vc2, nk, nv, lengths)
    assert torch.isnan(kc2[1]).all() and torch.isnan(kc2[2]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_append_argument_errors(device):
    B, H, M, D, S = 2, 2, 8, 4, 3
    kc = torch.zeros(B, H, M, D, device=device)
    vc = torch.zeros(B, H, M, D, device=device)
    nk = torch.zeros(B, H, S, D, device=device)
    lengths = torch.zeros(B, dtype=torch.int64, device=device)
    op = torch.ops.specdec.kv_append_
    with pytest.raises(TypeError, match="new_k has dtype"):
        op(kc, vc, nk.half(), nk, lengths)
    with pytest.raises(TypeError, match="value_cache has dtype"):
        op(kc, vc.half(), nk, nk, lengths)
    with pytest.raises(ValueError, match="new_v must be"):
        op(kc, vc, nk, nk[:, :1], lengths)
    with pytest.raises(ValueError, match="new_k must be"):
        op(kc, vc, nk[0], nk, lengths)
    with pytest.raises(ValueError, match="key_cache must be"):
        op(kc[0], vc[0], nk, nk, lengths)
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        op(kc, vc, nk, nk, lengths.float())
    with pytest.raises(ValueError, match=r"lengths must have shape \[B\]"):
        op(kc, vc, nk, nk, lengths[:1])
    with pytest.raises(TypeError, match="overflow must be a bool"):
        op(kc, vc, nk, nk, lengths, torch.zeros(B, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="stride 1 in its last"):
        op(kc.transpose(2, 3), vc.transpose(2, 3), nk, nk, lengths)
    with pytest.raises(ValueError, match="different tensors"):
        op(kc, kc, nk, nk, lengths)
    with pytest.raises(TypeError, match="must be float32, float16 or bfloat16"):
        op(kc.double(), vc.double(), nk.double(), nk.double(), lengths)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_flag", [False, True])
def test_append_opcheck(device, with_flag):
    gen = torch.Generator().manual_seed(1)
    kc, vc, nk, nv, lengths = make_case(3, 2, 10, 16, 3, torch.float16, device, gen)
    kc.zero_()
    vc.zero_()
    flag = torch.zeros(3, dtype=torch.bool, device=device) if with_flag else None
    torch.library.opcheck(torch.ops.specdec.kv_append_.default, (kc, vc, nk, nv, lengths, flag))


# ---- kv_rollback_ ------------------------------------------------------------------------

def ref_rollback(lengths, num_appended, num_kept):
    return lengths - (num_appended - num_kept.to(lengths.dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kept_dtype", [torch.int32, torch.int64])
def test_rollback_matches_reference(device, lengths_dtype, kept_dtype):
    S = K + 1
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([S, S + 7, 40, S, 100], dtype=lengths_dtype)
    cases = [
        torch.zeros(5, dtype=kept_dtype),                      # roll back everything appended
        torch.full((5,), S, dtype=kept_dtype),                 # full acceptance: no-op
        torch.randint(1, S + 1, (5,), generator=gen).to(kept_dtype),  # num_accepted + 1
    ]
    for kept in cases:
        got = lengths.clone().to(device)
        expected = ref_rollback(lengths, S, kept)
        kv_rollback_(got, S, kept.to(device))
        assert got.dtype == lengths_dtype
        assert torch.equal(got.cpu(), expected)
    # roll a row back to exactly 0
    got = lengths.clone().to(device)
    kv_rollback_(got, S, torch.tensor([0, S, S, 0, S], dtype=kept_dtype, device=device))
    assert got.cpu().tolist() == [0, S + 7, 40, 0, 100]
    # num_appended = 0 with num_kept = 0 is a no-op; an int num_kept broadcasts
    got = lengths.clone().to(device)
    kv_rollback_(got, 0, 0)
    assert torch.equal(got.cpu(), lengths)


@pytest.mark.parametrize("kept, msg", [([0, 7], "rolling forward"), ([-1, 0], "rolling forward"),
                                       ([6, 0], "negative")])
def test_rollback_refused_cpu(kept, msg):
    lengths = torch.tensor([10, 5])
    invalid = torch.zeros(2, dtype=torch.bool)
    with pytest.raises(ValueError, match=msg):
        kv_rollback_(lengths, 6, torch.tensor(kept), invalid=invalid)
    assert lengths.tolist() == [10, 5]
    assert not invalid.any()


@cuda
def test_rollback_invalid_rows_flagged_cuda():
    lengths = torch.tensor([10, 5, 10, 3], device="cuda")
    kept = torch.tensor([7, 3, -1, 0], device="cuda")  # forward, ok, negative kept, below 0
    invalid = torch.zeros(4, dtype=torch.bool, device="cuda")
    kv_rollback_(lengths, 6, kept, invalid=invalid)
    assert lengths.cpu().tolist() == [10, 2, 10, 3]
    assert invalid.cpu().tolist() == [True, False, True, True]


@pytest.mark.parametrize("device", DEVICES)
def test_rollback_argument_errors(device):
    lengths = torch.tensor([4, 4], device=device)
    op = torch.ops.specdec.kv_rollback_
    with pytest.raises(ValueError, match="num_appended must be >= 0"):
        op(lengths, -1, torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"num_kept must have shape \[B\]"):
        op(lengths, 1, torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match="num_kept must be int32 or int64"):
        op(lengths, 1, torch.zeros(2, device=device))
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        op(lengths.float(), 1, torch.zeros(2, dtype=torch.int64, device=device))
    assert lengths.cpu().tolist() == [4, 4]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_flag", [False, True])
def test_rollback_opcheck(device, with_flag):
    lengths = torch.tensor([10, 8, 6], device=device)
    kept = torch.tensor([1, 3, 6], device=device)
    flag = torch.zeros(3, dtype=torch.bool, device=device) if with_flag else None
    torch.library.opcheck(torch.ops.specdec.kv_rollback_.default, (lengths, 6, kept, flag))


# ---- KVCache -----------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths_dtype", [torch.int64, torch.int32])
def test_kvcache_decoding_steps_match_reference(device, dtype, lengths_dtype):
    """Prefill + speculative steps (append every layer, advance, roll back to the accepted
    prefix) against a per-row Python list of tokens; every step checks all layers."""
    L, B, H, D, M = 3, 4, 2, 8, 64
    gen = torch.Generator().manual_seed(7)
    cache = KVCache(L, B, H, D, M, dtype, device, lengths_dtype=lengths_dtype)
    assert cache.lengths.dtype == lengths_dtype
    model = [[[] for _ in range(B)] for _ in range(L)]  # model[layer][b] = list of (k, v) [H, D]
    for step in range(12):
        S = 8 if step == 0 else int(torch.randint(1, K + 2, (), generator=gen))
        for layer in range(L):
            k = torch.randn(B, H, S, D, generator=gen).to(dtype)
            v = torch.randn(B, H, S, D, generator=gen).to(dtype)
            keys, values = cache.append(layer, k.to(device), v.to(device))
            for b in range(B):
                model[layer][b] += [(k[b, :, s], v[b, :, s]) for s in range(S)]
            longest = max(len(r) for r in model[layer])
            assert keys.shape == (B, H, longest, D)
        cache.advance(S)
        kept = torch.randint(0, S + 1, (B,), generator=gen)
        if step % 3 == 0:
            kept[0] = S  # full acceptance
        cache.rollback(S, kept.to(device) if step % 2 else kept)
        for layer in range(L):
            for b in range(B):
                del model[layer][b][len(model[layer][b]) - (S - int(kept[b])):]
        lens = [len(r) for r in model[0]]
        assert cache.host_lengths().tolist() == lens
        assert cache.lengths.cpu().tolist() == lens
        for layer in range(L):
            kl, vl = cache.layer(layer)
            for b in range(B):
                if lens[b]:
                    assert torch.equal(kl[b, :, :lens[b]].cpu(), torch.stack([t[0] for t in model[layer][b]], 1))
                    assert torch.equal(vl[b, :, :lens[b]].cpu(), torch.stack([t[1] for t in model[layer][b]], 1))
    cache.check()


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_overflow_refused_unchanged(device):
    L, B, H, D, M = 2, 3, 2, 4, 10
    cache = KVCache(L, B, H, D, M, torch.bfloat16, device)
    ones = torch.ones(B, H, 7, D, dtype=torch.bfloat16, device=device)
    for layer in range(L):
        cache.append(layer, ones, ones)
    cache.advance(7)
    cache.rollback(7, torch.tensor([7, 4, 7]))  # lengths 7, 4, 7
    snap = (cache.key_cache.clone(), cache.value_cache.clone(), cache.lengths.clone())
    new = torch.full((B, H, 4, D), 2.0, dtype=torch.bfloat16, device=device)
    with pytest.raises(specdec_ext.CacheFullError, match=r"rows \[0, 2\].*max_len=10"):
        cache.append(1, new, new)
    with pytest.raises(specdec_ext.CacheFullError, match="max_len=10"):
        cache.advance(4)
    assert torch.equal(cache.key_cache, snap[0]) and torch.equal(cache.value_cache, snap[1])
    assert torch.equal(cache.lengths, snap[2])
    assert cache.host_lengths().tolist() == [7, 4, 7]
    # exactly to capacity is fine
    new3 = new[:, :, :3]
    cache.append(0, new3, new3)
    cache.advance(3)
    assert cache.host_lengths().tolist() == [10, 7, 10]


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_rollback_refused_unchanged(device):
    cache = KVCache(1, 2, 1, 4, 16, torch.float32, device)
    x = torch.ones(2, 1, 3, 4, device=device)
    cache.append(0, x, x)
    cache.advance(3)
    with pytest.raises(ValueError, match="no rolling forward"):
        cache.rollback(3, [4, 1])
    with pytest.raises(ValueError, match="no rolling forward"):
        cache.rollback(3, [-1, 1])
    with pytest.raises(ValueError, match="negative"):
        cache.rollback(5, [0, 0])
    assert cache.lengths.cpu().tolist() == [3, 3] and cache.host_lengths().tolist() == [3, 3]
    cache.rollback(3, 0)
    assert cache.lengths.cpu().tolist() == [0, 0]
    cache.rollback(0, 0)
    assert cache.host_lengths().tolist() == [0, 0]


def test_kvcache_arguments_and_reset():
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, 1, 1, 4, 0, torch.float16, "cpu")
    with pytest.raises(TypeError, match="dtype"):
        KVCache(1, 1, 1, 4, 8, torch.int8, "cpu")
    cache = KVCache(2, 2, 1, 4, 8, torch.float16, "cpu")
    x = torch.ones(2, 1, 2, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="layer"):
        cache.append(2, x, x)
    with pytest.raises(TypeError, match="new_k has dtype"):
        cache.append(0, x.float(), x.float())
    cache.append(0, x, x)
    cache.advance(2)
    cache.reset([1])
    assert cache.host_lengths().tolist() == [2, 0] and cache.lengths.tolist() == [2, 0]
    mask = cache.attention_mask(3)
    assert mask.shape == (2, 1, 3, 5) and mask.dtype == torch.float16


@cuda
def test_kvcache_device_rollback_flags_and_lazy_mirror_cuda():
    cache = KVCache(1, 2, 1, 8, 8, torch.float16, "cuda")
    x = torch.ones(2, 1, 6, 8, dtype=torch.float16, device="cuda")
    cache.append(0, x, x)
    cache.advance(6)
    cache.rollback(6, torch.tensor([1, 2], device="cuda"))  # device num_kept: no sync
    y = torch.ones(2, 1, 5, 8, dtype=torch.float16, device="cuda")
    cache.append(0, y, y)  # fits only with the exact lengths 1 and 2
    cache.advance(5)
    assert cache.host_lengths().tolist() == [6, 7]
    cache.rollback(5, torch.tensor([9, 0], device="cuda"))  # row 0 invalid: unchanged + flagged
    assert cache.lengths.cpu().tolist() == [6, 2]
    with pytest.raises(RuntimeError, match=r"rows \[0\]"):
        cache.check()


# ---- torch.compile / CUDA graphs --------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_step_under_torch_compile(device):
    """append + advance + rollback traced with fullgraph=True (fake kernels, functionalised
    mutations) gives the eager result."""
    def step(kc, vc, nk, nv, lengths, kept):
        torch.ops.specdec.kv_append_(kc, vc, nk, nv, lengths, None)
        lengths.add_(nk.shape[2])
        torch.ops.specdec.kv_rollback_(lengths, nk.shape[2], kept, None)
        return kc[:, :, :6].float().sum(), lengths * 2

    gen = torch.Generator().manual_seed(11)
    kc, vc, nk, nv, lengths = make_case(3, 2, 12, 8, 3, torch.float16, device, gen)
    kc, vc = kc.nan_to_num(0.5), vc.nan_to_num(0.5)
    kept = torch.tensor([1, 3, 0], device=device)
    eager = [t.clone() for t in (kc, vc, lengths)]
    out_eager = step(*eager[:2], nk, nv, eager[2], kept)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out = compiled(kc, vc, nk, nv, lengths, kept)
    for a, b in zip((kc, vc, lengths) + tuple(out), tuple(eager) + tuple(out_eager)):
        assert torch.equal(a, b)


@cuda
def test_step_replayed_in_cuda_graph_cuda():
    """kv_append_ + lengths += S + kv_rollback_ captured once and replayed with new inputs:
    no host sync inside, results match a host reference step by step."""
    B, H, M, D, S = 4, 2, 40, 16, 3
    dev = "cuda"
    kc = torch.zeros(B, H, M, D, dtype=torch.float16, device=dev)
    vc = torch.zeros_like(kc)
    init = torch.tensor([0, 3, 5, 7])
    lengths = init.to(dev)
    nk = torch.zeros(B, H, S, D, dtype=torch.float16, device=dev)
    nv = torch.zeros_like(nk)
    kept = torch.full((B,), S, dtype=torch.int64, device=dev)
    overflow = torch.zeros(B, dtype=torch.bool, device=dev)
    invalid = torch.zeros(B, dtype=torch.bool, device=dev)

    def step():
        kv_append_(kc, vc, nk, nv, lengths, overflow=overflow)
        lengths.add_(S)
        kv_rollback_(lengths, S, kept, invalid=invalid)

    graph = capture_graph(step)
    kc.zero_()
    vc.zero_()
    lengths.copy_(init)
    ref_k, ref_v, ref_len = torch.zeros(B, H, M, D, dtype=torch.float16), torch.zeros(B, H, M, D,
                                                                                       dtype=torch.float16), init.clone()
    gen = torch.Generator().manual_seed(5)
    for _ in range(8):
        k = torch.randn(B, H, S, D, generator=gen).half()
        v = torch.randn(B, H, S, D, generator=gen).half()
        keep = torch.randint(1, S + 1, (B,), generator=gen)
        nk.copy_(k)
        nv.copy_(v)
        kept.copy_(keep)
        graph.replay()
        for b in range(B):
            n = int(ref_len[b])
            ref_k[b, :, n:n + S], ref_v[b, :, n:n + S] = k[b], v[b]
        ref_len += keep
    torch.cuda.synchronize()
    assert lengths.cpu().tolist() == ref_len.tolist()
    for b in range(B):
        n = int(ref_len[b])
        assert torch.equal(kc[b, :, :n].cpu(), ref_k[b, :, :n])
        assert torch.equal(vc[b, :, :n].cpu(), ref_v[b, :, :n])
    assert not overflow.any() and not invalid.any()


def test_overlapping_caches_are_refused():
    """Partly overlapping key/value caches (or an expanded one) would race on CUDA: refused.
    (Overlap that torch cannot decide cheaply, between two strided views, is not detected.)"""
    flat = torch.zeros(2 * 2 * 8 * 4 + 32)
    k, v = flat[:128].view(2, 2, 8, 4), flat[32:160].view(2, 2, 8, 4)   # dense, partly overlapping
    big = flat
    new = torch.ones(2, 2, 1, 4)
    lengths = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="key_cache and value_cache overlap in memory"):
        specdec_ext.kv_append_(k, v, new, new, lengths)
    assert (big == 0).all()
    expanded = torch.zeros(1, 2, 8, 4).expand(2, 2, 8, 4)
    with pytest.raises(ValueError, match="key_cache has overlapping elements"):
        specdec_ext.kv_append_(expanded, torch.zeros(2, 2, 8, 4), new, new, lengths)
