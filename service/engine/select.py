"""One greedy step: given a belief, stop (with a reason) or name the next test."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from .belief import Belief, Observation, observe
from .compiled import CompiledInstance
from .errors import PolicyNotApplicable, StopRuleNotApplicable, UnknownPolicy
from .policies import POLICIES, Policy, ec2_gain
from .regions import decided_by_all, decision_posterior, expected_loss

# A normalised gain at or below this is zero: it is round-off, not information. Gains are
# differences of sums of order 1 (absolute round-off near 1e-16), so the tolerance is absolute;
# a positive prior below 1e-9 of the total, whose gains could fall under it, is refused at the
# wire (schemas/instance.py MIN_PRIOR_SHARE; docs/engine.md).
ZERO_GAIN = 1e-12
# A test fits the budget when the cost spent after it is within this relative distance of
# max_cost: costs summed in another order (0.1 + 0.2 vs 0.3) differ by round-off only.
BUDGET_TOLERANCE = 1e-12
# Scores within this relative distance of the best are ties, won by the earliest test.
TIE_TOLERANCE = 1e-9
# A likelihood instance never becomes certain; with no stop rule given it stops here.
DEFAULT_LIKELIHOOD_CONFIDENCE = 0.95


class StopReason(StrEnum):
    """Why a run stops; :func:`decide` checks them in this order and reports the first that holds."""

    DETERMINED = "determined"
    # Decision policies on decision instances, in place of the two above: one decision is
    # acceptable to every survivor, or probably enough (confidence / max_expected_loss).
    DECIDED = "decided"
    CONFIDENCE_REACHED = "confidence_reached"
    MAX_TESTS = "max_tests"
    # Deterministic instances: no unrun test separates two surviving hypotheses of different
    # classes. Checked before tests_exhausted, so running out of tests with several classes left
    # (which on a deterministic instance only happens to indistinguishable ones) says why.
    INDISTINGUISHABLE = "indistinguishable"
    TESTS_EXHAUSTED = "tests_exhausted"
    BUDGET_EXHAUSTED = "budget_exhausted"
    NO_INFORMATIVE_TEST = "no_informative_test"


@dataclass(frozen=True)
class StopRules:
    max_tests: int | None = None
    max_cost: float | None = None
    confidence: float | None = None
    # Decision instances with losses: decided once the least expected loss is at most this.
    max_expected_loss: float | None = None

    def effective_confidence(self, inst: CompiledInstance) -> float | None:
        if self.confidence is not None:
            return self.confidence
        if (inst.kind == "likelihood" and self.max_tests is None and self.max_cost is None
                and self.max_expected_loss is None):
            return DEFAULT_LIKELIHOOD_CONFIDENCE
        return None


@dataclass(frozen=True, eq=False)
class Decision:
    belief: Belief
    next_test: int | None
    stop_reason: StopReason | None
    # Each test's score in the policy's own units divided by cost; NaN where not eligible.
    scores: np.ndarray

    @property
    def done(self) -> bool:
        return self.next_test is None

    @property
    def next_test_id(self) -> str | None:
        """The next test's id (``next_test`` is its index)."""
        return None if self.next_test is None else self.belief.instance.test_ids[self.next_test]

    @property
    def class_posterior(self) -> dict[str, float]:
        """Class label → P(class | observations), the classes still possible, most probable first."""
        labels = self.belief.instance.class_labels
        posterior = self.belief.class_posterior
        order = np.argsort(-posterior, kind="stable")
        return {labels[i]: float(posterior[i]) for i in order if posterior[i] > 0}


def resolve_policy(inst: CompiledInstance, name: str | None) -> Policy:
    if name is None:
        name = "hec" if inst.is_decision else "ec2" if inst.kind == "deterministic" else "effecxtive"
    policy = POLICIES.get(name)
    if policy is None:
        raise UnknownPolicy(f"unknown policy '{name}'; choose one of {sorted(POLICIES)}")
    if policy.decision and not inst.is_decision:
        raise PolicyNotApplicable(
            f"policy '{name}' needs a decision instance (top-level 'decisions' and per-hypothesis "
            "'acceptable' or 'loss'); this instance has classes")
    if policy.deterministic_only and inst.kind != "deterministic":
        raise PolicyNotApplicable(
            f"policy '{name}' needs deterministic outcomes; for a likelihood instance use "
            "'effecxtive' (or give max_flips to expand noisy copies)"
        )
    return policy


def decide(belief: Belief, policy: Policy, rules: StopRules = StopRules(), seed: int = 0) -> Decision:
    """Stop with the first reason that applies (in the order of :class:`StopReason`), else the
    eligible test maximising gain / cost; ties go to the earliest test in instance order."""
    inst = belief.instance
    scores = np.full(inst.n_tests, np.nan)
    if rules.max_expected_loss is not None and inst.loss is None:
        raise StopRuleNotApplicable("max_expected_loss needs a decision instance with losses ('loss' or 'loss_matrix')")

    def stop(reason: StopReason) -> Decision:
        return Decision(belief, None, reason, scores)

    confidence = rules.effective_confidence(inst)
    if policy.decision:
        if _decided(belief, confidence, rules.max_expected_loss):
            return stop(StopReason.DECIDED)
    else:
        # Class policies (on a decision instance: on section 4's reduction to classes).
        if np.count_nonzero(belief.class_mass) <= 1:
            return stop(StopReason.DETERMINED)
        if confidence is not None and belief.class_posterior.max() >= confidence:
            return stop(StopReason.CONFIDENCE_REACHED)
    if rules.max_tests is not None and len(belief.observations) >= rules.max_tests:
        return stop(StopReason.MAX_TESTS)
    unrun = ~belief.run_tests
    # One pass over the alive cells computes what the policy reads (and, on deterministic
    # instances, what the indistinguishability check reads: Δ_EC needs Σ_i a²).
    class_edges = inst.kind == "deterministic" and not policy.decision
    statistics = policy.statistics | (POLICIES["ec2"].statistics if class_edges else frozenset())
    stats = belief.outcome_stats(statistics)
    if class_edges:
        # Policy-independent: can any unrun test still cut an edge between classes? A gain above
        # the tolerance says yes; otherwise the outcomes themselves decide, exactly (a class
        # too light for the tolerance is not "indistinguishable").
        if not (ec2_gain(stats)[unrun] > ZERO_GAIN).any() and not splits(belief, unrun):
            return stop(StopReason.INDISTINGUISHABLE)
    elif inst.kind == "deterministic":
        # Undecided, so every split of V cuts a hyperedge: does an unrun test split V? The region
        # sums give p(x) as sums of positive masses, exactly 0 for an outcome nobody in V gives.
        if not ((stats.p[unrun] > 0).sum(axis=1) >= 2).any():
            return stop(StopReason.INDISTINGUISHABLE)
    if not unrun.any():
        return stop(StopReason.TESTS_EXHAUSTED)
    gain = policy.gain(stats)
    eligible = unrun.copy()
    if rules.max_cost is not None:
        eligible &= belief.cost_spent + inst.costs <= rules.max_cost * (1 + BUDGET_TOLERANCE)
        if not eligible.any():
            return stop(StopReason.BUDGET_EXHAUSTED)
    informative = eligible & (gain > ZERO_GAIN)
    scale = belief.total_mass ** policy.score_power
    scores[eligible] = np.maximum(gain[eligible], 0.0) * scale / inst.costs[eligible]
    if not informative.any():
        beyond_budget = unrun & ~eligible & (gain > ZERO_GAIN)
        return stop(StopReason.BUDGET_EXHAUSTED if beyond_budget.any() else StopReason.NO_INFORMATIVE_TEST)

    if policy.seeded:
        # Seeded by (seed, step) so a replay of the same observations picks the same test.
        candidates = np.flatnonzero(informative)
        rng = np.random.default_rng([seed, len(belief.observations)])
        return Decision(belief, int(rng.choice(candidates)), None, scores)
    ratio = np.where(informative, gain / inst.costs, -np.inf)
    best = ratio.max()
    chosen = int(np.flatnonzero(ratio >= best - TIE_TOLERANCE * abs(best))[0])
    return Decision(belief, chosen, None, scores)


def _decided(belief: Belief, confidence: float | None, max_expected_loss: float | None) -> bool:
    """One decision suits every survivor; or some decision is acceptable with posterior
    probability ≥ ``confidence`` (the likelihood default, or given); or (with losses) the least
    expected loss is ≤ ``max_expected_loss``."""
    if decided_by_all(belief):
        return True
    if confidence is not None and decision_posterior(belief).max() >= confidence:
        return True
    losses = expected_loss(belief)
    return max_expected_loss is not None and losses is not None and losses.min() <= max_expected_loss


def splits(belief: Belief, tests: np.ndarray) -> bool:
    """Does any of ``tests`` (a mask) give two alive hypotheses different outcomes? With two
    classes alive that is exactly "cuts an edge": if h and h′ differ on t and share a class, any
    h″ of another class differs on t from one of them. Deterministic instances; blocks of rows
    keep the temporary small."""
    columns = np.flatnonzero(tests)
    if columns.size == 0:
        return False
    outcomes = belief.instance.outcomes
    first = outcomes[belief.alive[0], columns]
    step = max(1, (1 << 20) // columns.size)
    for start in range(0, belief.alive.size, step):
        if (outcomes[np.ix_(belief.alive[start:start + step], columns)] != first).any():
            return True
    return False


def next_step(
    inst: CompiledInstance,
    observations: list[Observation] | tuple[Observation, ...] = (),
    policy: str | None = None,
    rules: StopRules = StopRules(),
    seed: int = 0,
) -> Decision:
    """Observations (parsed indices) in, decision out: the whole engine in one call."""
    return decide(observe(inst, observations), resolve_policy(inst, policy), rules, seed)
