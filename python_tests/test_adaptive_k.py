"""The adaptive-K building blocks: Leviathan's formulas, the acceptance estimate, the
online cost fit and the policies' choices."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_ext.engine.adaptive_k import (MODEL_SOURCE, AcceptanceEstimator, CostModelPolicy, PerRowK, StepCosts,
                                           TextDraftCosts, ThresholdPolicy, draft_source, expected_tokens, make_policy,
                                           predicted_speedup, row_costs)


def test_expected_tokens_and_speedup_closed_form():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    # alpha = 0.8, K = 4, c = 0.1: (1 - 0.8^5) / (0.2 * 1.4)
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.4))
    # a 5-token target step costing 1.2x a 1-token one: (1 - 0.8^5) / (0.2 * (0.4 + 1.2))
    assert predicted_speedup(0.8, 4, 0.1, target_ratio=1.2) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.6))


def test_acceptance_estimate_moves_towards_outcomes():
    est = AcceptanceEstimator(2, rate=0.2, prior=0.5)
    for _ in range(20):
        est.update(0, 4, 4)       # always fully accepted
        est.update(1, 4, 0)       # always rejected at once
    assert est.alpha(0) > 0.99 and est.alpha(1) < 0.02
    est.update(0, 0, 0)           # K = 0 steps carry no evidence
    assert est.alpha(0) > 0.99


def test_estimates_are_kept_per_draft_source():
    """A one-token prompt-lookup match that always fails and a three-token one that always
    passes, in one row: each source keeps its own estimate; sources never updated (and the
    row's sourceless estimate) stay at the prior."""
    est = AcceptanceEstimator(1, rate=0.2, prior=0.5)
    for _ in range(20):
        est.update(0, 4, 4, draft_source(3))
        est.update(0, 4, 0, draft_source(1))
    assert est.alpha(0, "ngram3") > 0.99 and est.alpha(0, "ngram1") < 0.02
    assert est.alpha(0, MODEL_SOURCE) == 0.5 and est.alpha(0) == 0.5


def test_text_rows_pay_no_draft_cost():
    """model_rows: only rows drafting with the draft model pay its steps (row_costs); a text
    row with the same estimate takes the K of free drafts; model_rows=None: every row pays."""
    costs = StepCosts(draft_guess=0.5, target_guess=1.0, frozen=True, target_slope=0.02)
    free = max(range(9), key=lambda k: expected_tokens(0.7, k) / (1 + 0.02 * k))
    paid = max(range(9), key=lambda k: expected_tokens(0.7, k) / (0.5 * k + 1 + 0.02 * k))
    assert free > paid
    ks = PerRowK("cost", 8, 2).choose({0: 0.7, 1: 0.7}, costs, None, model_rows=frozenset({1}))
    assert ks == {0: free, 1: paid}
    assert PerRowK("cost", 8, 2).choose({0: 0.7, 1: 0.7}, costs) == {0: paid, 1: paid}
    # shared (greedy) rows: one K; the draft cost is paid when one of them drafts with the model
    shared = PerRowK("cost", 8, 2, frozenset({0, 1}))
    assert shared.choose({0: 0.7, 1: 0.7}, costs, None, model_rows=frozenset()) == {0: free, 1: free}
    assert shared.choose({0: 0.7, 1: 0.7}, costs, None, model_rows=frozenset({1})) == {0: paid, 1: paid}
    assert isinstance(row_costs(costs, [0], frozenset({1})), TextDraftCosts)
    assert row_costs(costs, [0], None) is costs


def test_cost_fit_recovers_a_linear_target_cost():
    c = StepCosts()
    for s in (1, 2, 3, 5, 7) * 10:
        c.add_target(s, 1.0 + 0.25 * s)
        c.add_draft(0.3)
    assert c.target(1) == pytest.approx(1.25, rel=1e-6)
    assert c.target(9) == pytest.approx(3.25, rel=1e-6)
    assert c.draft() == pytest.approx(0.3)
    frozen = StepCosts(draft_guess=0.1, target_guess=2.0, frozen=True)
    frozen.add_target(3, 99.0)
    frozen.add_draft(99.0)
    assert (frozen.draft(), frozen.target(3)) == (0.1, 2.0)


def test_cost_policy_picks_the_rate_maximising_k():
    costs = StepCosts(draft_guess=0.1, target_guess=1.0, frozen=True)
    pol = CostModelPolicy(k_max=8)
    for alpha in (0.3, 0.6, 0.8, 0.95):
        best = max(range(9), key=lambda k: expected_tokens(alpha, k) / (0.1 * k + 1.0))
        assert pol.choose([alpha], costs) == best
    # drafting that cannot pay: K = 0, with a K = 1 probe every 8th step
    expensive = StepCosts(draft_guess=2.0, target_guess=1.0, frozen=True)
    ks = [pol.choose([0.5], expensive) for _ in range(16)]
    assert ks.count(0) == 14 and ks.count(1) == 2


def test_frozen_width_cost_keeps_k_small_where_drafts_fail_and_long_where_they_pass():
    """The model-free drafters' frozen cost (engine.TEXT_DRAFT_WIDTH_COST): a pass over S
    tokens costs 1 + slope * (S - 1). With free drafts and a flat cost (slope 0) any alpha > 0
    takes k_max; with the slope, rarely accepted drafts (T > 0) get K <= 2, repetitive text
    (alpha 0.9+) k_max, and a batch of 8 (slope x 8) a shorter K than one row."""
    from specdec_ext.engine.engine import TEXT_DRAFT_WIDTH_COST

    def costs(rows):
        return StepCosts(draft_guess=0.0, target_guess=1.0, frozen=True, target_slope=TEXT_DRAFT_WIDTH_COST * rows)

    assert costs(1).target(17) == pytest.approx(1 + 16 * TEXT_DRAFT_WIDTH_COST)
    flat = StepCosts(draft_guess=0.0, target_guess=1.0, frozen=True)
    assert CostModelPolicy(16).choose([0.6], flat) == 16
    assert 1 <= CostModelPolicy(16).choose([0.2], costs(1)) <= 2
    assert CostModelPolicy(16).choose([0.95], costs(1)) == 16
    assert CostModelPolicy(16).choose([0.8], costs(8)) < CostModelPolicy(16).choose([0.8], costs(1))
    for alpha in (0.2, 0.5, 0.8):
        best = max(range(17), key=lambda k: expected_tokens(alpha, k) / (1 + TEXT_DRAFT_WIDTH_COST * k))
        assert CostModelPolicy(16).choose([alpha], costs(1)) == best
    with pytest.raises(ValueError, match="target_slope must be >= 0"):
        StepCosts(target_slope=-0.1)
    measured = StepCosts(target_slope=0.5)
    measured.add_target(1, 2.0)
    assert measured.target(1) == pytest.approx(2.0)  # a measurement replaces the guess


def test_threshold_policy_has_hysteresis():
    pol = ThresholdPolicy(k_high=6)
    seq = [pol.choose([a], None) for a in (0.9, 0.3, 0.45, 0.49, 0.5, 0.45)]
    assert seq == [6, 2, 2, 2, 6, 6]
    with pytest.raises(ValueError, match="adaptive policy"):
        make_policy("random", 4)


def test_step_costs_freeze_after_warm_up():
    c = StepCosts(freeze_after=3)
    for _ in range(3):
        c.add_target(1, 1.0)
        c.add_draft(0.2)
    assert c.frozen
    before = (c.target(1), c.draft())
    c.add_target(1, 100.0)
    c.add_draft(50.0)
    assert (c.target(1), c.draft()) == before


def test_shared_rows_take_one_k_own_rows_their_own():
    """Rows whose text does not depend on K share one choice (the joint rate of all their
    estimates) and get the step's K; the other rows choose alone."""
    costs = StepCosts(draft_guess=0.2, target_guess=1.0, frozen=True)
    alphas = {0: 0.95, 1: 0.05, 2: 0.05}
    alone = PerRowK("cost", 4, 3).choose(alphas, costs)
    assert alone[0] == 4 and alone[1] == alone[2] == 0
    mixed = PerRowK("cost", 4, 3, shared_rows={0, 1}).choose(alphas, costs)
    assert mixed[0] == mixed[1] >= 1 and mixed[2] == 0     # row 1 tests the drafts made for row 0
    lifted = PerRowK("cost", 4, 3, shared_rows={1, 2}).choose(alphas, costs)
    assert lifted == {0: 4, 1: 4, 2: 4}                   # an own row's larger K is the step's K
    assert PerRowK("fixed", 3, 2, shared_rows={0}).choose({0: 0.1, 1: 0.9}, costs) == {0: 3, 1: 3}
    # caps (token budgets) apply before the lift: an own row capped to 0 lifts nobody
    capped = PerRowK("cost", 4, 3, shared_rows={1, 2}).choose(alphas, costs, caps={0: 0, 1: 4, 2: 1})
    assert capped == {0: 0, 1: 0, 2: 0}
    assert PerRowK("fixed", 4, 2, shared_rows={0, 1}).choose({0: 0.5, 1: 0.5}, costs, caps={0: 4, 1: 2}) == \
        {0: 4, 1: 2}


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 6), st.booleans()), min_size=1, max_size=8),
       kind=st.sampled_from(["cost", "threshold", "fixed"]), k=st.integers(0, 6), draft=st.floats(0.0, 3.0))
def test_per_row_k_respects_caps_and_shares_one_k(rows, kind, k, draft):
    """Any estimates, caps and shared set: every K lies in [0, min(k, cap)]; an own row
    gets its policy's choice (capped), exactly as alone; the shared rows get one K, the
    largest of the shared choice and the own rows' capped choices, each capped."""
    alphas = {b: a for b, (a, _, _) in enumerate(rows)}
    caps = {b: c for b, (_, c, _) in enumerate(rows)}
    shared = {b for b, (_, _, sh) in enumerate(rows) if sh}
    costs = StepCosts(draft_guess=draft, target_guess=1.0, frozen=True)
    got = PerRowK(kind, k, len(rows), shared).choose(alphas, costs, caps)
    assert set(got) == set(alphas)
    assert all(0 <= got[b] <= min(k, caps[b]) for b in got)
    own = {b: min(make_policy(kind, k).choose([alphas[b]], costs), caps[b]) for b in alphas if b not in shared}
    assert {b: got[b] for b in own} == own
    if shared:
        step = max([make_policy(kind, k).choose([alphas[b] for b in sorted(shared)], costs)] + list(own.values()))
        assert {b: got[b] for b in shared} == {b: min(step, caps[b]) for b in shared}
