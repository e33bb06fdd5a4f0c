"""Robustness of the native ops (issue 11): extreme values, aliasing, devices,
integer edge cases. Every kernel variant is covered: the AVX2 and the default CPU
copies (SPECDEC_CPU_CAPABILITY=default) and CUDA when a GPU is present."""
import numpy as np
import pytest
import torch

import stats_reference
from helpers import draws

OPS = torch.ops.specdec

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _t(x, device="cpu", dtype=torch.float32):
    return torch.tensor(x, dtype=dtype, device=device)


def _sample(logits, temperature, seed=1, offset=0, probs_out=None):
    t = temperature if isinstance(temperature, torch.Tensor) else _t(temperature)
    return OPS.sample(logits, t, _t(seed, dtype=torch.int64), _t(offset, dtype=torch.int64), probs_out)


def _verify(logits, ids, q, temperature, seed=1, offset=0):
    t = temperature if isinstance(temperature, torch.Tensor) else _t(temperature)
    return OPS.verify(logits, ids, q, t, _t(seed, dtype=torch.int64), _t(offset, dtype=torch.int64))


# =============================================================================
# B.1  Out-of-range ids at tiny temperatures; finite logits always give a token
# =============================================================================

def test_tiny_temperature_gives_the_argmax(variant):
    """Repro of issue 11: the AVX2 kernels returned -128 / 0 / INT64_MAX here."""
    x = torch.tensor([[6.34375, 6.0]], device=variant)
    assert _sample(x, 1e-20, seed=1).tolist() == [0]
    torch.manual_seed(0)
    x = (torch.randn(64, 1000) * 5).to(variant)
    tok = _sample(x, 1e-9, seed=3)
    assert torch.equal(tok, x.argmax(-1))


def test_huge_finite_logits_are_valid(variant):
    """l / T overflows float32 but (l - max) / T does not: a valid token."""
    assert _sample(torch.tensor([[3e38, 0.0]], device=variant), 0.5).tolist() == [0]
    assert _sample(torch.tensor([[-3e38, 3e38, 0.0]], device=variant), 1e-3).tolist() == [1]
    L = torch.tensor([[[3e38, 0.0, -3e38], [0.0, -3e38, 3e38]]], device=variant)
    ids = torch.tensor([[0]], device=variant)
    tok, n, valid = _verify(L, ids, None, 0.5)
    assert valid.tolist() == [True] and n.tolist() == [1] and tok.tolist() == [[0, 2]]


def _dtype_max(dtype):
    return float(torch.finfo(dtype).max) if dtype != torch.float32 else 3e38


def _extreme_logits(B, V, dtype, scale, g):
    """Rows mixing huge positive / negative values and -inf (never a whole row)."""
    x = torch.randn(B, V, generator=g, dtype=torch.float64)
    x = x / x.abs().max() * min(scale, _dtype_max(dtype))
    mask = torch.rand(B, V, generator=g) < 0.2
    mask[:, 0] = False
    x[mask] = float("-inf")
    return x.to(dtype)


TEMPS = [1e-38, 1e-30, 1e-20, 1e-9, 1e-3, 1.0, 1e3, 1e20, 1e30, 3e38]
SCALES = [1.0, 1e4, 3e38]


def _point_mass(logits64: np.ndarray, t: float) -> bool:
    """True when every other token has weight < 1e-30 of the max's (a point mass)."""
    srt = np.sort(logits64[np.isfinite(logits64)])[::-1]
    return len(srt) < 2 or (srt[0] - srt[1]) / t > 69.1


@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_extreme_values(dtype, variant):
    B, V = 24, 300
    g = torch.Generator().manual_seed(7)
    for scale in SCALES:
        L = _extreme_logits(B, V, dtype, scale, g).to(variant)
        L64 = L.double().cpu().numpy()
        for T in TEMPS:
            out = torch.full((B, V), 7.0, device=variant)
            tok = _sample(L, T, seed=5, probs_out=out).cpu()
            assert ((tok >= 0) & (tok < V)).all(), (scale, T, tok)
            o = out.cpu()
            assert not o.isnan().any()
            torch.testing.assert_close(o.sum(-1), torch.ones(B), rtol=0, atol=1e-4)
            amax = L.float().argmax(-1).cpu()
            for b in range(B):
                assert o[b, tok[b]] > 0
                if _point_mass(L64[b], T):
                    assert tok[b] == amax[b], (scale, T, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dense_q", [False, True])
def test_verify_extreme_values(dtype, dense_q, variant):
    B, K, V = 16, 3, 300
    g = torch.Generator().manual_seed(11)
    for scale in SCALES:
        L = _extreme_logits(B * (K + 1), V, dtype, scale, g).view(B, K + 1, V).to(variant)
        amax = L.float().argmax(-1)
        ids = amax[:, :K].clone()
        flip = torch.rand(B, K, generator=g).to(variant) < 0.3
        ids[flip] = (ids[flip] + 1) % V
        q = None
        if dense_q:
            q = torch.softmax(torch.randn(B, K, V, generator=g), -1).to(dtype).to(variant)
        g_tok, g_n, g_valid = _verify(L, ids, q, 0.0)
        assert g_valid.all()
        L64 = L.double().cpu().numpy()
        for T in TEMPS:
            tok, n, valid = _verify(L, ids, q, T, seed=3)
            assert valid.all(), (scale, T)
            assert ((n >= 0) & (n <= K)).all()
            emitted = tok.gather(1, n.view(-1, 1)).view(-1)
            assert ((emitted >= 0) & (emitted < V)).all()
            for b in range(B):  # point mass at the argmax everywhere: exactly greedy
                if all(_point_mass(L64[b, i], T) for i in range(K + 1)):
                    assert torch.equal(tok[b], g_tok[b]) and n[b] == g_n[b], (scale, T, b)


def test_denormal_temperature_is_invalid(variant):
    """A denormal T (1/T = inf) stays unusable: a 0-dim CPU T is refused, a [B] one flags the row."""
    L = torch.randn(2, 10, device=variant)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        _sample(L, 1e-40)
    tok = _sample(L, torch.tensor([1e-40, 1e-38], device=variant))
    assert tok[0] == -1 and tok[1] == L[1].argmax()
    tok, n, valid = _verify(L.view(2, 1, 10), torch.empty(2, 0, dtype=torch.int64, device=variant), None,
                            torch.tensor([1e-40, 1.0], device=variant))
    assert valid.tolist() == [False, True]


@pytest.mark.parametrize("T", [1e-3, 1e3])
def test_sample_law_at_extreme_temperatures(T, variant):
    """Logits scaled with T, so l / T has O(1) spread: the law must still be exact."""
    V, N = 37, draws(100_000)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(V, generator=g) * 2.0 * T + 5.0 * T
    L = logits.to(variant).unsqueeze(0).expand(N, V)
    tok = _sample(L, T, seed=17, offset=2).cpu()
    assert ((tok >= 0) & (tok < V)).all()
    counts = torch.bincount(tok, minlength=V).numpy()
    assert stats_reference.chi_square_pvalue(counts, stats_reference.softmax64(logits, T)) > stats_reference.ALPHA


@pytest.mark.parametrize("T", [1e-3, 1e3])
@pytest.mark.parametrize("dense_q", [False, True])
def test_verify_law_at_extreme_temperatures(T, dense_q, variant):
    K, V, N = 2, 37, draws(100_000)
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(K + 1, V, generator=g) * 2.0 * T - 3.0 * T
    q = torch.softmax(torch.randn(K, V, generator=g) * 2.0, -1)
    draft = torch.multinomial(q, 1, generator=g).view(K)
    Q = q.to(variant).unsqueeze(0).expand(N, K, V) if dense_q else None
    tok, n, valid = _verify(logits.to(variant).unsqueeze(0).expand(N, K + 1, V),
                            draft.to(variant).unsqueeze(0).expand(N, K), Q, T, seed=23, offset=1)
    assert valid.all()
    p = stats_reference.softmax64(logits, T)
    expected = stats_reference.verify_joint(p, q.double().numpy() if dense_q else None, draft.numpy())
    counts = stats_reference.joint_counts(tok, n, K, V)
    assert stats_reference.chi_square_pvalue(counts, expected) > stats_reference.ALPHA


# =============================================================================
# B.2  Index / flag tensors inside the memory the op writes
# =============================================================================

def test_kv_append_lengths_inside_the_cache_is_refused():
    """Repro of issue 11 (segfault): lengths validated, then re-read after the copy changed them."""
    k, v = torch.zeros(2, 1, 64, 4), torch.zeros(2, 1, 64, 4)
    L = k.view(torch.int32).view(-1).as_strided((2,), (256,))
    with pytest.raises(ValueError, match="key_cache and lengths overlap in memory"):
        OPS.kv_append_(k, v, torch.full((2, 1, 3, 4), 1e9), torch.zeros(2, 1, 3, 4), L)
    assert not k.any() and not v.any()
    flags = v.view(torch.bool)[0, 0, 0, :2]
    with pytest.raises(ValueError, match="value_cache and overflow overlap in memory"):
        OPS.kv_append_(k, v, torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4), torch.zeros(2, dtype=torch.int64),
                       flags)
    assert not k.any() and not v.any()


def test_paged_append_slots_inside_the_cache_is_refused():
    kc, vc = torch.zeros(4, 2, 1, 4), torch.zeros(4, 2, 1, 4)
    slots = kc.view(torch.int64).view(-1)[:2]
    with pytest.raises(ValueError, match="key_cache and slot_mapping overlap in memory"):
        OPS.paged_kv_append_(kc, vc, torch.full((2, 1, 4), 1e9), torch.ones(2, 1, 4), slots)
    assert not kc.any() and not vc.any()
    with pytest.raises(ValueError, match="value_cache and invalid overlap in memory"):
        OPS.paged_kv_append_(kc, vc, torch.ones(2, 1, 4), torch.ones(2, 1, 4), torch.tensor([0, 1]),
                             vc.view(torch.bool).view(-1)[0])
    assert not kc.any() and not vc.any()


def test_rollback_num_kept_aliasing_lengths_is_refused():
    buf = torch.tensor([10, 10, 3, 3])
    with pytest.raises(ValueError, match="lengths and num_kept overlap in memory"):
        OPS.kv_rollback_(buf[:2], 5, buf[1:3], None)
    assert buf.tolist() == [10, 10, 3, 3]


# =============================================================================
# B.3  Aliasing the exact overlap test gave up on
# =============================================================================

def test_strided_views_of_one_buffer_are_refused():
    buf = torch.zeros(2, 1, 8, 8)
    k, v = buf[..., :6], buf[..., 2:]  # non-dense, partly overlapping: torch says "too hard"
    new = torch.ones(2, 1, 1, 6)
    with pytest.raises(ValueError, match="key_cache and value_cache overlap in memory"):
        OPS.kv_append_(k, v, new, new, torch.zeros(2, dtype=torch.int64))
    assert not buf.any()
    kc, vc = torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4)
    with pytest.raises(ValueError, match="key_cache and new_k overlap in memory"):
        OPS.kv_append_(kc, vc, kc[:, :, 4:5], vc[:, :, 5:6].clone(), torch.zeros(2, dtype=torch.int64))
    # as_strided self-overlap (rows sharing elements) of a written cache
    flat = torch.zeros(64)
    selfov = flat.as_strided((2, 2, 4, 4), (16, 4, 4, 1))  # dims 1 and 2 share elements
    with pytest.raises(ValueError, match="key_cache has overlapping elements"):
        OPS.kv_append_(selfov, torch.zeros(2, 2, 4, 4), torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4),
                       torch.zeros(2, dtype=torch.int64))
    assert not flat.any()


def test_separate_halves_of_one_buffer_are_fine():
    kv = torch.zeros(2, 2, 1, 8, 4)
    new = torch.ones(2, 1, 2, 4)
    OPS.kv_append_(kv[0], kv[1], new, 2 * new, torch.tensor([1, 3]))
    assert kv[0, 0, 0, 1:3].eq(1).all() and kv[1, 1, 0, 3:5].eq(2).all() and kv.sum() == 2 * 8 + 4 * 8


def test_interleaved_paged_layout_is_fine():
    """FlashInfer-style [NB, 2, BS, H, D]: key and value halves interleave block by block but share
    no element (exact test for two views of one geometry)."""
    kv = torch.zeros(3, 2, 4, 1, 8)
    new = torch.ones(2, 1, 8)
    OPS.paged_kv_append_(kv[:, 0], kv[:, 1], new, 2 * new, torch.tensor([5, 11]))
    assert kv[1, 0, 1].eq(1).all() and kv[2, 1, 3].eq(2).all() and kv.sum() == 3 * 16
    keys, values = OPS.paged_kv_gather(kv[:, 0], kv[:, 1], torch.tensor([[1, 2]], dtype=torch.int32),
                                       torch.tensor([8]), 8)
    assert keys[0, 0, 1].eq(1).all() and values[0, 0, 7].eq(2).all()
    with pytest.raises(ValueError, match="key_cache and value_cache overlap in memory"):
        OPS.paged_kv_append_(kv[:, 0], kv[:, 0, :, :, :].as_strided((3, 4, 1, 8), (64, 8, 8, 1), 8),
                             new, new, torch.tensor([5, 11]))


def test_rollback_expanded_lengths_is_refused():
    lengths = torch.tensor([9]).expand(3)
    with pytest.raises(ValueError, match="lengths has overlapping elements"):
        OPS.kv_rollback_(lengths, 2, torch.tensor([1, 1, 1]), None)
    assert lengths.tolist() == [9, 9, 9]


def test_gather_outputs_must_not_alias_inputs_but_caches_may_alias():
    kc = torch.randn(4, 2, 1, 4)
    tables, lengths = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([3, 4])
    ref_k, ref_v = OPS.paged_kv_gather(kc, kc.clone(), tables, lengths, 4)
    k2, v2 = OPS.paged_kv_gather(kc, kc, tables, lengths, 4)  # value_cache is key_cache: read-only, fine
    assert torch.equal(k2, ref_k) and torch.equal(v2, ref_k)
    k3, v3 = OPS.paged_kv_gather(kc[:1].expand(4, 2, 1, 4), kc, tables, lengths, 4)  # expanded cache: fine
    assert torch.equal(v3, ref_k) and torch.equal(k3[0, 0, :2], kc[0, :, 0]) and torch.equal(k3[0, 0, 2], kc[0, 0, 0])
    big = torch.zeros(2, 1, 4, 4)
    with pytest.raises(ValueError, match="keys_out and key_cache overlap in memory"):
        OPS.paged_kv_gather_into_(big.view(4, 2, 1, 4), kc, tables, lengths, big, torch.empty(2, 1, 4, 4))
    outs = torch.zeros(2, 1, 4, 8)
    with pytest.raises(ValueError, match="keys_out and values_out overlap in memory"):
        OPS.paged_kv_gather_into_(kc, kc, tables, lengths, outs[..., :4], outs[..., 2:6])
    vals = torch.zeros(2, 1, 4, 4)
    inside = vals.view(torch.int32).view(-1)[4:8].view(2, 2)  # block ids 0: valid
    with pytest.raises(ValueError, match="values_out and block_tables overlap in memory"):
        OPS.paged_kv_gather_into_(kc, kc, inside, lengths, torch.empty(2, 1, 4, 4), vals)
    assert not outs.any() and not vals.any()


def test_sample_probs_out_aliasing_is_refused():
    x = torch.randn(4, 16)
    rows = torch.zeros(40).as_strided((4, 16), (8, 1))  # rows overlap each other
    with pytest.raises(ValueError, match="probs_out has overlapping elements"):
        _sample(x, 1.0, probs_out=rows)
    both = torch.randn(4, 32)
    with pytest.raises(ValueError, match="probs_out and logits overlap in memory"):
        _sample(both[:, :16], 1.0, probs_out=both[:, 8:24])
    before = both.clone()
    _sample(both[:, :16], 1.0, probs_out=both[:, 16:])  # side by side: fine (logits read, not overwritten)
    assert torch.equal(both[:, :16], before[:, :16])


# =============================================================================
# B.4  Every tensor argument on the op's device
# =============================================================================

def test_meta_arguments_among_cpu_tensors_are_refused():
    L, D = torch.randn(2, 3, 10), torch.zeros(2, 2, dtype=torch.int64)
    t, s, o = _t(1.0), _t(1, dtype=torch.int64), _t(0, dtype=torch.int64)
    meta = lambda x: x.to("meta")  # noqa: E731
    with pytest.raises(ValueError, match="seed is on meta but target_logits is on cpu"):
        OPS.verify(L, D, None, t, meta(s), o)
    with pytest.raises(ValueError, match="temperature is on meta"):
        OPS.verify(L, D, None, meta(t), s, o)
    with pytest.raises(ValueError, match="draft_probs is on meta"):
        OPS.verify(L, D, meta(torch.rand(2, 2, 10)), t, s, o)
    with pytest.raises(ValueError, match="offset is on meta but logits is on cpu"):
        OPS.sample(L[:, 0], t, s, meta(o), None)
    with pytest.raises(ValueError, match="probs_out is on meta"):
        OPS.sample(L[:, 0], t, s, o, torch.empty(2, 10, device="meta"))
    lengths = torch.tensor([5, 5])
    with pytest.raises(ValueError, match="num_kept is on meta but lengths is on cpu"):
        OPS.kv_rollback_(lengths, 2, torch.zeros(2, dtype=torch.int64, device="meta"), None)
    assert lengths.tolist() == [5, 5]
    kc, vc = torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4)
    with pytest.raises(ValueError, match="lengths is on meta but key_cache is on cpu"):
        OPS.kv_append_(kc, vc, torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4), meta(torch.zeros(2, dtype=torch.int64)))
    with pytest.raises(ValueError, match="slot_mapping is on meta"):
        OPS.paged_kv_append_(kc, vc, torch.ones(2, 1, 4), torch.ones(2, 1, 4), meta(torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="block_tables is on meta"):
        OPS.paged_kv_gather(kc, vc, meta(torch.zeros(1, 1, dtype=torch.int32)), torch.tensor([1]), 2)
    assert not kc.any()


def test_meta_data_goes_to_the_fake_kernels():
    L = torch.empty(3, 10, device="meta")
    out = OPS.sample(L, _t(1.0), _t(1, dtype=torch.int64), _t(0, dtype=torch.int64), None)
    assert out.device.type == "meta" and out.shape == (3,)


@pytest.mark.cuda
def test_cuda_host_scalars_and_device_rule():
    L = torch.randn(4, 3, 50, device="cuda")
    D = torch.zeros(4, 2, dtype=torch.int64, device="cuda")
    temps = torch.tensor([0.0, 0.5, 1.0, 2.0])  # [B] on the CPU: copied, allowed
    seeds = torch.arange(4)
    r_host = OPS.verify(L, D, None, temps, seeds, _t(3, dtype=torch.int64))
    r_dev = OPS.verify(L, D, None, temps.cuda(), seeds.cuda(), _t(3, dtype=torch.int64, device="cuda"))
    assert all(torch.equal(a, b) for a, b in zip(r_host, r_dev))
    with pytest.raises(ValueError, match="draft_token_ids is on cpu but target_logits is on cuda"):
        OPS.verify(L, D.cpu(), None, temps, seeds, _t(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="seed is on meta"):
        OPS.verify(L, D, None, temps, seeds.to("meta"), _t(0, dtype=torch.int64))
    lengths = torch.tensor([5, 5], device="cuda")
    with pytest.raises(ValueError, match="num_kept is on cpu but lengths is on cuda"):
        OPS.kv_rollback_(lengths, 2, torch.zeros(2, dtype=torch.int64), None)


# =============================================================================
# B.5  Integer edge cases
# =============================================================================

def test_rollback_integer_edges_cpu():
    lengths = torch.tensor([-2])
    with pytest.raises(ValueError, match="negative"):
        OPS.kv_rollback_(lengths, 2**63 - 1, torch.tensor([0]), None)  # wrapped to INT64_MAX before
    assert lengths.tolist() == [-2]
    lengths = torch.tensor([5], dtype=torch.int32)
    OPS.kv_rollback_(lengths, 2**63 - 1, torch.tensor([2**63 - 1 - 3]), None)
    assert lengths.tolist() == [2] and lengths.dtype == torch.int32
    with pytest.raises(ValueError, match="negative"):
        OPS.kv_rollback_(lengths, 2**63 - 1, torch.tensor([0]), None)
    assert lengths.tolist() == [2]


def test_append_integer_edges_cpu():
    kc, vc = torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4)
    new = torch.ones(2, 1, 3, 4)
    for big in [2**63 - 1, 2**63 - 2, 2**31 - 1]:
        with pytest.raises(ValueError, match="would exceed max_len"):
            OPS.kv_append_(kc, vc, new, new, torch.tensor([0, big]))
    with pytest.raises(ValueError, match="would exceed max_len"):
        OPS.kv_append_(kc, vc, new, new, torch.tensor([0, 2**31 - 1], dtype=torch.int32))
    assert not kc.any()
    OPS.kv_append_(kc, vc, new, new, torch.tensor([5, 0], dtype=torch.int32))
    assert kc[0, 0, 5:].eq(1).all() and kc[1, 0, :3].eq(1).all()


@pytest.mark.cuda
def test_integer_edges_cuda_flags():
    lengths = torch.tensor([-2, 5, 5], device="cuda")
    invalid = torch.zeros(3, dtype=torch.bool, device="cuda")
    OPS.kv_rollback_(lengths, 2**63 - 1, torch.tensor([0, 2**63 - 1 - 3, 0], device="cuda"), invalid)
    assert lengths.tolist() == [-2, 2, 5] and invalid.tolist() == [True, False, True]
    kc, vc = torch.zeros(2, 1, 8, 4, device="cuda"), torch.zeros(2, 1, 8, 4, device="cuda")
    new = torch.ones(2, 1, 3, 4, device="cuda")
    overflow = torch.zeros(2, dtype=torch.bool, device="cuda")
    OPS.kv_append_(kc, vc, new, new, torch.tensor([2**63 - 1, 1], device="cuda"), overflow)
    assert overflow.tolist() == [True, False] and not kc[0].any() and kc[1, 0, 1:4].eq(1).all()
