"""Sympson–Hetter exposure parameters for an item bank, by the usual iterative simulation.

Sympson & Hetter (1985) give item j, when the selection rule chooses it, with probability K_j.
With S_j "item j is chosen" and A_j "item j is given", P(A_j) = K_j · P(S_j): the coin of item j
is drawn only once j is chosen, so it is independent of S_j. The parameters are set by simulation
(Hetter & Sympson 1997; van der Linden 2003, JEBS 28(3), 249–265, describes the procedure and why
it can be slow and is not guaranteed to reach the target):

1. start with K_j = 1 for every item;
2. simulate examinees drawn from the prior with the current K and measure P(A_j);
   P(S_j) = P(A_j) / K_j;
3. set K_j = r_max / P(S_j) where P(S_j) > r_max, else K_j = 1; when fewer than n items (the
   fixed test length) have K_j = 1, the n largest K_j are set to 1, so that every examinee can
   still be given a whole test;
4. repeat from 2 for the given number of iterations.

Each K_j carries the sampling noise of the P(S_j) it was set from: on 1,000 examinees an item
held at 0.3 is measured within about 5 % of its rate, so K_j, and the item's rate on fresh
examinees, scatter by as much, and the largest of fifty such rates sits well above r_max. So the
first half of the iterations (which move the parameters most, as each tier of items is held back
in turn) set K from their own measure alone, and from the middle on P(S_j) is pooled over the
iterations since the middle: the items each gave over the number of examinees whose coin it
would have passed, Σ given / Σ (examinees · K_j). The parameters written are those the last
pooled estimate sets, and they are checked on examinees none of the iterations drew
(:attr:`ExposureCalibration.check`): what a user measures on fresh examinees.

The simulation is :func:`~service.evaluation.report.simulate`, the one ``edgecut evaluate`` runs
(runs through the engine's Sympson–Hetter rule, service/engine/item_bank.py), each iteration and
the check with their own examinees drawn from ``seed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from service.engine import CompiledInstance, StopRules, resolve_policy

from .report import Progress, items_given, simulate

FALSE_ALARM = 0.01  # how often a bank held at its target is reported as not reached


@dataclass(frozen=True)
class ExposureIteration:
    """One simulation of the procedure: the parameters it ran with, and what it measured."""

    exposure_parameters: np.ndarray  # (N,) K_j
    given_rate: np.ndarray  # (N,) P(A_j): the share of examinees given item j

    @property
    def top_rate(self) -> float:
        return float(self.given_rate.max())


@dataclass(frozen=True)
class ExposureCalibration:
    max_rate: float
    iterations: list[ExposureIteration]
    check: ExposureIteration  # the parameters set, run on examinees no iteration drew
    examinees: int

    @property
    def exposure_parameters(self) -> np.ndarray:
        return self.check.exposure_parameters

    @property
    def noise(self) -> float:
        """One standard error of a rate of ``max_rate`` measured on the check's examinees."""
        return float(np.sqrt(self.max_rate * (1 - self.max_rate) / self.examinees))

    @property
    def margin(self) -> float:
        """How far above ``max_rate`` the check's top rate may be from counting alone: were every
        held-back item given at exactly ``max_rate``, the largest of their counted rates would pass
        ``max_rate + margin`` in one check of a hundred (normal approximation, shared out over
        the items held back, Bonferroni's way)."""
        held = max(1, int(np.count_nonzero(self.exposure_parameters < 1)))
        return NormalDist().inv_cdf(1 - FALSE_ALARM / held) * self.noise

    @property
    def reached(self) -> bool:
        """Whether every item's rate on the check's examinees is within :attr:`margin` of
        ``max_rate``: held there, as far as that many examinees can tell."""
        return self.check.top_rate <= self.max_rate + self.margin


def calibrate_exposure(inst: CompiledInstance, max_rate: float, rules: StopRules = StopRules(), *,
                       policy: str | None = None, examinees: int = 1000, iterations: int = 10, seed: int = 0,
                       progress: Progress | None = None,
                       on_iteration: Callable[[ExposureIteration], None] | None = None) -> ExposureCalibration:
    """K_j for every item of ``inst`` (an item bank) such that simulated examinees, tested under
    ``rules`` (Sympson–Hetter on, with randomesque or the progressive method if the rules ask for
    it) by ``policy`` (default: the instance's), are each given any one item at a rate at most
    ``max_rate``.

    Iteration i draws its ``examinees`` from the prior with the seed (``seed``, i), the check
    with (``seed``, ``iterations``); the same arguments give the same parameters."""
    if inst.theta is None:
        raise ValueError("exposure calibration needs an item-bank instance ('item_bank')")
    if not 0 < max_rate <= 1 or examinees < 1 or iterations < 1:
        raise ValueError("max_rate must be in (0, 1], examinees and iterations at least 1")
    if rules.max_rate is not None:
        # Restricted control holds items back by the counts of earlier runs; the parameters would
        # be fitted to a sequence of examinees, not to the rate at which the rule chooses an item.
        raise ValueError("Sympson–Hetter parameters are calibrated without restricted exposure control (max_rate)")
    rules = rules._replace(sympson_hetter=True)
    chosen = resolve_policy(inst, policy, rules)

    def run(k: np.ndarray, i: int) -> ExposureIteration:
        trial = dataclasses.replace(inst, exposure_parameters=k)
        iteration_seed = int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
        truths = np.random.default_rng(iteration_seed).choice(inst.n_hypotheses, size=examinees, p=inst.prior)
        runs = simulate(trial, chosen, rules, iteration_seed, truths, progress=progress)
        return ExposureIteration(k, items_given(inst, runs) / examinees)

    k = np.ones(inst.n_tests)
    done: list[ExposureIteration] = []
    for i in range(iterations):
        done.append(run(k, i))
        if on_iteration is not None:
            on_iteration(done[-1])
        pooled = done[min(i, iterations // 2):]
        chosen_rate = sum(step.given_rate for step in pooled) / sum(step.exposure_parameters for step in pooled)
        k = next_parameters(chosen_rate, max_rate, rules.max_tests)
    return ExposureCalibration(max_rate, done, run(k, iterations), examinees)


def next_parameters(chosen_rate: np.ndarray, max_rate: float, test_length: int | None) -> np.ndarray:
    """Step 3: K_j = min(1, r_max / P(S_j)), and at least ``test_length`` items at 1. P(S_j) is a
    probability: the estimate is clipped to 1, which keeps K_j ≥ r_max."""
    chosen_rate = np.minimum(chosen_rate, 1.0)
    with np.errstate(divide="ignore"):
        new = np.where(chosen_rate > max_rate, max_rate / chosen_rate, 1.0)
    if test_length is not None and np.count_nonzero(new == 1.0) < test_length:
        new[np.argsort(-new, kind="stable")[:test_length]] = 1.0
    return new
