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
4. repeat from 2 until the largest P(A_j) is at most r_max, or the iterations run out; then the
   parameters of the iteration with the lowest largest P(A_j) are the calibration.

The largest of many measured rates sits above the rates themselves (for 300 items capped at 0.3
and 1,000 examinees, by about two standard errors, 0.03), so a bank that must stay at r_max on
fresh examinees is calibrated to a target somewhat below it (docs/item-banks.md measures this).

The simulation is :func:`~service.evaluation.report.simulate`, the one ``edgecut evaluate`` runs
(runs through the engine's Sympson–Hetter rule, service/engine/item_bank.py), each iteration
with its own examinees drawn from ``seed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.engine import CompiledInstance, StopRules, resolve_policy

from .report import Progress, items_given, simulate


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

    @property
    def best(self) -> ExposureIteration:
        """The iteration with the lowest top rate (the last, when it reached ``max_rate``): past the
        first few, the top rate moves with sampling noise as the parameters settle."""
        return min(reversed(self.iterations), key=lambda step: step.top_rate)

    @property
    def exposure_parameters(self) -> np.ndarray:
        return self.best.exposure_parameters

    @property
    def reached(self) -> bool:
        return self.best.top_rate <= self.max_rate


def calibrate_exposure(inst: CompiledInstance, max_rate: float, rules: StopRules = StopRules(), *,
                       policy: str | None = None, examinees: int = 1000, iterations: int = 10, seed: int = 0,
                       progress: Progress | None = None,
                       on_iteration: Callable[[ExposureIteration], None] | None = None) -> ExposureCalibration:
    """K_j for every item of ``inst`` (an item bank) such that simulated examinees, tested under
    ``rules`` (Sympson–Hetter on, with randomesque if the rules ask for it) by ``policy`` (default:
    the instance's), are each given any one item at a rate at most ``max_rate``.

    Iteration i draws its ``examinees`` from the prior with the seed (``seed``, i); the same
    arguments give the same parameters."""
    if inst.theta is None:
        raise ValueError("exposure calibration needs an item-bank instance ('item_bank')")
    if not 0 < max_rate <= 1 or examinees < 1 or iterations < 1:
        raise ValueError("max_rate must be in (0, 1], examinees and iterations at least 1")
    rules = rules._replace(sympson_hetter=True)
    chosen = resolve_policy(inst, policy, rules)
    k = np.ones(inst.n_tests)
    done: list[ExposureIteration] = []
    for i in range(iterations):
        trial = dataclasses.replace(inst, exposure_parameters=k)
        iteration_seed = int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
        truths = np.random.default_rng(iteration_seed).choice(inst.n_hypotheses, size=examinees, p=inst.prior)
        runs = simulate(trial, chosen, rules, iteration_seed, truths, progress=progress)
        done.append(ExposureIteration(k, items_given(inst, runs) / examinees))
        if on_iteration is not None:
            on_iteration(done[-1])
        if done[-1].top_rate <= max_rate:
            break
        if i + 1 < iterations:
            k = next_parameters(k, done[-1].given_rate, max_rate, rules.max_tests)
    return ExposureCalibration(max_rate, done)


def next_parameters(k: np.ndarray, given_rate: np.ndarray, max_rate: float, test_length: int | None) -> np.ndarray:
    """Step 3: K_j = min(1, r_max / P(S_j)) with P(S_j) = P(A_j) / K_j, and at least ``test_length``
    items at 1. P(S_j) is a probability: the estimate is clipped to 1, which keeps K_j ≥ r_max."""
    chosen_rate = np.minimum(given_rate / k, 1.0)
    with np.errstate(divide="ignore"):
        new = np.where(chosen_rate > max_rate, max_rate / chosen_rate, 1.0)
    if test_length is not None and np.count_nonzero(new == 1.0) < test_length:
        new[np.argsort(-new, kind="stable")[:test_length]] = 1.0
    return new
