"""The pass over the alive cells that accumulates the masses α(i, t, x) = Σ_{h ∈ H_i ∩ V}
w(h)·P(X_t = x | h) and reduces them over classes into what the policies read
(:func:`reduce_over_classes` → :class:`~.belief.OutcomeStats`): whole and vectorised for small
beliefs, streamed in blocks otherwise (bit planes for singleton classes, cast-and-GEMV blocks,
per-class sums for big classes, two threads for the biggest, the second from
service/engine/helper_thread.py). The paths share the block constants here and are checked
against each other by switching them (tests/test_engine_paths.py)."""

from __future__ import annotations

from functools import cache

import numpy as np

from .belief import Belief, OutcomeStats, xlog2x
from .compiled import (DENSE_CELLS, PADDED_GROWTH, PADDED_RUNS, CompiledInstance, class_runs, padded_by_runs,
                       pads_runs, sum_runs)
from .helper_thread import helper

# Cells (rows × tests) per block when accumulating α. Two reasons, both measured in bench/engine.py:
# the block's float64 image stays in cache, and it stays under OpenBLAS's threshold for threading
# a GEMV (about 4·10⁵ cells): on this shared 2-core machine a threaded GEMV waits for the busy
# core and one step took 150 ms instead of 3 ms with 512 × 1000 blocks.
_BLOCK_CELLS = 1 << 17
# Below this many cells (rows × tests) a class is "small": a per-class GEMV loop would cost more
# in Python overhead than it saves, so small classes are reduced many at a time (see
# Belief.outcome_stats). Singletons are always small.
_SMALL_CLASS_CELLS = 1 << 12
# A batch of big classes with at least this many alive cells is split in two at a class boundary
# and the halves accumulated on two threads (numpy releases the GIL in its casts and in BLAS):
# about half the time on an idle 2-core machine at (1e5, 1e3), bit-identical results. Smaller
# steps are not worth the hand-off.
_PARALLEL_CELLS = 1 << 23
# At most this many alive numbers (rows × tests × outcomes), α is built whole, (classes, N, ℓ), by
# one vectorised sum per class: a handful of numpy calls in all, where the streamed pass pays
# ~0.1 ms of fixed cost (run detection, blocks, complements) that dominates small steps. Its
# classes' sums: rows padded to the longest class (compiled.py says when), else one GEMM with the
# matrix of class weights when that costs at most _DENSE_FLOPS multiplications (classes × rows ×
# N × ℓ), else a per-class np.add.reduceat.
_DENSE_CELLS = DENSE_CELLS
_PADDED_RUNS = PADDED_RUNS
_PADDED_GROWTH = PADDED_GROWTH
_DENSE_FLOPS = 1 << 22
# The bit-plane pass (singleton classes, _Sums.add_bit_planes) looks up at most this many bytes of
# a plane per block of groups: the block's tables and looked-up entries stay in the L2 cache.
_LOOKUP_BLOCK = 1 << 16
# It reads a byte per group of eight hypotheses whether or not all eight are alive; with fewer
# than this many alive per group it touches (a version space thinned out by answers) the
# cast-and-GEMV blocks, which read alive rows only, cost less.
_MIN_GROUP_FILL = 3.5


class _Sums:
    """Running reductions over classes of a(i, t, x), fed class by class or block by block."""

    def __init__(self, n_tests: int, width: int, wanted: frozenset[str]):
        self.width = width
        self.p = np.zeros((n_tests, width))
        self.sum_sq = np.zeros((n_tests, width)) if "sum_sq" in wanted else None
        self.sum_xlogx = np.zeros((n_tests, width)) if "sum_xlogx" in wanted else None
        self.max = np.zeros((n_tests, width)) if "max" in wanted else None
        # Singletons' linear sums Σ_h u(h)·[X_ht = x] for the weights u = w, w², w log₂ w, kept
        # apart until the end so outcomes 0 and 1 come once from totals and first moments.
        self.linear_weights = [s for s in ("p", "sum_sq", "sum_xlogx") if getattr(self, s) is not None]
        self.linear = np.zeros((len(self.linear_weights), n_tests, width))
        # Σ_h u(h)·X_ht, from which outcome 1 follows at the end (cast-and-GEMV blocks only).
        self.moment: np.ndarray | None = None
        self.total = np.zeros((len(self.linear_weights), 1))
        self.buffers: dict[str, np.ndarray] = {}
        self.has_singletons = False
        # Likelihood blocks' statistics as they come, outcome-major (ℓ·N,): folded into the
        # (N, ℓ) arrays once at the end (a strided add per block cost ~10 µs, 3 ms a step at
        # 10⁴ × 10³).
        self.outcome_major: dict[str, np.ndarray] = {}

    def add_outcome(self, k: int, a: np.ndarray, with_p: bool = True) -> None:
        """Fold in a(i, ·, k) for a block of classes i: ``a`` is (classes, N) (p too unless the
        caller added it another way)."""
        if with_p:
            self.p[:, k] += a.sum(axis=0)
        if self.sum_sq is not None:
            self.sum_sq[:, k] += np.einsum("cn,cn->n", a, a)
        if self.sum_xlogx is not None:
            self.sum_xlogx[:, k] += xlog2x(a).sum(axis=0)
        if self.max is not None:
            np.maximum(self.max[:, k], a.max(axis=0), out=self.max[:, k])

    def add_classes(self, a: np.ndarray) -> None:
        """Fold in a(i, ·, ·) for a batch of classes i: ``a`` is (classes, N, ℓ)."""
        self.p += a.sum(axis=0)
        if self.sum_sq is not None:
            self.sum_sq += np.einsum("cnk,cnk->nk", a, a)
        if self.sum_xlogx is not None:
            self.sum_xlogx += xlog2x(a).sum(axis=0)
        if self.max is not None:
            np.maximum(self.max, a.max(axis=0), out=self.max)

    def linear_weight_rows(self, weight: np.ndarray) -> list[np.ndarray]:
        rows = {"p": weight, "sum_sq": weight * weight}
        if self.sum_xlogx is not None:
            rows["sum_xlogx"] = weight * np.log2(weight)
        return [rows[s] for s in self.linear_weights]

    def buffer(self, shape: tuple[int, int], dtype=np.float64) -> np.ndarray:
        """A reused block-sized scratch array: a fresh 1 MB temporary per block is served by
        mmap and page-faulted anew each time (measured 6× slower than the GEMVs themselves)."""
        key = np.dtype(dtype).char
        held = self.buffers.get(key)
        if held is None or held.shape[0] < shape[0] or held.shape[1] != shape[1]:
            held = self.buffers[key] = np.empty(shape, dtype)
        return held[: shape[0]]

    def add_singletons(self, cells: np.ndarray, weight: np.ndarray) -> None:
        """Deterministic singleton classes: a(h, t, x) = w(h)·[X_ht = x], so each statistic is
        a weighted count; outcomes ≥ 2 by comparison, 1 and 0 later from moments and totals.
        One float image of the block serves a GEMV per weight (w, w², w log w): a GEMM with
        those few rows is slower in OpenBLAS than the separate GEMVs."""
        weights = self.linear_weight_rows(weight)
        image = self.buffer(cells.shape)
        if self.width > 2 or self.max is not None:
            mask = self.buffer(cells.shape, bool)
        for k in range(2, self.width):
            np.equal(cells, k, out=mask)
            np.copyto(image, mask)
            for position, u in enumerate(weights):
                self.linear[position, :, k] += u @ image
        if self.width >= 2:
            if self.moment is None:
                self.moment = np.zeros(self.linear.shape[:2])
            np.copyto(image, cells)
            for position, u in enumerate(weights):
                self.moment[position] += u @ image
        self.total += np.array([[u.sum()] for u in weights])
        self.has_singletons = True
        if self.max is not None:
            column = weight[:, None]
            for k in range(self.width):
                np.equal(cells, k, out=mask)
                np.multiply(mask, column, out=image)
                np.maximum(self.max[:, k], image.max(axis=0), out=self.max[:, k])

    def add_bit_planes(self, planes: np.ndarray, alive: np.ndarray, weight: np.ndarray, n_hypotheses: int) -> None:
        """Deterministic singleton classes, all at once from the answers' bit planes
        (CompiledInstance.outcome_bits): each statistic is Σ_h u(h)·[X_ht = k] for a weight
        u ∈ {w, w², w log₂ w}, and bit j of byte (k − 1, g, t) is [X_{8g+j, t} = k]. So the sum
        over the eight hypotheses of group g is entry (byte) of a 256-entry table of the subset
        sums of their weights (the "Four Russians" trick): one lookup per eight cells, all the
        weights at once, instead of a cast and a multiply-add per cell and weight. Groups with
        no alive hypothesis are skipped; dead ones weigh 0. Outcome 0 comes from the totals."""
        weights = self.linear_weight_rows(weight)
        n_weights = len(weights)
        group = alive >> 3
        if alive.size == n_hypotheses:  # alive is 0 … n−1
            touched, slots = None, alive
        else:
            starts = np.empty(alive.size, dtype=bool)
            starts[0] = True
            np.not_equal(group[1:], group[:-1], out=starts[1:])
            touched = group[starts]
            slots = 8 * (np.cumsum(starts) - 1) + (alive & 7)
        n_groups = planes.shape[1] if touched is None else touched.size
        member_weights = np.zeros((n_groups, 8, n_weights))
        for position, u in enumerate(weights):
            member_weights.reshape(-1, n_weights)[slots, position] = u
        member_weights = member_weights.reshape(n_groups, 8 * n_weights)
        subset_sums = _subset_sums(n_weights)
        n_tests = planes.shape[2]
        # A block's table and looked-up entries stay in the L2 cache: built whole, the tables
        # (256 numbers per weight and group) would go to memory and back. At most 256 groups, so
        # that g fits in a byte (below).
        block = max(1, min(256, _LOOKUP_BLOCK // max(n_tests, 256)))
        table = np.empty((block, 256 * n_weights))
        # Entry 256·g + byte of the block's table, with no arithmetic per lookup: the byte and g
        # are the low and high bytes of a little-endian uint16 (np.take widens it to an index).
        index_bytes = np.empty((block, n_tests, 2), dtype=np.uint8)
        index_bytes[:, :, 1] = np.arange(block, dtype=np.uint8)[:, None]
        index = index_bytes.view("<u2")[:, :, 0]
        looked_up = np.empty((block, n_tests, n_weights))
        ones = np.ones(block)
        counts = np.zeros((len(planes), n_tests * n_weights))
        for start in range(0, n_groups, block):
            stop = min(n_groups, start + block)
            rows = stop - start
            # Row g: entry (byte, s) = Σ_{j: bit j of byte} u_s(8g + j).
            np.matmul(member_weights[start:stop], subset_sums, out=table[:rows])
            for k, plane in enumerate(planes):
                index_bytes[:rows, :, 0] = plane[start:stop] if touched is None else plane[touched[start:stop]]
                # Every index is in range by construction: "clip" skips the per-element check.
                np.take(table.reshape(-1, n_weights), index[:rows], axis=0, out=looked_up[:rows], mode="clip")
                counts[k] += ones[:rows] @ looked_up[:rows].reshape(rows, -1)
        self.linear[:, :, 1:] += counts.reshape(len(planes), n_tests, n_weights).transpose(2, 1, 0)
        self.total += np.array([[u.sum()] for u in weights])
        self.has_singletons = True

    def outcome_major_sum(self, name: str) -> np.ndarray:
        """The outcome-major accumulator of statistic ``name`` (see ``outcome_major``)."""
        flat = self.outcome_major.get(name)
        if flat is None:
            flat = self.outcome_major[name] = np.zeros(self.p.size)
        return flat

    def finish(self, b: np.ndarray) -> OutcomeStats:
        for name, flat in self.outcome_major.items():
            target, folded = getattr(self, name), flat.reshape(self.width, -1).T
            if name == "max":
                np.maximum(target, folded, out=target)
            else:
                target += folded
        if self.has_singletons:
            linear = self.linear
            if self.moment is not None:
                linear[:, :, 1] = self.moment - linear[:, :, 2:] @ np.arange(2, self.width, dtype=np.float64)
            linear[:, :, 0] = self.total - linear[:, :, 1:].sum(axis=2)
            for position, name in enumerate(self.linear_weights):
                target = getattr(self, name)
                # The complements may leave ±1e-17 where the exact value is 0.
                if name == "sum_xlogx":
                    target += np.minimum(linear[position], 0.0)
                else:
                    target += np.maximum(linear[position], 0.0)
        # Hold the sums to the bounds they obey exactly, 0 ≤ Σ_i a² ≤ p² and Σ_i a log a ≤ p log p
        # (every a(i, x) ≤ p(x)): where p(x) is a complement's round-off (1e-17 instead of 0), its
        # partner sums are round-off too, and an unbounded ratio Σa²/p would be noise of order 1.
        if self.sum_sq is not None:
            np.clip(self.sum_sq, 0.0, self.p * self.p, out=self.sum_sq)
        if self.sum_xlogx is not None:
            np.minimum(self.sum_xlogx, xlog2x(self.p), out=self.sum_xlogx)
        return OutcomeStats(self.p, b, self.sum_sq, self.sum_xlogx, self.max)


def reduce_over_classes(belief: Belief, wanted: frozenset[str]) -> OutcomeStats:
    """p, b and the reductions of α over classes in ``wanted`` (:data:`CLASS_REDUCTIONS`), in one
    pass over the alive cells (:meth:`Belief.outcome_stats` says how)."""
    inst = belief.instance
    n_tests, width = inst.n_tests, inst.max_outcomes
    total = belief.total_mass
    weight, b = (belief.mass, belief.class_mass) if total == 1.0 else (belief.mass / total, belief.class_mass / total)
    if len(belief.alive) * n_tests * width <= _DENSE_CELLS:
        return _dense_stats(belief, wanted, weight, b)
    sums = _Sums(n_tests, width, wanted)
    deterministic = inst.outcomes is not None
    by_outcome = None if deterministic else inst.likelihood_by_outcome
    full = len(belief.alive) == inst.n_hypotheses

    def rows_of(start: int, stop: int):
        return slice(start, stop) if full else belief.alive[start:stop]

    classes = inst.class_index[belief.alive]
    bounds = np.flatnonzero(np.diff(classes)) + 1
    if deterministic and bounds.size + 1 == classes.size and "max" not in wanted and width >= 2:
        alive = belief.alive
        groups = 1 + np.count_nonzero((alive[1:] >> 3) != (alive[:-1] >> 3))
        if alive.size >= _MIN_GROUP_FILL * groups and inst.outcome_bits is not None:
            sums.add_bit_planes(inst.outcome_bits, alive, weight, inst.n_hypotheses)
            return sums.finish(b)
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(classes)]))
    sizes = ends - starts
    small = (sizes == 1) | (sizes * n_tests < _SMALL_CLASS_CELLS)
    block_rows = max(1, _BLOCK_CELLS // n_tests)
    # Blocks of small likelihood classes take all ℓ outcomes of a row at once.
    small_rows = block_rows if deterministic else max(1, _BLOCK_CELLS // (n_tests * width))
    kind_changes = np.flatnonzero(small[1:] != small[:-1]) + 1 if small.any() else np.empty(0, np.intp)
    # Big classes' a(i, ·, ·) are folded in batches of ≤ _BLOCK_CELLS numbers: one vectorised
    # fold instead of a few small numpy calls per class.
    batch_classes = max(1, _BLOCK_CELLS // (n_tests * width))
    for first, last in zip(np.concatenate(([0], kind_changes)), np.concatenate((kind_changes, [len(starts)]))):
        if not small[first]:
            for batch in range(first, last, batch_classes):
                chosen = slice(batch, min(last, batch + batch_classes))
                sums.add_classes(_classes_alpha_split(inst, rows_of, weight, starts[chosen], ends[chosen],
                                                      block_rows, width, None if deterministic else inst.arity))
            continue
        boundaries = np.concatenate((starts[first:last], [ends[last - 1]]))
        i = 0
        while i < len(boundaries) - 1:
            # The next block: as many whole classes as fit in small_rows rows (at least one).
            j = max(i + 1, int(np.searchsorted(boundaries, boundaries[i] + small_rows, side="right")) - 1)
            start, stop = int(boundaries[i]), int(boundaries[j])
            rows, w = rows_of(start, stop), weight[start:stop]
            if deterministic and j - i == stop - start:
                sums.add_singletons(inst.outcomes[rows], w)
            elif deterministic:
                cells, column, offsets = inst.outcomes[rows], w[:, None], boundaries[i:j] - start
                for k in range(width):
                    sums.add_outcome(k, sum_runs(column * (cells == k), offsets))
            else:
                _add_likelihood_block(sums, by_outcome, rows, w, boundaries[i:j] - start, j - i == stop - start)
            i = j
    return sums.finish(b)


@cache
def _subset_sums(n_weights: int) -> np.ndarray:
    """(8·m, 256·m): maps a group's weights, laid out (hypothesis j, weight s), to its table of
    subset sums, laid out (byte, weight s): entry ((j, s), (byte, s)) = bit j of byte."""
    bits = (np.arange(256)[None, :] >> np.arange(8)[:, None]) & 1
    return np.einsum("jv,st->jsvt", bits, np.eye(n_weights)).reshape(8 * n_weights, 256 * n_weights)


def _dense_stats(belief: Belief, wanted: frozenset[str], weight: np.ndarray, b: np.ndarray) -> OutcomeStats:
    """Small beliefs: α as a whole (classes, ℓ, N) array, then each statistic is one reduction over
    its first axis. A(h, x, t) = P(X_t = x | h) (one-hot answers, or the likelihood rows);
    a(i, x, t) = Σ_{h ∈ H_i ∩ V} w(h) A(h, x, t), the classes being runs of rows:

    * singleton classes: the weights times A;
    * short runs (the longest ≤ 1/_PADDED_RUNS of the rows, the padded table ≤ _PADDED_GROWTH
      times the rows): the rows of A laid out in a table of the runs padded to the longest (kept
      on the instance for the whole version space), each run's sum one small product with its
      weights (a batched GEMV reading each number once, where a GEMM would multiply it by every
      class);
    * else one GEMM of the (classes × rows) matrix of weights with A, or a per-class
      ``np.add.reduceat`` when that GEMM would do more than _DENSE_FLOPS multiplications.

    No complements: an empty cell is exactly 0, no round-off to bound."""
    inst = belief.instance
    rows, width, n_tests = len(belief.alive), inst.max_outcomes, inst.n_tests
    whole = rows == inst.n_hypotheses
    if whole:  # every row: views, no copies
        alive, runs = slice(None), inst.class_runs
    else:
        alive = belief.alive
        runs = class_runs(inst.class_index[alive])
    if pads_runs(rows, runs, _PADDED_RUNS, _PADDED_GROWTH):
        run_weights = np.zeros((runs.count, 1, runs.longest))
        run_weights.reshape(-1)[runs.slot] = weight
        padded = inst.padded_answers if whole else padded_by_runs(inst.outcome_probabilities(alive), runs)
        a = np.matmul(run_weights, padded).reshape(runs.count, width, n_tests)
    else:
        answers = inst.outcome_probabilities(alive)
        if runs.count == rows:
            a = answers * weight[:, None, None]
        elif runs.count * answers.size <= _DENSE_FLOPS:
            class_weights = np.zeros((runs.count, rows))
            class_weights[runs.run, np.arange(rows)] = weight
            a = (class_weights @ answers.reshape(rows, -1)).reshape(runs.count, width, n_tests)
        else:
            a = np.add.reduceat(answers * weight[:, None, None], np.searchsorted(runs.run, np.arange(runs.count)),
                                axis=0)
    # (N, ℓ) views of the (ℓ, N) reductions. The sums over classes as products with a vector of
    # ones: on these sizes a GEMV costs half a strided reduction over the first axis.
    flat = a.reshape(a.shape[0], -1)
    ones = np.ones(flat.shape[0])
    return OutcomeStats(
        (ones @ flat).reshape(width, n_tests).T, b,
        sum_sq=(ones @ np.square(flat)).reshape(width, n_tests).T if "sum_sq" in wanted else None,
        sum_xlogx=xlog2x(a).sum(axis=0).T if "sum_xlogx" in wanted else None,
        max=a.max(axis=0).T if "max" in wanted else None,
    )


def _classes_alpha_split(inst: CompiledInstance, rows_of, weight: np.ndarray, starts: np.ndarray,
                         ends: np.ndarray, block_rows: int, width: int, arity: np.ndarray | None) -> np.ndarray:
    """:func:`_classes_alpha`, with a big enough batch split into two runs of whole classes of
    about equal rows: the first on a helper thread, the second on this one."""
    rows = ends - starts
    if len(starts) < 2 or int(rows.sum()) * inst.n_tests < _PARALLEL_CELLS:
        return _classes_alpha(inst, rows_of, weight, starts, ends, block_rows, width, arity)
    cumulative = np.cumsum(rows)
    half = int(np.clip(np.searchsorted(cumulative, cumulative[-1] / 2) + 1, 1, len(starts) - 1))
    first = helper().submit(_classes_alpha, inst, rows_of, weight, starts[:half], ends[:half],
                             block_rows, width, arity)
    second = _classes_alpha(inst, rows_of, weight, starts[half:], ends[half:], block_rows, width, arity)
    return np.concatenate((first.result(), second))


def _classes_alpha(inst: CompiledInstance, rows_of, weight: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   block_rows: int, width: int, arity: np.ndarray | None) -> np.ndarray:
    """a(i, t, x) of classes whose alive rows are starts[j]:ends[j], (classes, N, ℓ): a GEMV per
    block of rows and outcome. One outcome per test comes free from b(i) = Σ_x a(i, t, x):

    * deterministic: outcomes k ≥ 2 by comparison, then outcome 1 from the first moment
      Σ_h w(h)·X_ht (a GEMV on the stored integers, no comparison: a quarter less work on
      binary tests), outcome 0 = b − Σ(others);
    * likelihoods: outcomes 0 … ℓ−2 from the tensor, the last = b − Σ(others), masked to 0
      beyond a test's arity.
    """
    alpha = np.zeros((len(starts), inst.n_tests, width))
    deterministic = inst.outcomes is not None
    moment = np.zeros((len(starts), inst.n_tests))
    for j, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):  # Python ints: cheaper
        for block in range(start, end, block_rows):
            stop = min(end, block + block_rows)
            rows, w = rows_of(block, stop), weight[block:stop]
            if deterministic:
                cells = inst.outcomes[rows]
                moment[j] += w @ cells
                for k in range(2, width):
                    alpha[j, :, k] += w @ (cells == k)
            else:
                # (rows, N) with unit stride along tests: a GEMV straight on the stored tensor.
                by_outcome = inst.likelihood_by_outcome
                for k in range(width - 1):
                    alpha[j, :, k] += w @ by_outcome[rows, k]
    # The classes are consecutive runs of rows: b(i) for all of them in one reduceat.
    beta = np.add.reduceat(weight[starts[0]:ends[-1]], starts - starts[0])[:, None]
    if deterministic:
        if width >= 2:
            alpha[:, :, 1] = moment - alpha[:, :, 2:] @ np.arange(2, width, dtype=np.float64)
        alpha[:, :, 0] = beta - alpha[:, :, 1:].sum(axis=2)
    else:
        alpha[:, :, width - 1] = beta - alpha[:, :, : width - 1].sum(axis=2)
        alpha[:, arity < width, width - 1] = 0.0
    np.maximum(alpha, 0.0, out=alpha)  # the subtractions may leave −1e-17
    return alpha


def _add_likelihood_block(sums: _Sums, by_outcome: np.ndarray, rows, weight: np.ndarray,
                          offsets: np.ndarray, singletons: bool) -> None:
    """A block of small classes of a likelihood instance: a(i, t, x) = Σ_h w(h) P(x | h, t).
    p needs no classes (one GEMV over every row), nor do the rows alone in their class:
    Σ_i a² = (w²)·L², Σ_i a log a = (w log w)·L + w·(L log L). Only the rows of classes of
    several are summed per class (:func:`sum_runs`). The block's (rows, ℓ, N) likelihoods are
    contiguous, so each statistic is one GEMV over all outcomes at once."""
    n_rows, width, n_tests = len(weight), by_outcome.shape[1], by_outcome.shape[2]
    cells = by_outcome[rows].reshape(n_rows, width * n_tests)
    sums.outcome_major_sum("p")[:] += weight @ cells
    if sums.sum_sq is None and sums.sum_xlogx is None and sums.max is None:
        return
    if not singletons:
        lengths = np.diff(np.append(offsets, n_rows))
        several = lengths > 1
        a = sum_runs(cells, offsets[several], lengths[several], weight).reshape(-1, width, n_tests)
        for k in range(width):
            sums.add_outcome(k, a[:, k], with_p=False)
        alone = np.repeat(~several, lengths)
        if not alone.any():
            return
        cells, weight = cells[alone], weight[alone]
    if sums.sum_sq is not None:
        sums.outcome_major_sum("sum_sq")[:] += (weight * weight) @ np.square(cells, out=sums.buffer(cells.shape))
    if sums.sum_xlogx is not None:
        sums.outcome_major_sum("sum_xlogx")[:] += (weight * np.log2(weight)) @ cells + weight @ xlog2x(cells)
    if sums.max is not None:
        scaled = np.multiply(cells, weight[:, None], out=sums.buffer(cells.shape))
        largest = sums.outcome_major_sum("max")
        np.maximum(largest, scaled.max(axis=0), out=largest)
