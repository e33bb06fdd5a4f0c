"""The batch-wide verification budget (engine/budget.py): the plan is the brute-force optimum
on synthetic cost curves, reduces to today's adaptive K at B = 1, and in the engine keeps
greedy output equal to target-only greedy and the sampled law exact."""
import itertools
import random

import pytest
import torch

from specdec_ext import SpeculativeEngine
from specdec_ext.engine.adaptive_k import CostModelPolicy, StepCosts, expected_tokens
from specdec_ext.engine.budget import BudgetPolicy, padded_cost, plan_budget, ragged_cost
from table_models import BigramModel


def _costs(a, b, c_draft):
    """A StepCosts whose fitted curve is exactly c_target(S) = a + b * S."""
    costs = StepCosts(draft_guess=c_draft, frozen=False)
    for s in (1, 2, 3, 4):
        costs.add_target(s, a + b * s)
    costs.frozen, costs.draft_t = True, c_draft
    return costs


def _brute(alphas, caps, cost):
    best = -1.0
    rows = sorted(alphas)
    for ks in itertools.product(*[range(caps[r] + 1) for r in rows]):
        rate = sum(expected_tokens(alphas[r], k) for r, k in zip(rows, ks)) / cost(max(ks), sum(k + 1 for k in ks))
        best = max(best, rate)
    return best


@pytest.mark.parametrize("shape", ["padded", "ragged"])
def test_plan_is_the_brute_force_optimum(shape):
    rng = random.Random(3)
    for _ in range(60):
        B = rng.randint(1, 3)
        alphas = {r: rng.choice([0.0, 1.0, rng.random()]) for r in range(B)}
        caps = {r: rng.randint(0, 4) for r in range(B)}
        costs = _costs(rng.uniform(0.1, 1.0), rng.uniform(0.0, 0.5), rng.uniform(0.0, 0.3))
        cost = (padded_cost if shape == "padded" else ragged_cost)(costs, B)
        ks, rate = plan_budget(alphas, caps, cost)
        got = sum(expected_tokens(alphas[r], ks[r]) for r in alphas) / cost(max(ks.values()),
                                                                             sum(k + 1 for k in ks.values()))
        assert all(0 <= ks[r] <= caps[r] for r in alphas)
        assert got == pytest.approx(rate, rel=1e-12)
        assert rate == pytest.approx(_brute(alphas, caps, cost), rel=1e-9), (alphas, caps, ks)


def test_ragged_plan_truncates_unlikely_rows():
    """A forward that scores only the admitted slots: a row that rejects everything drafts
    nothing while a row that accepts everything drafts deep; padded, both take the deep K."""
    costs = _costs(0.2, 0.05, 0.0)
    alphas, caps = {0: 0.95, 1: 0.05}, {0: 6, 1: 6}
    ks, _ = plan_budget(alphas, caps, ragged_cost(costs, 2))
    assert ks[1] == 0 and ks[0] >= 3
    ks, _ = plan_budget(alphas, caps, padded_cost(costs, 2))
    assert ks[0] == ks[1] >= 3


def test_b1_picks_todays_adaptive_k():
    """At B = 1 the budget's K is CostModelPolicy's for the same alpha and costs (its probe too)."""
    rng = random.Random(5)
    for _ in range(300):
        k_max = rng.randint(0, 8)
        costs = _costs(rng.uniform(0.05, 1.0), rng.uniform(0.0, 0.4), rng.choice([0.0, rng.uniform(0.0, 0.5)]))
        alpha = rng.choice([0.0, 1.0, rng.random()])
        today, budget = CostModelPolicy(k_max), BudgetPolicy(k_max)
        for _ in range(9):  # 9 steps: the K = 1 probe at step 8 when drafting does not pay
            assert budget.choose({0: alpha}, costs, {0: k_max}) == {0: today.choose([alpha], costs)}


def _tables(seed, V=6, scale=1.5):
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_equals_target_only_greedy():
    t = _tables(7)
    ids = torch.tensor([[4], [2], [1], [0]])
    plain = SpeculativeEngine(BigramModel(t), BigramModel(t), k=0, adaptive_k=False).generate(ids, 15)
    out = SpeculativeEngine(BigramModel(t), BigramModel(_tables(8)), k=5, adaptive_k="budget").generate(ids, 15)
    assert torch.equal(out.sequences, plain.sequences)


def test_budget_gives_every_row_the_steps_k():
    """Padded steps: a T > 0 row whose own policy would draft little gets the batch's K."""
    t = _tables(1)
    ids = torch.tensor([[3], [2]])
    out = SpeculativeEngine(BigramModel(t), BigramModel(_tables(2)), k=4, adaptive_k="budget").generate(
        ids, 12, temperature=torch.tensor([1.0, 0.0]), seed=2)
    for s0, s1 in zip(out.stats[0].ks, out.stats[1].ks):
        assert s0 == s1 or min(s0, s1) < 4  # equal unless a row's token budget capped it


def test_k_never_exceeds_k_max_or_the_row_cap():
    """Whatever the estimates, caps (above and below k_max) and curve, every row's K is in
    [0, min(k_max, cap)], the K = 1 probe included; cheap drafts and alphas near 1 push the
    plan to the limit, so an off-by-one in either bound shows."""
    rng = random.Random(11)
    reached = 0
    for _ in range(300):
        k_max, B = rng.randint(0, 6), rng.randint(1, 4)
        alphas = {r: rng.choice([1.0, 0.99, rng.random()]) for r in range(B)}
        caps = {r: rng.randint(0, 10) for r in range(B)}
        costs = _costs(rng.uniform(0.5, 1.0), rng.uniform(0.0, 0.01), 0.0)
        policy = BudgetPolicy(k_max, ragged=rng.random() < 0.5)
        for _ in range(9):
            ks = policy.choose(alphas, costs, caps)
            assert set(ks) == set(alphas)
            assert all(0 <= ks[r] <= min(k_max, caps[r]) for r in ks), (k_max, caps, ks)
            reached += any(ks[r] == min(k_max, caps[r]) > 0 for r in ks)
    assert reached > 100  # the bound is reached, not only respected


def test_engine_steps_draft_at_most_k():
    """In the engine (draft == target, so every draft is accepted; a flat target curve and free
    drafts, fixed rather than measured so the plan does not follow the machine's load, so the
    plan goes deep): every step's K is <= k, and K = k is reached."""
    t = _tables(3)
    ids = torch.tensor([[1], [4]])
    k = 3
    out = SpeculativeEngine(BigramModel(t), BigramModel(t), k=k, adaptive_k="budget",
                            step_costs=_costs(1.0, 0.0, 0.0)).generate(ids, 24)
    ks = [x for s in out.stats for x in s.ks]
    assert max(ks) == k and min(ks) >= 0, ks
