"""The statistics the policies read, by name: the only place that knows them all.

Every policy reads p(x) = P(X_t = x | x_A) and the class posterior b, which are always computed,
and declares the rest in ``Policy.statistics``:

* the reductions over classes of the masses α (:data:`~.belief.CLASS_REDUCTIONS`: Σ_i a²,
  Σ_i a log a, max_i a), computed together by belief.py's one pass over the alive cells;
* the statistics of :data:`STATISTICS`, each computed on request by its own function of the
  belief, and found in ``OutcomeStats.derived`` under its name.

A new statistic is one more row of :data:`STATISTICS` (and its function): neither the pass over α
nor the selection loop changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

import numpy as np

from .belief import CLASS_REDUCTIONS, Belief, OutcomeStats, reduce_over_classes
from .compiled import CompiledInstance
from .regions import PowerSums, power_sums, region_sets


def _no_reductions(inst: CompiledInstance) -> frozenset[str]:
    return frozenset()


@dataclass(frozen=True)
class Statistic:
    name: str
    # (belief, the reductions of α it requires or None when it requires none) -> its value
    compute: Callable[[Belief, OutcomeStats | None], Any]
    # The reductions of α (CLASS_REDUCTIONS) it reads, per instance.
    requires: Callable[[CompiledInstance], frozenset[str]] = _no_reductions
    # When no reduction of α is wanted, p(x) read off this statistic's value instead of a pass.
    outcome_probabilities: Callable[[Any], np.ndarray] | None = None


class HyperedgeSums(NamedTuple):
    """HEC's power sums q_j (j ≤ k) over V and V ∩ R_S for every set S some hypothesis accepts,
    with the hyperedge order k and the inclusion-exclusion signs (-1)^(|S|+1)."""

    sums: PowerSums
    order: int
    signs: np.ndarray


def _hyperedge_sums(belief: Belief, reductions: OutcomeStats | None) -> HyperedgeSums:
    inst = belief.instance
    return HyperedgeSums(power_sums(belief, region_sets(inst, True), inst.hyperedge_order),
                         inst.hyperedge_order, inst.decision_intersections[1])


def _region_sums(belief: Belief, reductions: OutcomeStats | None) -> PowerSums:
    """DiRECt's power sums q_j (j ≤ 2) over V and over V ∩ R_d for each decision d."""
    return power_sums(belief, region_sets(belief.instance, False), 2)


STATISTICS: dict[str, Statistic] = {
    statistic.name: statistic
    for statistic in (
        # p from the sums themselves: q_1 over V is Σ_h a(h) P(x | h, t).
        Statistic("hyperedge_sums", _hyperedge_sums, outcome_probabilities=lambda value: value.sums.after[0, 0]),
        Statistic("region_sums", _region_sums, outcome_probabilities=lambda value: value.after[0, 0]),
    )
}


def outcome_stats(belief: Belief, statistics: Iterable[str]) -> OutcomeStats:
    """p, b, the reductions of α and the registered statistics named in ``statistics``: one pass
    over α for the reductions (and for p, unless a registered statistic gives it), then each
    registered statistic by its function."""
    wanted = frozenset(statistics)
    unknown = wanted - CLASS_REDUCTIONS - STATISTICS.keys()
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)}")
    registered = [statistic for name, statistic in STATISTICS.items() if name in wanted]
    inst = belief.instance
    reductions = (wanted & CLASS_REDUCTIONS).union(*(statistic.requires(inst) for statistic in registered))
    givers = [statistic for statistic in registered if statistic.outcome_probabilities is not None]
    stats = reduce_over_classes(belief, reductions) if reductions or not givers else None
    derived = {statistic.name: statistic.compute(belief, stats) for statistic in registered}
    if stats is None:
        giver = givers[0]
        return OutcomeStats(p=giver.outcome_probabilities(derived[giver.name]),
                            b=belief.class_mass / belief.total_mass, derived=derived)
    return replace(stats, derived=derived) if derived else stats
