"""The pieces that make a step of the reference Llama decoder cheap, each against the plain
formula it replaces: fused QKV / gate-up projections (HF key names outside), RoPE with a
sign-flipped sin table, ``F.rms_norm`` with HF's float32 statistics, the unmasked
single-token step, and the optional compiled decode step. No timings are asserted
(``step_profile`` is a benchmark; only its output format is checked here)."""
import io

import pytest
import torch
import torch.nn.functional as F

from specdec_ext.bench.step_profile import step_profile
from specdec_ext.models import LlamaConfig, LlamaModel
from specdec_ext.models.compiling import RECOMPILE_LIMIT
from specdec_ext.models.llama import _rms_norm, _rope

V = 61


def small_config(**kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)
    base.update(kw)
    return LlamaConfig(**base)


def hf_names(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names.add(f"{p}self_attn.{proj}.weight")
            if cfg.attention_bias:
                names.add(f"{p}self_attn.{proj}.bias")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names.add(f"{p}mlp.{proj}.weight")
            if cfg.mlp_bias:
                names.add(f"{p}mlp.{proj}.bias")
    return names


def random_hf_state(cfg, seed=0):
    """A state dict with HF names where every tensor is distinct random data."""
    torch.manual_seed(seed)
    shapes = {k: tuple(v.shape) for k, v in LlamaModel(cfg, dtype=torch.float64).state_dict().items()}
    return {k: torch.randn(s, dtype=torch.float64) for k, s in shapes.items()}


# ---- fused projections ----------------------------------------------------------------------
@pytest.mark.parametrize("bias", [False, True])
def test_state_dict_keeps_hf_names_and_round_trips(bias):
    cfg = small_config(attention_bias=bias, mlp_bias=bias)
    sd = random_hf_state(cfg)
    assert set(sd) == hf_names(cfg)
    model = LlamaModel.from_state_dict(cfg, sd, dtype=torch.float64)
    out = model.state_dict()
    assert set(out) == hf_names(cfg)
    for k, v in sd.items():
        assert torch.equal(out[k], v), k
    # torch's own load_state_dict accepts the HF names too, and torch.save / load round trips
    buf = io.BytesIO()
    torch.save(out, buf)
    buf.seek(0)
    other = LlamaModel(cfg, dtype=torch.float64)
    other.load_state_dict(torch.load(buf, weights_only=True))
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(other(ids), model(ids))
    assert sum(p.numel() for p in model.parameters()) == sum(v.numel() for v in sd.values())


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_equal_the_separate_ones(bias):
    cfg = small_config(attention_bias=bias, mlp_bias=bias)
    sd = random_hf_state(cfg, seed=3)
    model = LlamaModel.from_state_dict(cfg, sd, dtype=torch.float64)
    x = torch.randn(5, cfg.hidden_size, dtype=torch.float64)
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."

        def sep(name):
            return F.linear(x, sd[p + name + ".weight"], sd.get(p + name + ".bias"))

        qkv = F.linear(x, layer.self_attn.qkv_proj.weight, layer.self_attn.qkv_proj.bias)
        ref = torch.cat([sep("self_attn.q_proj"), sep("self_attn.k_proj"), sep("self_attn.v_proj")], -1)
        torch.testing.assert_close(qkv, ref, rtol=1e-13, atol=1e-13)
        gu = F.linear(x, layer.mlp.gate_up_proj.weight, layer.mlp.gate_up_proj.bias)
        torch.testing.assert_close(gu, torch.cat([sep("mlp.gate_proj"), sep("mlp.up_proj")], -1),
                                   rtol=1e-13, atol=1e-13)


def test_load_hf_state_dict_errors_name_hf_keys():
    cfg = small_config()
    sd = random_hf_state(cfg)
    model = LlamaModel(cfg)
    bad = dict(sd)
    del bad["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['model.layers.0.self_attn.k_proj.weight'\]"):
        model.load_hf_state_dict(bad)
    fused = dict(sd, **{"model.layers.0.self_attn.qkv_proj.weight": torch.zeros(64, 32)})
    with pytest.raises(ValueError, match="unexpected keys .*qkv_proj"):
        model.load_hf_state_dict(fused)


# ---- RoPE and RMSNorm -------------------------------------------------------------------------
def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rope_equals_the_rotate_half_formula_bit_for_bit(dtype):
    cfg = small_config(head_dim=16)
    model = LlamaModel(cfg, dtype=dtype)
    table = model._rope_tables(40)
    inv = cfg.inv_freq()
    emb = torch.cat([torch.arange(40, dtype=torch.float32)[:, None] * inv[None]] * 2, -1)
    assert torch.equal(table[:40, 0], emb.cos())
    pos = torch.tensor([[3, 4, 5], [37, 38, 39]])
    cs = table[pos].to(dtype)
    cos, sin_signed = cs[:, :, 0:1], cs[:, :, 1:2]
    cos_ref, sin_ref = emb.cos()[pos].to(dtype)[:, :, None], emb.sin()[pos].to(dtype)[:, :, None]
    x = torch.randn(2, 3, 6, 16).to(dtype)  # [B, S, heads, D]
    assert torch.equal(_rope(x, cos, sin_signed), x * cos_ref + _rotate_half(x) * sin_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_rms_norm_equals_the_hf_formula_bit_for_bit(dtype):
    torch.manual_seed(0)
    x = (3 * torch.randn(4, 7, 96)).to(dtype)
    w = (1 + 0.1 * torch.randn(96)).to(dtype)
    h = x.to(torch.float32)
    ref = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    out = _rms_norm(x, w, 1e-5)
    assert out.dtype == dtype and torch.equal(out, ref)


# ---- steps -----------------------------------------------------------------------------------
def test_unmasked_single_token_steps_equal_the_full_forward():
    torch.manual_seed(4)
    model = LlamaModel(small_config(), dtype=torch.float64)
    ids = torch.randint(0, V, (1, 12))
    full = model(ids)
    cache = model.new_cache(1, 16)
    step = cache.begin(1)
    assert step.mask is None  # B = 1, S = 1: nothing to mask
    assert cache.begin(2).mask is not None
    outs = [model(ids[:, :5], cache)] + [model(ids[:, i:i + 1], cache) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("freeze", [False, True])
def test_compiled_decode_equals_eager(freeze):
    pytest.importorskip("torch._dynamo")
    torch.manual_seed(5)
    eager = LlamaModel(small_config(num_hidden_layers=1), dtype=torch.float32)
    comp = LlamaModel.from_state_dict(eager.config, eager.state_dict()).compile_decode(freeze=freeze)
    ids = torch.randint(0, V, (2, 14))
    ce, cc = eager.new_cache(2, 16), comp.new_cache(2, 16)
    for chunk in (ids[:, :6], ids[:, 6:7], ids[:, 7:10], ids[:, 10:11]):
        torch.testing.assert_close(comp(chunk, cc), eager(chunk, ce), rtol=1e-5, atol=1e-5)
    cc.rollback(4, torch.tensor([1, 3]))
    ce.rollback(4, torch.tensor([1, 3]))
    torch.testing.assert_close(comp(ids[:, 11:14], cc), eager(ids[:, 11:14], ce), rtol=1e-5, atol=1e-5)
    assert cc.host_lengths().tolist() == ce.host_lengths().tolist() == [11, 13]
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT  # target and draft share _layers' code
    assert comp.compile_decode(False)._compiled is None


def test_freeze_sets_inductor_freezing_while_compiling():
    """freeze=True compiles with ``torch._inductor.config.freezing`` set (a backend that
    records the flag stands in for Inductor) and restores it after each call; without
    freeze the flag stays off."""
    from torch._inductor import config as inductor_config

    torch.manual_seed(7)
    ids = torch.randint(0, V, (1, 6))
    for freeze in (False, True):
        seen = []

        def spy(gm, example_inputs):
            seen.append(inductor_config.freezing)
            return gm.forward

        model = LlamaModel(small_config(num_hidden_layers=1), dtype=torch.float32)
        model.compile_decode(freeze=freeze, backend=spy)
        cache = model.new_cache(1, 8)
        model(ids[:, :4], cache)
        model(ids[:, 4:5], cache)  # the unmasked 1-token graph
        assert len(seen) == 2 and all(f is freeze for f in seen), (freeze, seen)
        assert inductor_config.freezing is False


def test_compiled_steps_trace_once_and_share_a_graph_with_the_prefill():
    """compile_decode traces each graph once (float attributes such as eps and the attention
    scale are constants: no "restarting analysis"), and a masked step of another length
    reuses the prefill's graph (no duck-shaped guard "cache length == step length"); the
    tracing settings are back to torch's after each call."""
    import torch._dynamo.config as dynamo_config
    import torch.fx.experimental._config as shapes_config

    before = dynamo_config.specialize_float, shapes_config.use_duck_shape
    torch.manual_seed(7)
    ids = torch.randint(0, V, (1, 9))
    calls = []

    def spy(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    model = LlamaModel(small_config(num_hidden_layers=1), dtype=torch.float32)
    eager = LlamaModel(small_config(num_hidden_layers=1), dtype=torch.float32)
    eager.load_state_dict(model.state_dict())
    model.compile_decode(backend=spy)
    caches = model.new_cache(1, 12), eager.new_cache(1, 12)
    for lo, hi in ((0, 4), (4, 7)):  # a prefill, then a 3-token step
        got, want = model(ids[:, lo:hi], caches[0]), eager(ids[:, lo:hi], caches[1])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1, f"{len(calls)} backend calls for one masked graph"
    assert (dynamo_config.specialize_float, shapes_config.use_duck_shape) == before


def test_step_profile_reports_without_asserting_speed(capsys):
    torch.manual_seed(6)
    model = LlamaModel(small_config(), dtype=torch.float32)
    res = step_profile(model, tokens=2, context=4, iters=2)
    assert {"forward_ms", "matmul_ms", "ratio", "ops"} <= set(res) and res["matmul_ms"] > 0
    assert "forward" in capsys.readouterr().out
