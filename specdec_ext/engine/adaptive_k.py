"""Choosing K, the number of drafted tokens per step.

Leviathan et al.: with per-token acceptance rate alpha, K drafts give in expectation
E[tokens] = (1 - alpha^(K+1)) / (1 - alpha) tokens per target step, for a step time of
K * c_draft + c_target(K+1). :class:`CostModelPolicy` estimates alpha per request online
and the two costs from measured step times, and picks the K in [0, k_max] that
maximises expected tokens per second (K = 0: plain decoding, when drafting does not
pay). :class:`ThresholdPolicy` is the simple rule (alpha below 40% -> K = 2, back up when
it recovers); :class:`FixedK` never changes.

The engine chooses K per row (:class:`PerRowK`). A row sampled exactly at T > 0 runs its
own policy on its own acceptance estimate, as if it were decoded alone, so its text (which
depends on K at T > 0) and statistics depend only on its own history. Rows whose text
does not depend on K (greedy rows, and every row in coupled mode) share one policy over
all their estimates: the step is one batched forward whatever K each row tests, so they
test every draft the step makes (the largest K chosen). The step drafts to the largest K
and verify tests each row's K (``num_drafts``).
"""
from __future__ import annotations

from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target step] = (1 - alpha^(K+1)) / (1 - alpha) (K + 1 when alpha = 1)."""
    if alpha >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, cost_ratio: float, target_ratio: float = 1.0) -> float:
    """Leviathan's speedup over plain decoding, c = draft step / target step.

    ``target_ratio``: the cost of the step's target part (the (K+1)-token forward and
    what a plain step spends around it) over a plain decoding step. Leviathan's formula
    takes it as 1 (true where a forward is bound by reading the weights, as on a GPU at
    small batch); a measured value gives the prediction for hardware where it is not.
    """
    return expected_tokens(alpha, k) / (k * cost_ratio + target_ratio)


class AcceptanceEstimator:
    """Online per-request estimate of alpha from the outcomes of tested drafts, one estimate
    per (row, draft source).

    A step with K drafts and n accepted tested n + 1 drafts (n acceptances, then one
    rejection) or, if n = K, K drafts (all accepted); later drafts were never tested. Each
    tested draft moves the estimate by ``rate`` towards its outcome (an exponential moving
    average over the last ~1/rate tested drafts), so the estimate follows a changing
    acceptance rate within a few steps.

    ``source`` names where a step's drafts came from (None: one estimate for the row). Drafts
    of different sources are accepted at very different rates: a one-token prompt-lookup match
    is rarely right, a three-token match inside a loop the text repeats nearly always, the draft
    model in between. Kept apart, each source's estimate predicts its own next draft, so K can
    follow the kind of draft a step has (the engine's sources: :func:`draft_source`).
    """

    def __init__(self, num_rows: int, rate: float = 0.15, prior: float = 0.5):
        # num_rows: kept for the callers; estimates are made on a row's first update
        self.rate, self.prior = rate, prior
        self._alpha: Dict[Tuple[int, Optional[str]], float] = {}  # (row, source) -> alpha; absent: the prior

    def update(self, row: int, k: int, accepted: int, source: Optional[str] = None) -> None:
        a = self.alpha(row, source)
        for _ in range(accepted):
            a += self.rate * (1.0 - a)
        if accepted < k:
            a -= self.rate * a
        self._alpha[(row, source)] = a

    def alpha(self, row: int, source: Optional[str] = None) -> float:
        return self._alpha.get((row, source), self.prior)


def draft_source(match_length: int) -> str:
    """The source name of a prompt-lookup draft whose matched suffix is ``match_length`` tokens
    long (:meth:`.ngram.NgramIndex.propose_match`); see :class:`AcceptanceEstimator`."""
    return f"ngram{match_length}"


#: The source name of drafts the draft model proposed (see :class:`AcceptanceEstimator`).
MODEL_SOURCE = "model"


class StepCosts:
    """Online step-time model: c_draft (seconds per draft step) and c_target(S) = a + b*S
    (seconds for a target forward over S tokens per row), fitted by decayed least squares."""

    def __init__(self, decay: float = 0.9, draft_guess: float = 0.1, target_guess: float = 1.0,
                 frozen: bool = False, freeze_after: Optional[int] = None, target_slope: float = 0.0):
        """frozen=True: keep the guesses (a known cost ratio), ignore measurements.
        freeze_after=N: stop learning once N target steps were measured (after warm-up), so
        K choices do not swing with timing noise for the rest of the run.
        target_slope: the guessed extra cost of each token per row past the first, as a share
        of ``target_guess``: c_target(S) = target_guess * (1 + target_slope * (S - 1)) until
        a measurement replaces it (0: a pass costs the same whatever S, Leviathan's model)."""
        if not target_slope >= 0.0:
            raise ValueError(f"target_slope must be >= 0, got {target_slope!r}")
        self.decay, self.frozen, self.freeze_after = decay, frozen, freeze_after
        self._slope_guess = float(target_slope)
        self.draft_t, self.draft_w = draft_guess, 0.0
        # sums for the weighted linear fit t = a + b * S
        self._w = self._s = self._t = self._ss = self._st = 0.0
        self._n = 0  # target steps measured
        self._guess = target_guess

    def add_draft(self, seconds_per_step: float) -> None:
        if self.frozen:
            return
        self.draft_w = self.decay * self.draft_w + 1.0
        self.draft_t += (seconds_per_step - self.draft_t) / self.draft_w

    def add_target(self, tokens: int, seconds: float) -> None:
        if self.frozen:
            return
        d = self.decay
        self._w = d * self._w + 1.0
        self._s = d * self._s + tokens
        self._t = d * self._t + seconds
        self._ss = d * self._ss + tokens * tokens
        self._st = d * self._st + tokens * seconds
        self._n += 1
        if self.freeze_after is not None and self._n >= self.freeze_after:
            self.frozen = True

    def target(self, tokens: int) -> float:
        if self._w == 0.0:
            return self._guess * (1.0 + self._slope_guess * (tokens - 1))
        mean_s, mean_t = self._s / self._w, self._t / self._w
        var = self._ss / self._w - mean_s * mean_s
        slope = (self._st / self._w - mean_s * mean_t) / var if var > 1e-9 else 0.0
        slope = max(slope, 0.0)  # a forward never gets cheaper with more tokens
        return max(mean_t + slope * (tokens - mean_s), 1e-9)

    def draft(self) -> float:
        return self.draft_t


def hinted_costs(target_hint: Optional[float], draft_hint: Optional[float],
                 target_slope: float = 0.0) -> Optional["StepCosts"]:
    """A frozen cost model from the models' step-cost hints (parameter counts): c = draft /
    target (``target_slope``: as for :class:`StepCosts`). Deterministic, so a seeded run makes
    the same K decisions every time; None when either hint is unknown."""
    if not target_hint or not draft_hint or target_hint <= 0 or draft_hint <= 0:
        return None
    return StepCosts(draft_guess=draft_hint / target_hint, target_guess=1.0, frozen=True, target_slope=target_slope)


class TextDraftCosts:
    """The view of a :class:`StepCosts` for drafts taken from the text (prompt lookup, a
    suffix index, a datastore): they cost no draft-model step, the target pass costs the same."""

    def __init__(self, costs: StepCosts):
        self.costs = costs

    def draft(self) -> float:
        return 0.0

    def target(self, tokens: int) -> float:
        return self.costs.target(tokens)


def row_costs(costs: StepCosts, rows, model_rows: Optional[AbstractSet[int]]):
    """The costs a choice for ``rows`` sees: ``costs`` when one of them drafts with the draft
    model (``model_rows`` None: every row does), else its :class:`TextDraftCosts` view."""
    if model_rows is None or any(b in model_rows for b in rows):
        return costs
    return TextDraftCosts(costs)


class FixedK:
    """Always the same K."""

    def __init__(self, k: int):
        self.k = k

    def choose(self, alphas: Sequence[float], costs: StepCosts) -> int:
        return self.k


class CostModelPolicy:
    """K maximising sum over active requests of E[tokens](alpha_r, K) / (K c_d + c_t(K+1)).

    While drafting does not pay (K = 0), a K = 1 probe runs every ``probe_every`` steps so
    the acceptance estimates can recover.
    """

    def __init__(self, k_max: int, probe_every: int = 8):
        self.k_max, self.probe_every = k_max, probe_every
        self._zero_steps = 0

    def choose(self, alphas: Sequence[float], costs: StepCosts) -> int:
        best_k, best_rate = 0, -1.0
        for k in range(self.k_max + 1):
            rate = sum(expected_tokens(a, k) for a in alphas) / (k * costs.draft() + costs.target(k + 1))
            if rate > best_rate * (1 + 1e-9):
                best_k, best_rate = k, rate
        if best_k == 0 and self.k_max > 0:
            self._zero_steps += 1
            if self._zero_steps % self.probe_every == 0:
                return 1
        else:
            self._zero_steps = 0
        return best_k


class ThresholdPolicy:
    """alpha (mean over active requests) below ``low`` -> K = k_low; back to k_high once it
    reaches ``high`` (hysteresis)."""

    def __init__(self, k_high: int, k_low: int = 2, low: float = 0.4, high: float = 0.5):
        self.k_high, self.k_low, self.low, self.high = k_high, min(k_low, k_high), low, high
        self.k = k_high

    def choose(self, alphas: Sequence[float], costs: StepCosts) -> int:
        if alphas:
            a = sum(alphas) / len(alphas)
            if a < self.low:
                self.k = self.k_low
            elif a >= self.high:
                self.k = self.k_high
        return self.k


class PerRowK:
    """One policy object per row (so probe counters and hysteresis are per row), each
    choosing its row's K from that row's acceptance estimate alone, and one shared policy
    for the rows in ``shared_rows`` (whose text does not depend on K: greedy rows, or every
    row in coupled mode), choosing from all their estimates at once."""

    def __init__(self, kind: str, k: int, num_rows: int, shared_rows: AbstractSet[int] = frozenset()):
        self.policies = [make_policy(kind, k) for _ in range(num_rows)]
        self.shared, self.shared_rows = make_policy(kind, k), frozenset(shared_rows)

    def choose(self, alphas: Dict[int, float], costs: StepCosts,
               caps: Optional[Dict[int, int]] = None,
               model_rows: Optional[AbstractSet[int]] = None) -> Dict[int, int]:
        """alphas {row: estimate} of the active rows -> {row: K in [0, k]}; caps {row: the
        most K the row may take} (its token budget; default no cap); model_rows: the rows
        whose drafts this step come from the draft model (the others' cost no draft step,
        :func:`row_costs`; None: every row's). A shared row gets the step's K: the largest
        of the shared choice and the own rows' (capped) choices, capped by its own cap."""
        cap = (lambda b, k: min(k, caps[b])) if caps is not None else (lambda b, k: k)
        ks = {b: cap(b, self.policies[b].choose([a], row_costs(costs, [b], model_rows))) for b, a in alphas.items()
              if b not in self.shared_rows}
        shared = [b for b in alphas if b in self.shared_rows]
        if shared:
            k = max([self.shared.choose([alphas[b] for b in shared], row_costs(costs, shared, model_rows))]
                    + list(ks.values()))
            ks.update({b: cap(b, k) for b in shared})
        return ks


def make_policy(kind: str, k: int, k_max: Optional[int] = None):
    """'fixed' | 'cost' | 'threshold' -> policy object."""
    k_max = k if k_max is None else k_max
    if kind == "fixed":
        return FixedK(k)
    if kind == "cost":
        return CostModelPolicy(k_max)
    if kind == "threshold":
        return ThresholdPolicy(k_max)
    raise ValueError(f"adaptive policy must be 'fixed', 'cost' or 'threshold', got {kind!r}")


__all__: List[str] = ["AcceptanceEstimator", "MODEL_SOURCE", "CostModelPolicy", "FixedK", "PerRowK", "StepCosts",
                      "TextDraftCosts", "ThresholdPolicy", "draft_source", "expected_tokens", "hinted_costs",
                      "make_policy", "predicted_speedup", "row_costs"]
