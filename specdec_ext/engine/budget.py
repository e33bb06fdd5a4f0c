"""A batch-wide verification budget: how many drafts each row verifies in one step.

Every (row, depth j) draft slot is scored by its survival probability, the chance that the
row's first j drafts are all accepted: the running product of the row's per-position
acceptance estimates (alpha_r^j with :class:`.adaptive_k.AcceptanceEstimator`'s one estimate
per row), so a row verifying K drafts emits E = sum_{j=0..K} alpha^j tokens in expectation
(:func:`.adaptive_k.expected_tokens`). A step costs ``cost(depth, tokens)`` seconds: ``depth``
draft steps (the deepest admitted slot) and a target forward over ``tokens`` positions. The
plan admits the set of slots that maximises expected emitted tokens per second
(:func:`plan_budget`, exact: for every depth D and count n the best n slots of depth <= D are
the n most likely ones, vLLM's best-first admission).

The step-cost curve is the run's :class:`.adaptive_k.StepCosts` (c_target(S) = a + b*S over
the S tokens per row of the forward, fitted to every step's measured time, so it is refreshed
as the run goes; frozen at the models' parameter ratio when the run is seeded, as adaptive K).
The engine's chain step pads every row to the step's deepest K (the target forward is
[B, K + 1]), so a step's cost depends on its deepest K only (:func:`padded_cost`) and the plan
gives every row min(D, its cap) drafts for the best D: the slots below D are free. A forward
that scores only the admitted slots (:func:`ragged_cost`) would make the plan truncate rows
whose drafts are unlikely.

At B = 1 the plan is today's adaptive K (:class:`.adaptive_k.CostModelPolicy`, the same rate,
the same tie rule and the same K = 1 probe while drafting does not pay).

Exactness. K is chosen from past information only (acceptance estimates of earlier steps and
measured costs), before the step's draws, so the emitted tokens of every row follow the target
law exactly for any K the plan picks. What a batch-wide plan gives up is per-row
reproducibility: a row sampled in ``verify_mode="exact"`` at T > 0 gets a K that depends on
the other rows' estimates, and its text depends on K, so with per-row seeds its text can
change with the batch it runs in (``adaptive_k="cost"`` keeps that property: a row's K
from its own history). Greedy rows and coupled mode, whose text does not depend on K, lose
nothing.
"""
from __future__ import annotations

from typing import AbstractSet, Callable, Dict, Optional, Tuple

from .adaptive_k import StepCosts, row_costs

__all__ = ["BudgetPolicy", "padded_cost", "plan_budget", "ragged_cost"]

Cost = Callable[[int, int], float]  # (depth: draft steps, tokens the target forward scores) -> seconds


def padded_cost(costs: StepCosts, rows: int) -> Cost:
    """The engine's chain step: ``depth`` draft steps and a [rows, depth + 1] target forward
    (every row padded to the deepest K): depth * c_draft + c_target(depth + 1)."""
    return lambda depth, tokens: depth * costs.draft() + costs.target(depth + 1)


def ragged_cost(costs: StepCosts, rows: int) -> Cost:
    """A forward that scores only the admitted slots (``tokens`` over ``rows`` rows): depth *
    c_draft + c_target(tokens / rows), c_target's per-row curve at the mean width."""
    return lambda depth, tokens: depth * costs.draft() + costs.target(tokens / max(rows, 1))


def plan_budget(alphas: Dict[int, float], caps: Dict[int, int], cost: Cost) -> Tuple[Dict[int, int], float]:
    """({row: K}, expected tokens per second) maximising sum_r E(alpha_r, K_r) / cost(max K_r,
    sum_r (K_r + 1)) over K_r in [0, caps[r]] (alphas {row: estimate in [0, 1]}). Exact: for
    every depth D and count n, the best n slots of depth <= D are the n of highest survival
    alpha_r^j (ties: shallower, then lower row); rates are compared with a 1e-9 relative margin
    so that ties go to the shallower plan, as :class:`.adaptive_k.CostModelPolicy` does."""
    rows = sorted(alphas)
    if not rows:
        return {}, 0.0
    best: Tuple[float, Dict[int, int]] = (len(rows) / cost(0, len(rows)), {r: 0 for r in rows})
    for depth in range(1, max(caps[r] for r in rows) + 1):
        slots = []  # (survival, j, row) of every slot of depth <= D
        for r in rows:
            s = 1.0
            for j in range(1, min(depth, caps[r]) + 1):
                s *= alphas[r]
                slots.append((-s, j, r))
        slots.sort()
        ks = {r: 0 for r in rows}
        tokens, n = float(len(rows)), len(rows)
        for neg_s, j, r in slots:
            ks[r] = max(ks[r], j)
            tokens -= neg_s
            n += 1
            rate = tokens / cost(depth, n)
            if rate > best[0] * (1 + 1e-9):
                best = (rate, dict(ks))
    return best[1], best[0]


class BudgetPolicy:
    """Chooses every active row's K from one plan (:func:`plan_budget`) over all of them.
    ``ragged``: plan for a forward that scores only the admitted slots (default: the engine's
    padded chain step). While the plan drafts nothing, a K = 1 probe runs every
    ``probe_every`` steps so the estimates can recover (CostModelPolicy's rule)."""

    def __init__(self, k_max: int, probe_every: int = 8, ragged: bool = False):
        self.k_max, self.probe_every, self.ragged = k_max, probe_every, ragged
        self._zero_steps = 0
        self.last_rate: Optional[float] = None  # the chosen plan's expected tokens per second

    def choose(self, alphas: Dict[int, float], costs: StepCosts,
               caps: Optional[Dict[int, int]] = None,
               model_rows: Optional[AbstractSet[int]] = None) -> Dict[int, int]:
        """alphas {row: estimate} of the active rows -> {row: K in [0, min(k_max, cap)]};
        model_rows as for :meth:`.adaptive_k.PerRowK.choose` (a step pays draft-model steps
        when one of its rows drafts with the model)."""
        caps = {r: min(self.k_max, self.k_max if caps is None else caps[r]) for r in alphas}
        costs = row_costs(costs, alphas, model_rows)
        cost = (ragged_cost if self.ragged else padded_cost)(costs, len(alphas))
        ks, self.last_rate = plan_budget(alphas, caps, cost)
        if ks and max(ks.values()) == 0 and self.k_max > 0:
            self._zero_steps += 1
            if self._zero_steps % self.probe_every == 0:
                return {r: min(1, caps[r]) for r in ks}
        else:
            self._zero_steps = 0
        return ks

