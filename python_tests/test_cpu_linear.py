"""models/cpu_linear.py: the oneDNN-packed linear of the reference model on a CPU agrees with
F.linear / addmm, follows weight updates, and falls back where it does not apply."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_ext.models import cpu_linear
from specdec_ext.models.cpu_linear import linear, residual_linear, wide_linear_available

needs_onednn = pytest.mark.skipif(not wide_linear_available(), reason="this torch has no oneDNN linear ops")


@pytest.fixture(autouse=True)
def every_weight_packed():
    """The tests' small weights take the packed path too (the size bounds are tested apart)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_linear, "MIN_NUMEL_ROWS", 1)
        mp.setattr(cpu_linear, "MIN_NUMEL_ONE_ROW", 1)
        yield


def _calls(monkeypatch):
    """Count the packed path's calls (the oneDNN op) made through cpu_linear."""
    seen = []
    real = cpu_linear._packed

    def counting(weight):
        seen.append(weight)
        return real(weight)

    monkeypatch.setattr(cpu_linear, "_packed", counting)
    return seen


@needs_onednn
@settings(max_examples=40, deadline=None)
# rows past MAX_ROWS take F.linear
@given(rows=st.integers(1, 40), n_in=st.integers(1, 70), n_out=st.integers(1, 90), bias=st.booleans(),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), seed=st.integers(0, 2**31 - 1))
def test_matches_f_linear_and_addmm(rows, n_in, n_out, bias, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g) * scale
    w = torch.randn(n_out, n_in, generator=g)
    b = torch.randn(n_out, generator=g) if bias else None
    r = torch.randn(rows, n_out, generator=g)
    tol = dict(rtol=1e-5, atol=1e-5 * scale * n_in ** 0.5)
    with torch.no_grad():
        torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), **tol)
        torch.testing.assert_close(residual_linear(r, x, w, b), r + F.linear(x, w, b), **tol)


@needs_onednn
def test_packed_path_is_taken_and_follows_in_place_weight_updates(monkeypatch):
    seen = _calls(monkeypatch)
    w = torch.randn(48, 16)
    x = torch.randn(5, 16)
    with torch.no_grad():
        first = linear(x, w)
        assert len(seen) == 1, "float32 rows on a CPU without grad take the packed path"
        w.mul_(2.0)  # an in-place write: the packed copy must be renewed
        torch.testing.assert_close(linear(x, w), 2.0 * first, rtol=1e-5, atol=1e-5)
        w.copy_(torch.zeros_like(w))  # load_state_dict writes weights like this
        assert linear(x, w).abs().max().item() == 0.0


@needs_onednn
def test_pack_is_made_once_per_weight_and_dropped_with_it():
    w = torch.randn(32, 8)
    x = torch.randn(3, 8)
    with torch.no_grad():
        linear(x, w)
        entry = cpu_linear._PACKED[id(w)]
        linear(x, w)
        assert cpu_linear._PACKED[id(w)] is entry, "an unchanged weight reuses its packed copy"
    key = id(w)
    del w, entry
    assert key not in cpu_linear._PACKED, "the packed copy goes with its weight"


@pytest.mark.parametrize("case", ["float64", "grad", "3-d", "bfloat16", "inference", "empty", "many rows"])
def test_falls_back_to_f_linear(case, monkeypatch):
    seen = _calls(monkeypatch)
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    if case == "inference":
        with torch.inference_mode():
            w = torch.randn(12, 8)
    else:
        w = torch.randn(12, 8, dtype=dtype, requires_grad=case == "grad")
    x = torch.randn({"3-d": (2, 3, 8), "empty": (0, 8), "many rows": (cpu_linear.MAX_ROWS + 1, 8)}.get(case, (4, 8)),
                    dtype=dtype)
    with torch.set_grad_enabled(case == "grad"):
        out = linear(x, w)
        ref = F.linear(x, w)
    assert seen == []
    assert torch.equal(out, ref)
    if case == "grad":
        out.sum().backward()  # autograd works: F.linear was used
        assert w.grad is not None


def test_meta_tensors_take_f_linear():
    w = torch.empty(12, 8, device="meta")
    with torch.no_grad():
        out = linear(torch.empty(4, 8, device="meta"), w)
        res = residual_linear(torch.empty(4, 12, device="meta"), torch.empty(4, 8, device="meta"), w)
    assert out.shape == (4, 12) and out.device.type == "meta"
    assert res.shape == (4, 12)


@needs_onednn
def test_size_bounds_choose_the_path(monkeypatch):
    """One row packs weights of MIN_NUMEL_ONE_ROW elements or more, several rows weights of
    MIN_NUMEL_ROWS or more (where oneDNN's fixed cost per call pays), at most MAX_ROWS rows."""
    monkeypatch.setattr(cpu_linear, "MIN_NUMEL_ROWS", 64)
    monkeypatch.setattr(cpu_linear, "MIN_NUMEL_ONE_ROW", 256)
    seen = _calls(monkeypatch)
    small, large = torch.randn(8, 8), torch.randn(32, 8)  # 64 and 256 elements
    with torch.no_grad():
        for rows, w, packed in ((1, small, False), (1, large, True), (2, small, True), (2, torch.randn(7, 9), False),
                                (cpu_linear.MAX_ROWS, large, True), (cpu_linear.MAX_ROWS + 1, large, False)):
            seen.clear()
            x = torch.randn(rows, w.shape[1])
            torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
            assert bool(seen) == packed, (rows, tuple(w.shape))


@pytest.mark.parametrize("case", ["x columns", "bias length", "residual shape"])
def test_mismatched_shapes_raise_torch_s_own_error(case):
    """A shape error comes from F.linear / addmm, naming the sizes, not from oneDNN."""
    w = torch.randn(16, 8)
    x = torch.randn(3, 7 if case == "x columns" else 8)
    b = torch.randn(5) if case == "bias length" else None
    with torch.no_grad(), pytest.raises(RuntimeError, match="size|shape"):
        if case == "residual shape":
            residual_linear(torch.randn(3, 15), x, w)
        else:
            linear(x, w, b)


@needs_onednn
def test_prime_makes_the_kernels_of_both_kinds():
    """After prime, neither kind of call (plain, residual add fused) at any row count the
    packed path takes grows the process: oneDNN makes a kernel of ~0.7 MiB for each (row
    count, weight shape, kind), so a prime that skipped the fused kind left ~10 MiB to grow."""
    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2 ** 20

    w = torch.randn(200, 520)  # a shape no other test runs
    with torch.no_grad():
        cpu_linear.prime([w])
        before = rss_mib()
        for rows in range(1, cpu_linear.MAX_ROWS + 1):
            linear(torch.zeros(rows, 520), w)
            residual_linear(torch.zeros(rows, 200), torch.zeros(rows, 520), w)
    assert rss_mib() - before < 3.0
