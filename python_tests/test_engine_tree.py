"""Tree speculation in the engine (SpeculativeEngine(tree=...)): greedy output equals the
target's own greedy generation token for token (ragged batch; the reference model on both
caches and the batched Hugging Face path), the caches after a generation equal a fresh
prefill of the emitted text, seeded sampling is reproducible, the caches' compaction
matches its definition, and the errors."""
import numpy as np
import pytest
import torch

from helpers import (assert_cache_matches_prefill, hf_fresh_prefill, near_copy, ragged_prompts, reference_model,
                     tiny_llama)
import specdec_ext
from specdec_ext import KVCache, PagedKVCache, SpeculativeEngine
from specdec_ext.engine.tree import TreeShape
from stats_reference import ALPHA, chi_square_pvalue
from table_models import BigramModel

transformers = pytest.importorskip("transformers")


class TreeBigram(BigramModel):
    """The bigram table model with tree steps: a node's logits are its token's row, and
    compaction reorders the token history (the "cache")."""

    def forward_tree(self, input_ids, tree):
        return self.forward(input_ids)

    def compact(self, num_appended, src_index, count):
        j = torch.arange(src_index.shape[1]).view(1, -1)
        base = (self._len - num_appended).view(-1, 1)
        src = base + torch.where(j < count.view(-1, 1), src_index, j)   # later columns: onto themselves
        self.hist.scatter_(1, base + j, self.hist.gather(1, src))


@pytest.fixture(scope="module")
def hf_pair():
    target = tiny_llama(64, 2, seed=1)
    return target, near_copy(target, 1e-3, seed=None)


def _engine(target, draft, cache, tree, **kw):
    if cache == "hf":
        return SpeculativeEngine(target, draft, tree=tree, **kw)
    return SpeculativeEngine(reference_model(target, cache), reference_model(draft, cache), tree=tree, **kw)


# ---------------------------------------------------------------- the shape
def test_tree_shape_bfs():
    s = TreeShape((3, 2))
    assert s.depth == 2 and s.num_nodes() == 10 and s.num_nodes(1) == 4 and s.num_nodes(0) == 1
    assert s.parents == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert s.firsts == [0, 1, 4] and s.level_sizes == [1, 3, 6]


# ---------------------------------------------------------------- greedy == target-only
@pytest.mark.parametrize("cache", ["contiguous", "paged", "hf"])
@pytest.mark.parametrize("tree,mode", [((2, 2), "sampled"), ((3, 1, 2), "topk"), ((1,), "sampled")])
def test_greedy_equals_target_generate(hf_pair, cache, tree, mode):
    target, draft = hf_pair
    eng = _engine(target, draft, cache, tree, tree_mode=mode)
    ids, mask = ragged_prompts()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    out = eng.generate(ids, 16, attention_mask=mask)
    assert torch.equal(out.sequences, ref)
    assert out.steps < 16 and sum(s.accepted for s in out.stats) > 0   # the close draft is accepted
    assert all(s.tokens_generated == 16 for s in out.stats)


def test_greedy_with_an_unrelated_draft_and_eos(hf_pair):
    target, _ = hf_pair
    draft = tiny_llama(32, 1, seed=9)
    ids = torch.randint(1, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    ref = target.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    eos = int(ref[0, 8])  # row 0 stops there
    ref = target.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=eos, eos_token_id=eos)
    out = _engine(target, draft, "contiguous", (3, 2)).generate(ids, 12, eos_token_id=eos)
    assert torch.equal(out.sequences[:, :ref.shape[1]], ref)


# ---------------------------------------------------------------- caches
@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("mode", ["sampled", "topk"])
def test_caches_equal_a_fresh_prefill_reference_model(hf_pair, cache, mode):
    target, draft = hf_pair
    eng = _engine(target, draft, cache, (3, 2), tree_mode=mode)
    ids, mask = ragged_prompts()
    out = eng.generate(ids, 13, temperature=1.0, seed=7, attention_mask=mask)
    seqs = [ids[b][mask[b].bool()].tolist() + out.generated[b] for b in range(3)]
    assert_cache_matches_prefill(eng.target, target, seqs, (1,))
    # the draft: 1 or 2 pending tokens, 3 when the last step had one token left (depth 0: it idled)
    assert_cache_matches_prefill(eng.draft, draft, seqs, (1, 2, 3))


def test_caches_equal_a_fresh_prefill_hf(hf_pair):
    target, draft = hf_pair
    eng = _engine(target, draft, "hf", (3, 2))
    ids, mask = ragged_prompts()
    out = eng.generate(ids, 13, temperature=1.0, seed=7, attention_mask=mask)
    for b in range(3):
        seq = ids[b][mask[b].bool()].tolist() + out.generated[b]
        for model, wrapper, pending in ((target, eng.target, (1,)), (draft, eng.draft, (1, 2, 3))):
            cached = wrapper.cache_tensors(b)
            n = cached[0][0].shape[-2]
            assert len(seq) - n in pending
            for (k1, v1), (k2, v2) in zip(cached, hf_fresh_prefill(model, seq[:n])):
                torch.testing.assert_close(k1, k2, rtol=1e-9, atol=1e-10)   # float64 models
                torch.testing.assert_close(v1, v2, rtol=1e-9, atol=1e-10)


# ---------------------------------------------------------------- sampling
@pytest.mark.parametrize("mode", ["sampled", "topk"])
def test_seeded_sampling_is_reproducible(hf_pair, mode):
    target, draft = hf_pair
    ids, mask = ragged_prompts()
    run = lambda seed: _engine(target, draft, "contiguous", (2, 2), tree_mode=mode).generate(  # noqa: E731
        ids, 12, temperature=torch.tensor([1.0, 0.0, 0.7]), seed=seed, attention_mask=mask)
    a, b, c = run(11), run(11), run(12)
    assert torch.equal(a.sequences, b.sequences) and a.steps == b.steps
    assert not torch.equal(a.sequences, c.sequences)
    per_row = torch.tensor([5, 6, 7])
    assert torch.equal(run(per_row).sequences, run(per_row).sequences)
    # the greedy row is target-only greedy whatever the others do
    ref = target.generate(ids[1:2, 2:], max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert a.generated[1] == ref[0, 5:].tolist()


@pytest.mark.law
@pytest.mark.parametrize("mode", ["sampled", "topk"])
def test_three_tokens_follow_the_target_law(mode):
    """Many rows of one prompt, 3 new tokens each (a first step of depth 2, then whatever is
    left): the (t1, t2, t3) triples follow the bigram target's law (chi-square), and each
    row's target history is exactly its committed text."""
    V, B = 5, 3000
    g = torch.Generator().manual_seed(0)
    table = torch.randn(V, V, generator=g) * 1.5
    target = TreeBigram(table)
    draft = TreeBigram(table + torch.randn(V, V, generator=g))
    out = SpeculativeEngine(target, draft, tree=(3, 2), tree_mode=mode).generate(
        torch.tensor([[1, 2]]).expand(B, 2), 3, temperature=1.0, seed=123)
    p = torch.softmax(table.double(), -1).numpy()
    law = np.einsum("a,ab,bc->abc", p[2], p, p).ravel()
    gen = np.array(out.generated)
    counts = np.bincount(gen[:, 0] * V * V + gen[:, 1] * V + gen[:, 2], minlength=V ** 3)
    assert chi_square_pvalue(counts, law) > ALPHA
    assert sum(s.accepted for s in out.stats) > B   # trees were accepted
    for b in range(0, B, 97):
        assert target.history(b) == [1, 2] + out.generated[b][:-1]


def test_filters_reach_the_draft_and_verify(hf_pair):
    """top_k = 1 at T = 1 keeps only the argmax, in the draft's draws and in verify_tree:
    the text is the greedy text."""
    target, draft = hf_pair
    ids, mask = ragged_prompts()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    out = _engine(target, draft, "contiguous", (2, 2)).generate(ids, 10, attention_mask=mask, temperature=1.0,
                                                                   top_k=1, seed=3)
    assert torch.equal(out.sequences, ref)


def test_depth_shrinks_at_the_capacity(hf_pair):
    """A request filling the model's positions (here 24: 3 + 22 - 1): the tree's depth is
    clipped to the room left, so it is served, and stays exact."""
    from specdec_ext.models import LlamaModel, LlamaSpecModel

    target, draft = hf_pair

    def short(hf):  # the same weights, max_position_embeddings = 24
        cfg = hf.config.to_dict() | {"max_position_embeddings": 24}
        return LlamaSpecModel(LlamaModel.from_state_dict(cfg, hf.state_dict(), dtype=torch.float64))

    eng = SpeculativeEngine(short(target), short(draft), tree=(2, 2))
    with pytest.raises(specdec_ext.CacheFullError, match="exceed its capacity of 24"):
        eng.generate(torch.tensor([[1, 2, 3]]), 23)
    out = eng.generate(torch.tensor([[1, 2, 3]]), 22)
    ref = target.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=22, do_sample=False, pad_token_id=0)
    assert out.generated[0] == ref[0, 3:].tolist()


def test_metrics_and_stats(hf_pair):
    target, draft = hf_pair
    metrics = specdec_ext.SpecDecMetrics()
    eng = _engine(target, draft, "contiguous", (2, 2), metrics=metrics)
    out = eng.generate(torch.tensor([[5, 6, 7]]), 20)
    s = out.stats[0]
    assert s.tokens_generated == 20 and s.steps == out.steps and s.tokens_per_step > 1.5
    assert s.drafted == sum(s.ks) and max(s.ks) == 2
    got = {m.name: m for m in metrics.registry.collect()}
    assert got["speculative_steps"].samples[0].value == out.steps


# ---------------------------------------------------------------- compaction
def _expected(cache_rows, base, src, count):
    out = cache_rows.clone()
    for b in range(len(base)):
        for j in range(int(count[b])):
            out[:, b, :, base[b] + j] = cache_rows[:, b, :, base[b] + int(src[b, j])]
    return out


def test_kv_cache_compact():
    kv = KVCache(2, 3, 2, 4, 16, torch.float32)
    kv.key_cache.normal_()
    kv.value_cache.normal_()
    kv.advance(9)
    kv.rollback(9, [9, 4, 7])                 # lengths 9, 4, 7; the step appended 5 to each
    kv.advance(5)
    before_k, before_v = kv.key_cache.clone(), kv.value_cache.clone()
    src = torch.tensor([[0, 3, 4, -1], [0, 2, 3, 4], [0, 1, -1, -1]])   # overlapping moves in row 1
    count = torch.tensor([3, 4, 0])
    kv.compact(5, src, count)
    base = [9, 4, 7]
    assert torch.equal(kv.key_cache, _expected(before_k, base, src, count))
    assert torch.equal(kv.value_cache, _expected(before_v, base, src, count))
    assert kv.host_lengths().tolist() == [14, 9, 12]
    with pytest.raises(ValueError, match=r"src_index\[0, :count\] must be strictly increasing .* = 5"):
        kv.compact(5, torch.tensor([[0, 5], [0, 0], [0, 0]]), torch.tensor([2, 1, 1]))
    with pytest.raises(ValueError, match=r"src_index\[1, 1\] = 0"):
        kv.compact(5, torch.tensor([[0, 1], [0, 0], [0, 0]]), torch.tensor([2, 2, 1]))
    with pytest.raises(ValueError, match="count must be in"):
        kv.compact(5, src, torch.tensor([5, 0, 0]))


@pytest.mark.parametrize("paged", [False, True])
def test_compact_more_than_a_row_holds_names_num_appended(paged):
    """num_appended above a row's length: ValueError naming num_appended, the row and its length,
    the same message for both caches; nothing written (KVCache used to name an internal
    lengths[0] = -2 from the op)."""
    if paged:
        cache = PagedKVCache(1, 16, 4, 2, 3, torch.float32, max_blocks_per_seq=6)
        for s, n in (("a", 6), ("b", 1)):
            cache.manager.add(s)
            cache.allocate([s], n)
        call = lambda n: cache.compact(["a", "b"], n, torch.tensor([[0, 1], [0, 1]]), torch.tensor([2, 2]))  # noqa: E731
        rows = r"\['b'\]"
    else:
        cache = KVCache(1, 2, 2, 4, 16, torch.float32)
        cache.advance(3)
        cache.rollback(3, [3, 1])                 # lengths 3, 1
        call = lambda n: cache.compact(n, torch.tensor([[0, 1], [0, 1]]), torch.tensor([2, 2]))  # noqa: E731
        rows = r"\[1\]"
    cache.key_cache.normal_()
    before = cache.key_cache.clone()
    with pytest.raises(ValueError, match=rf"compact: num_appended=3 is more than rows {rows} hold \(lengths \[1\]\)"):
        call(3)
    assert torch.equal(cache.key_cache, before)


def test_paged_kv_cache_compact():
    cache = PagedKVCache(2, 16, 4, 2, 3, torch.float32, max_blocks_per_seq=6)
    cache.key_cache.normal_()
    cache.value_cache.normal_()
    seqs = ["a", "b"]
    for s in seqs:
        cache.manager.add(s)
    cache.allocate(seqs, [6, 3])
    cache.allocate(seqs, 5)                   # the step: 5 entries each, across block borders
    dense_before = [cache.gather(layer, seqs) for layer in range(2)]
    src = torch.tensor([[0, 2, 4], [0, 1, 3]])
    count = torch.tensor([3, 2])
    cache.compact(seqs, 5, src, count)
    for layer in range(2):
        k, v = cache.gather(layer, seqs)
        for got, before in ((k, dense_before[layer][0]), (v, dense_before[layer][1])):
            assert torch.equal(got, _expected(before.unsqueeze(0), [6, 3], src, count)[0])


# ---------------------------------------------------------------- errors
def test_errors(hf_pair):
    from specdec_ext.models.hf import HFSpecModel

    target, draft = hf_pair
    t, d = reference_model(target), reference_model(draft)
    for tree, match in (((), "non-empty sequence"), ((2, 0), r"tree\[1\] must be an int in \[1, inf\]"),
                        ("22", "non-empty sequence")):
        with pytest.raises(ValueError, match=match):
            SpeculativeEngine(t, d, tree=tree)
    with pytest.raises(TypeError, match=r"tree\[0\] must be an int"):
        SpeculativeEngine(t, d, tree=(True, 2))
    with pytest.raises(ValueError, match="tree_mode must be one of"):
        SpeculativeEngine(t, d, tree=(2,), tree_mode="beam")
    with pytest.raises(ValueError, match="needs a draft model .* drafter 'ngram'"):
        SpeculativeEngine(t, None, tree=(2,))
    with pytest.raises(ValueError, match="drafter 'hybrid' proposes chains"):
        SpeculativeEngine(t, d, tree=(2,), drafter="hybrid")
    with pytest.raises(ValueError, match="verify_mode='exact' only"):
        SpeculativeEngine(t, d, tree=(2,), verify_mode="coupled")
    with pytest.raises(ValueError, match="verify_mode='exact' only .*no block mode"):
        SpeculativeEngine(t, d, tree=(2,), verify_mode="block")
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        SpeculativeEngine(t, d, tree=(98,))
    with pytest.raises(ValueError, match="draft model \\(HFSpecModel\\) does not support tree speculation"):
        SpeculativeEngine(t, HFSpecModel(draft), tree=(2,))


@pytest.mark.parametrize("top_k", [1, torch.tensor([1, 1, 1])], ids=["int", "per_row"])
def test_sampled_children_are_drawn_from_the_filtered_draft_law(top_k):
    """Sampled mode draws a node's children, and writes its q, under the run's filters: with
    top_k = 1 every child is the draft's argmax and q is one-hot there (the law verify_tree is
    given is the one the children were drawn from, the filtered one, as in a chain)."""
    from specdec_ext.engine.inputs import SamplingArgs
    from specdec_ext.engine.tree import _children

    B, M, b, V = 3, 2, 4, 50
    logits = torch.randn(B, M, V, generator=torch.Generator().manual_seed(0)) * 3
    sampling = SamplingArgs(torch.full((B,), 1.0), {"top_k": top_k, "top_p": None, "min_p": None}, 5)
    offsets = torch.arange(M * b).view(M, b)
    q = torch.empty(B * M, V)
    kids = _children(logits, b, True, sampling, offsets, q)
    argmax = logits.argmax(-1)
    assert torch.equal(kids, argmax.unsqueeze(-1).expand(B, M, b))
    assert torch.equal(q, torch.nn.functional.one_hot(argmax.view(-1), V).float())
