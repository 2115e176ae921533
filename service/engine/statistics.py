"""The statistics the policies read, by name: the only place that knows them all.

Every policy reads p(x) = P(X_t = x | x_A) and the class posterior b, which are always computed,
and declares the rest in ``Policy.statistics``:

* the reductions over classes of the masses α (:data:`~.belief.CLASS_REDUCTIONS`: Σ_i a²,
  Σ_i a log a, max_i a), computed together by alpha.py's one pass over the alive cells;
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

from .alpha import reduce_over_classes
from .belief import CLASS_REDUCTIONS, Belief, OutcomeStats, xlog2x
from .compiled import CompiledInstance, class_runs, sum_runs
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


class LikelihoodRatioSums(NamedTuple):
    """ECED's reductions, per test t and outcome x ((N, ℓ) arrays), with the likelihoods divided
    by the largest of their test, λ(h, t, x) = P(X_t = x | h) / max_x′ P(X_t = x′ | h), and
    a(h) = w(h)/M:

    * ``p`` = Σ_h a(h) P(X_t = x | h), the outcome distribution;
    * ``ratio_mass`` = Σ_h a(h) λ(h, t, x), and ``ratio_sum_sq`` = Σ_i (Σ_{h ∈ H_i} a(h) λ(h, t, x))²
      over the classes i: the weight of the edges between classes after discounting by λ is
      ½(ratio_mass² − ratio_sum_sq);
    * ``largest`` = max over every hypothesis θ of λ(θ, t, x) (a property of the instance).

    On a deterministic instance λ = P(X_t = x | h) ∈ {0, 1}: the masses α themselves."""

    p: np.ndarray
    ratio_mass: np.ndarray
    ratio_sum_sq: np.ndarray
    largest: np.ndarray


# Numbers per block of rows in the passes below: a block and what is computed from it stay in cache.
_RATIO_BLOCK_CELLS = 1 << 17
# A block's per-class sums are one GEMM with the (classes × rows) matrix of weights up to this many
# multiplications (classes × rows × numbers per row), else sum_runs: a few classes of many rows
# cost half of sum_runs's time that way (61 rows × 600 numbers in 3 classes, 15 against 30 µs),
# many short classes less by sum_runs (measured from 61 × 600 to 600 × 200).
_CLASS_PRODUCT_FLOPS = 1 << 20


class _RowBlock(NamedTuple):
    rows: slice | np.ndarray  # the block's rows of the instance
    weight: np.ndarray  # (r,) a(h) = w(h)/M
    run: np.ndarray  # (r,) each row's class, numbered by runs of rows (non-decreasing)
    alone: np.ndarray  # (r,) bool: the row is the only alive hypothesis of its class
    continues: bool  # the block's last class goes on in the next block


def _row_blocks(belief: Belief, block_cells: int):
    """The alive rows of a likelihood belief, in blocks of about ``block_cells`` numbers."""
    inst = belief.instance
    alive = belief.alive
    full = alive.size == inst.n_hypotheses
    runs = inst.class_runs if full else class_runs(inst.class_index[alive])  # the instance's: kept on it
    alone = (np.bincount(runs.run, minlength=runs.count) == 1)[runs.run]
    total = belief.total_mass
    weight = belief.mass if total == 1.0 else belief.mass / total
    block_rows = max(1, block_cells // (inst.n_tests * inst.max_outcomes))
    for start in range(0, alive.size, block_rows):
        stop = min(alive.size, start + block_rows)
        rows = slice(start, stop) if full else alive[start:stop]
        yield _RowBlock(rows, weight[start:stop], runs.run[start:stop], alone[start:stop],
                        stop < alive.size and runs.run[stop] == runs.run[stop - 1])


def _class_sums(values: np.ndarray, run: np.ndarray, weight: np.ndarray, carried: np.ndarray | None,
                continues: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Sums of the rows of ``values`` times ``weight`` per class, ``run`` numbering the rows'
    classes (non-decreasing): (the sums of the classes that end here, the running sum of the last
    class when it ``continues`` in the next block). ``carried``: the running sum of the first
    class, begun in the block before."""
    starts = run[1:] != run[:-1]
    count = int(np.count_nonzero(starts)) + 1
    if count * values.size <= _CLASS_PRODUCT_FLOPS:
        class_of_row = np.zeros(run.size, dtype=np.intp)
        np.cumsum(starts, out=class_of_row[1:])
        class_weights = np.zeros((count, run.size))
        class_weights[class_of_row, np.arange(run.size)] = weight
        per_class = class_weights @ values
    else:
        per_class = sum_runs(values, np.concatenate(([0], np.flatnonzero(starts) + 1)), weight=weight)
    if carried is not None:
        per_class[0] += carried
    if continues:
        return per_class[:-1], per_class[-1].copy()
    return per_class, None


def _likelihood_ratio_sums(belief: Belief, reductions: OutcomeStats | None) -> LikelihoodRatioSums:
    """One pass over the alive rows in blocks: p by a GEMV on the likelihoods, the block's ratios
    λ read from the instance's table (:attr:`~.compiled.CompiledInstance.likelihood_ratios`) or,
    past its size bound, computed as L / max_x L in a scratch buffer; then Σ a λ by a GEMV, and
    Σ_i (Σ_{h ∈ H_i} a λ)² by a GEMV of a² against λ² for the rows alone in their class, by
    per-class sums for the others (a class cut by a block's end carried into the next).
    O(|V|·N·ℓ) time, O(N·ℓ) memory beyond the block and the table."""
    inst = belief.instance
    if inst.outcomes is not None:
        return LikelihoodRatioSums(reductions.p, reductions.p, reductions.sum_sq, inst.largest_likelihood_ratios)
    n_tests, width = inst.n_tests, inst.max_outcomes
    by_outcome, table = inst.likelihood_by_outcome, inst.likelihood_ratios
    p, ratio_mass, ratio_sum_sq = (np.zeros(width * n_tests) for _ in range(3))
    buffer, carried, total = None, None, 0.0
    for block in _row_blocks(belief, _RATIO_BLOCK_CELLS):
        rows, w = len(block.weight), block.weight
        if buffer is None:
            buffer = np.empty((rows, width * n_tests))
        if table is None:
            cells = by_outcome[block.rows]
            p += w @ cells.reshape(rows, -1)
            ratios = np.divide(cells, cells.max(axis=1, keepdims=True), out=buffer[:rows].reshape(cells.shape))
        else:
            # Outcomes 0 … ℓ−2 only: the last follows from the total (below), and this GEMV reads
            # the likelihoods from memory, not from the cache as the division above leaves them.
            p[: -n_tests] += w @ by_outcome[block.rows, : width - 1].reshape(rows, -1)
            total += w.sum()
            ratios = table[block.rows]
        ratios = ratios.reshape(rows, -1)
        ratio_mass += w @ ratios
        together = ~block.alone
        if together.any():
            done, carried = _class_sums(ratios[together], block.run[together], w[together], carried,
                                        block.continues)
            ratio_sum_sq += np.einsum("cj,cj->j", done, done)
            w = np.where(block.alone, w, 0.0)
        # The rows alone in their class: Σ_h a² λ² (the table is read-only: its squares go to the buffer).
        ratio_sum_sq += (w * w) @ np.square(ratios, out=buffer[:rows])
    if table is not None:
        # Every row sums to 1 over the outcomes. The complement is round-off (±1e-17) where no
        # alive hypothesis gives the last outcome (a test of fewer outcomes, or a sure answer); there
        # Σ a λ is exactly 0 as well (λ > 0 exactly where P > 0), and so is p.
        last = total - p[: -n_tests].reshape(width - 1, n_tests).sum(axis=0)
        p[-n_tests:] = np.where(ratio_mass[-n_tests:] > 0, np.maximum(last, 0.0), 0.0)
    ratio_mass, ratio_sum_sq = (s.reshape(width, n_tests).T for s in (ratio_mass, ratio_sum_sq))
    # 0 ≤ Σ_i (Σ a λ)² ≤ (Σ a λ)² exactly; round-off must not make the discounted weight negative.
    np.clip(ratio_sum_sq, 0.0, ratio_mass * ratio_mass, out=ratio_sum_sq)
    return LikelihoodRatioSums(p.reshape(width, n_tests).T, ratio_mass, ratio_sum_sq, inst.largest_likelihood_ratios)


class EntropySums(NamedTuple):
    """infogain's reductions: ``p`` (N, ℓ) and ``sum_xlogx`` (N,) = Σ_x Σ_i a(i, t, x) log₂ a(i, t, x)."""

    p: np.ndarray
    sum_xlogx: np.ndarray


def _entropy_sums(belief: Belief, reductions: OutcomeStats | None) -> EntropySums:
    """One pass over the alive rows in blocks, no logarithm of the tensor for a hypothesis alone
    in its class: with a(h, x) = a(h)·P(x | h, t),

        Σ_x a(h, x) log₂ a(h, x) = a(h) log₂ a(h)·Σ_x P(x | h, t) − a(h)·H(X_t | h),

    a GEMV against the instance's table H(X_t | h) (:attr:`~.compiled.CompiledInstance.outcome_entropy`),
    Σ_x P(x | h, t) being 1 (compile_instance normalises every row). The other classes sum their
    weighted rows first (:func:`_class_sums`; a class cut by a block's end carried into the
    next) and take a log₂ a of the sums; their sums are also their part of p, so each row is read
    once. Deterministic instances: Σ_x of the reduction ``sum_xlogx`` of α."""
    inst = belief.instance
    if inst.outcomes is not None:
        return EntropySums(reductions.p, reductions.sum_xlogx.sum(axis=1))
    n_tests, width = inst.n_tests, inst.max_outcomes
    entropy = inst.outcome_entropy
    p, sum_xlogx = np.zeros(width * n_tests), np.zeros(n_tests)
    carried = None
    by_outcome = inst.likelihood_by_outcome
    for block in _row_blocks(belief, _RATIO_BLOCK_CELLS):
        rows, w = len(block.weight), block.weight
        flat = by_outcome[block.rows].reshape(rows, -1)
        alone_weight = w
        if not block.alone.all():
            together = ~block.alone
            everyone = together.all()  # no copies of the block then
            done, carried = _class_sums(flat if everyone else flat[together],
                                        block.run if everyone else block.run[together],
                                        w if everyone else w[together], carried, block.continues)
            p += done.sum(axis=0)
            sum_xlogx += xlog2x(done).sum(axis=0).reshape(width, n_tests).sum(axis=0)
            if everyone:
                continue
            alone_weight = np.where(block.alone, w, 0.0)
        p += alone_weight @ flat
        sum_xlogx += xlog2x(alone_weight).sum() - alone_weight @ entropy[block.rows]
    return EntropySums(p.reshape(width, n_tests).T, sum_xlogx)


def _ratio_reductions(inst: CompiledInstance) -> frozenset[str]:
    # On deterministic instances λ is the one-hot answer: the pass over α gives everything.
    return frozenset({"sum_sq"}) if inst.outcomes is not None else frozenset()


def _entropy_reductions(inst: CompiledInstance) -> frozenset[str]:
    # On deterministic instances the pass over α (bit planes and all) gives Σ_i a log a.
    return frozenset({"sum_xlogx"}) if inst.outcomes is not None else frozenset()


STATISTICS: dict[str, Statistic] = {
    statistic.name: statistic
    for statistic in (
        # p from the sums themselves: q_1 over V is Σ_h a(h) P(x | h, t).
        Statistic("hyperedge_sums", _hyperedge_sums, outcome_probabilities=lambda value: value.sums.after[0, 0]),
        Statistic("region_sums", _region_sums, outcome_probabilities=lambda value: value.after[0, 0]),
        Statistic("likelihood_ratio_sums", _likelihood_ratio_sums, requires=_ratio_reductions,
                  outcome_probabilities=lambda value: value.p),
        Statistic("entropy_sums", _entropy_sums, requires=_entropy_reductions,
                  outcome_probabilities=lambda value: value.p),
    )
}


def outcome_stats(belief: Belief, statistics: Iterable[str]) -> OutcomeStats:
    """p, b, the reductions of α and the registered statistics named in ``statistics``: one pass
    over α for the reductions (and for p, unless a registered statistic gives it), then each
    registered statistic by its function."""
    wanted = statistics if isinstance(statistics, frozenset) else frozenset(statistics)
    if wanted <= CLASS_REDUCTIONS:  # the usual step: one pass over α and nothing else
        return reduce_over_classes(belief, wanted)
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
