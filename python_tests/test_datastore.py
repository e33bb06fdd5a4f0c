"""Retrieval drafting (specdec_ext.Datastore): the native suffix array and its proposals
against a brute-force reference (random corpora and a hypothesis fuzz over every parameter,
the sampled-count path and extreme ids included), the argument errors, the engine's greedy
output equal to target-only greedy, the emitted law at T > 0 (chi-square at ALPHA), and the
CLI flag."""
import array
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import draws, ragged_prompts, run_generate
from specdec_ext import Datastore, SpeculativeEngine
from specdec_ext._suffix import TokenDatastore
from specdec_ext.engine.datastore import DATASTORE_SOURCE, DatastoreRow
from stats_reference import ALPHA, bigram_law_pvalue
from table_models import BigramModel

V = 6


# ---------------------------------------------------------------- the reference
def ref_suffix_array(corpus, depth):
    return sorted(range(len(corpus)), key=lambda i: (corpus[i:i + depth], i))


def ref_propose(corpus, context, k, max_depth, min_prob, max_scan, prior, depth):
    """token_datastore.h's rule, written out over the corpus and its reference suffix array."""
    n, sa = len(corpus), ref_suffix_array(corpus, depth)

    def rng(pat):  # the suffix array range of the suffixes starting with pat
        hits = [j for j, s in enumerate(sa) if corpus[s:s + len(pat)] == list(pat)]
        return (hits[0], hits[-1] + 1) if hits else (0, 0)

    def followed(lo, hi, m):
        return sum(1 for j in range(lo, hi) if sa[j] + m < n)

    L, lo, hi = 0, 0, 0
    for m in range(1, min(len(context), max_depth, depth - 1) + 1):
        a, b = rng(context[-m:])
        if followed(a, b, m) == 0:
            break
        L, lo, hi = m, a, b
    if L == 0 or k == 0:
        return [], [], L if k else 0
    pat, draft, probs, prob = list(context[-L:]), [], [], 1.0
    while len(draft) < k and len(pat) < depth:
        m, size = len(pat), hi - lo
        count = min(size, max_scan)
        picks = range(lo, hi) if count == size else [lo + (i * size) // count for i in range(count)]
        nxt = [corpus[sa[j] + m] for j in picks if sa[j] + m < n]
        if not nxt:
            break
        c = Counter(nxt)
        best = min(c, key=lambda t: (-c[t], t))
        scanned, total = len(nxt), followed(lo, hi, m)
        prob *= c[best] / (scanned + prior * (scanned / total))
        if prob < min_prob:
            break
        draft.append(best)
        probs.append(prob)
        pat.append(best)
        lo, hi = rng(pat)
    return draft, probs, L


def _check(corpus, context, k, max_depth, min_prob, max_scan, prior, depth):
    ds = TokenDatastore(array.array("i", corpus), depth)
    assert ds.suffix_array() == ref_suffix_array(corpus, depth)
    tokens, probs, score, match = ds.propose(context, k, max_depth, min_prob, max_scan, prior)
    r_tokens, r_probs, r_match = ref_propose(corpus, context, k, max_depth, min_prob, max_scan, prior, depth)
    assert (tokens, match if k else 0) == (r_tokens, r_match)
    assert probs == pytest.approx(r_probs, rel=1e-12) and score == pytest.approx(sum(r_probs), rel=1e-12)


@pytest.mark.parametrize("seed", range(25))
def test_proposals_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    corpus = rng.integers(0, 3 + seed % 3, size=int(rng.integers(1, 120))).tolist()
    for _ in range(6):
        context = rng.integers(0, 5, size=int(rng.integers(1, 10))).tolist()
        _check(corpus, context, int(rng.integers(0, 8)), int(rng.integers(1, 8)), float(rng.choice([0.0, 0.2, 0.5])),
               int(rng.choice([1, 3, 1000])), float(rng.choice([0.0, 2.0])), int(rng.choice([2, 5, 64])))


@settings(max_examples=150, deadline=None)
@given(corpus=st.lists(st.sampled_from([0, 1, 2, 2**31 - 1]), max_size=60),
       context=st.lists(st.sampled_from([0, 1, 2, 3, 2**31 - 1]), max_size=8),
       k=st.integers(0, 6), max_depth=st.integers(1, 6), min_prob=st.floats(0.0, 1.0),
       max_scan=st.integers(1, 8), prior=st.floats(0.0, 5.0), depth=st.integers(1, 8))
def test_fuzz_proposals_match_the_reference(corpus, context, k, max_depth, min_prob, max_scan, prior, depth):
    _check(corpus, context, k, max_depth, min_prob, max_scan, prior, depth)


def test_examples():
    ds = Datastore([5, 1, 2, 3, 5, 1, 2, 4, 5, 1, 2, 3], prior=0.0, min_prob=0.0)
    assert ds.propose([9, 5, 1], 3) == ([2, 3, 5], 2)  # "5 1" -> 2 (3x), then 3 (2 of 3), then 5
    assert ds.propose([9], 3) == ([], 0)  # no match
    assert ds.native.count([5, 1, 2]) == 3 and ds.native.count([]) == 12 and len(ds) == 12
    assert Datastore([1, 2], prior=2.0, min_prob=0.4).propose([1], 4) == ([], 1)  # 1 / (1 + 2) < 0.4
    assert Datastore([], min_prob=0.0).propose([1], 4) == ([], 0)


def test_inputs_of_every_kind_give_one_datastore(tmp_path):
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    strided = torch.tensor([[3, 0], [1, 0], [4, 0], [1, 0], [5, 0], [9, 0], [2, 0], [6, 0]])[:, 0]
    (tmp_path / "c.u16").write_bytes(array.array("H", ids).tobytes())
    (tmp_path / "c.i32").write_bytes(array.array("i", ids).tobytes())
    made = [Datastore(ids), Datastore(torch.tensor(ids)), Datastore(strided), Datastore(array.array("H", ids)),
            Datastore.from_file(str(tmp_path / "c.u16")), Datastore.from_path(str(tmp_path / "c.i32")),
            Datastore(np.array(ids, dtype=np.uint16)), Datastore(np.array(ids)[::-1][::-1])]
    for ds in made:
        assert ds.native.suffix_array() == made[0].native.suffix_array() and ds.max_token == 9


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match=r"tokens\[1\] must be in \[0, 2\^31 - 1\]"):
        Datastore([1, -1])
    with pytest.raises(TypeError, match=r"tokens\[0\] must be an int"):
        Datastore([1.0])
    with pytest.raises(TypeError, match="integer tensor"):
        Datastore(torch.ones(3))
    with pytest.raises(TypeError, match="integer tensor"):
        Datastore(np.ones(3))
    with pytest.raises(ValueError, match="1-D"):
        Datastore(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="int32 .* or uint16"):
        TokenDatastore(array.array("d", [1.0]), 64)
    with pytest.raises(ValueError, match="sort_depth"):
        TokenDatastore(array.array("i", [1]), 0)
    for kw, name in ((dict(max_depth=0), "max_depth"), (dict(max_depth=64), "max_depth"),
                     (dict(min_prob=1.5), "min_prob"), (dict(min_prob=float("nan")), "min_prob"),
                     (dict(prior=-1.0), "prior"), (dict(prior=float("inf")), "prior"),
                     (dict(max_scan=0), "max_scan"), (dict(min_context_match=0), "min_context_match")):
        with pytest.raises(ValueError, match=name):
            Datastore([1, 2], **kw)
    ds = TokenDatastore(array.array("i", [1, 2]), 64)
    for args, name in (((-1, 24, 0.1, 8, 2.0), "max_tokens"), ((2, 0, 0.1, 8, 2.0), "max_depth"),
                       ((2, 24, 0.1, 0, 2.0), "max_scan"), ((2, 24, 0.1, 8, -1.0), "prior")):
        with pytest.raises(ValueError, match=name):
            ds.propose([1], *args)
    with pytest.raises(ValueError, match=r"context\[0\]"):
        ds.propose([-3], 2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Datastore.from_path(str(tmp_path / "missing.u16"))
    (tmp_path / "odd.u16").write_bytes(b"abc")
    with pytest.raises(ValueError, match="whole number of 2-byte tokens"):
        Datastore.from_file(str(tmp_path / "odd.u16"))
    (tmp_path / "text.txt").write_text("hello")
    with pytest.raises(ValueError, match="needs the target's tokenizer"):
        Datastore.from_path(str(tmp_path / "text.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        Datastore.from_path(str(tmp_path / "empty"))


def test_engine_arguments():
    t = torch.randn(V, V, generator=torch.Generator().manual_seed(1))
    ds = Datastore([1, 2, 3])
    with pytest.raises(TypeError, match="datastore must be a specdec_ext.Datastore"):
        SpeculativeEngine(BigramModel(t), None, datastore=[1, 2, 3])
    with pytest.raises(ValueError, match="drafter 'ngram' or 'hybrid'"):
        SpeculativeEngine(BigramModel(t), BigramModel(t), datastore=ds)
    with pytest.raises(ValueError, match="drafter 'ngram' or 'hybrid'"):
        SpeculativeEngine(BigramModel(t), None, drafter="suffix", datastore=ds)
    with pytest.raises(ValueError, match=r"token id 6, outside the target's vocabulary \[0, 6\)"):
        SpeculativeEngine(BigramModel(t), None, datastore=Datastore([1, 6]))


# ---------------------------------------------------------------- the engine
def _looping_target():
    t = torch.randn(V, V, generator=torch.Generator().manual_seed(3)) * 0.5
    for a, b in ((1, 2), (2, 3), (3, 1), (0, 1), (4, 1), (5, 2)):
        t[a, b] += 2.5
    return t


def test_row_prefers_its_own_text_then_the_datastore():
    row = DatastoreRow(Datastore([0, 4, 5, 3, 0, 4, 5, 2], prior=0.0, min_prob=0.0), max_ngram=3)
    row.extend([1, 0, 4])
    assert row.propose(3) == [5, 2] and row.from_datastore == 1  # own text: "4" never seen; "0 4 5" -> 3 or 2: the smaller
    row.extend([1, 0, 4])
    assert row.propose(3) == [1, 0, 4] and row.from_datastore == 1  # own match "1 0 4" (3 tokens) wins


def test_row_sources_and_prefix_consistent_drafts():
    """propose_source names where the draft came from, and the draft for k is the prefix of
    the one for any larger k (the engine proposes k_max tokens before it chooses K)."""
    row = DatastoreRow(Datastore([0, 4, 5, 3, 0, 4, 5, 2], prior=0.0, min_prob=0.0), max_ngram=3)
    row.extend([1, 0, 4])
    assert row.propose_source(3) == ([5, 2], DATASTORE_SOURCE)
    row.extend([1, 0, 4])
    assert row.propose_source(3) == ([1, 0, 4], "ngram3")
    assert DatastoreRow(Datastore([7, 8]), max_ngram=2).propose_source(4) == ([], None)
    gen = np.random.default_rng(5)
    for _ in range(40):
        ds = Datastore(gen.integers(0, 5, 300).tolist(), min_prob=float(gen.choice([0.0, 0.3])))
        row = DatastoreRow(ds, max_ngram=int(gen.integers(1, 4)))
        row.extend(gen.integers(0, 5, int(gen.integers(1, 12))).tolist())
        longest, source = row.propose_source(24)
        for k in range(1, 25):
            assert row.propose_source(k) == (longest[:k], source)


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_equals_target_only(drafter, k):
    t = _looping_target()
    ids, mask = ragged_prompts(vocab=V, seed=4)
    ref = SpeculativeEngine(BigramModel(t), None, k=0).generate(ids, 25, temperature=0.0, attention_mask=mask)
    corpus = [tok for row in ref.generated for tok in row[::-1]] + [1, 2, 3, 1, 2, 3, 5, 4, 0]  # right and wrong
    draft = None if drafter == "ngram" else BigramModel(t * 0.7)
    eng = SpeculativeEngine(BigramModel(t), draft, k=k, adaptive_k=False, drafter=drafter,
                            datastore=Datastore(corpus, min_prob=0.0, min_context_match=3))
    out = eng.generate(ids, 25, temperature=0.0, attention_mask=mask)
    assert out.generated == ref.generated
    assert sum(s.accepted for s in out.stats) > 0


@pytest.mark.law
@pytest.mark.parametrize("temperature", [0.8, 1.3])
def test_first_three_tokens_follow_the_target_exactly(temperature):
    """The exact law of the first three tokens (chi-square at ALPHA, 216 cells): rows whose
    prompt has no repeated token, so the first step drafts 3 tokens from the datastore."""
    t = torch.randn(V, V, generator=torch.Generator().manual_seed(1)) * 1.5
    N = draws(20_000)
    prompt = [0, 2, 3]
    ids = torch.tensor(prompt).repeat(N, 1)
    ds = Datastore([2, 3, 4, 1, 5] * 4, min_prob=0.0)
    out = SpeculativeEngine(BigramModel(t), None, k=3, adaptive_k=False, datastore=ds).generate(
        ids, 4, temperature=temperature, seed=11)
    assert {s.ks[0] for s in out.stats} == {3}, "the first step drafted 3 tokens in every row"
    assert bigram_law_pvalue(out.generated, t, temperature, prompt) > ALPHA
    acc = sum(s.accepted for s in out.stats) / max(1, sum(s.drafted for s in out.stats))
    assert 0.0 < acc < 1.0


_main = run_generate  # (exit code, stdout, stderr) of generate.main(argv) in this process


def test_cli_datastore(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("def fibonacci(n):\n    if n < 2:\n        return n\n" * 3)
    used = []
    real = SpeculativeEngine.generate

    def spy(self, *a, **kw):
        used.append(self.datastore)
        return real(self, *a, **kw)

    monkeypatch.setattr(SpeculativeEngine, "generate", spy)
    rc, out, err = _main(capsys, "--prompt", "def fibonacci(n):", "--max-new-tokens", "24", "--no-progress",
                         "--rounds", "1", "--datastore", str(corpus))
    assert rc == 0, err
    assert "tokens/step" in out
    spec = [d for d in used if d is not None]
    assert spec and len({id(d) for d in spec}) == 1 and len(spec[0]) > 20  # built once, from the text
    rc, _, err = _main(capsys, "--prompt", "x", "--datastore", str(tmp_path / "missing"))
    assert rc == 2 and "--datastore" in err and "no such file" in err
    rc, _, err = _main(capsys, "--prompt", "x", "--drafter", "suffix", "--datastore", str(corpus))
    assert rc == 2 and "--drafter ngram or hybrid" in err
