"""The engine on the package's reference Llama model (contiguous and paged caches):
greedy output equals Hugging Face generate, and after a generation both caches hold
exactly the committed tokens (next-token logits from the cache equal a fresh forward)."""
import pytest
import torch

from helpers import assert_cache_matches_prefill, near_copy, ragged_prompts, reference_model, tiny_llama
import specdec_ext
from specdec_ext import SpeculativeEngine
from specdec_ext.models import LlamaModel, LlamaSpecModel

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_pair():
    target = tiny_llama(64, 2, seed=1)
    return target, near_copy(target, 1e-3, seed=None)


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("k,adaptive", [(1, False), (3, False), (5, False), (5, "cost")])
def test_greedy_equals_hf_generate_reference_model(hf_pair, cache, k, adaptive):
    target, draft = hf_pair
    eng = SpeculativeEngine(reference_model(target, cache), reference_model(draft, cache), k=k, adaptive_k=adaptive)
    ids1 = torch.randint(1, 97, (1, 6), generator=torch.Generator().manual_seed(k))
    ref1 = target.generate(ids1, max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert torch.equal(eng.generate(ids1, 24).sequences, ref1)
    ids, mask = ragged_prompts()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(eng.generate(ids, 16, attention_mask=mask).sequences, ref)


def test_llama_model_is_wrapped_automatically(hf_pair):
    target, draft = hf_pair
    t = LlamaModel.from_state_dict(target.config, target.state_dict(), dtype=torch.float64)
    d = LlamaModel.from_state_dict(draft.config, draft.state_dict(), dtype=torch.float64)
    eng = SpeculativeEngine(t, d, k=3)
    assert isinstance(eng.target, LlamaSpecModel)
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(eng.generate(ids, 8).sequences,
                       target.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0))


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_caches_equal_a_fresh_prefill_reference_model(hf_pair, cache):
    target, draft = hf_pair
    eng = SpeculativeEngine(reference_model(target, cache), reference_model(draft, cache), k=4, adaptive_k=False)
    ids, mask = ragged_prompts()
    out = eng.generate(ids, 13, temperature=1.0, seed=7, attention_mask=mask)
    seqs = [ids[b][mask[b].bool()].tolist() + out.generated[b] for b in range(3)]
    assert_cache_matches_prefill(eng.target, target, seqs, (1,))
    assert_cache_matches_prefill(eng.draft, draft, seqs, (1, 2))


def test_capacity_error_reference_model(hf_pair):
    target, draft = hf_pair
    eng = SpeculativeEngine(reference_model(target, "contiguous"), reference_model(draft, "contiguous"), k=5)
    with pytest.raises(specdec_ext.CacheFullError, match="target model: .* exceed its capacity of 256"):
        eng.generate(torch.tensor([[1, 2, 3]]), 255)
    eng.generate(torch.tensor([[1, 2, 3]]), 254)  # 3 + 254 - 1 = 256 positions: served (K clipped at the end)
