"""models/cpu_linear.py: the reference model's linears and the batched transformers path's
``nn.Linear`` layers go through skinny_linear for a few float32 CPU rows, agree with F.linear /
addmm, fall back where the kernel does not apply, and fast_linears leaves the model as it was."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from specdec_ext.models import cpu_linear
from specdec_ext.models.cpu_linear import RowsLinear, fast_linears, linear, plain_linears, residual_linear


def _calls(monkeypatch):
    """Record the skinny kernel's calls made through cpu_linear (x's row count each)."""
    seen = []
    real = cpu_linear._op

    def counting(x, w, b, r):
        seen.append(x.shape[0])
        return real(x, w, b, r)

    monkeypatch.setattr(cpu_linear, "_op", counting)
    return seen


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


def test_rows_up_to_max_rows_take_the_kernel(monkeypatch):
    seen = _calls(monkeypatch)
    w, b = torch.randn(12, 8), torch.randn(12)
    with torch.no_grad():
        for rows in (1, 2, 5, cpu_linear.MAX_ROWS, cpu_linear.MAX_ROWS + 1):
            seen.clear()
            x = torch.randn(rows, 8)
            linear(x, w, b)
            residual_linear(torch.randn(rows, 12), x, w, b)
            assert seen == ([rows, rows] if rows <= cpu_linear.MAX_ROWS else []), rows


def test_it_works_with_grad_mode_on_when_nothing_needs_grad(monkeypatch):
    """The engine's forwards run under no_grad, a user's loop may not: plain tensors still take it."""
    seen = _calls(monkeypatch)
    linear(torch.randn(3, 8), torch.randn(12, 8))
    assert seen == [3]


@pytest.mark.parametrize("case", ["float64", "grad", "3-d", "bfloat16", "empty", "many rows", "compiling"])
def test_falls_back_to_f_linear(case, monkeypatch):
    seen = _calls(monkeypatch)
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    w = torch.randn(12, 8, dtype=dtype, requires_grad=case == "grad")
    x = torch.randn({"3-d": (2, 3, 8), "empty": (0, 8), "many rows": (cpu_linear.MAX_ROWS + 1, 8)}.get(case, (4, 8)),
                    dtype=dtype)
    if case == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
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


@pytest.mark.parametrize("case", ["x columns", "bias length", "residual shape"])
def test_mismatched_shapes_raise_torch_s_own_error(case):
    """A shape error comes from F.linear / addmm, naming the sizes, as torch's users expect."""
    w = torch.randn(16, 8)
    x = torch.randn(3, 7 if case == "x columns" else 8)
    b = torch.randn(5) if case == "bias length" else None
    with torch.no_grad(), pytest.raises(RuntimeError, match="size|shape"):
        if case == "residual shape":
            residual_linear(torch.randn(3, 15), x, w)
        else:
            linear(x, w, b)


def _mlp():
    class Scaled(nn.Linear):  # a subclass computes something else: left alone
        def forward(self, input):
            return 2.0 * super().forward(input)

    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Scaled(16, 16), nn.Linear(16, 4, bias=False))


def test_fast_linears_runs_the_plain_linears_through_the_kernel_and_restores_them(monkeypatch):
    model = _mlp()
    linears = plain_linears(model)
    assert linears == [model[0], model[3]]
    x = torch.randn(2, 5, 8)  # 3-d: flattened to 10 rows and back
    with torch.no_grad():
        ref = model(x)
        seen = _calls(monkeypatch)
        with fast_linears(linears):
            assert type(model[0]) is RowsLinear and type(model[2]).__name__ == "Scaled"
            got = model(x)
        assert seen == [10, 10]
    assert type(model[0]) is nn.Linear and type(model[3]) is nn.Linear
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert set(model.state_dict()) == set(_mlp().state_dict())


def test_fast_linears_restores_the_modules_when_the_block_raises():
    model = _mlp()
    with pytest.raises(KeyError):
        with fast_linears(plain_linears(model)):
            raise KeyError("boom")
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, type(model[2]), nn.Linear]


@pytest.mark.parametrize("shape", [(0, 5, 8), (2, 0, 8), (8,), (3, 8), (2, 3, 4, 8)])
def test_rows_linear_takes_every_input_shape_nn_linear_takes(shape):
    """Leading dims of any size (none, empty ones included) are flattened to rows and restored."""
    m = nn.Linear(8, 6)
    x = torch.randn(*shape)
    with torch.no_grad():
        ref = m(x)
        with fast_linears([m]):
            got = m(x)
    assert got.shape == ref.shape == (*shape[:-1], 6)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
