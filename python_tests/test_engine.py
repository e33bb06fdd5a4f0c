"""SpeculativeEngine: exact greedy output, exact sampling law, cache bookkeeping,
adaptive K, metrics, bad inputs."""
import copy
import urllib.request

import numpy as np
import pytest
import torch

import specdec_ext
from helpers import draws
from specdec_ext import SpecDecMetrics, SpeculativeEngine
from specdec_ext.engine.adaptive_k import StepCosts
from stats_reference import ALPHA, chi_square_pvalue, sequence_counts, sequence_law
from table_models import BigramModel, ScriptedModel

V = 6


def _tables(seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * scale


# ---------------------------------------------------------------- sampling law
def _bigram_law(table, temperature, prompt, n):
    """Exact law of a BigramModel's first n tokens after ``prompt`` (flat over V^n)."""
    p = torch.softmax(table.double() / temperature, -1).numpy()
    return sequence_law(lambda contexts: p[[c[-1] for c in contexts]], prompt, n, V)


def _three_token_run(temperature, adaptive, seed=11):
    """20k rows of one prompt, k = 3, 4 new tokens (so the first step may draft all 3: the
    budget cap is max_new_tokens - 1), a correlated draft that is sometimes rejected."""
    target_t, draft_t = _tables(1), _tables(2) * 0.5 + _tables(1) * 0.5
    N, x0 = draws(20_000), 3
    ids = torch.full((N, 2), x0, dtype=torch.int64)
    out = SpeculativeEngine(BigramModel(target_t), BigramModel(draft_t), k=3, adaptive_k=adaptive).generate(
        ids, 4, temperature=temperature, seed=seed)
    return out, _bigram_law(target_t, temperature, [x0], 3)


@pytest.mark.parametrize("temperature,adaptive", [(0.7, False), (1.3, False), (1.0, "threshold"),
                                                  (0.9, "budget")])
def test_first_three_tokens_follow_the_target_exactly(temperature, adaptive):
    """The joint law of the first three generated tokens equals the target's, enumerated
    exactly (chi-square at ALPHA, 216 cells), with steps that really draft K >= 2 (deeper
    draft_probs, per-position offsets, multi-token rollback)."""
    out, law = _three_token_run(temperature, adaptive)
    first_ks = [s.ks[0] for s in out.stats]
    if adaptive is False:
        assert set(first_ks) == {3}, "the first step drafted 3 tokens in every row"
    else:
        assert sum(k >= 2 for k in first_ks) == len(first_ks), sorted(set(first_ks))
    assert chi_square_pvalue(sequence_counts(out.generated, 3, V), law) > ALPHA
    acc = sum(s.accepted for s in out.stats) / max(1, sum(s.drafted for s in out.stats))
    assert 0.0 < acc < 1.0  # the test exercised both acceptance and rejection


def test_three_token_law_detects_position_zero_draft_law(monkeypatch):
    """Power check: an engine that gives every draft position the draft law of position 0
    (a bug two-token tests cannot see, their steps draft one token) fails the same test."""
    from specdec_ext.engine import engine as engine_module

    real = engine_module.verify_phase

    def position_zero_law(logits, draft_ids, draft_probs, *a, **k):
        if draft_probs is not None:
            draft_probs = draft_probs[:, :1].expand_as(draft_probs).contiguous()
        return real(logits, draft_ids, draft_probs, *a, **k)

    monkeypatch.setattr(engine_module, "verify_phase", position_zero_law)
    out, law = _three_token_run(1.0, False)
    assert chi_square_pvalue(sequence_counts(out.generated, 3, V), law) < ALPHA


def test_sampling_law_detects_a_wrong_engine():
    """Power check: sampling the draft's tokens without verification fails the same test."""
    target_t, draft_t = _tables(1), _tables(2)
    N, x0 = draws(20_000), 3
    draft = BigramModel(draft_t)
    ids = torch.full((N, 2), x0, dtype=torch.int64)
    out = SpeculativeEngine(draft, copy.deepcopy(draft), k=3, adaptive_k=False).generate(ids, 4, temperature=1.0,
                                                                                        seed=11)
    assert chi_square_pvalue(sequence_counts(out.generated, 3, V), _bigram_law(target_t, 1.0, [x0], 3)) < ALPHA


# ---------------------------------------------------------------- bookkeeping
@pytest.mark.parametrize("k,adaptive", [(1, False), (4, False), (4, "cost"), (0, False)])
def test_caches_hold_exactly_the_committed_tokens(k, adaptive):
    """Target cache = emitted sequence minus its last token; draft cache = emitted sequence
    minus its pending tokens (1, or 2 after a fully accepted step, more after K = 0)."""
    t = _tables(4)
    target, draft = BigramModel(t), BigramModel(t * 0.9 + _tables(5) * 0.3)
    prompts = [[1, 2, 3, 4, 5], [2], [3, 1, 4]]
    ids = torch.zeros(3, 5, dtype=torch.int64)
    mask = torch.zeros(3, 5, dtype=torch.int64)
    for b, p in enumerate(prompts):
        ids[b, 5 - len(p):] = torch.tensor(p)   # left padding
        mask[b, 5 - len(p):] = 1
    eng = SpeculativeEngine(target, draft, k=k, adaptive_k=adaptive)
    out = eng.generate(ids, 17, temperature=1.0, seed=3, attention_mask=mask)
    for b, p in enumerate(prompts):
        seq = p + out.generated[b]
        assert len(out.generated[b]) == 17
        assert target.history(b) == seq[:-1]
        d = draft.history(b)
        assert d == seq[:len(d)]
        if k == 0:  # the draft never runs: it holds the prompt minus its last token
            assert len(seq) - len(d) == 17 + 1
        else:  # 1 pending token, 2 after a fully accepted step (measured: 1 or 2 for every row)
            assert 1 <= len(seq) - len(d) <= 2


def test_rows_stop_at_eos_and_max_new_tokens():
    t = _tables(6)
    target = BigramModel(t)
    eng = SpeculativeEngine(target, BigramModel(t), k=4, adaptive_k=False)
    ids = torch.tensor([[1, 2], [3, 4], [5, 0]])
    out = eng.generate(ids, 12, temperature=1.0, seed=5, eos_token_id=0)
    for b in range(3):
        g = out.generated[b]
        assert len(g) <= 12
        assert 0 not in g[:-1]                      # nothing after EOS
        assert len(g) == 12 or g[-1] == 0
        assert target.history(b) == ids[b].tolist() + g[:-1]   # cache trimmed at the stop
        # sequences are padded after a stop
        row = out.sequences[b, 2:].tolist()
        assert row[:len(g)] == g and all(x == 0 for x in row[len(g):])
    assert out.stats[0].tokens_generated == len(out.generated[0])


def test_max_new_tokens_zero_returns_the_prompt():
    t = _tables(0)
    ids = torch.tensor([[1, 2, 3]])
    out = SpeculativeEngine(BigramModel(t), BigramModel(t)).generate(ids, 0)
    assert torch.equal(out.sequences, ids) and out.generated == [[]]


def test_greedy_matches_target_only_decoding():
    t = _tables(7)
    target = BigramModel(t)
    ids = torch.tensor([[4], [2]])
    plain = SpeculativeEngine(target, BigramModel(t), k=0, adaptive_k=False).generate(ids, 15)
    for k, ad in [(1, False), (3, False), (5, "cost"), (5, "threshold")]:
        out = SpeculativeEngine(target, BigramModel(_tables(8)), k=k, adaptive_k=ad).generate(ids, 15)
        assert torch.equal(out.sequences, plain.sequences)
    # greedy by hand
    x, seq = 4, []
    for _ in range(15):
        x = int(t[x].argmax())
        seq.append(x)
    assert plain.generated[0] == seq


def test_seed_makes_runs_reproducible():
    t = _tables(9)
    eng = SpeculativeEngine(BigramModel(t), BigramModel(_tables(10)), k=3)
    ids = torch.tensor([[1, 2], [3, 4]])
    a = eng.generate(ids, 10, temperature=1.0, seed=42).sequences
    b = eng.generate(ids, 10, temperature=1.0, seed=42).sequences
    c = eng.generate(ids, 10, temperature=1.0, seed=43).sequences
    assert torch.equal(a, b) and not torch.equal(a, c)
    per_row = eng.generate(ids, 10, temperature=torch.tensor([0.0, 1.0]), seed=42)
    greedy = eng.generate(ids[:1], 10, temperature=0.0)
    assert per_row.generated[0] == greedy.generated[0]


# ---------------------------------------------------------------- adaptive K
def _ks(out):
    return out.stats[0].ks


def _unclipped_ks(out, k, max_new):
    """Row 0's K at the steps where the token budget left did not clip K below k."""
    budget = (max_new - np.cumsum([0] + out.stats[0].emitted[:-1]) - 1).tolist()
    return [kk for kk, b in zip(out.stats[0].ks, budget) if b >= k]


def test_adaptive_k_rises_with_high_acceptance_and_falls_with_low():
    t = _tables(11)
    costs = StepCosts(draft_guess=0.05, target_guess=1.0, frozen=True)
    ids = torch.tensor([[1, 2]])
    high = SpeculativeEngine(BigramModel(t), BigramModel(t), k=6, adaptive_k="cost", step_costs=costs)
    ks = _unclipped_ks(high.generate(ids, 120, temperature=1.0, seed=1), 6, 120)
    assert ks[-1] == 6 and max(ks[-5:]) == 6
    # disjoint: the draft only proposes tokens the target never emits
    t_masked = t.clone()
    t_masked[:, :3] = float("-inf")
    d_masked = t.clone()
    d_masked[:, 3:] = float("-inf")
    low = SpeculativeEngine(BigramModel(t_masked), BigramModel(d_masked), k=6, adaptive_k="cost", step_costs=costs)
    out = low.generate(ids, 60, temperature=1.0, seed=1)
    ks = _ks(out)
    assert out.stats[0].accepted == 0
    assert ks[-10:].count(0) >= 7       # drafting turned off, apart from probes
    thr = SpeculativeEngine(BigramModel(t_masked), BigramModel(d_masked), k=6, adaptive_k="threshold")
    assert _unclipped_ks(thr.generate(ids, 40, temperature=1.0, seed=1), 2, 40)[-1] == 2


def test_adaptive_k_follows_a_changing_draft():
    t = _tables(12)
    t_tgt, bad = t.clone(), t.clone()
    t_tgt[:, 3:] = float("-inf")
    bad[:, :3] = float("-inf")
    # the draft agrees with the target up to position 80, proposes only tokens the target
    # never emits from 80 to 200, and agrees again after 200
    draft = ScriptedModel([(80, t_tgt), (200, bad), (10**9, t_tgt)])
    costs = StepCosts(draft_guess=0.05, target_guess=1.0, frozen=True)
    eng = SpeculativeEngine(BigramModel(t_tgt), draft, k=5, adaptive_k="cost", step_costs=costs)
    out = eng.generate(torch.tensor([[3, 4]]), 320, temperature=1.0, seed=2)
    ks = _ks(out)
    # sequence position at the start of each step (prompt: 2 tokens)
    positions = (2 + np.cumsum([0] + out.stats[0].emitted[:-1])).tolist()
    phase = lambda lo, hi: [k for k, x in zip(ks, positions) if lo + 12 <= x < hi]  # noqa: E731
    assert min(phase(0, 80)) == 5                 # rose (and stayed) while the draft was good
    assert phase(80, 200)[-20:].count(0) >= 15    # fell while it was bad (K = 1 probes aside)
    # and came back (to 5, or the budget left: a step drafts at most max_new_tokens - emitted - 1)
    left = [320 - (x - 2) - 1 for x in positions]
    assert phase(200, 10**9)[-5:] == [min(5, n) for k, x, n in zip(ks, positions, left) if 212 <= x][-5:]


# ---------------------------------------------------------------- metrics
def test_metrics_scrape_matches_stats():
    t = _tables(13)
    m = SpecDecMetrics(engine="e1")
    eng = SpeculativeEngine(BigramModel(t), BigramModel(t * 0.8), k=3, adaptive_k=False, metrics=m)
    out = eng.generate(torch.tensor([[1, 2], [3, 4], [0, 5]]), 25, temperature=1.0, seed=4)
    server = m.serve(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()

    def value(name, extra=""):
        for line in body.splitlines():
            if line.startswith(name + '{engine="e1"' + extra + "}"):
                return float(line.split()[-1])
        raise AssertionError(f"{name} missing")

    assert value("speculative_tokens_generated_total") == sum(s.tokens_generated for s in out.stats)
    assert value("speculative_tokens_drafted_total") == sum(s.drafted for s in out.stats)
    assert value("speculative_tokens_accepted_total") == sum(s.accepted for s in out.stats)
    per_pos = sum(value("speculative_tokens_accepted_per_position_total", f',position="{i}"') for i in range(3)
                  if f'position="{i}"' in body)
    assert per_pos == sum(s.accepted for s in out.stats)
    last = [s.ks[-1] for s in out.stats if s.steps == out.steps]  # the rows active in the run's last step
    assert value("speculative_current_k") == max(last)  # the last step's K (clipped to the budget)
    assert "speculative_draft_latency_seconds_bucket" in body and "speculative_verify_latency_seconds_count" in body


def test_two_engines_share_a_registry_without_colliding():
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    t = _tables(14)
    a = SpeculativeEngine(BigramModel(t), BigramModel(t), k=2, metrics=SpecDecMetrics(reg, engine="a"))
    b = SpeculativeEngine(BigramModel(t), BigramModel(t), k=2, metrics=SpecDecMetrics(reg, engine="b"))
    oa = a.generate(torch.tensor([[1]]), 5, seed=1)
    ob = b.generate(torch.tensor([[1]]), 7, seed=1)
    ga = reg.get_sample_value("speculative_tokens_generated_total", {"engine": "a"})
    gb = reg.get_sample_value("speculative_tokens_generated_total", {"engine": "b"})
    assert (ga, gb) == (oa.stats[0].tokens_generated, ob.stats[0].tokens_generated) == (5, 7)


# ---------------------------------------------------------------- bad inputs
def test_bad_inputs():
    t = _tables(15)
    eng = SpeculativeEngine(BigramModel(t), BigramModel(t), k=2)
    with pytest.raises(ValueError, match="empty"):
        eng.generate(torch.empty(1, 0, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate(torch.tensor([[1, 2]]), 3, attention_mask=torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="temperature must be 0 \\(greedy\\) or positive"):
        eng.generate(torch.tensor([[1]]), 3, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens must be an int in \\[0, inf\\]"):
        eng.generate(torch.tensor([[1]]), -1)
    with pytest.raises(ValueError, match="outside \\[0, 6\\)"):
        eng.generate(torch.tensor([[7]]), 3)
    with pytest.raises(ValueError, match="k must be an int in \\[0, inf\\]"):
        SpeculativeEngine(BigramModel(t), BigramModel(t), k=-1)
    with pytest.raises(ValueError, match="draft vocabulary \\(7\\) differs"):
        SpeculativeEngine(BigramModel(t), BigramModel(torch.zeros(7, 7)))
    with pytest.raises(ValueError, match="put both models on one device"):
        SpeculativeEngine(BigramModel(t), BigramModel(t, device="meta"))
    small = BigramModel(t)
    small.max_positions = 10
    with pytest.raises(specdec_ext.CacheFullError, match="target model: .* 11 positions exceed its capacity of 10"):
        SpeculativeEngine(small, BigramModel(t), k=2).generate(torch.tensor([[1, 2, 3]]), 9)
    # adaptive_k's bad values: test_engine_robustness.test_bad_adaptive_k
