"""Suffix drafting (drafter='suffix'): the native index against a brute-force reference
(counts, proposals, removal; random texts and a hypothesis fuzz of operation sequences),
greedy output equal to target-only greedy (chains and trees, contiguous and paged caches,
ragged rows), the global index carried across generate calls with FIFO eviction, and the
emitted law at T > 0 (chi-square at ALPHA) for chains and trees."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import draws, ragged_prompts, reference_model, tiny_llama
from specdec_ext import SpeculativeEngine, SuffixConfig
from specdec_ext._suffix import SuffixIndex
from stats_reference import ALPHA, bigram_law_pvalue
from suffix_reference import RefSuffixIndex
from table_models import BigramModel
from test_engine_tree import TreeBigram

V = 6


def _all_patterns(ref, extra=()):
    pats = [()] + sorted(ref.distinct_substrings()) + list(extra)
    return pats


def _check_equal(ix, ref, rng):
    assert ix.num_sequences == len(ref.seqs)
    assert ix.num_nodes == 1 + len(ref.distinct_substrings())  # pruning leaves no empty node
    for pat in _all_patterns(ref, [(9,), (0, 9)]):
        assert ix.counts(list(pat)) == ref.counts(list(pat)), pat
    for _ in range(6):
        ctx = rng.integers(0, 4, size=int(rng.integers(0, 9))).tolist()
        if ref.seqs and rng.random() < 0.5:  # a context that surely matches: a tail of a sequence
            s = list(ref.seqs.values())[int(rng.integers(0, len(ref.seqs)))]
            ctx = s[:int(rng.integers(0, len(s) + 1))]
        for tree in (False, True):
            for factor, offset, min_prob, k in ((1.0, 0.0, 0.1, 8), (2.5, 1.0, 0.0, 6), (0.5, 0.0, 0.3, 4)):
                got = ix.propose(ctx, k, factor, offset, min_prob, tree)
                want = ref.propose(ctx, k, factor, offset, min_prob, tree)
                assert got[0] == want[0] and got[1] == want[1] and got[4] == want[4], (ctx, tree, got, want)
                assert got[2] == pytest.approx(want[2], rel=1e-12) and got[3] == pytest.approx(want[3], rel=1e-12)
                assert all(p < i for i, p in enumerate(got[1]))


# ---------------------------------------------------------------- the index
@pytest.mark.parametrize("seed", range(12))
def test_index_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(1, 6))
    ix, ref = SuffixIndex(depth), RefSuffixIndex(depth)
    for sid in range(3):
        ix.add_sequence(sid), ref.add_sequence(sid)
        text = rng.integers(0, 4, size=int(rng.integers(0, 30))).tolist()
        cut = int(rng.integers(0, len(text) + 1))
        for part in (text[:cut], text[cut:]):  # incremental == at once
            ix.append(sid, part), ref.append(sid, part)
    _check_equal(ix, ref, rng)
    for sid in (1, 0):  # eviction: counts of the removed sequence are taken back, empty nodes pruned
        ix.remove(sid), ref.remove(sid)
        _check_equal(ix, ref, rng)


def test_index_examples_and_errors():
    ix = SuffixIndex(4)
    ix.add_sequence(7)
    ix.append(7, [1, 2, 3, 1, 2, 4, 1, 2])
    assert ix.counts([1, 2]) == (3, 2)  # the trailing "1 2" has no continuation
    assert ix.counts([]) == (8, 8)
    # after "2": 3 and 4 once each (p = 1/2); after "1 2": the same; ties to the longer match
    assert ix.propose([1, 2], 8, factor=4.0, tree=True, min_prob=0.0)[0] == [3, 4, 1, 1]
    assert ix.propose([5], 8)[0] == []
    with pytest.raises(ValueError, match="no sequence 3"):
        ix.append(3, [1])
    with pytest.raises(ValueError, match="already exists"):
        ix.add_sequence(7)
    with pytest.raises(ValueError, match=r"tokens\[1\] must be in"):
        ix.append(7, [1, -2])
    with pytest.raises(ValueError, match="max_depth"):
        SuffixIndex(0)
    with pytest.raises(ValueError, match="min_prob"):
        ix.propose([1], 4, min_prob=1.5)
    ix.remove(7)
    assert ix.num_nodes == 1 and ix.num_sequences == 0


_ops = st.lists(st.tuples(st.sampled_from(["add", "append", "remove", "check"]), st.integers(0, 2),
                          st.lists(st.integers(0, 3), max_size=12)), max_size=25)


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 5), ops=_ops)
def test_fuzz_index_operation_sequences(depth, ops):
    ix, ref = SuffixIndex(depth), RefSuffixIndex(depth)
    rng = np.random.default_rng(len(ops))
    for op, sid, tokens in ops:
        live = sid in ref.seqs
        if op == "add" and not live:
            ix.add_sequence(sid), ref.add_sequence(sid)
        elif op == "append" and live:
            ix.append(sid, tokens), ref.append(sid, tokens)
        elif op == "remove" and live:
            ix.remove(sid), ref.remove(sid)
        elif op == "check":
            ctx = tokens[:8]
            for tree in (False, True):
                assert ix.propose(ctx, 6, 2.0, 0.0, 0.1, tree)[:2] == ref.propose(ctx, 6, 2.0, 0.0, 0.1, tree)[:2]
    assert ix.num_nodes == 1 + len(ref.distinct_substrings())
    for pat in _all_patterns(ref):
        assert ix.counts(list(pat)) == ref.counts(list(pat))


def _row(prompt, **config):
    from specdec_ext.engine.suffix import GlobalSuffixCache, SuffixRow

    return SuffixRow(GlobalSuffixCache(SuffixConfig(max_cached_requests=0, **config)), prompt)


def _continued_reference(text, k, c):
    """SuffixRow's continued chain, by hand: one native lookup after the text, then again
    after the text plus the chain while it is short, the floor divided by the last probability."""
    ix = SuffixIndex(c.max_depth)
    ix.add_sequence(0), ix.append(0, text)
    tokens, probs, floor = [], [], c.min_prob
    while len(tokens) < k:
        got = ix.propose((text + tokens)[-c.max_depth:], k - len(tokens), c.factor, c.offset, floor, False)
        if not got[0]:
            break
        last = probs[-1] if probs else 1.0
        tokens += list(got[0])
        probs += [last * q for q in got[2]]
        if not c.continue_chains or probs[-1] <= 0.0 or c.min_prob > probs[-1]:
            break
        floor = min(1.0, c.min_prob / probs[-1])
    return tokens, probs


def test_chains_continue_past_the_end_of_a_loop():
    row = _row([1, 2, 3, 1, 2, 3, 1], min_prob=0.0)
    assert row.propose(10) == [2, 3, 1, 2, 3, 1, 2, 3, 1, 2]  # the loop goes on past the text's end
    tokens, parents, probs = row.propose_tree(10)
    assert parents == list(range(-1, 9)) and probs == sorted(probs, reverse=True)
    once = _row([1, 2, 3, 1, 2, 3, 1], min_prob=0.0, continue_chains=False)
    assert once.propose(10) == [2, 3, 1]  # one lookup: the earlier "1 2 3 1" was followed by "2 3 1", then the end
    tree = _row([1, 2, 3, 1, 2, 3, 1], min_prob=0.0, tree=True)
    assert tree.propose_tree(10) == ([2, 3, 1], [-1, 0, 1], [1.0, 1.0, 1.0])  # trees: one lookup


@pytest.mark.parametrize("seed", range(16))
def test_continued_chains_match_a_reference(seed):
    rng = np.random.default_rng(seed)
    text = rng.integers(0, 3, size=int(rng.integers(1, 40))).tolist()
    c = SuffixConfig(max_depth=int(rng.integers(1, 8)), factor=float(rng.choice([0.5, 1.0, 2.0])),
                     offset=float(rng.choice([0.0, 1.0])), min_prob=float(rng.choice([0.0, 0.1, 0.4])),
                     continue_chains=bool(rng.integers(0, 2)), max_cached_requests=0)
    row = _row(text, **{f: getattr(c, f) for f in ("max_depth", "factor", "offset", "min_prob", "continue_chains")})
    for k in (1, 5, 16):
        tokens, parents, probs = row.propose_tree(k)
        want_tokens, want_probs = _continued_reference(text, k, c)
        assert tokens == want_tokens and parents == list(range(-1, len(tokens) - 1))
        assert probs == pytest.approx(want_probs, rel=1e-12) and all(p >= c.min_prob for p in probs)


def test_config_errors():
    with pytest.raises(TypeError, match="continue_chains"):
        SuffixConfig(continue_chains=1)
    with pytest.raises(ValueError, match="min_prob"):
        SuffixConfig(min_prob=2.0)
    with pytest.raises(ValueError, match="factor"):
        SuffixConfig(factor=-1.0)
    with pytest.raises(ValueError, match="max_cached_requests"):
        SuffixConfig(max_cached_requests=-1)
    with pytest.raises(ValueError, match="takes no draft model"):
        SpeculativeEngine(BigramModel(torch.zeros(V, V)), BigramModel(torch.zeros(V, V)), drafter="suffix")
    with pytest.raises(ValueError, match="configures drafter='suffix'"):
        SpeculativeEngine(BigramModel(torch.zeros(V, V)), None, suffix=SuffixConfig())
    with pytest.raises(ValueError, match="does not support tree"):
        SpeculativeEngine(BigramModel(torch.zeros(V, V)), None, drafter="suffix", suffix=SuffixConfig(tree=True))
    with pytest.raises(TypeError, match="SuffixConfig"):
        SpeculativeEngine(BigramModel(torch.zeros(V, V)), None, drafter="suffix", suffix={"tree": True})


# ---------------------------------------------------------------- the engine
def _table(seed, scale=1.5):
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * scale


def _looping_table():
    """A bigram table whose greedy text loops 1 -> 2 -> 3 -> 1 (the others lead into it), so
    suffix drafts get accepted."""
    t = _table(3, scale=0.5)
    for a, b in ((1, 2), (2, 3), (3, 1), (0, 1), (4, 1), (5, 2)):
        t[a, b] += 2.5
    return t


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(64, 2, seed=1)


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("tree", [False, True])
def test_greedy_equals_target_generate(llama, cache, tree):
    """Ragged rows; the second call drafts from the first call's outputs (global index)."""
    ids, mask = ragged_prompts()
    ref = llama.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    eng = SpeculativeEngine(reference_model(llama, cache), None, k=4, drafter="suffix",
                            suffix=SuffixConfig(tree=tree, factor=2.0, min_prob=0.0))
    first = eng.generate(ids, 16, attention_mask=mask)
    second = eng.generate(ids, 16, attention_mask=mask)
    assert torch.equal(first.sequences, ref) and torch.equal(second.sequences, ref)
    assert len(eng.suffix) == 6  # two calls of three rows
    assert second.steps < first.steps and second.steps <= 8  # the earlier outputs were drafted and accepted


@pytest.mark.parametrize("tree", [False, True])
def test_greedy_bigram_and_eos(tree):
    t = _looping_table()
    ids, mask = ragged_prompts(vocab=V, seed=4)
    ref = SpeculativeEngine(BigramModel(t), "ngram", k=0).generate(ids, 25, attention_mask=mask, eos_token_id=5)
    eng = SpeculativeEngine(TreeBigram(t), None, k=4, adaptive_k=False, drafter="suffix",
                            suffix=SuffixConfig(tree=tree))
    out = eng.generate(ids, 25, attention_mask=mask, eos_token_id=5)
    assert out.generated == ref.generated and sum(s.accepted for s in out.stats) > 0
    for b in range(3):
        seq = ids[b][mask[b] == 1].tolist() + out.generated[b]
        assert eng.target.history(b) == seq[:-1]  # the target holds every emitted token but the last


def test_a_tree_row_without_a_match_tests_no_drafts(monkeypatch):
    """In a suffix-tree step a row without a proposal is padded to the step's width; it tests
    no drafts (its K is 0 in the stats, as in a chain step, and it emits one token per step),
    while the other rows draft: the text stays target-only's."""
    from specdec_ext.engine import suffix as suffix_module
    t = _looping_table()
    ids, mask = ragged_prompts(vocab=V, seed=4)
    rows, propose = [], suffix_module.SuffixRow.propose_tree
    init = suffix_module.SuffixRow.__init__

    def record(self, *a):
        init(self, *a)
        rows.append(self)
    monkeypatch.setattr(suffix_module.SuffixRow, "__init__", record)
    monkeypatch.setattr(suffix_module.SuffixRow, "propose_tree",
                        lambda self, k: ([], [], []) if self is rows[1] else propose(self, k))
    ref = SpeculativeEngine(BigramModel(t), "ngram", k=0).generate(ids, 25, attention_mask=mask)
    out = SpeculativeEngine(TreeBigram(t), None, k=4, adaptive_k=False, drafter="suffix",
                            suffix=SuffixConfig(tree=True)).generate(ids, 25, attention_mask=mask)
    assert out.generated == ref.generated
    assert set(out.stats[1].ks) == {0} and set(out.stats[1].emitted) == {1}
    assert sum(out.stats[0].ks) > 0 and out.stats[0].accepted > 0


def test_global_index_carries_over_and_evicts_fifo():
    """Prompt A's output is drafted for prompt B, which continues the same way; the index
    keeps the last max_cached_requests outputs."""
    t = _table(8)
    target = BigramModel(t)
    eng = SpeculativeEngine(target, None, k=4, adaptive_k=False, drafter="suffix",
                            suffix=SuffixConfig(max_cached_requests=2, min_prob=0.0))
    outs = [eng.generate(torch.tensor([[p, 0]]), 12) for p in (1, 2, 3)]
    # a bigram target after token 0 continues the same way in every call
    assert outs[0].generated == outs[1].generated == outs[2].generated
    assert outs[1].stats[0].accepted >= 8 and outs[1].steps <= 4
    assert len(eng.suffix) == 2 and eng.suffix.index.num_sequences == 2
    g = outs[0].generated[0]
    assert eng.suffix.index.counts(g)[0] == 2  # the oldest of the three outputs was evicted
    none = SpeculativeEngine(BigramModel(t), None, k=4, adaptive_k=False, drafter="suffix",
                             suffix=SuffixConfig(max_cached_requests=0, min_prob=0.0))
    a, b = none.generate(torch.tensor([[1, 0]]), 12), none.generate(torch.tensor([[2, 0]]), 12)
    assert b.steps == a.steps  # without the global index the second call learns nothing from the first


@pytest.mark.law
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("temperature", [0.8, 1.3])
def test_first_three_tokens_follow_the_target_exactly(tree, temperature):
    """The exact law of the first three tokens (chi-square at ALPHA, 216 cells): rows of a
    prompt whose last token 3 was followed by 4 1 and 5 2 before, so the first step drafts
    a chain (3 tokens) or a two-branch tree from the index."""
    t = _table(1)
    N = draws(8_000, 2_000)
    prompt = [3, 4, 1, 3, 5, 2, 0, 3]
    ids = torch.tensor(prompt).repeat(N, 1)
    eng = SpeculativeEngine(TreeBigram(t), None, k=3, adaptive_k=False, drafter="suffix",
                            suffix=SuffixConfig(tree=tree, factor=3.0, min_prob=0.0, max_cached_requests=0))
    out = eng.generate(ids, 4, temperature=temperature, seed=11)
    assert {s.ks[0] for s in out.stats} == {2 if tree else 3}, "the first step's draft (a tree: its depth)"
    assert bigram_law_pvalue(out.generated, t, temperature, prompt) > ALPHA
    acc = sum(s.accepted for s in out.stats) / max(1, sum(s.drafted for s in out.stats))
    assert 0.0 < acc < 1.0
