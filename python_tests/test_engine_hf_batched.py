"""The batched Hugging Face path (SpecDecCache + HFBatchedSpecModel): adapt() picks it (and
warns when it falls back), greedy output equals generate() token for token for tiny
Llama / Qwen2 / Mistral models in float64 (ragged batch of 3; K in {1, 4} and adaptive),
the caches equal a fresh HF prefill of the emitted text, the first two tokens at T = 1
follow the target's law (chi-square), the cache itself behaves as a transformers Cache,
torch.compile'd forwards stay exact without recompiling per step, and (GPU only) an
engine step does not sync with the host."""
import copy
import inspect
import warnings

import pytest
import torch

from helpers import draws, hf_fresh_prefill, ragged_prompts
from specdec_ext import SpeculativeEngine
from specdec_ext.errors import CacheFullError
from specdec_ext.models import adapt
from stats_reference import ALPHA, chi_square_pvalue, sequence_counts, sequence_law

transformers = pytest.importorskip("transformers")
from specdec_ext.models.hf import (BATCHED_MODEL_TYPES, RECOMPILE_LIMIT, HFBatchedSpecModel, HFSpecModel,  # noqa: E402
                                   SpecDecCache)

FAMILIES = ("llama", "qwen2", "mistral")


def _config(family, vocab=97, hidden=64, layers=2, **extra):
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **extra)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "mistral": transformers.MistralConfig}[family]
    return cls(**common)


def _model(family, seed, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(_config(family, **kw)).to(dtype).eval()


def _close_draft(target, noise=1e-3):
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * noise)
    return draft


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    target = _model(request.param, seed=1)
    return target, _close_draft(target)


# ---------------------------------------------------------------- which path
@pytest.mark.parametrize("family", FAMILIES)
def test_adapt_picks_the_batched_path(family):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = adapt(_model(family, seed=0, dtype=torch.float32))
    assert isinstance(spec, HFBatchedSpecModel)


def test_unsupported_model_falls_back_with_a_warning():
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=1, n_head=2,
                                                                n_positions=64)).eval()
    with pytest.warns(UserWarning, match="per-row HF path.*model_type 'gpt2'"):
        spec = adapt(gpt2)
    assert isinstance(spec, HFSpecModel)
    with pytest.raises(ValueError, match="gpt2"):
        HFBatchedSpecModel(gpt2)


def test_engine_uses_the_batched_path(pair):
    target, draft = pair
    eng = SpeculativeEngine(target, draft, k=2, adaptive_k=False)
    assert isinstance(eng.target, HFBatchedSpecModel) and isinstance(eng.draft, HFBatchedSpecModel)


# ---------------------------------------------------------------- exactness
@pytest.mark.parametrize("k,adaptive", [(1, False), (4, False), (4, "cost")])
def test_greedy_equals_hf_generate(pair, k, adaptive):
    target, draft = pair
    ids, mask = ragged_prompts()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    out = SpeculativeEngine(target, draft, k=k, adaptive_k=adaptive).generate(ids, 16, attention_mask=mask)
    assert torch.equal(out.sequences, ref)
    if k == 4 and not adaptive:
        assert sum(s.accepted for s in out.stats) > 0.3 * sum(s.drafted for s in out.stats)


def test_per_row_path_is_still_exact(pair):
    """The compatibility path, chosen explicitly, gives the same greedy output."""
    target, draft = pair
    ids, mask = ragged_prompts()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = SpeculativeEngine(HFSpecModel(target), HFSpecModel(draft), k=3, adaptive_k=False).generate(
        ids, 12, attention_mask=mask)
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_three_tokens_follow_the_target_law(temperature):
    """20k rows of one prompt through the batched HF path: the joint law of the first three
    tokens equals the target's, computed from the HF model (chi-square at ALPHA, 216 cells),
    with a first step that drafts K = 3 (4 new tokens: the budget cap allows 3)."""
    V, N, prompt = 6, draws(20_000), [3, 1, 4]

    def peaked(seed):
        m = _model("llama", seed, vocab=V, hidden=16, layers=1)
        with torch.no_grad():
            m.lm_head.weight.mul_(40.0)  # distributions far from uniform
        return m

    target, draft = peaked(1), peaked(2)
    ids = torch.tensor([prompt] * N)
    eng = SpeculativeEngine(target, draft, k=3, adaptive_k=False)
    assert isinstance(eng.target, HFBatchedSpecModel)
    out = eng.generate(ids, 4, temperature=temperature, seed=11)
    assert {s.ks[0] for s in out.stats} == {3}, "the first step drafted 3 tokens in every row"

    def next_probs(contexts):
        with torch.no_grad():
            return torch.softmax(target(torch.tensor(contexts)).logits[:, -1].double() / temperature, -1).numpy()

    law = sequence_law(next_probs, prompt, 3, V)
    assert chi_square_pvalue(sequence_counts(out.generated, 3, V), law) > ALPHA
    acc = sum(s.accepted for s in out.stats) / max(1, sum(s.drafted for s in out.stats))
    assert 0.0 < acc < 1.0  # both acceptance and rejection happened


# ---------------------------------------------------------------- the cache itself
def test_spec_dec_cache_as_a_plain_transformers_cache():
    """Implicit steps (plain model(..., cache=)) give the logits of one full forward; a
    rollback is O(1) on the device lengths (the buffers are never reallocated)."""
    model = _model("llama", seed=3)
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = SpecDecCache.for_model(model, batch_size=2, max_len=16)
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        parts = [model(ids[:, :6], **{kw: cache}).logits, model(ids[:, 6:], **{kw: cache}).logits]
        whole = model(ids).logits
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-9, atol=1e-10)
    assert cache.lengths.tolist() == [9, 9] and cache.get_seq_length() == 9
    assert cache.get_mask_sizes(2, 0) == (11, 0)
    keys_before = cache.layer_tensors(0)[0].data_ptr()
    cache.rollback(3, torch.tensor([1, 3]))
    assert cache.lengths.tolist() == [7, 9]
    assert cache.layer_tensors(0)[0].data_ptr() == keys_before
    with pytest.raises(NotImplementedError, match="rollback"):
        cache.crop(-1)
    with pytest.raises(TypeError, match="key_states"):
        cache.update(torch.zeros(2, 2, 1, 16), torch.zeros(2, 2, 1, 16), 0)


@pytest.mark.parametrize("model_type", sorted(BATCHED_MODEL_TYPES))
def test_ragged_rows_in_one_forward_match_separate_rows(model_type):
    """Every family adapt() sends to the batched path: one forward over rows of different
    lengths (after a rollback) equals each row run alone."""
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=97, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16, max_position_embeddings=256, pad_token_id=0,
                                            bos_token_id=1, eos_token_id=2)
    torch.manual_seed(4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).double().eval()
    spec = adapt(model)
    assert isinstance(spec, HFBatchedSpecModel)
    spec.reset(2, 32)
    a, b = torch.randint(1, 97, (1, 7)), torch.randint(1, 97, (1, 4))
    spec.forward(torch.cat([a, torch.cat([b, torch.zeros(1, 3, dtype=torch.int64)], 1)]))
    spec.rollback(7, torch.tensor([7, 4]))
    nxt = torch.randint(1, 97, (2, 3))
    got = spec.forward(nxt)
    # float64 throughout, except where transformers' eager attention takes the softmax in
    # float32 (gemma2 has no sdpa path in transformers 5.x): there a float64 matmul of another
    # shape (the padded rows, the cached prefix) may round one float32 softmax weight the other
    # way (seen: 6e-8 between HF's own incremental and full forwards). A wrong mask or cache
    # would be off by orders of magnitude more.
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    tol = dict(rtol=1e-5, atol=1e-6) if eager else dict(rtol=1e-9, atol=1e-10)
    with torch.no_grad():
        for row, prefix in enumerate((a, b)):
            ref = model(torch.cat([prefix, nxt[row:row + 1]], 1)).logits[0, -3:]
            torch.testing.assert_close(got[row], ref, **tol)


def test_sliding_window_caps_the_request():
    """A Mistral whose window is shorter than a request: a clear CacheFullError, not wrong text."""
    target = _model("mistral", seed=5, sliding_window=16)
    spec = adapt(target)
    assert isinstance(spec, HFBatchedSpecModel) and spec.max_positions == 16
    with pytest.raises(CacheFullError, match="sliding window"):
        spec.reset(1, 32)
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(CacheFullError, match="capacity of 16"):
        SpeculativeEngine(target, _close_draft(target), k=2, adaptive_k=False).generate(ids, 20)
    ref = target.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)  # fits the window
    out = SpeculativeEngine(target, _close_draft(target), k=2, adaptive_k=False).generate(ids, 8)
    assert torch.equal(out.sequences, ref)


# ---------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_forwards_stay_exact_and_compile_a_few_graphs(backend):
    """compile_decode(): the whole transformers forward, SpecDecCache.update and its
    kv_append_ included, as ONE graph (fullgraph=True) under dynamic shapes (float32).
    Greedy output of a ragged batch equals generate() with adaptive K, whose steps vary S
    and every row's length; a second call with other lengths compiles nothing new; the
    caches equal a fresh HF prefill of the emitted text."""
    from torch._dynamo.testing import CompileCounterWithBackend

    target = _model("llama", seed=1, dtype=torch.float32)
    draft = _close_draft(target)
    counters = CompileCounterWithBackend(backend), CompileCounterWithBackend(backend)
    ct, cd = (HFBatchedSpecModel(m).compile_decode(backend=c, fullgraph=True)
              for m, c in zip((target, draft), counters))
    eng = SpeculativeEngine(ct, cd, k=4, adaptive_k="cost")
    ids, mask = ragged_prompts()
    frames = []
    for second in (False, True):
        if second:  # drop each row's first token (left padding): every row's length differs
            first = mask.argmax(1)
            ids, mask = ids.clone(), mask.clone()
            ids[torch.arange(3), first], mask[torch.arange(3), first] = 0, 0
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
        out = eng.generate(ids, 16, attention_mask=mask)
        assert torch.equal(out.sequences, ref)
        assert len({k for s in out.stats for k in s.ks}) > 1  # adaptive K: steps of several S ran
        frames.append([c.frame_count for c in counters])
    # S = 1 and S > 1 steps (the prefill stays eager): 2 graphs per model with torch 2.14;
    # up to 4 backend calls allowed (a torch that restarts a trace calls the backend twice
    # for one graph), against ~10 steps per model
    assert all(1 <= f <= 4 for f in frames[0]), frames
    assert frames[1] == frames[0], frames  # the second call, at other lengths, compiled nothing
    for b in range(3):
        seq = ids[b][mask[b].bool()].tolist() + out.generated[b]
        cached = ct.cache_tensors(b)
        assert len(seq) - cached[0][0].shape[-2] == 1
        for (k1, v1), (k2, v2) in zip(cached, hf_fresh_prefill(target, seq[:-1])):
            torch.testing.assert_close(k1, k2, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v1, v2, rtol=1e-4, atol=1e-5)
    assert ct.compiled and not ct.compile_decode(False).compiled
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT  # models share one forward code object


def test_cli_compile_needs_the_batched_path():
    """generate --compile on a model only the per-row path serves: a one-line error."""
    from specdec_ext import generate

    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=1, n_head=2,
                                                                n_positions=64)).eval()
    with pytest.warns(UserWarning, match="per-row"), pytest.raises(SystemExit, match="batched HF path"):
        generate._compiled(gpt2)
    assert generate._compiled(_model("llama", seed=0, dtype=torch.float32)).compiled


def test_compile_refuses_float64_models():
    """float64 caches ride as float32 word pairs (a dtype-changing view torch.compile
    cannot trace through a mutation): a clear error up front, not a backend failure."""
    with pytest.raises(ValueError, match="float64"):
        HFBatchedSpecModel(_model("llama", seed=0)).compile_decode()


# ---------------------------------------------------------------- GPU
@pytest.mark.cuda
def test_compiled_forwards_stay_exact_cuda():
    """compile_decode on the GPU (aot_eager: the trace with the CUDA kv_append_, quick to
    build): greedy output of a ragged batch equals generate()."""
    target = _model("llama", seed=1, dtype=torch.float32).cuda()
    draft = _close_draft(target)
    ids, mask = ragged_prompts()
    ref = target.generate(ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=12, do_sample=False,
                          pad_token_id=0).cpu()
    ct, cd = (HFBatchedSpecModel(m).compile_decode(backend="aot_eager", fullgraph=True) for m in (target, draft))
    out = SpeculativeEngine(ct, cd, k=3, adaptive_k=False).generate(ids, 12, attention_mask=mask)
    assert torch.equal(out.sequences, ref)


@pytest.mark.cuda
def test_hf_batched_engine_step_has_no_hidden_sync_cuda():
    """sdpa and eager: every phase of a step runs under set_sync_debug_mode('error') (the
    engine's debug_sync) apart from the step's one device->host copy."""
    for impl in ("sdpa", "eager"):
        torch.manual_seed(0)
        cfg = _config("llama", vocab=512)
        cfg._attn_implementation = impl
        target = transformers.AutoModelForCausalLM.from_config(cfg).float().eval().cuda()
        eng = SpeculativeEngine(target, _close_draft(target, 1e-2), k=4, adaptive_k=False)
        assert isinstance(eng.target, HFBatchedSpecModel)
        ids = torch.randint(0, 512, (4, 9), generator=torch.Generator().manual_seed(1))
        eng.generate(ids, 4, temperature=1.0, seed=1)  # warm up
        out = eng.generate(ids, 24, temperature=1.0, seed=2, debug_sync=True)
        assert all(len(g) == 24 for g in out.generated)
        eng.target.cache.check()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:  # the cache's own rollback with device num_kept: no sync
            eng.target.rollback(2, torch.tensor([1, 2, 0, 1], device="cuda"))
        finally:
            torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------- the skinny linears
def test_float32_cpu_forwards_run_the_linears_through_skinny_linear_and_give_the_model_back(monkeypatch):
    """On a CPU a float32 model's nn.Linear layers take skinny_linear during the adapter's
    forwards (1, 4 and 17 tokens), the logits agree with F.linear's to float32 rounding, and the
    model's modules are plain nn.Linear again after each forward."""
    from specdec_ext.models import cpu_linear

    model = _model("llama", seed=5, dtype=torch.float32)
    calls = []
    real = cpu_linear._op
    monkeypatch.setattr(cpu_linear, "_op", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    fast, plain = HFBatchedSpecModel(model), HFBatchedSpecModel(model, skinny_linears=False)
    n_linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    for spec in (fast, plain):
        spec.reset(1, 64)
        spec.forward(torch.randint(1, 97, (1, 20), generator=torch.Generator().manual_seed(0)))  # prefill: F.linear
    assert calls == []
    for S in (1, 4, 17):
        ids = torch.randint(1, 97, (1, S), generator=torch.Generator().manual_seed(S))
        calls.clear()
        got, ref = fast.forward(ids), plain.forward(ids)
        assert calls == [S] * n_linears, "every linear of the fast forward, none of the plain one"
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        assert all(type(m) is not cpu_linear.RowsLinear for m in model.modules())
