"""Robustness of the native ops (issue 11): extreme values, aliasing, devices,
integer edge cases. Every kernel variant is covered: the AVX2 and the default CPU
copies (SPECDEC_CPU_CAPABILITY=default) and CUDA when a GPU is present."""
import numpy as np
import pytest
import torch

import specdec_ext
import stats_reference

CUDA = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()
OPS = torch.ops.specdec

VARIANTS = ["avx2", "default",
            pytest.param("cuda", marks=[pytest.mark.cuda,
                                        pytest.mark.skipif(not CUDA, reason="needs a GPU and CUDA kernels")])]


@pytest.fixture(params=VARIANTS)
def variant(request, monkeypatch):
    """The device to run on; selects the CPU copy through the environment."""
    if request.param == "default":
        monkeypatch.setenv("SPECDEC_CPU_CAPABILITY", "default")
    else:
        monkeypatch.delenv("SPECDEC_CPU_CAPABILITY", raising=False)
    return "cuda" if request.param == "cuda" else "cpu"


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
    with pytest.raises((RuntimeError, ValueError), match="temperature must be >= 0"):  # TODO(A.1): ValueError
        _sample(L, 1e-40)
    tok = _sample(L, torch.tensor([1e-40, 1e-38], device=variant))
    assert tok[0] == -1 and tok[1] == L[1].argmax()
    tok, n, valid = _verify(L.view(2, 1, 10), torch.empty(2, 0, dtype=torch.int64, device=variant), None,
                            torch.tensor([1e-40, 1.0], device=variant))
    assert valid.tolist() == [False, True]


@pytest.mark.parametrize("T", [1e-3, 1e3])
def test_sample_law_at_extreme_temperatures(T, variant):
    """Logits scaled with T, so l / T has O(1) spread: the law must still be exact."""
    V, N = 37, 100_000
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
    K, V, N = 2, 37, 100_000
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
