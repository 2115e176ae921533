"""Simulated subjects for a likelihood instance: the paper's accuracy-vs-tests experiment.

A subject is a true hypothesis drawn as the paper draws it (a class uniformly, then one of its
hypotheses uniformly); it answers each test by sampling P(x | h, t). After each answer we record
whether the MAP class, argmax_i P(H_i | x_A), is the true class.

Reproducibility: every random choice of subject ``k`` comes from generators seeded by
``(seed, study, k)``, never from a shared stream, so the results do not depend on how subjects
are spread over processes. The same subjects (true hypothesis and answer stream) face every
policy: a paired comparison, with less variance in the differences between policies.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from service import engine

# What to do when the engine finds no test with positive gain before the test budget is spent.
#   stop:   the engine's rule; the subject's classification is frozen from then on.
#   first:  keep asking the earliest unrun test, as an argmax over all-zero scores would.
#   random: keep asking a seeded uniformly random unrun test.
WHEN_UNINFORMATIVE = ("stop", "first", "random")


@dataclass(frozen=True)
class SubjectRun:
    true_class: int
    # MAP class before any test and after each of ``tests`` answers (carried forward after a stop).
    map_classes: np.ndarray  # (tests + 1,) int
    tests_asked: int  # chosen by the policy itself (not by the fallback)
    stop_reason: str | None  # the engine's reason when it stopped before the budget, else None


def draw_subject(inst: engine.CompiledInstance, seed: int, study: int, subject: int) -> tuple[int, int]:
    """(true hypothesis index, the random policy's integer seed) of subject ``subject``."""
    rng = np.random.default_rng([seed, study, subject])
    true_class = int(rng.integers(inst.n_classes))
    members = np.flatnonzero(inst.class_index == true_class)
    # Uniform within the class, as the paper samples "a model, then parameter values".
    hypothesis = int(rng.choice(members))
    policy_seed = int(np.random.SeedSequence([seed, study, subject]).generate_state(1)[0])
    return hypothesis, policy_seed


def run_subject(
    inst: engine.CompiledInstance,
    policy_name: str,
    tests: int,
    seed: int,
    study: int,
    subject: int,
    when_uninformative: str = "stop",
) -> SubjectRun:
    hypothesis, policy_seed = draw_subject(inst, seed, study, subject)
    policy = engine.resolve_policy(inst, policy_name)
    answers = np.random.default_rng([seed, study, subject, 1])
    # max_tests only: no confidence stop, so every subject is asked the full budget.
    rules = engine.StopRules(max_tests=tests)
    run = engine.run_policy(inst, hypothesis, policy, rules, seed=policy_seed, rng=answers)
    map_classes = list(run.map_classes)
    observations = list(run.observations)
    stop_reason = None if run.stop_reason == engine.StopReason.MAX_TESTS else str(run.stop_reason)
    tests_asked = len(observations)
    if stop_reason == engine.StopReason.NO_INFORMATIVE_TEST and when_uninformative != "stop":
        fallback = np.random.default_rng([policy_seed, 2])
        while len(observations) < tests:
            decision = engine.decide(engine.observe(inst, observations), policy, rules, policy_seed)
            if decision.done and decision.stop_reason != engine.StopReason.NO_INFORMATIVE_TEST:
                break
            if decision.done:
                unrun = np.flatnonzero(~decision.belief.run_tests)
                t = int(unrun[0] if when_uninformative == "first" else fallback.choice(unrun))
            else:
                t = decision.next_test
            row = inst.likelihood[hypothesis, t]
            observations.append((t, int(answers.choice(row.size, p=row))))
            map_classes.append(int(np.argmax(engine.observe(inst, observations).class_mass)))
    # After a stop the classification no longer changes: carry the last MAP class forward.
    map_classes += [map_classes[-1]] * (tests + 1 - len(map_classes))
    return SubjectRun(int(inst.class_index[hypothesis]), np.array(map_classes), tests_asked, stop_reason)


@dataclass(frozen=True)
class Curve:
    """Accuracy after 0..tests answers, over ``subjects`` subjects, with 95% Wilson intervals."""

    policy: str
    correct: np.ndarray  # (tests + 1,) number of subjects whose MAP class is the true one
    subjects: int
    stop_reasons: Counter
    mean_tests_asked: float

    @property
    def accuracy(self) -> np.ndarray:
        return self.correct / self.subjects

    @property
    def interval(self) -> tuple[np.ndarray, np.ndarray]:
        return wilson_interval(self.correct, self.subjects)


def curve(policy: str, runs: list[SubjectRun]) -> Curve:
    correct = np.sum([r.map_classes == r.true_class for r in runs], axis=0)
    return Curve(
        policy,
        correct,
        len(runs),
        Counter(r.stop_reason for r in runs if r.stop_reason is not None),
        float(np.mean([r.tests_asked for r in runs])),
    )


def wilson_interval(successes: np.ndarray, n: int, z: float = 1.959963984540054) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval for a binomial proportion (95% by default): unlike the normal
    approximation it stays inside [0, 1] and is not degenerate at 0% or 100% accuracy."""
    successes = np.asarray(successes, dtype=float)
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return np.maximum(centre - half, 0.0), np.minimum(centre + half, 1.0)


def paired_difference_interval(a: list[SubjectRun], b: list[SubjectRun], after: int,
                               z: float = 1.959963984540054) -> tuple[float, float, float]:
    """Mean and 95% normal interval of accuracy(a) − accuracy(b) after ``after`` answers, over the
    same subjects (paired: each subject contributes the difference of two 0/1 outcomes)."""
    diff = np.array([int(x.map_classes[after] == x.true_class) - int(y.map_classes[after] == y.true_class)
                     for x, y in zip(a, b, strict=True)], dtype=float)
    mean = float(diff.mean())
    half = z * float(diff.std(ddof=1)) / math.sqrt(len(diff)) if len(diff) > 1 else math.inf
    return mean, mean - half, mean + half


def map_subjects(run: Callable[[Any], Any], tasks: Iterable[Any], jobs: int, initializer: Callable[..., None],
                 initargs: tuple = (), chunksize: int = 8) -> Iterator[Any]:
    """``run`` over ``tasks``, results in task order: in this process when ``jobs`` ≤ 1, else over
    ``jobs`` processes. ``initializer(*initargs)`` runs once per process, so what it loads (the
    compiled instances) reaches each worker once, not once per task."""
    if jobs <= 1:
        initializer(*initargs)
        yield from map(run, tasks)
        return
    with ProcessPoolExecutor(max_workers=jobs, initializer=initializer, initargs=initargs) as pool:
        yield from pool.map(run, tasks, chunksize=chunksize)
