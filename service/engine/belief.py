"""What is known after some observations: the version space (deterministic instances) or the
exact Bayesian posterior kept in log space (likelihood instances), and the reductions over classes
of the masses α(i, t, x) that the policies read (:class:`OutcomeStats`; the statistics beyond
them are registered in statistics.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .compiled import CompiledInstance
from .errors import ConflictingObservation, InconsistentObservation, UnknownOutcome, UnknownTest

Observation = tuple[int, int]  # (test index, outcome index), or (test index, SKIPPED)
# The outcome index of a skipped test: the respondent gave no answer, so nothing is learnt.
SKIPPED = -1

# The reductions over classes of α a policy may ask for beyond p (always computed), all computed
# by one pass over the alive cells (:func:`reduce_over_classes`): see :class:`OutcomeStats`.
CLASS_REDUCTIONS = frozenset({"sum_sq", "sum_xlogx", "max"})



@dataclass(frozen=True, eq=False)
class OutcomeStats:
    """Everything the policies read about the masses α, normalised by M = P(V).

    With a(i, t, x) = α(i, t, x)/M, per test t and outcome x (arrays of shape (N, ℓ)):
    ``p`` = Σ_i a(i, t, x) = P(X_t = x | x_A), ``sum_sq`` = Σ_i a², ``sum_xlogx`` = Σ_i a log₂ a,
    ``max`` = max_i a (exact); ``b`` (C,) = β(i)/M, the class posterior. The optional three are
    ``None`` unless asked for (:data:`CLASS_REDUCTIONS`). Outcomes beyond a test's arity have 0
    mass. Entries that are exactly 0 may carry round-off of order 1e-17 (complements β − Σ others).
    ``derived`` holds the registered statistics asked for, by name (statistics.py).
    """

    p: np.ndarray
    b: np.ndarray
    sum_sq: np.ndarray | None = None
    sum_xlogx: np.ndarray | None = None
    max: np.ndarray | None = None
    derived: dict[str, Any] = field(default_factory=dict)
    _gains: dict = field(default_factory=dict, init=False, repr=False)

    def gain(self, function: Callable[[OutcomeStats], np.ndarray]) -> np.ndarray:
        """``function(self)``, computed once: a stop rule and the policy may read the same gain."""
        value = self._gains.get(function)
        if value is None:
            value = self._gains[function] = function(self)
        return value


def xlog2x(x: np.ndarray) -> np.ndarray:
    """x log₂ x elementwise, 0 at x = 0 (its limit). The logarithm is taken only where x > 0,
    into zeros: no masked copy of x and no select after (a fifth of the time on a 61 × 600 block)."""
    result = np.zeros(x.shape)
    np.log2(x, out=result, where=x > 0)
    result *= x
    return result


def parse_observations(inst: CompiledInstance, labelled: Iterable[tuple[str, str | None]],
                       parsed_before: Sequence[Observation] = (), start: int = 0) -> list[Observation]:
    """Labels → indices, in order. An outcome of None is a skip, parsed as (t, SKIPPED).

    A repeated identical observation counts once, except an answer to a repeatable test, which
    is a new observation each time. A test cannot be both answered and skipped.

    ``parsed_before``: the parse of the ``start`` observations before ``labelled`` (a belief's
    observations), continued from: the result is the parse of all of them (positions in messages
    count from the first), without reading the earlier ones' labels again."""
    answered: dict[int, int] = {t: k for t, k in parsed_before if k != SKIPPED}
    skipped: set[int] = {t for t, k in parsed_before if k == SKIPPED}
    repeatable = inst.repeatable_tests
    parsed: list[Observation] = list(parsed_before)
    for position, (test_id, outcome) in enumerate(labelled, start):
        t = inst.test_index.get(test_id)
        if t is None:
            raise UnknownTest(f"observation {position}: unknown test '{test_id}'")
        if outcome is None:
            if t in answered:
                raise ConflictingObservation(
                    f"observation {position}: test '{test_id}' was answered "
                    f"('{inst.outcome_labels[t][answered[t]]}'), so it cannot be skipped")
            if t not in skipped:
                skipped.add(t)
                parsed.append((t, SKIPPED))
            continue
        k = inst.outcome_index[t].get(str(outcome))
        if k is None:
            raise UnknownOutcome(
                f"observation {position}: '{outcome}' is not an outcome of test '{test_id}' "
                f"(expected one of {list(inst.outcome_labels[t])})"
            )
        if t in skipped:
            raise ConflictingObservation(f"observation {position}: test '{test_id}' was skipped, so it has "
                                         "no answer")
        if t in answered and not repeatable[t]:
            if answered[t] != k:
                raise ConflictingObservation(
                    f"observation {position}: test '{test_id}' was already observed as "
                    f"'{inst.outcome_labels[t][answered[t]]}'"
                )
            continue
        answered[t] = k
        parsed.append((t, k))
    return parsed


class _cached:
    """``functools.cached_property`` without the lock Python 3.11 takes on every first access
    (~1 µs, and a step reads several): two threads racing on a belief at worst compute the same
    value twice."""

    def __init__(self, compute):
        self.compute = compute
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


@dataclass(frozen=True, eq=False)
class Belief:
    """The state after ``observations`` (answers, and skips: ``(t, SKIPPED)``, which change no
    mass).

    ``alive`` holds the indices of hypotheses with positive mass (the version space V(x_A) for
    deterministic instances); ``mass`` their weights: the prior P(h) itself for deterministic
    instances (not renormalised, as Δ_EC is defined), the posterior P(h | x_A) otherwise.
    """

    instance: CompiledInstance
    observations: tuple[Observation, ...]
    alive: np.ndarray  # (|V|,) sorted hypothesis indices
    mass: np.ndarray  # (|V|,) float64 > 0
    # Likelihood instances, to carry the belief forward exactly (see :func:`observe`): the rows
    # whose log posterior is finite (alive rows and rows whose weight underflowed to 0, which a
    # later observation can bring back) and that unnormalised, unshifted log posterior.
    support: np.ndarray | None = field(default=None, repr=False)
    log_posterior: np.ndarray | None = field(default=None, repr=False)

    @_cached
    def total_mass(self) -> float:
        """Σ mass (the prior mass of V on a deterministic instance); 1 for a likelihood posterior
        :func:`observe` computed, which it normalised (the sum differs from 1 by round-off only)."""
        return 1.0 if self.log_posterior is not None else float(self.mass.sum())

    @_cached
    def answers(self) -> tuple[Observation, ...]:
        """The observations that were answered (skips left out)."""
        return tuple((t, k) for t, k in self.observations if k != SKIPPED)

    @_cached
    def run_tests(self) -> np.ndarray:
        """(N,) bool: the tests answered at least once."""
        ran = np.zeros(self.instance.n_tests, dtype=bool)
        if self.answers:
            ran[[t for t, _ in self.answers]] = True
        return ran

    @_cached
    def skipped_tests(self) -> np.ndarray:
        """(N,) bool: the tests the respondent skipped (never proposed again)."""
        skipped = np.zeros(self.instance.n_tests, dtype=bool)
        if len(self.answers) < len(self.observations):
            skipped[[t for t, k in self.observations if k == SKIPPED]] = True
        return skipped

    @_cached
    def cost_spent(self) -> float:
        """The cost of every answer (a repeated test each time), plus every skipped test's when
        the instance says ``skip_cost: charged``."""
        inst = self.instance
        charged = self.observations if inst.skip_charged else self.answers
        return float(sum(inst.costs[t] for t, _ in charged))

    @_cached
    def class_mass(self) -> np.ndarray:
        """β(i) = P(H_i ∩ V) (unnormalised for deterministic instances)."""
        inst = self.instance
        classes = inst.class_index if self.alive.size == inst.n_hypotheses else inst.class_index[self.alive]
        return np.bincount(classes, weights=self.mass, minlength=inst.n_classes)

    @_cached
    def class_posterior(self) -> np.ndarray:
        return self.class_mass / self.class_mass.sum()

    def outcome_stats(self, statistics: Iterable[str] = CLASS_REDUCTIONS) -> OutcomeStats:
        """The per-(test, outcome) reductions over classes that every policy needs, in one pass.

        With a(i, t, x) = α(i, t, x)/M and α(i, t, x) = Σ_{h ∈ H_i ∩ V} w(h) P(X_t = x | h):
        ``p`` = Σ_i a always, and those of ``sum_sq`` = Σ_i a², ``sum_xlogx`` = Σ_i a log₂ a,
        ``max`` = max_i a that are asked for. The (classes × tests × outcomes) tensor α is never
        built: O(|V|·N) time and O(N·ℓ) memory beyond blocks of ≤ 2¹⁷ cells (section 3's fast
        method; the per-class sums are what makes Σ_i a² possible without edge lists).

        Hypotheses are stored grouped by class, so each class is a contiguous run of alive rows:

        * a class with many cells (rows·N ≥ 2¹²) gets α(i, ·, ·) by a BLAS GEMV per block of
          rows, then is folded into the statistics;
        * runs of small classes are cut into blocks of whole classes. A block of singletons
          (the default, class = hypothesis) needs no α at all: α(h, t, x) = w(h)·[X_ht = x], so
          Σ_i a^m and Σ_i a log a are the weights w, w², w log w against the one-hot [X = x] (one
          GEMM); a block of other small classes sums its rows per class (:func:`sum_runs`).

        Statistics registered in statistics.py are computed on request beside these
        (:func:`~.statistics.outcome_stats`).
        """
        return outcome_stats(self, statistics)


def observe(inst: CompiledInstance, observations: Sequence[Observation], previous: Belief | None = None) -> Belief:
    """The belief after ``observations`` (already parsed). Raises ``InconsistentObservation``
    when they leave no hypothesis alive; nothing is mutated either way.

    ``previous``, when given and its observations are the first ones of ``observations`` (the
    step before, in a session), is carried forward: only the later observations are applied, to
    its survivors, O(|V|) each instead of a pass over every row. The result is the same, bit for
    bit. Any other ``previous`` is ignored."""
    observations = tuple(observations)
    done = 0
    if (previous is not None and previous.instance is inst
            and (inst.outcomes is not None or previous.support is not None)
            and observations[: len(previous.observations)] == previous.observations):
        done = len(previous.observations)
    # Skips change no mass: only the answers after the carried-forward prefix are applied.
    new_answers = [(t, k) for t, k in observations[done:] if k != SKIPPED]
    if inst.outcomes is not None:
        alive = previous.alive if done else None
        # Filter the survivors of each observation in turn: late in a session each filter reads
        # a handful of rows, not a column of the whole matrix.
        for t, k in new_answers:
            if alive is None:
                alive = ((inst.outcomes[:, t] == k) & (inst.prior > 0)).nonzero()[0]
            else:
                alive = alive[inst.outcomes[alive, t] == k]
        if alive is None:
            alive = (inst.prior > 0).nonzero()[0]
        if alive.size == 0:
            raise InconsistentObservation(_inconsistent_message(inst, observations))
        return _carried(Belief(inst, observations, alive, inst.prior[alive]), previous if done else None, new_answers)
    if done:
        support, log_post = previous.support, previous.log_posterior
    else:
        support, log_post = np.arange(inst.n_hypotheses), inst.log_prior
    rows = slice(None) if support.size == inst.n_hypotheses else support
    for t, k in new_answers:
        # The log of one column of likelihoods per observation: O(n), and no second n × N × ℓ
        # tensor of logs beside the instance.
        column = inst.likelihood[rows, t, k]
        if column.all():
            log_post = log_post + np.log(column)
        else:
            with np.errstate(divide="ignore"):
                log_post = log_post + np.log(column)
    top = log_post.max() if log_post.size else -np.inf
    if top == -np.inf:  # log probabilities are ≤ 0
        raise InconsistentObservation(_inconsistent_message(inst, observations))
    # Shift by the maximum before exponentiating: 500+ observations stay finite and exact.
    weight = np.exp(log_post - top)
    if weight.min() > 0.0:
        alive, mass = support, weight
    else:
        positive = weight > 0
        finite = log_post > -np.inf
        if not finite.all():
            # Rows of probability 0 (log −∞) stay there whatever comes next: no need to carry them.
            support, log_post, weight, positive = support[finite], log_post[finite], weight[finite], positive[finite]
        alive, mass = support[positive], weight[positive]
    return _carried(Belief(inst, observations, alive, mass / mass.sum(), support, log_post),
                    previous if done else None, new_answers)


def _carried(belief: Belief, previous: Belief | None, new_answers: list[Observation]) -> Belief:
    """``belief`` with what ``previous`` (the belief of a prefix of its observations) already
    knows about the answers carried forward: one step late in a session then costs O(1) here, not
    a pass over every observation. The same values as computing them afresh: the answers in order,
    the costs summed in the same order."""
    if previous is None:
        return belief
    known, carried = previous.__dict__, belief.__dict__
    added = belief.observations[len(previous.observations):]
    if "answers" in known:
        carried["answers"] = known["answers"] + tuple(new_answers)
    if "run_tests" in known:
        ran = known["run_tests"].copy()
        ran[[t for t, _ in new_answers]] = True
        carried["run_tests"] = ran
    if "cost_spent" in known:
        inst = belief.instance
        charged = added if inst.skip_charged else new_answers
        spent = known["cost_spent"]
        for t, _ in charged:
            spent += inst.costs[t]
        carried["cost_spent"] = float(spent)
    return belief


def _inconsistent_message(inst: CompiledInstance, observations: Sequence[Observation]) -> str:
    answered = [(t, k) for t, k in observations if k != SKIPPED]
    if not answered:
        return "no hypothesis has a positive prior"
    t, k = answered[-1]
    return (
        f"observing '{inst.outcome_labels[t][k]}' on test '{inst.test_ids[t]}' contradicts every "
        "remaining hypothesis"
    )


# Last: alpha.py and statistics.py build on this module, and every name they import from here is
# defined now.
from .statistics import outcome_stats  # noqa: E402
