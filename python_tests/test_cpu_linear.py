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


# ---- packed weights (pack_linears_, packed_weight, layer_linear) ---------------------------

def _packed_calls(monkeypatch):
    """Record whether each skinny call through cpu_linear got a packed (3-D) weight."""
    seen = []
    real = cpu_linear._op

    def recording(x, w, b, r):
        seen.append(w.dim() == 3)
        return real(x, w, b, r)

    monkeypatch.setattr(cpu_linear, "_op", recording)
    return seen


def test_layer_linear_reads_the_packed_copy_and_agrees_with_f_linear(monkeypatch):
    seen = _packed_calls(monkeypatch)
    layer = nn.Linear(24, 48).requires_grad_(False)
    assert cpu_linear.pack_linears_([layer]) == 1
    x, r = torch.randn(5, 24), torch.randn(5, 48)
    torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(cpu_linear.layer_residual_linear(r, x, layer), r + F.linear(x, layer.weight, layer.bias))
    assert seen == [True, True]
    # more rows than MAX_ROWS: F.linear on the nn.Linear weight, as without a packed copy
    seen.clear()
    cpu_linear.layer_linear(torch.randn(cpu_linear.MAX_ROWS + 1, 24), layer)
    assert seen == []


def test_pack_linears_skips_what_cannot_be_packed():
    layers = [nn.Linear(8, 20), nn.Linear(8, 16, dtype=torch.float64), nn.Linear(8, 32, device="meta"), nn.Linear(8, 16)]
    assert cpu_linear.pack_linears_(layers) == 1
    assert [cpu_linear.packed_weight(m) is not None for m in layers] == [False, False, False, True]


def test_the_packed_copy_follows_the_weight():
    """An in-place change (optimizer step, load_state_dict) repacks; a move off float32 CPU drops it."""
    layer = nn.Linear(8, 16).requires_grad_(False)
    cpu_linear.pack_linears_([layer])
    x = torch.randn(3, 8)
    with torch.no_grad():
        layer.weight.mul_(2.0)
    torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
    layer.load_state_dict({"weight": torch.randn(16, 8), "bias": torch.randn(16)})
    torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
    layer.weight = nn.Parameter(torch.randn(16, 8), requires_grad=False)  # a new tensor
    torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
    layer.double()
    assert cpu_linear.packed_weight(layer) is None
    torch.testing.assert_close(cpu_linear.layer_linear(x.double(), layer), F.linear(x.double(), layer.weight, layer.bias))


def test_the_reference_model_packs_at_load_and_gives_the_same_tokens():
    """from_state_dict packs a float32 CPU model's projections; its logits agree with the
    unpacked model's to float32 rounding, and its greedy tokens are the same."""
    from specdec_ext.models import LlamaModel
    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    plain = LlamaModel(cfg)
    packed = LlamaModel.from_state_dict(cfg, plain.state_dict())
    assert sum(cpu_linear.packed_weight(m) is not None for m in packed.modules()) == 2 * 4 + 1  # 4 projections a layer, the lm_head
    assert all(cpu_linear.packed_weight(m) is None for m in plain.modules())
    ids = torch.randint(0, 64, (1, 7))
    with torch.no_grad():
        a, b = plain(ids), packed(ids)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_fast_linears_hand_the_kernel_the_packed_copies(monkeypatch):
    """Layers given packed copies (as HFBatchedSpecModel does) run on them inside fast_linears;
    a layer whose outputs are not a multiple of 16 keeps its plain weight."""
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 5)).requires_grad_(False)
    linears = plain_linears(model)
    assert cpu_linear.pack_linears_(linears) == 1
    x = torch.randn(2, 3, 8)
    ref = model(x)
    seen = _packed_calls(monkeypatch)
    with fast_linears(linears):
        got = model(x)
    assert seen == [True, False]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_packing_works_on_inference_tensors():
    """Weights made under torch.inference_mode have no version counter: packing and the
    follow-up check still work, and a new weight tensor is still seen."""
    with torch.inference_mode():
        layer = nn.Linear(8, 16)
        assert cpu_linear.pack_linears_([layer]) == 1
        x = torch.randn(3, 8)
        torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
        layer.weight = nn.Parameter(torch.randn(16, 8), requires_grad=False)
        torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(cpu_linear.layer_linear(x, layer), F.linear(x, layer.weight, layer.bias))
