"""The engine on the package's reference Llama model (contiguous and paged caches):
greedy output equals Hugging Face generate, and after a generation both caches hold
exactly the committed tokens (next-token logits from the cache equal a fresh forward)."""
import copy

import pytest
import torch

from helpers import ragged_prompts
import specdec_ext
from specdec_ext import SpeculativeEngine
from specdec_ext.models import LlamaModel, LlamaSpecModel

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_pair():
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    target = transformers.LlamaForCausalLM(cfg).double().eval()
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    return target, draft


def _ours(hf, cache):
    m = LlamaModel.from_state_dict(hf.config, hf.state_dict(), dtype=torch.float64)
    return LlamaSpecModel(m, cache=cache, block_size=4) if cache == "paged" else LlamaSpecModel(m)


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("k,adaptive", [(1, False), (3, False), (5, False), (5, "cost")])
def test_greedy_equals_hf_generate_reference_model(hf_pair, cache, k, adaptive):
    target, draft = hf_pair
    eng = SpeculativeEngine(_ours(target, cache), _ours(draft, cache), k=k, adaptive_k=adaptive)
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
    eng = SpeculativeEngine(_ours(target, cache), _ours(draft, cache), k=4, adaptive_k=False)
    ids, mask = ragged_prompts()
    out = eng.generate(ids, 13, temperature=1.0, seed=7, attention_mask=mask)
    seqs = [ids[b][mask[b].bool()].tolist() + out.generated[b] for b in range(3)]
    for wrapper, full_model, pending_ok in ((eng.target, target, (1,)), (eng.draft, draft, (1, 2))):
        lengths = wrapper.lengths.tolist()
        pending = [len(s) - n for s, n in zip(seqs, lengths)]
        assert all(p in pending_ok for p in pending), pending
        width = max(pending)
        feed = torch.zeros(3, width, dtype=torch.int64)
        for b, s in enumerate(seqs):
            feed[b, :pending[b]] = torch.tensor(s[lengths[b]:])
        logits = wrapper.forward(feed)   # cached prefix + the pending tokens (pads after: causal)
        for b, s in enumerate(seqs):
            fresh = full_model(torch.tensor([s])).logits[0, -1]
            torch.testing.assert_close(logits[b, pending[b] - 1], fresh, rtol=1e-9, atol=1e-9)


def test_capacity_error_reference_model(hf_pair):
    target, draft = hf_pair
    eng = SpeculativeEngine(_ours(target, "contiguous"), _ours(draft, "contiguous"), k=5)
    with pytest.raises(specdec_ext.CacheFullError, match="target model: .* exceed its capacity of 256"):
        eng.generate(torch.tensor([[1, 2, 3]]), 255)
    eng.generate(torch.tensor([[1, 2, 3]]), 254)  # 3 + 254 - 1 = 256 positions: served (K clipped at the end)
