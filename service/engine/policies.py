"""Selection policies: each scores every test at once from reductions of the masses α(i, t, x).

A policy is one small object registered by name in :data:`POLICIES` (the only place that knows
them all). ``gain`` returns the expected benefit of each test in *normalised* units (masses
divided by the current total ``M``), so one zero-tolerance serves every policy; ``score_power``
says how the paper's own units scale with ``M`` (Δ_EC is a sum of products P(h)P(h′) of the
unnormalised prior, so it scales with M²; GBS's version-space mass with M).

Notation, per test t: a(i, x) = α(i, t, x)/M, b(i) = Σ_x a(i, x) (the class posterior),
p(x) = Σ_i a(i, x) (the outcome distribution). No gain needs a(i, x) itself, only p, b and the
sums over classes Σ_i a², Σ_i a log a, max_i a (:class:`~.belief.OutcomeStats`); ``statistics``
names those a policy reads beyond p and b, so :meth:`~.belief.Belief.outcome_stats` computes only
them (O(|V|·N) time, O(N·ℓ) memory even when every hypothesis is its own class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .belief import OutcomeStats, xlog2x

GainFunction = Callable[[OutcomeStats], np.ndarray]


@dataclass(frozen=True)
class Policy:
    name: str
    gain: GainFunction  # OutcomeStats -> (N,) expected benefit, normalised units
    score_power: int = 0
    deterministic_only: bool = False
    summary: str = ""
    statistics: frozenset[str] = frozenset()  # read by gain beyond p and b


def ec2_gain(stats: OutcomeStats) -> np.ndarray:
    """Δ_EC(t) = w(E ∩ V) − Σ_x p(x) w(E ∩ V(x)), with w(E') = ½[(Σ_i a_i)² − Σ_i a_i²]
    (the paper's fast implementation: no O(n²) edge list)."""
    b, p = stats.b, stats.p
    remaining = 0.5 * (1.0 - np.dot(b, b))
    after = 0.5 * (p * p - stats.sum_sq)  # w(E ∩ V(x)) per (t, x)
    return remaining - (p * after).sum(axis=1)


def effecxtive_gain(stats: OutcomeStats) -> np.ndarray:
    """Δ_Eff(t) = Σ_x p(x) Σ_i P(i | x)² − Σ_i b(i)² on class posteriors (Rényi-2 gain)."""
    p = stats.p
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.where(p > 0, stats.sum_sq / np.where(p > 0, p, 1.0), 0.0).sum(axis=1)
    return expected - np.dot(stats.b, stats.b)


def gbs_gain(stats: OutcomeStats) -> np.ndarray:
    """Δ_GBS(t) = P(V) − Σ_x P(x) P(V ∩ {X_t = x}) = M(1 − Σ_x p(x)²).

    On likelihood instances the version-space mass becomes the posterior mass each outcome
    keeps, Σ_h P(h) P(x | h) = p(x), giving the same formula (docs/policies.md)."""
    p = stats.p
    return 1.0 - (p * p).sum(axis=1)


def infogain_gain(stats: OutcomeStats) -> np.ndarray:
    """H(class) − E_x H(class | x) in bits = H(b) + Σ_{i,x} a log a − Σ_x p log p."""
    class_entropy = -xlog2x(stats.b).sum()
    return class_entropy + stats.sum_xlogx.sum(axis=1) - xlog2x(stats.p).sum(axis=1)


def voi_gain(stats: OutcomeStats) -> np.ndarray:
    """Value of information under 0–1 loss over classes: E_x max_i P(i | x) − max_i b(i)."""
    return stats.max.sum(axis=1) - stats.b.max()


def uncertainty_gain(stats: OutcomeStats) -> np.ndarray:
    """Shannon entropy (bits) of the test's outcome distribution p."""
    return -xlog2x(stats.p).sum(axis=1)


def random_gain(stats: OutcomeStats) -> np.ndarray:
    """1 for every test whose outcome is still uncertain; the choice among them is seeded."""
    return ((stats.p > 1e-12).sum(axis=1) >= 2).astype(float)


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy("ec2", ec2_gain, score_power=2, deterministic_only=True,
               summary="EC²: expected weight of edges cut between classes, per unit cost",
               statistics=frozenset({"sum_sq"})),
        Policy("effecxtive", effecxtive_gain,
               summary="EffECXtive: expected gain in Σ P(class)² (Rényi-2), per unit cost",
               statistics=frozenset({"sum_sq"})),
        Policy("gbs", gbs_gain, score_power=1,
               summary="generalised binary search: expected reduction of version-space mass"),
        Policy("infogain", infogain_gain,
               summary="information gain (bits) about the class",
               statistics=frozenset({"sum_xlogx"})),
        Policy("voi", voi_gain,
               summary="value of information under 0-1 loss over classes",
               statistics=frozenset({"max"})),
        Policy("uncertainty", uncertainty_gain,
               summary="uncertainty sampling: entropy of the test's outcome"),
        Policy("random", random_gain,
               summary="a uniformly random informative test (seeded)"),
    )
}
