"""specdec_ext.skinny_linear (torch.ops.specdec.skinny_linear), the CPU linear layer over a few
rows, with a plain [N, K] weight and a packed one (pack_linear_weight): against a float64
reference in both compiled copies (AVX2, default), row invariance (a row's bits do not depend on
the other rows of the call or on the thread count), strides and copies, empty shapes, IEEE
specials, argument errors naming the argument, and a hypothesis fuzz (shapes, strides, layouts,
extreme values, aliasing between the read-only arguments)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec_ext
from specdec_ext import pack_linear_weight, skinny_linear

CPU_VARIANTS = ["avx2", "default"]


@pytest.fixture(params=CPU_VARIANTS)
def cpu_variant(request, monkeypatch):
    """Both compiled copies of the CPU kernels (the choice is read per call)."""
    if request.param == "default":
        monkeypatch.setenv("SPECDEC_CPU_CAPABILITY", "default")
    else:
        monkeypatch.delenv("SPECDEC_CPU_CAPABILITY", raising=False)
    return request.param


def _unpack(w: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight a packed [N / 16, K, 16] one holds (a plain one as it is)."""
    return w if w.dim() == 2 else w.transpose(1, 2).reshape(w.shape[0] * w.shape[2], w.shape[1])


def _layouts(w: torch.Tensor):
    """The weight as it is, and packed where its row count allows."""
    return [w] + ([pack_linear_weight(w)] if w.shape[0] % 16 == 0 else [])


def _reference(x, w, b=None, r=None) -> torch.Tensor:
    w = _unpack(w)
    out = x.double() @ w.double().T
    if b is not None:
        out = out + b.double()
    if r is not None:
        out = out + r.double()
    return out


def _tol(x, w):
    """float32 sums of K products against float64: a few ulps of the sum of |products|."""
    w = _unpack(w)
    return 1e-6 * (x.double().abs() @ w.double().abs().T) + 1e-30


def _close(got, x, w, b=None, r=None):
    ref = _reference(x, w, b, r)
    bound = _tol(x, w) + (0.0 if b is None else 1e-6 * b.double().abs()) + (0.0 if r is None else 1e-6 * r.double().abs())
    err = (got.double() - ref).abs()
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert bool((err <= 4 * bound).all()), f"max error {err.max().item()} vs bound {bound.max().item()}"


# K: below one vector, exact vectors, vectors plus a tail; N: below, at and past the feature
# tile, and (packed) one panel, whole blocks of 64 outputs, blocks plus one or three panels
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 9, 17, 40])
@pytest.mark.parametrize("N,K", [(1, 1), (2, 7), (3, 8), (5, 17), (16, 5), (64, 96), (80, 33), (112, 1),
                                 (385, 192), (1024, 200)])
def test_matches_float64_reference(cpu_variant, M, N, K):
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    b, r = torch.randn(N, generator=g), torch.randn(M, N, generator=g)
    for w in _layouts(w):
        _close(skinny_linear(x, w), x, w)
        _close(skinny_linear(x, w, b), x, w, b)
        _close(skinny_linear(x, w, b, r), x, w, b, r)
        _close(skinny_linear(x, w, None, r), x, w, None, r)


def test_pack_linear_weight_layout_and_errors():
    w = torch.arange(32 * 3, dtype=torch.float32).reshape(32, 3)
    p = pack_linear_weight(w)
    assert p.shape == (2, 3, 16) and p.is_contiguous() and p.data_ptr() != w.data_ptr()
    assert all(p[q, k, j] == w[16 * q + j, k] for q in range(2) for k in range(3) for j in range(16))
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        pack_linear_weight(torch.randn(24, 3))
    with pytest.raises(TypeError, match="weight must be float32"):
        pack_linear_weight(torch.randn(16, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight must be \[N, K\]"):
        pack_linear_weight(torch.randn(16))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("N,K", [(7, 13), (96, 192), (4096, 192), (1024, 512), (48, 3)])
def test_a_row_is_the_same_bits_whatever_the_other_rows_and_threads(cpu_variant, N, K, packed):
    """Every output is one dot product in a fixed order: the one-token pass and a K-token pass
    compute a token's projections alike (row tiles of 4, 3, 2, 1, feature tiles of 3, 2, 1 or
    packed slices of 8, 4, 2 vectors, one or two threads). A kernel whose sum order followed
    the tile shape fails here."""
    if packed and N % 16:
        pytest.skip("a packed weight has a multiple of 16 rows")
    g = torch.Generator().manual_seed(N + K)
    x, w, b = torch.randn(17, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    w = pack_linear_weight(w) if packed else w
    r = torch.randn(17, N, generator=g)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2):
            torch.set_num_threads(t)
            outs.append(skinny_linear(x, w, b, r))
            for M in (1, 2, 3, 5, 6, 17):
                part = skinny_linear(x[:M], w, b, r[:M])
                assert torch.equal(part, outs[-1][:M]), (t, M)
            for m in range(17):
                assert torch.equal(skinny_linear(x[m:m + 1], w, b, r[m:m + 1])[0], outs[-1][m]), (t, m)
        assert torch.equal(outs[0], outs[1]), "one thread and two give the same bits"
    finally:
        torch.set_num_threads(threads)


def test_strided_arguments_are_read_or_copied():
    g = torch.Generator().manual_seed(3)
    big = torch.randn(6, 40, generator=g)
    x = big[::2, 3:27]                    # row stride 80, unit last stride: read in place
    w = torch.randn(24, 10, generator=g).T  # [10, 24], last stride 10: copied
    b = torch.randn(20, generator=g)[::2]   # strided bias: copied
    r = torch.randn(3, 20, generator=g)[:, ::2]  # strided residual: copied
    _close(skinny_linear(x, w, b, r), x, w, b, r)
    xt = torch.randn(24, 3, generator=g).T  # x with last stride 3
    _close(skinny_linear(xt, w), xt, w)
    p = pack_linear_weight(torch.randn(32, 24, generator=g))
    strided = torch.empty(2, 24, 32)[:, :, :16]  # packed values, non-contiguous: copied
    strided.copy_(p)
    _close(skinny_linear(x, strided), x, p)
    assert torch.equal(skinny_linear(x, strided), skinny_linear(x, p))


def test_empty_shapes():
    assert skinny_linear(torch.randn(0, 5), torch.randn(4, 5)).shape == (0, 4)
    assert skinny_linear(torch.randn(3, 5), torch.randn(0, 5)).shape == (3, 0)
    b, r = torch.randn(4), torch.randn(3, 4)
    torch.testing.assert_close(skinny_linear(torch.randn(3, 0), torch.randn(4, 0), b, r), b + r, rtol=0, atol=0)
    assert skinny_linear(torch.randn(0, 5), torch.randn(2, 5, 16)).shape == (0, 32)
    assert skinny_linear(torch.randn(3, 5), torch.randn(0, 5, 16)).shape == (3, 0)
    b, r = torch.randn(16), torch.randn(3, 16)
    torch.testing.assert_close(skinny_linear(torch.randn(3, 0), torch.randn(1, 0, 16), b, r), b + r, rtol=0, atol=0)


def test_ieee_specials_propagate_like_the_math():
    x = torch.tensor([[1.0, 2.0, 3.0], [float("nan"), 0.0, 1.0], [float("inf"), 1.0, 0.0], [1e30, 1e30, 0.0]])
    w = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [1e30, 1e30, 0.0]])
    got = skinny_linear(x, w)
    ref = _reference(x, w).float()  # float64 sums rounded: the overflow of row 3 is inf there too
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    torch.testing.assert_close(got[finite], ref[finite])


@pytest.mark.parametrize("case,error,words", [
    ("x dtype", TypeError, "x must be float32"),
    ("weight dtype", TypeError, "weight must be float32"),
    ("bias dtype", TypeError, "bias must be float32"),
    ("residual dtype", TypeError, "residual must be float32"),
    ("x rank", ValueError, "x must be [M, K]"),
    ("weight rank", ValueError, "weight must be [N, K] or packed [N / 16, K, 16]"),
    ("K mismatch", ValueError, "weight must be [N, K] with K = 8"),
    ("packed K mismatch", ValueError, "packed weight must be [N / 16, K, 16] with K = 8"),
    ("packed panel", ValueError, "packed weight must be [N / 16, K, 16] with K = 8"),
    ("packed bias", ValueError, "bias must be [N] with N = 32"),
    ("bias shape", ValueError, "bias must be [N] with N = 5"),
    ("residual shape", ValueError, "residual must be [M, N] = [3, 5]"),
    ("device", ValueError, "weight is on meta"),
])
def test_bad_arguments_raise_naming_the_argument(case, error, words):
    x, w, b, r = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5), torch.randn(3, 5)
    args = dict(x=x, weight=w, bias=b, residual=r)
    key = case.split()[0]
    if case.startswith("packed"):
        args["weight"] = {"packed K mismatch": torch.randn(2, 9, 16), "packed panel": torch.randn(2, 8, 8),
                          "packed bias": torch.randn(2, 8, 16)}[case]
        args["residual"] = None
    elif case.endswith("dtype"):
        args[key] = args[key].double()
    elif case == "x rank":
        args["x"] = torch.randn(3, 8, 1)
    elif case == "weight rank":
        args["weight"] = torch.randn(40)
    elif case == "K mismatch":
        args["weight"] = torch.randn(5, 9)
    elif case == "bias shape":
        args["bias"] = torch.randn(6)
    elif case == "residual shape":
        args["residual"] = torch.randn(5, 3)
    else:
        args["weight"] = torch.empty(5, 8, device="meta")
    with pytest.raises(error) as info:
        skinny_linear(**args)
    assert words in str(info.value)


def test_the_output_is_new_and_the_arguments_unchanged():
    x, w, b, r = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6), torch.randn(4, 6)
    saved = [t.clone() for t in (x, w, b, r)]
    out = skinny_linear(x, w, b, r)
    assert all(torch.equal(t, s) for t, s in zip((x, w, b, r), saved))
    assert out.data_ptr() not in {t.data_ptr() for t in (x, w, b, r)} and out.is_contiguous()


def test_under_torch_compile():
    """The fake kernel traces it (both layouts); the compiled call gives the eager result."""
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    f = torch.compile(lambda a, c, d: skinny_linear(a, c, d) * 2.0, backend="aot_eager", fullgraph=True)
    assert torch.equal(f(x, w, b), skinny_linear(x, w, b) * 2.0)
    p, b = pack_linear_weight(torch.randn(32, 8)), torch.randn(32)
    assert torch.equal(f(x, p, b), skinny_linear(x, p, b) * 2.0)


def test_opcheck_with_a_packed_weight():
    """The packed layout through torch.library.opcheck (schema, fake kernel, autograd registration);
    the plain layout is checked with every op in test_compile_ops.py."""
    g = torch.Generator().manual_seed(5)
    args = (torch.randn(3, 8, generator=g), pack_linear_weight(torch.randn(32, 8, generator=g)),
            torch.randn(32, generator=g), torch.randn(3, 32, generator=g))
    torch.library.opcheck(torch.ops.specdec.skinny_linear.default, args)


# ---- fuzz --------------------------------------------------------------------------------

_SCALES = [0.0, 1e-30, 1e-3, 1.0, 1e3, 1e15]


@st.composite
def skinny_cases(draw):
    M, N, K = draw(st.integers(0, 20)), draw(st.integers(0, 40)), draw(st.integers(0, 70))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    g = torch.Generator().manual_seed(seed)
    scale_x, scale_w = draw(st.sampled_from(_SCALES)), draw(st.sampled_from(_SCALES))
    # a larger buffer, sliced: row strides and offsets other than the packed ones
    pad = draw(st.integers(0, 3))
    x = (torch.randn(M, K + pad, generator=g) * scale_x)[:, pad:] if K + pad > 0 else torch.randn(M, 0)
    w = torch.randn(N, K, generator=g) * scale_w
    layout = draw(st.sampled_from(["plain", "transposed", "packed"]))
    if layout == "transposed" and N > 0 and K > 0:
        w = w.T.contiguous().T  # same values, last stride N: the op copies it
    elif layout == "packed":
        N = N // 16 * 16
        w = pack_linear_weight(w[:N])
    b = torch.randn(N, generator=g) if draw(st.booleans()) else None
    r = torch.randn(M, N, generator=g) if draw(st.booleans()) else None
    if r is not None and M == N == K and M > 0 and draw(st.booleans()):
        r = x  # residual and x alias: both are only read
    specials = draw(st.sampled_from(["none", "nan", "inf"]))
    if specials != "none" and M > 0 and K > 0:
        x = x.clone()
        x[draw(st.integers(0, M - 1)), draw(st.integers(0, K - 1))] = float(specials)
    return x, w, b, r


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=skinny_cases(), variant=st.sampled_from(CPU_VARIANTS))
def test_fuzz_skinny_linear(case, variant):
    x, w, b, r = case
    with pytest.MonkeyPatch.context() as mp:
        if variant == "default":
            mp.setenv("SPECDEC_CPU_CAPABILITY", "default")
        else:
            mp.delenv("SPECDEC_CPU_CAPABILITY", raising=False)
        got = skinny_linear(x, w, b, r)
        rows = [skinny_linear(x[m:m + 1], w, b, None if r is None else r[m:m + 1]) for m in range(x.shape[0])]
    ref = _reference(x, w, b, r)
    assert got.shape == ref.shape and got.dtype == torch.float32
    for m, row in enumerate(rows):  # row invariance, NaNs included
        torch.testing.assert_close(row[0], got[m], rtol=0, atol=0, equal_nan=True)
    # the scales keep every float32 partial sum below overflow, so the specials are the math's:
    # NaN where the float64 result is NaN, the same infinity where it is infinite, else finite
    ref32 = ref.float()
    nan, inf, finite = torch.isnan(ref32), torch.isinf(ref32), torch.isfinite(ref32)
    assert bool(torch.isnan(got)[nan].all())
    assert torch.equal(got[inf], ref32[inf])
    assert bool(torch.isfinite(got)[finite].all())
    bound = _tol(x, w) + (0.0 if b is None else 1e-6 * b.double().abs()) + (0.0 if r is None else 1e-6 * r.double().abs())
    assert bool(((got.double() - ref).abs()[finite] <= 4 * bound[finite] + 1e-37).all())
