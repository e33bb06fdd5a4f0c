"""Prompt-lookup (n-gram) and hybrid drafting: the index, greedy equality with target-only
decoding, the exact law at T = 1, and the caches after generation."""
import numpy as np
import pytest
import torch

from helpers import draws, ragged_prompts
from specdec_ext import SpeculativeEngine
from specdec_ext.engine.ngram import NgramIndex
from stats_reference import ALPHA, bigram_law_pvalue
from table_models import BigramModel

V = 6


def _table(seed, scale=1.5):
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * scale


# ---------------------------------------------------------------- the index
def _naive(text, k, max_n, min_n=1):
    for n in range(min(max_n, len(text) - 1), min_n - 1, -1):
        suffix = text[len(text) - n:]
        for start in range(len(text) - n - 1, -1, -1):  # latest earlier occurrence first
            if text[start:start + n] == suffix:
                seq = list(text)  # the overlapping copy: the draft copies the text it extends
                for j in range(k):
                    seq.append(seq[start + n + j])
                return seq[len(text):]
    return []


@pytest.mark.parametrize("seed", range(20))
def test_index_matches_a_naive_search(seed):
    rng = np.random.default_rng(seed)
    text = rng.integers(0, 4, size=int(rng.integers(1, 60))).tolist()
    ix = NgramIndex(max_ngram=3)
    cut = int(rng.integers(0, len(text) + 1))
    ix.extend(text[:cut])
    ix.extend(text[cut:])  # incremental == at once
    for k in (1, 4, 16):
        assert ix.propose(k) == _naive(text, k, 3)


def test_index_edges():
    ix = NgramIndex(max_ngram=2)
    assert ix.propose(3) == []
    ix.extend([7])
    assert ix.propose(3) == []
    ix.extend([8, 7])
    assert ix.propose(3) == [8, 7, 8]  # "7" was followed by 8, 7, then the loop "8 7" goes on
    assert ix.propose(1) == [8]
    ix.extend([1, 2, 3, 1])  # "1" -> "2 3 1", then the period-3 loop
    assert ix.propose(7) == [2, 3, 1, 2, 3, 1, 2]
    ix.extend([5, 6, 5, 9, 5, 6, 5])  # latest "6 5" (n = 2) is followed by "9 5 6 5", then its copy
    assert ix.propose(6) == [9, 5, 6, 5, 9, 5]
    with pytest.raises(ValueError, match="min_ngram"):
        NgramIndex(max_ngram=2, min_ngram=3)


# ---------------------------------------------------------------- the engine
def _looping_target():
    """A bigram target that cycles 1 -> 2 -> 3 -> 1 under greedy decoding, with real
    probability elsewhere (so n-gram drafts are often, not always, right at T = 1)."""
    t = _table(3, scale=0.5)
    for a, b in ((1, 2), (2, 3), (3, 1), (0, 1), (4, 1), (5, 2)):
        t[a, b] += 2.5
    return t


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_equals_target_only(drafter, k):
    t = _looping_target()
    ids, mask = ragged_prompts(vocab=V, seed=4)
    draft = None if drafter == "ngram" else BigramModel(t * 0.7 + _table(5) * 0.5)
    eng = SpeculativeEngine(BigramModel(t), draft, k=k, adaptive_k=False, drafter=drafter)
    out = eng.generate(ids, 25, temperature=0.0, attention_mask=mask)
    ref = SpeculativeEngine(BigramModel(t), "ngram", k=0).generate(ids, 25, temperature=0.0, attention_mask=mask)
    assert out.generated == ref.generated
    assert sum(s.accepted for s in out.stats) > 0  # the n-gram drafts were used and accepted


@pytest.mark.parametrize("temperature", [0.8, 1.3])
@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_first_three_tokens_follow_the_target_exactly(drafter, temperature):
    """The exact law of the first three tokens (chi-square at ALPHA, 216 cells): 20k rows of a
    prompt whose last token occurred before, followed by 4 1 5, so the first step drafts
    K = 3 from the n-gram index (4 new tokens: the budget cap allows 3)."""
    t = _table(1)
    N = draws(20_000)
    prompt = [3, 4, 1, 5, 3]  # after "3" the index proposes 4 1 5
    ids = torch.tensor(prompt).repeat(N, 1)
    draft = None if drafter == "ngram" else BigramModel(_table(2))
    out = SpeculativeEngine(BigramModel(t), draft, k=3, adaptive_k=False, drafter=drafter).generate(
        ids, 4, temperature=temperature, seed=11)
    assert {s.ks[0] for s in out.stats} == {3}, "the first step drafted 3 tokens in every row"
    assert bigram_law_pvalue(out.generated, t, temperature, prompt) > ALPHA
    acc = sum(s.accepted for s in out.stats) / max(1, sum(s.drafted for s in out.stats))
    assert 0.0 < acc < 1.0


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_caches_hold_exactly_the_committed_tokens(drafter):
    t = _looping_target()
    target, draft = BigramModel(t), BigramModel(t * 0.8 + _table(6) * 0.4)
    ids, mask = ragged_prompts(vocab=V, seed=7)
    eng = SpeculativeEngine(target, None if drafter == "ngram" else draft, k=3, adaptive_k=False, drafter=drafter)
    out = eng.generate(ids, 19, temperature=1.0, seed=2, attention_mask=mask)
    for b in range(ids.shape[0]):
        seq = ids[b][mask[b] == 1].tolist() + out.generated[b]
        assert target.history(b) == seq[:-1]  # the target holds every emitted token but the last
        if drafter == "hybrid":
            d = draft.history(b)
            assert d == seq[:len(d)] and len(d) < len(seq)


def _run(engine, ids, max_new_tokens=8, mask=None):
    """The engine's state of a request after its prefill (no step taken)."""
    return engine._start(ids, max_new_tokens, 0.0, 0, None, mask, dict(top_k=None, top_p=None, min_p=None))


def test_k_follows_the_draft_source():
    """K is chosen from the estimate of the step's draft source: the same row, with a
    three-token match that passed and a one-token match that failed, drafts long for the
    first and not at all for the second; the step's outcome is credited to its source."""
    t = _looping_target()
    eng = SpeculativeEngine(BigramModel(t), None, k=8)
    run = _run(eng, torch.tensor([[1, 2, 3, 1, 2]]), 16)
    for _ in range(30):
        run.alpha.update(0, 8, 8, "ngram3")
        run.alpha.update(0, 8, 0, "ngram1")
    assert run.choose_ks(["ngram3"]) == [8]
    assert run.choose_ks(["ngram1"]) == [0]
    assert 0 < run.choose_ks(None)[0] < 8, "without sources: the row's own estimate, still the prior"
    props, sources = eng._propose(run)
    assert sources == ["ngram2"] and props == [[3, 1, 2, 3, 1, 2, 3, 1]]  # "1 2" occurred before
    before = run.alpha.alpha(0, "ngram2")
    run.choose_ks(["ngram2"])
    from specdec_ext.engine.commit import commit_step
    run.apply(commit_step([[3, 1, 5, -1, 1, 1, 1]], 3, run.active, run.pending, [0], 16, set(), ["idle"], [3]), 3)
    assert run.alpha.alpha(0, "ngram2") < before < 1.0, "2 accepted then a rejection, credited to ngram2"
    assert run.alpha.alpha(0, "ngram3") > 0.99


def test_hybrid_rows_without_a_match_draft_with_the_model():
    """Hybrid sources: a row with no match is a 'model' row (it pays draft steps); in a mixed
    step the rows with a match are cut to the model rows' largest K, so the draft model never
    runs further than a model row needs."""
    t = _looping_target()
    eng = SpeculativeEngine(BigramModel(t), BigramModel(t * 0.7 + _table(5) * 0.5), k=8, drafter="hybrid")
    run = _run(eng, torch.tensor([[1, 2, 3, 1, 2], [0, 4, 5, 0, 0]]), 16, torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]))
    props, sources = eng._propose(run)
    assert sources == ["ngram2", "model"]
    ks, draft_ids, _, how = eng._draft(run, [8, 2], props)
    assert ks == [2, 2] and draft_ids.shape == (2, 2)
    assert draft_ids[0].tolist() == [3, 1] and how == ["overridden", "drafted"]


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_adaptive_k_by_source_keeps_outputs_and_caches_exact(drafter, temperature):
    """Adaptive K by draft source (the default policy) with ragged rows: greedy output equal to
    target-only, and at T = 1 the caches hold exactly the committed tokens."""
    t = _looping_target()
    target, draft = BigramModel(t), BigramModel(t * 0.7 + _table(5) * 0.5)
    ids, mask = ragged_prompts(vocab=V, seed=4)
    eng = SpeculativeEngine(target, None if drafter == "ngram" else draft, k=8, drafter=drafter)
    out = eng.generate(ids, 30, temperature=temperature, seed=3, attention_mask=mask)
    if temperature == 0.0:
        ref = SpeculativeEngine(BigramModel(t), "ngram", k=0).generate(ids, 30, temperature=0.0, attention_mask=mask)
        assert out.generated == ref.generated
    for b in range(ids.shape[0]):
        seq = ids[b][mask[b] == 1].tolist() + out.generated[b]
        assert target.history(b) == seq[:-1]
        if drafter == "hybrid":
            d = draft.history(b)
            assert d == seq[:len(d)] and len(d) < len(seq)
    assert sum(s.accepted for s in out.stats) > 0


def test_drafter_arguments():
    t = _table(1)
    with pytest.raises(ValueError, match="needs a draft model"):
        SpeculativeEngine(BigramModel(t), None, drafter="hybrid")
    with pytest.raises(ValueError, match="takes no draft model"):
        SpeculativeEngine(BigramModel(t), BigramModel(t), drafter="ngram")
    with pytest.raises(ValueError, match="drafter must be one of"):
        SpeculativeEngine(BigramModel(t), BigramModel(t), drafter="magic")
    with pytest.raises(ValueError, match="draft must be a model, None or 'ngram'"):
        SpeculativeEngine(BigramModel(t), "bigram")
