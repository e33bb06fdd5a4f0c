"""The engine with Hugging Face models: greedy output equals target.generate token for
token (B = 1 and a ragged batch; K in {1, 3, 5}; adaptive K), and the HF caches equal a
fresh prefill of the emitted sequence."""

import pytest
import torch

from helpers import hf_fresh_prefill, near_copy, ragged_prompts, tiny_llama
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


@pytest.mark.parametrize("path", ["batched", "per_row"])
def test_hf_caches_equal_fresh_prefill(pair, path):
    """After generation each row's cache (target: everything but the last emitted token;
    draft: 1 or 2 fewer) equals a fresh HF prefill, on the batched path (what adapt picks
    for Llama) and on the per-row compatibility path."""
    from specdec_ext.models.hf import HFSpecModel

    target, draft = pair
    ids, mask = ragged_prompts()
    wrap = (lambda m: m) if path == "batched" else HFSpecModel
    eng = SpeculativeEngine(wrap(target), wrap(draft), k=4, adaptive_k=False)
    out = eng.generate(ids, 13, temperature=1.0, seed=7, attention_mask=mask)
    for b in range(3):
        seq = ids[b][mask[b].bool()].tolist() + out.generated[b]
        for model, wrapper, exact in ((target, eng.target, True), (draft, eng.draft, False)):
            cached = wrapper.cache_tensors(b)  # the row's valid prefix
            n = cached[0][0].shape[-2]
            assert len(seq) - n in ((1,) if exact else (1, 2))
            for (k1, v1), (k2, v2) in zip(cached, hf_fresh_prefill(model, seq[:n])):
                torch.testing.assert_close(k1, k2, rtol=1e-9, atol=1e-10)
                torch.testing.assert_close(v1, v2, rtol=1e-9, atol=1e-10)
