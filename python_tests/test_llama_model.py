"""The reference Llama decoder (specdec_ext.models.llama) against transformers' LlamaForCausalLM.

Tolerances (relative to max |logit|): float64 1e-10 (measured: 0 for a full prompt, <= 6e-16
through the caches), float32 1e-5. Tests that need transformers skip without it.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import specdec_ext
from specdec_ext.models import LlamaConfig, LlamaModel, LlamaSpecModel


F64_TOL = 1e-10
V = 97


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def hf_config(**overrides):
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    kw.update(overrides)
    return transformers.LlamaConfig(**kw)


def hf_rope(rope_type, theta, **params):
    """LlamaConfig kwargs for a RoPE variant in the spelling of the installed transformers
    (>= 5: one rope_parameters dict; before: rope_theta + rope_scaling)."""
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": dict(params, rope_type=rope_type, rope_theta=theta)}
    return {"rope_theta": theta, "rope_scaling": dict(params, rope_type=rope_type)}


def hf_model(cfg, seed=0, dtype=torch.float64):
    """A seeded LlamaForCausalLM with every weight random (norm weights around 1, biases too)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.1)
    return model


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


# ---- whole prompts -----------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["gqa", "mha", "mqa", "tied", "bias", "llama3", "linear", "head_dim"])
def test_full_prompt_matches_hf_float64(variant):
    overrides = {"gqa": {}, "mha": {"num_key_value_heads": 4}, "mqa": {"num_key_value_heads": 1},
                 "tied": {"tie_word_embeddings": True, "num_hidden_layers": 3},
                 "bias": {"attention_bias": True, "mlp_bias": True},
                 "llama3": hf_rope("llama3", 500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=16),
                 "linear": hf_rope("linear", 10000.0, factor=2.0),
                 "head_dim": {"head_dim": 32}}[variant]
    cfg = hf_config(**overrides)
    hf = hf_model(cfg)
    ours = LlamaModel.from_state_dict(cfg, hf.state_dict(), dtype=torch.float64)
    if variant == "tied":
        assert ours.lm_head.weight is ours.model.embed_tokens.weight
    ids = torch.randint(0, V, (3, 40), generator=torch.Generator().manual_seed(1))
    ref = hf_logits(hf, ids)
    out = ours(ids)
    assert out.shape == (3, 40, V) and out.dtype == torch.float64
    assert rel_err(out, ref) < F64_TOL


def test_float32_matches_hf():
    cfg = hf_config()
    hf = hf_model(cfg, dtype=torch.float32)
    ours = LlamaModel.from_state_dict(cfg, hf.state_dict(), dtype=torch.float32)
    ids = torch.randint(0, V, (2, 17), generator=torch.Generator().manual_seed(2))
    assert rel_err(ours(ids), hf_logits(hf, ids)) < 1e-5


# ---- loading from a directory -------------------------------------------------------------
@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin", "tied"])
def test_from_pretrained_matches_hf(tmp_path, layout):
    cfg = hf_config(tie_word_embeddings=(layout == "tied"))
    hf = hf_model(cfg)
    if layout == "bin":
        with open(tmp_path / "config.json", "w") as f:
            json.dump(cfg.to_dict(), f)
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    else:
        hf.save_pretrained(tmp_path, max_shard_size="40KB" if layout == "sharded" else "10GB")
    files = set(os.listdir(tmp_path))
    if layout == "sharded":
        assert "model.safetensors.index.json" in files
    elif layout != "bin":
        assert "model.safetensors" in files
    ours = LlamaModel.from_pretrained(tmp_path, dtype=torch.float64)
    ids = torch.randint(0, V, (2, 21), generator=torch.Generator().manual_seed(3))
    assert rel_err(ours(ids), hf_logits(hf, ids)) < F64_TOL


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        LlamaModel.from_pretrained(tmp_path)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2)
    with open(tmp_path / "config.json", "w") as f:
        json.dump({**cfg.__dict__, "model_type": "llama"}, f)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        LlamaModel.from_pretrained(tmp_path)
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}, f)
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        LlamaModel.from_pretrained(tmp_path)


# ---- bad checkpoints ----------------------------------------------------------------------
def small_config(**kw):
    args = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)
    args.update(kw)
    return LlamaConfig(**args)


def test_bad_state_dicts_name_the_key():
    cfg = small_config()
    sd = LlamaModel(cfg).state_dict()
    missing = dict(sd)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['model.layers.1.mlp.up_proj.weight'\]"):
        LlamaModel.from_state_dict(cfg, missing)
    extra = dict(sd, **{"model.layers.2.mlp.up_proj.weight": torch.zeros(48, 32)})
    with pytest.raises(ValueError, match=r"unexpected keys \['model.layers.2.mlp.up_proj.weight'\]"):
        LlamaModel.from_state_dict(cfg, extra)
    wrong = dict(sd, **{"model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 32)})
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(32, 32\), "
                                         r"expected \(16, 32\)"):
        LlamaModel.from_state_dict(cfg, wrong)
    # Old checkpoints carry RoPE buffers; they are ignored.
    old = dict(sd, **{"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(4)})
    LlamaModel.from_state_dict(cfg, old)


def test_bad_configs():
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
        small_config(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="rope_scaling type 'dynamic' is not supported"):
        LlamaConfig.from_dict(dict(small_config().__dict__, rope_scaling={"type": "dynamic", "factor": 2.0}))
    with pytest.raises(ValueError, match="missing"):
        small_config(rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        small_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="required keys"):
        LlamaConfig.from_dict({"vocab_size": 10})
    with pytest.raises(ValueError, match="only Llama"):
        LlamaConfig.from_dict(dict(small_config().__dict__, model_type="mistral"))
    with pytest.raises(ValueError, match="dtype"):
        LlamaModel(small_config(), dtype=torch.int32)


def test_unsupported_rope_in_hf_config_dict():
    cfg = hf_config(**hf_rope("yarn", 10000.0, factor=4.0, original_max_position_embeddings=64))
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
        LlamaModel.from_state_dict(cfg, {})


# ---- incremental decoding through the caches -----------------------------------------------
CACHES = [("contiguous", {}), ("paged", {"block_size": 4}), ("paged", {"block_size": 16})]
CACHE_IDS = ["contiguous", "paged4", "paged16"]


@pytest.mark.parametrize("cache,opts", CACHES, ids=CACHE_IDS)
def test_prefill_then_single_steps_match_hf(device, cache, opts):
    cfg = hf_config()
    hf = hf_model(cfg)
    ids = torch.randint(0, V, (3, 24), generator=torch.Generator().manual_seed(4))
    ref = hf_logits(hf, ids)
    spec = LlamaSpecModel(LlamaModel.from_state_dict(cfg, hf.state_dict(), torch.float64, device), cache, **opts)
    spec.reset(3, 32)
    outs = [spec.forward(ids[:, :9].to(device))]
    for t in range(9, 24):
        outs.append(spec.forward(ids[:, t:t + 1].to(device)))
    out = torch.cat(outs, 1).cpu()
    assert rel_err(out, ref) < F64_TOL
    assert spec.lengths.tolist() == [24, 24, 24]
    assert spec.lengths.dtype == torch.int64 and spec.lengths.device.type == torch.device(device).type


def speculate(spec, seqs, prompt_lens, K, steps, device, seed, device_kept=True):
    """Drive ``spec`` like the engine: each step feeds K+1 tokens per row, of which the first
    ``kept[b]`` are the row's true next tokens (the rest junk), then rolls back to them.
    Returns, per row, the logits of every kept token (list of [V] tensors, position order)."""
    g = torch.Generator().manual_seed(seed)
    B = len(seqs)
    S = K + 1
    got = [[] for _ in range(B)]
    # Ragged prompts: one chunk of max(prompt_lens) tokens, then keep each row's own prompt.
    P = max(prompt_lens)
    chunk = torch.stack([torch.cat([s[:n], torch.randint(0, V, (P - n,), generator=g)])
                         for s, n in zip(seqs, prompt_lens)])
    logits = spec.forward(chunk.to(device)).cpu()
    for b, n in enumerate(prompt_lens):
        got[b].extend(logits[b, :n])
    spec.rollback(P, torch.tensor(prompt_lens, dtype=torch.int64, device=device if device_kept else "cpu"))
    lens = list(prompt_lens)
    for _ in range(steps):
        kept = torch.randint(1, S + 1, (B,), generator=g).tolist()
        rows = []
        for b in range(B):
            true = seqs[b][lens[b]:lens[b] + kept[b]]
            rows.append(torch.cat([true, torch.randint(0, V, (S - kept[b],), generator=g)]))
        logits = spec.forward(torch.stack(rows).to(device)).cpu()
        for b in range(B):
            got[b].extend(logits[b, :kept[b]])
            lens[b] += kept[b]
        kept_t = torch.tensor(kept, dtype=torch.int64)
        spec.rollback(S, kept_t.to(device) if device_kept else kept_t)
    assert spec.lengths.cpu().tolist() == lens
    return [torch.stack(r) for r in got], lens


@pytest.mark.parametrize("cache,opts", CACHES, ids=CACHE_IDS)
@pytest.mark.parametrize("device_kept", [True, False], ids=["device_kept", "host_kept"])
def test_ragged_chunks_with_rollbacks_match_hf(device, cache, opts, device_kept):
    cfg = hf_config(num_hidden_layers=3)
    hf = hf_model(cfg, seed=5)
    K, steps, B = 3, 7, 3
    seqs = [torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(10 + b)) for b in range(B)]
    spec = LlamaSpecModel(LlamaModel.from_state_dict(cfg, hf.state_dict(), torch.float64, device), cache, **opts)
    spec.reset(B, 48)
    got, lens = speculate(spec, seqs, [5, 11, 2], K, steps, device, seed=6, device_kept=device_kept)
    for b in range(B):
        ref = hf_logits(hf, seqs[b][None, :lens[b]])[0]
        assert rel_err(got[b], ref) < F64_TOL
    # The cache keeps working after a reset (reused buffers, stale entries masked).
    spec.reset(B, 48)
    got2, lens2 = speculate(spec, seqs, [7, 3, 9], K, 4, device, seed=7, device_kept=device_kept)
    for b in range(B):
        ref = hf_logits(hf, seqs[b][None, :lens2[b]])[0]
        assert rel_err(got2[b], ref) < F64_TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_contiguous_and_paged_caches_agree(device, dtype):
    # No transformers needed: our own random weights.
    torch.manual_seed(0)
    model = LlamaModel(small_config(num_hidden_layers=3), dtype=dtype, device=device)
    seqs = [torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(b)) for b in range(4)]
    results = []
    for cache, opts in CACHES:
        spec = LlamaSpecModel(model, cache, **opts)
        spec.reset(4, 40)
        results.append(speculate(spec, seqs, [3, 8, 1, 6], 4, 5, device, seed=9))
    (base, base_lens), others = results[0], results[1:]
    for got, lens in others:
        assert lens == base_lens
        for a, b in zip(got, base):
            # The same arithmetic on the same (gathered vs sliced) keys: equal to rounding.
            assert rel_err(a, b) < (1e-12 if dtype == torch.float64 else 1e-5 if dtype == torch.float32 else 2e-2)


def test_cached_equals_uncached_forward(device):
    torch.manual_seed(1)
    model = LlamaModel(small_config(), dtype=torch.float64, device=device)
    ids = torch.randint(0, V, (2, 19), device=device)
    full = model(ids)
    cache = model.new_cache(2, 19)
    steps = [model(ids[:, :7], cache), model(ids[:, 7:8], cache), model(ids[:, 8:], cache)]
    assert rel_err(torch.cat(steps, 1).cpu(), full.cpu()) < F64_TOL


# ---- the SpecModel protocol ---------------------------------------------------------------
def test_spec_model_protocol(device):
    torch.manual_seed(2)
    model = LlamaModel(small_config(), dtype=torch.float32, device=device)
    spec = LlamaSpecModel(model)
    assert spec.vocab_size == V and spec.device == model.device
    with pytest.raises(RuntimeError, match="reset"):
        spec.forward(torch.zeros(2, 1, dtype=torch.int64, device=device))
    spec.reset(2, 8)
    lengths = spec.lengths
    assert lengths.dtype == torch.int64 and lengths.shape == (2,) and lengths.device == model.device
    out = spec.forward(torch.zeros(2, 5, dtype=torch.int64, device=device))
    assert out.shape == (2, 5, V) and out.dtype == torch.float32
    with pytest.raises(specdec_ext.CacheFullError, match="max_len=8"):
        spec.forward(torch.zeros(2, 4, dtype=torch.int64, device=device))
    assert spec.lengths.tolist() == [5, 5]
    spec.rollback(5, torch.tensor([2, 5], device=device))
    assert spec.lengths.tolist() == [2, 5]
    with pytest.raises(ValueError, match="batch_size"):
        spec.forward(torch.zeros(3, 1, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"\[B, S\]"):
        spec.forward(torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="cache must be"):
        LlamaSpecModel(model, "ring")
    paged = LlamaSpecModel(model, "paged", block_size=2)
    paged.reset(2, 8)
    paged.forward(torch.zeros(2, 5, dtype=torch.int64, device=device))
    with pytest.raises(specdec_ext.CacheFullError, match="max_len=8"):
        paged.forward(torch.zeros(2, 4, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="num_kept"):
        paged.rollback(5, torch.tensor([6, 5], device=device))
    assert paged.lengths.tolist() == [5, 5]


def test_models_import_without_transformers():
    code = ("import sys; sys.modules['transformers'] = None; sys.modules['safetensors'] = None\n"
            "import specdec_ext.models as m; import torch\n"
            "c = m.LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=8, num_hidden_layers=1, "
            "num_attention_heads=2)\n"
            "print(m.LlamaModel(c)(torch.zeros(1, 3, dtype=torch.int64)).shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "torch.Size([1, 3, 11])" in out.stdout


# ---- low precision ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_smoke(device, dtype):
    cfg = hf_config()
    hf = hf_model(cfg)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(8))
    ref = hf_logits(hf, ids)
    spec = LlamaSpecModel(LlamaModel.from_state_dict(cfg, hf.state_dict(), dtype, device), "contiguous")
    spec.reset(2, 16)
    out = torch.cat([spec.forward(ids[:, :8].to(device)), spec.forward(ids[:, 8:].to(device))], 1)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert rel_err(out.cpu(), ref) < 5e-2


@pytest.mark.cuda
def test_cuda_matches_cpu_float32():
    cfg = small_config()
    torch.manual_seed(3)
    cpu = LlamaModel(cfg, dtype=torch.float32)
    cuda = LlamaModel.from_state_dict(cfg, cpu.state_dict(), torch.float32, "cuda")
    ids = torch.randint(0, V, (3, 10))
    assert rel_err(cuda(ids.cuda()).cpu(), cpu(ids)) < 1e-4


def test_config_spellings_agree():
    # Older config.json files: top-level rope_theta + rope_scaling (with "type" or "rope_type");
    # newer ones: one rope_parameters dict. Both give the same frequencies.
    base = dict(small_config().__dict__)
    base.pop("rope_scaling"), base.pop("rope_theta")
    llama3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    legacy = LlamaConfig.from_dict(dict(base, rope_theta=5e5, rope_scaling=dict(llama3, rope_type="llama3")))
    older = LlamaConfig.from_dict(dict(base, rope_theta=5e5, rope_scaling=dict(llama3, type="llama3")))
    newer = LlamaConfig.from_dict(dict(base, rope_parameters=dict(llama3, rope_type="llama3", rope_theta=5e5)))
    plain = LlamaConfig.from_dict(dict(base, rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert legacy.rope_theta == newer.rope_theta == plain.rope_theta == 5e5
    assert torch.equal(legacy.inv_freq(), newer.inv_freq()) and torch.equal(older.inv_freq(), newer.inv_freq())
    assert plain.rope_scaling is None
    assert not torch.equal(plain.inv_freq(), newer.inv_freq())


def test_empty_step_is_refused():
    model = LlamaModel(small_config())
    with pytest.raises(ValueError, match="at least one token"):
        model(torch.zeros(2, 0, dtype=torch.int64), model.new_cache(2, 4))


@pytest.mark.cuda
def test_cuda_contiguous_step_and_rollback_do_not_sync():
    torch.manual_seed(4)
    spec = LlamaSpecModel(LlamaModel(small_config(), dtype=torch.bfloat16, device="cuda"))
    spec.reset(2, 32)
    spec.forward(torch.randint(0, V, (2, 6), device="cuda"))
    ids = torch.randint(0, V, (2, 4), device="cuda")
    kept = torch.tensor([1, 3], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        spec.rollback(6, torch.tensor([6, 4], device="cuda"))
        spec.forward(ids)
        spec.rollback(4, kept)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert spec.lengths.tolist() == [7, 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_one_row_step_mask_is_spec_attention_mask(dtype):
    """A one-row step with an exact host length takes its mask as a view of the cache's mask
    table: the same values as spec_attention_mask at every past length and step width, up to a
    full cache (an offset one column off would show at every step)."""
    from specdec_ext import spec_attention_mask
    from specdec_ext.models.llama_cache import ContiguousLlamaCache

    cache = ContiguousLlamaCache(1, 1, 4, 1, 40, dtype, "cpu")
    for past in (0, 1, 7, 23, 38):
        for S in (2, 3, 17):
            if past + S > 40:
                continue
            cache.reset()
            if past:
                cache.kv.advance(past)
            step = cache.begin(S)
            assert step.kv_len == past + S
            torch.testing.assert_close(step.mask, spec_attention_mask(torch.tensor([past]), S, past + S, dtype),
                                       rtol=0, atol=0)
