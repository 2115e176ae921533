"""What is known after some observations: the version space (deterministic instances) or the
exact Bayesian posterior kept in log space (likelihood instances), and the masses α(i, x)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .compiled import CompiledInstance
from .errors import ConflictingObservation, InconsistentObservation, UnknownOutcome, UnknownTest

Observation = tuple[int, int]  # (test index, outcome index)

# Cells (rows × tests) per block when accumulating α. Two reasons, both measured in bench/engine.py:
# the block's float64 image stays in cache, and it stays under OpenBLAS's threshold for threading
# a GEMV (about 4·10⁵ cells): on this shared 2-core machine a threaded GEMV waits for the busy
# core and one step took 150 ms instead of 3 ms with 512 × 1000 blocks.
_BLOCK_CELLS = 1 << 17


def parse_observations(inst: CompiledInstance, labelled: Iterable[tuple[str, str]]) -> list[Observation]:
    """Labels → indices, in order; a repeated identical observation counts once."""
    seen: dict[int, int] = {}
    parsed: list[Observation] = []
    for position, (test_id, outcome) in enumerate(labelled):
        t = inst.test_index.get(test_id)
        if t is None:
            raise UnknownTest(f"observation {position}: unknown test '{test_id}'")
        k = inst.outcome_index[t].get(str(outcome))
        if k is None:
            raise UnknownOutcome(
                f"observation {position}: '{outcome}' is not an outcome of test '{test_id}' "
                f"(expected one of {list(inst.outcome_labels[t])})"
            )
        if t in seen:
            if seen[t] != k:
                raise ConflictingObservation(
                    f"observation {position}: test '{test_id}' was already observed as "
                    f"'{inst.outcome_labels[t][seen[t]]}'"
                )
            continue
        seen[t] = k
        parsed.append((t, k))
    return parsed


@dataclass(frozen=True, eq=False)
class Belief:
    """The state after ``observations``.

    ``alive`` holds the indices of hypotheses with positive mass (the version space V(x_A) for
    deterministic instances); ``mass`` their weights: the prior P(h) itself for deterministic
    instances (not renormalised, as Δ_EC is defined), the posterior P(h | x_A) otherwise.
    """

    instance: CompiledInstance
    observations: tuple[Observation, ...]
    alive: np.ndarray  # (|V|,) sorted hypothesis indices
    mass: np.ndarray  # (|V|,) float64 > 0

    @property
    def total_mass(self) -> float:
        return float(self.mass.sum())

    @cached_property
    def run_tests(self) -> np.ndarray:
        ran = np.zeros(self.instance.n_tests, dtype=bool)
        ran[[t for t, _ in self.observations]] = True
        return ran

    @cached_property
    def cost_spent(self) -> float:
        return float(sum(self.instance.costs[t] for t, _ in self.observations))

    @cached_property
    def class_mass(self) -> np.ndarray:
        """β(i) = P(H_i ∩ V) (unnormalised for deterministic instances)."""
        return np.bincount(self.instance.class_index[self.alive], weights=self.mass,
                           minlength=self.instance.n_classes)

    @cached_property
    def class_posterior(self) -> np.ndarray:
        return self.class_mass / self.class_mass.sum()

    @cached_property
    def alpha(self) -> np.ndarray:
        """α(i, t, x) = Σ_{h ∈ H_i ∩ V} w(h) P(X_t = x | h), shape (classes, tests, outcomes).

        Hypotheses are stored grouped by class, so each class is a contiguous block of the alive
        rows and α is one weighted pass (a GEMV per block and outcome) over the alive cells:
        O(|V|·N), never O(|V|²). One outcome per test comes free from β(i) = Σ_x α(i, t, x):

        * deterministic: outcomes k ≥ 2 by comparison, then outcome 1 from the first moment
          Σ_h w(h)·X_ht (a GEMV on the stored integers, no comparison: a quarter less work on
          binary tests), outcome 0 = β − Σ(others);
        * likelihoods: outcomes 0 … ℓ−2 from the tensor, the last = β − Σ(others), masked to 0
          beyond a test's arity.

        The subtractions leave round-off of order 1e-17·β where the exact value is 0; the
        policies' zero tolerance absorbs it (and evaluate.policy_tree does not branch on it).
        """
        inst = self.instance
        width = inst.max_outcomes
        alpha = np.zeros((inst.n_classes, inst.n_tests, width))
        classes = inst.class_index[self.alive]
        bounds = np.flatnonzero(np.diff(classes)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(classes)]))
        full = len(self.alive) == inst.n_hypotheses
        block_rows = max(1, _BLOCK_CELLS // inst.n_tests)
        deterministic = inst.outcomes is not None
        by_outcome = None if deterministic else inst.likelihood_by_outcome
        moment = np.zeros((inst.n_classes, inst.n_tests)) if deterministic else None
        for start, end in zip(starts, ends):
            c = classes[start]
            for block in range(start, end, block_rows):
                stop = min(end, block + block_rows)
                rows = slice(block, stop) if full else self.alive[block:stop]
                weight = self.mass[block:stop]
                if deterministic:
                    cells = inst.outcomes[rows]
                    moment[c] += weight @ cells
                    for k in range(2, width):
                        alpha[c, :, k] += weight @ (cells == k)
                else:
                    # (rows, N) with unit stride along tests: a GEMV straight on the stored tensor.
                    for k in range(width - 1):
                        alpha[c, :, k] += weight @ by_outcome[rows, k]
        beta = self.class_mass[:, None]
        if deterministic:
            if width >= 2:
                alpha[:, :, 1] = moment - alpha[:, :, 2:] @ np.arange(2, width, dtype=np.float64)
            alpha[:, :, 0] = beta - alpha[:, :, 1:].sum(axis=2)
        else:
            alpha[:, :, width - 1] = beta - alpha[:, :, : width - 1].sum(axis=2)
            arity = np.array([len(labels) for labels in inst.outcome_labels])
            alpha[:, arity < width, width - 1] = 0.0
        np.maximum(alpha, 0.0, out=alpha)  # the subtractions may leave −1e-17
        return alpha


def initial_belief(inst: CompiledInstance) -> Belief:
    alive = np.flatnonzero(inst.prior > 0)
    return Belief(inst, (), alive, inst.prior[alive])


def observe(inst: CompiledInstance, observations: Sequence[Observation]) -> Belief:
    """The belief after ``observations`` (already parsed). Raises ``InconsistentObservation``
    when they leave no hypothesis alive; nothing is mutated either way."""
    observations = tuple(observations)
    if inst.outcomes is not None:
        keep = inst.prior > 0
        for t, k in observations:
            keep &= inst.outcomes[:, t] == k
        alive = np.flatnonzero(keep)
        if alive.size == 0:
            raise InconsistentObservation(_inconsistent_message(inst, observations))
        return Belief(inst, observations, alive, inst.prior[alive])
    with np.errstate(divide="ignore"):
        log_post = np.log(inst.prior)
    for t, k in observations:
        log_post = log_post + inst.log_likelihood[:, t, k]
    top = log_post.max()
    if not np.isfinite(top):
        raise InconsistentObservation(_inconsistent_message(inst, observations))
    # Shift by the maximum before exponentiating: 500+ observations stay finite and exact.
    weight = np.exp(log_post - top)
    alive = np.flatnonzero(weight > 0)
    mass = weight[alive]
    return Belief(inst, observations, alive, mass / mass.sum())


def _inconsistent_message(inst: CompiledInstance, observations: Sequence[Observation]) -> str:
    t, k = observations[-1]
    return (
        f"observing '{inst.outcome_labels[t][k]}' on test '{inst.test_ids[t]}' contradicts every "
        "remaining hypothesis"
    )
