"""The engine with Hugging Face models: greedy output equals target.generate token for
token (B = 1 and a ragged batch; K in {1, 3, 5}; adaptive K), and the HF caches equal a
fresh prefill of the emitted sequence."""
import inspect

import pytest
import torch

from helpers import near_copy, ragged_prompts, tiny_llama
from specdec_ext import SpeculativeEngine

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(64, 2, seed=1)
    return target, near_copy(target, 1e-3, seed=None)   # a close draft: high acceptance


@pytest.mark.parametrize("k,adaptive", [(1, False), (3, False), (5, False), (5, "cost"), (4, "threshold")])
def test_greedy_equals_hf_generate(pair, k, adaptive):
    target, draft = pair
    ids1 = torch.randint(1, 97, (1, 6), generator=torch.Generator().manual_seed(k))
    ref1 = target.generate(ids1, max_new_tokens=24, do_sample=False, pad_token_id=0)
    out1 = SpeculativeEngine(target, draft, k=k, adaptive_k=adaptive).generate(ids1, 24)
    assert torch.equal(out1.sequences, ref1)
    if k >= 3:
        assert out1.stats[0].acceptance_rate > 0.3  # the close draft is accepted often
    ids, mask = ragged_prompts()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    out = SpeculativeEngine(target, draft, k=k, adaptive_k=adaptive).generate(ids, 16, attention_mask=mask)
    assert torch.equal(out.sequences, ref)


def test_greedy_with_an_unrelated_draft(pair):
    target, _ = pair
    draft = tiny_llama(32, 1, seed=9)
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(0))
    ref = target.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(SpeculativeEngine(target, draft, k=3, adaptive_k=False).generate(ids, 12).sequences, ref)


def test_hf_caches_equal_fresh_prefill(pair):
    target, draft = pair
    ids, mask = ragged_prompts()
    eng = SpeculativeEngine(target, draft, k=4, adaptive_k=False)
    out = eng.generate(ids, 13, temperature=1.0, seed=7, attention_mask=mask)
    for b in range(3):
        seq = ids[b][mask[b].bool()].tolist() + out.generated[b]
        for model, wrapper, exact_len in ((target, eng.target, len(seq) - 1), (draft, eng.draft, None)):
            cached = wrapper.cache_tensors(b)
            n = cached[0][0].shape[-2] if exact_len is None else exact_len
            assert cached[0][0].shape[-2] == n
            assert len(seq) - n in ((1,) if exact_len else (1, 2))
            fresh = transformers.DynamicCache()
            kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            model(torch.tensor([seq[:n]]), use_cache=True, **{kw: fresh})
            fresh_kv = [(layer.keys, layer.values) for layer in fresh.layers] if hasattr(fresh, "layers") else \
                list(zip(fresh.key_cache, fresh.value_cache))
            for (k1, v1), (k2, v2) in zip(cached, fresh_kv):
                torch.testing.assert_close(k1, k2, rtol=1e-9, atol=1e-10)
                torch.testing.assert_close(v1, v2, rtol=1e-9, atol=1e-10)
