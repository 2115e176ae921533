"""One greedy step: given a belief, stop (with a reason) or name the next test."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from .belief import Belief, Observation, OutcomeStats, observe
from .compiled import CompiledInstance
from .errors import InfeasibleComputation, StopRuleNotApplicable
from .item_bank import balanced, enemies_of, sympson_hetter_blocked, theta_estimate
from .policies import EDGE_CUTTING_STATISTICS, Policy, edge_cutting_gain, resolve_policy
from .regions import decided_by_all, decision_posterior, expected_loss
from .restricted import Restriction, restricted

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
# Work limits of a batch choice (greedy_batch), checked by check_batch before a session starts:
# conditioned beliefs evaluated per step, and cells (hypotheses × tests) they pass over.
MAX_BATCH_BRANCHES = 4096
MAX_BATCH_CELLS = 200_000_000


class StopReason(StrEnum):
    """Why a run stops; :func:`decide` checks them in this order and reports the first that holds."""

    DETERMINED = "determined"
    # Decision policies on decision instances, in place of the two above: one decision is
    # acceptable to every survivor, or probably enough (confidence / max_expected_loss).
    DECIDED = "decided"
    CONFIDENCE_REACHED = "confidence_reached"
    # Item banks: θ's posterior SD is at most max_se.
    MAX_SE = "max_se"
    MAX_TESTS = "max_tests"
    # Deterministic instances: no unrun test separates two surviving hypotheses of different
    # classes. Checked before tests_exhausted, so running out of tests with several classes left
    # (which on a deterministic instance only happens to indistinguishable ones) says why.
    INDISTINGUISHABLE = "indistinguishable"
    TESTS_EXHAUSTED = "tests_exhausted"
    BUDGET_EXHAUSTED = "budget_exhausted"
    NO_INFORMATIVE_TEST = "no_informative_test"


class StopRules(NamedTuple):
    """When a run stops, besides running out of informative tests. A tuple: cheap to build and
    to hash (a session's rules are part of the key its steps are cached under)."""

    max_tests: int | None = None
    max_cost: float | None = None
    confidence: float | None = None
    # Decision instances with losses: decided once the least expected loss is at most this.
    max_expected_loss: float | None = None
    # Item banks: stop once θ's posterior SD is at most this (item_bank.py).
    max_se: float | None = None
    # Not a stop rule but exposure control, kept here because these rules travel with every run
    # (sessions, their cached steps, evaluation, auto): draw the test uniformly among the k best
    # (randomesque), seeded by (seed, step).
    randomesque: int | None = None
    # Sympson–Hetter with the item bank's exposure parameters (item_bank.py), seeded by seed.
    sympson_hetter: bool = False
    # The progressive method: each test's score a blend of a random draw and its gain, the gain's
    # weight growing with the step (needs max_tests), seeded by (seed, step).
    progressive: bool = False
    # The restricted method's share of sessions per test (the caller counts them: restricted.py).
    max_rate: float | None = None

    @property
    def draws_for_exposure(self) -> bool:
        """Whether exposure control draws from the seed (randomesque, Sympson–Hetter, progressive)."""
        return self.randomesque is not None or self.sympson_hetter or self.progressive

    def effective_confidence(self, inst: CompiledInstance) -> float | None:
        if self.confidence is not None:
            return self.confidence
        if (inst.kind == "likelihood" and self.max_tests is None and self.max_cost is None
                and self.max_expected_loss is None and self.max_se is None):
            return DEFAULT_LIKELIHOOD_CONFIDENCE
        return None


@dataclass(frozen=True, eq=False)
class Decision:
    belief: Belief
    next_test: int | None
    stop_reason: StopReason | None
    # Each test's score in the policy's own units divided by cost; NaN where not eligible.
    scores: np.ndarray
    # A page of distinct tests to ask together, best first (``next_test`` is the first); empty
    # when the run stops. One test unless a batch size above 1 was asked for.
    batch: tuple[int, ...] = ()

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


def decide(belief: Belief, policy: Policy, rules: StopRules = StopRules(), seed: int = 0,
           excluded: np.ndarray | None = None, batch_size: int = 1, restriction: Restriction | None = None) -> Decision:
    """Stop with the first reason that applies (in the order of :class:`StopReason`), else the
    eligible test maximising gain / cost; ties go to the earliest test in instance order.

    A test is *open* while it can still be answered: never answered, or repeatable. It is
    *available* when open, not skipped and not ``excluded`` ((N,) bool, tests that cannot be run
    here). Only available tests are proposed; when informative tests remain open but none is
    available (the respondent skipped them, the clinic lacks them) the stop is
    ``no_informative_test``, and ``tests_exhausted`` means every test was answered. What a
    ``restriction`` keeps from the session is proposed only when no other eligible test informs.

    With ``batch_size`` k > 1, :attr:`Decision.batch` extends the choice greedily on the batch's
    joint outcomes (:func:`greedy_batch`)."""
    inst = belief.instance
    _check_rules_apply(inst, rules)

    def stop(reason: StopReason, scores: np.ndarray | None = None) -> Decision:
        return Decision(belief, None, reason, np.full(inst.n_tests, np.nan) if scores is None else scores)

    reached = _rule_reached(belief, policy, rules)
    if reached is not None:
        return stop(reached)
    unrun = ~belief.run_tests
    open_tests = unrun if inst.repeatable is None else unrun | inst.repeatable_tests
    available = _available(belief, open_tests, excluded, rules, seed)
    # One pass over the alive cells computes what the policy reads (and, on deterministic
    # instances, what the indistinguishability check reads: Δ_EC needs Σ_i a²).
    class_edges = inst.kind == "deterministic" and not policy.decision
    statistics = policy.statistics | EDGE_CUTTING_STATISTICS if class_edges else policy.statistics
    stats = belief.outcome_stats(statistics)
    if inst.kind == "deterministic" and _indistinguishable(belief, stats, unrun, class_edges):
        return stop(StopReason.INDISTINGUISHABLE)
    if not open_tests.any():
        return stop(StopReason.TESTS_EXHAUSTED)
    gain = stats.gain(policy.gain)  # computed once when it is also Δ_EC above
    eligible = available
    if rules.max_cost is not None:
        eligible = available & (belief.cost_spent + inst.costs <= rules.max_cost * (1 + BUDGET_TOLERANCE))
        if available.any() and not eligible.any():
            return stop(StopReason.BUDGET_EXHAUSTED)
    positive = gain > ZERO_GAIN
    eligible = eligible if restriction is None else restricted(belief, eligible, positive, restriction)
    informative = balanced(inst, belief.run_tests, eligible & positive)
    per_cost = gain / inst.costs
    scores = _shown_scores(belief, policy, per_cost, eligible)
    ratio = np.where(informative, per_cost, -np.inf)
    best = int(ratio.argmax())
    if ratio[best] == -np.inf:  # nothing informative
        beyond_budget = available & ~eligible & positive
        return stop(StopReason.BUDGET_EXHAUSTED if beyond_budget.any() else StopReason.NO_INFORMATIVE_TEST, scores)

    if policy.seeded:
        return _seeded_choice(belief, rules, seed, informative, scores, batch_size)
    if rules.progressive:
        ratio = _progressive(ratio, informative, len(belief.answers) / rules.max_tests, seed, len(belief.observations))
        best = int(ratio.argmax())
    chosen = _earliest_best(ratio, best)
    if rules.randomesque is not None and rules.randomesque > 1:
        chosen = _randomesque(ratio, informative, rules.randomesque, seed, len(belief.observations))
    batch = (chosen,)
    if batch_size > 1:
        batch = greedy_batch(belief, policy, rules, stats, chosen, eligible, batch_size)
    return Decision(belief, chosen, None, scores, batch)


def _available(belief: Belief, open_tests: np.ndarray, excluded: np.ndarray | None, rules: StopRules,
               seed: int) -> np.ndarray:
    """The open tests neither skipped, nor ``excluded``, nor held back by exposure control or enemies."""
    available = open_tests if len(belief.answers) == len(belief.observations) else open_tests & ~belief.skipped_tests
    if excluded is not None:
        available = available & ~excluded
    if rules.sympson_hetter:
        available = available & ~sympson_hetter_blocked(belief.instance, seed)
    if belief.instance.enemies is not None:  # an item bank's: never an enemy of a test already shown
        available = available & ~enemies_of(belief.instance, belief.run_tests | belief.skipped_tests)
    return available


def _check_rules_apply(inst, rules: StopRules) -> None:
    if rules.max_expected_loss is not None and inst.loss is None:
        raise StopRuleNotApplicable("max_expected_loss needs a decision instance with losses ('loss' or 'loss_matrix')",
                                    "max_expected_loss")
    if rules.max_se is not None and inst.theta is None:
        raise StopRuleNotApplicable("max_se needs an item-bank instance ('item_bank'): others have no θ", "max_se")
    if rules.sympson_hetter and inst.exposure_parameters is None:
        raise StopRuleNotApplicable("sympson_hetter needs an item bank whose items give exposure_parameter",
                                    "exposure.method")
    if rules.progressive and rules.max_tests is None:
        raise StopRuleNotApplicable("progressive needs max_tests: the gain's weight grows with the step towards the "
                                    "last", "exposure.method")


def _shown_scores(belief: Belief, policy: Policy, per_cost: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """:attr:`Decision.scores`: each eligible test's gain per cost (at least 0), NaN elsewhere."""
    scores = np.maximum(per_cost, 0.0)
    scale = belief.total_mass ** policy.score_power
    if scale != 1.0:  # a likelihood belief's mass is normalised
        scores *= scale
    return np.where(eligible, scores, np.nan)


def _rule_reached(belief: Belief, policy: Policy, rules: StopRules) -> StopReason | None:
    """The first stop rule the belief meets before any test is scored, if any."""
    confidence = rules.effective_confidence(belief.instance)
    if policy.decision:
        if _decided(belief, confidence, rules.max_expected_loss):
            return StopReason.DECIDED
    else:
        # Class policies (on a decision instance: on section 4's reduction to classes).
        if np.count_nonzero(belief.class_mass) <= 1:
            return StopReason.DETERMINED
        if confidence is not None and belief.class_posterior.max() >= confidence:
            return StopReason.CONFIDENCE_REACHED
    if rules.max_se is not None and theta_estimate(belief)[1] <= rules.max_se:
        return StopReason.MAX_SE
    if rules.max_tests is not None and len(belief.answers) >= rules.max_tests:
        return StopReason.MAX_TESTS
    return None


def _indistinguishable(belief: Belief, stats, unrun: np.ndarray, class_edges: bool) -> bool:
    """On a deterministic instance: no unrun test can separate what is left."""
    if class_edges:
        # Policy-independent: can any unrun test still cut an edge between classes? A gain above
        # the tolerance says yes; otherwise the outcomes themselves decide, exactly (a class
        # too light for the tolerance is not "indistinguishable").
        edge_gain = stats.gain(edge_cutting_gain)
        return not (edge_gain[unrun] > ZERO_GAIN).any() and not splits(belief, unrun)
    # Undecided, so every split of V cuts a hyperedge: does an unrun test split V? The region
    # sums give p(x) as sums of positive masses, exactly 0 for an outcome nobody in V gives.
    return not ((stats.p[unrun] > 0).sum(axis=1) >= 2).any()


def _seeded_choice(belief: Belief, rules: StopRules, seed: int, informative: np.ndarray, scores: np.ndarray,
                   batch_size: int) -> Decision:
    # Seeded by (seed, step) so a replay of the same observations picks the same test.
    candidates = informative.nonzero()[0]
    rng = np.random.default_rng([seed, len(belief.observations)])
    chosen = int(rng.choice(candidates))
    batch: tuple[int, ...] = (chosen,)
    if batch_size > 1:
        rest = rng.permutation(candidates[candidates != chosen]).tolist()
        batch = _fit_batch(belief, rules, [chosen, *rest], batch_size)
    return Decision(belief, chosen, None, scores, batch)


def _earliest_best(ratio: np.ndarray, best: int) -> int:
    """The first test within TIE_TOLERANCE of ``ratio[best]``, the largest."""
    top = ratio[best]
    return int((ratio >= top - TIE_TOLERANCE * abs(top)).argmax())


def _batch_room(belief: Belief, rules: StopRules, batch_size: int) -> tuple[int, float]:
    """How many tests a batch may hold and what they may cost together under the stop rules."""
    room = batch_size
    if rules.max_tests is not None:
        room = min(room, rules.max_tests - len(belief.answers))
    budget = np.inf if rules.max_cost is None else rules.max_cost * (1 + BUDGET_TOLERANCE) - belief.cost_spent
    return room, budget


def _fit_batch(belief: Belief, rules: StopRules, ranked: list[int], batch_size: int) -> tuple[int, ...]:
    """The first tests of ``ranked`` (the first always) that fit the batch's room and budget."""
    room, budget = _batch_room(belief, rules, batch_size)
    costs = belief.instance.costs
    batch, spent = [ranked[0]], float(costs[ranked[0]])
    for t in ranked[1:]:
        if len(batch) >= room:
            break
        if spent + costs[t] <= budget:
            batch.append(t)
            spent += float(costs[t])
    return tuple(batch)


def batch_branches_bound(inst: CompiledInstance, batch_size: int) -> int:
    """An upper bound on the conditioned beliefs :func:`greedy_batch` evaluates: layer j holds
    at most one per joint outcome of the first j tests (≤ the product of the j largest arities),
    and on a deterministic instance at most one per hypothesis (the outcomes partition V)."""
    arities = sorted((len(labels) for labels in inst.outcome_labels), reverse=True)
    total, joint = 0, 1
    for j in range(min(batch_size, inst.n_tests) - 1):
        joint *= arities[j]
        layer = min(joint, inst.n_hypotheses) if inst.kind == "deterministic" else joint
        total += layer
        if total > 10 * MAX_BATCH_BRANCHES:
            break  # far enough past the limit
    return total


def check_batch(inst: CompiledInstance, batch_size: int) -> None:
    """Refuse a batch size whose greedy selection could exceed the work limits, before any
    step is run (a session must not be able to reach a step it cannot compute)."""
    if batch_size <= 1:
        return
    branches = batch_branches_bound(inst, batch_size)
    if branches > MAX_BATCH_BRANCHES:
        raise InfeasibleComputation(
            f"batch_size {batch_size} on this instance could need {branches} conditioned beliefs per "
            f"step (one per joint outcome of the batch); the limit (MAX_BATCH_BRANCHES) is "
            f"{MAX_BATCH_BRANCHES}: ask for a smaller batch")
    # Each conditioned belief costs one α pass over its alive hypotheses. On a deterministic
    # instance a layer's beliefs partition V, so a layer is one pass; on a likelihood instance
    # every belief keeps every hypothesis.
    passes = min(batch_size, inst.n_tests) - 1 if inst.kind == "deterministic" else branches
    cells = passes * inst.n_hypotheses * inst.n_tests
    if cells > MAX_BATCH_CELLS:
        raise InfeasibleComputation(
            f"batch_size {batch_size} on this {inst.n_hypotheses}×{inst.n_tests} instance could need "
            f"{cells} cells of work per step; the limit (MAX_BATCH_CELLS) is {MAX_BATCH_CELLS}: "
            "ask for a smaller batch")


def greedy_batch(belief: Belief, policy: Policy, rules: StopRules, stats: OutcomeStats, first: int,
                 eligible: np.ndarray, batch_size: int) -> tuple[int, ...]:
    """A page of tests chosen greedily on their joint outcomes (Chen & Krause, ICML 2013).

    The policy's objective of observing a set S at once is f(S) = U(x_A) − E_{x_S}[U(x_A, x_S)],
    the expected improvement over the joint outcomes x_S (edges cut for EC², Rényi-2 gain for
    EffECXtive, entropy reduction for infogain, …). Given the batch B so far, the next member
    maximises the marginal gain per unit cost

        f(B ∪ {t}) − f(B) = Σ_{x_B} P(x_B | x_A) · Δ_t(x_A, x_B),

    the single-test gain Δ_t in the belief conditioned on each joint outcome x_B, weighted by its
    probability. Units: in the conditioned belief Δ_t = gain · M(x_B)^power with M(x_B) =
    q(x_B)·M, so each branch weighs q^(power+1) in units of M^power (constant over t).

    B starts with ``first``, the single-step choice, so ``next_test`` does not depend on k. A
    member must be ``eligible``, distinct, within the remaining test count and budget, and add a
    positive marginal gain; the batch is shorter when fewer do.
    """
    inst = belief.instance
    room, budget = _batch_room(belief, rules, batch_size)
    batch = [first]
    spent = float(inst.costs[first])
    in_batch = np.zeros(inst.n_tests, dtype=bool)
    in_batch[first] = True
    # (belief, q(x_B), its outcome statistics) for every joint outcome x_B of positive probability.
    branches: list[tuple[Belief, float, OutcomeStats]] = [(belief, 1.0, stats)]
    while len(batch) < room:
        last = batch[-1]
        grown = []
        for branch, q, branch_stats in branches:
            for k in range(len(inst.outcome_labels[last])):
                q_child = q * float(branch_stats.p[last, k])
                if q_child <= ZERO_GAIN:
                    continue
                child = observe(inst, (*branch.observations, (last, k)), branch)  # carried forward
                grown.append((child, q_child, child.outcome_stats(policy.statistics)))
        branches = grown
        marginal = np.zeros(inst.n_tests)
        for _, q, branch_stats in branches:
            marginal += q ** (policy.score_power + 1) * np.maximum(policy.gain(branch_stats), 0.0)
        candidates = eligible & ~in_batch & (inst.costs <= budget - spent) & (marginal > ZERO_GAIN)
        ratio = np.where(candidates, marginal / inst.costs, -np.inf)
        best = int(ratio.argmax())
        if ratio[best] == -np.inf:  # no candidate left
            break
        chosen = _earliest_best(ratio, best)
        batch.append(chosen)
        in_batch[chosen] = True
        spent += float(inst.costs[chosen])
    return tuple(batch)


def _randomesque(ratio: np.ndarray, informative: np.ndarray, k: int, seed: int, step: int) -> int:
    """One of the ``k`` informative tests of highest gain per cost (ties in instance order), drawn
    uniformly with a generator keyed by (seed, step, 1): a replay of the same observations
    draws the same test, and the stream differs from the random policy's (seed, step)."""
    order = np.argsort(-np.where(informative, ratio, -np.inf), kind="stable")
    best = order[:min(k, int(informative.sum()))]
    return int(np.random.default_rng([seed, step, 1]).choice(best))


def _progressive(ratio: np.ndarray, informative: np.ndarray, progress: float, seed: int, step: int) -> np.ndarray:
    """The progressive method (Revuelta & Ponsoda 1998, JEM 35(4), 311–327): each informative
    test scores (1 − w)·R + w·g, g its gain per cost, R uniform on [0, the best g], w the share of
    the test already given (``progress``, at most 1). The first test is drawn at random among the
    informative ones, the last almost by gain alone. The draws come from (seed, step, 3): a replay
    of the same observations scores the same, and the stream differs from randomesque's."""
    weight = min(progress, 1.0)
    drawn = np.random.default_rng([seed, step, 3]).uniform(size=ratio.size) * ratio[informative].max()
    return np.where(informative, (1.0 - weight) * drawn + weight * np.where(informative, ratio, 0.0), -np.inf)


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
    excluded: np.ndarray | None = None,
    batch_size: int = 1,
) -> Decision:
    """Observations (parsed indices) in, decision out: the whole engine in one call."""
    return decide(observe(inst, observations), resolve_policy(inst, policy, rules), rules, seed, excluded, batch_size)
