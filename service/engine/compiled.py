"""Compilation of a validated wire :class:`~schemas.instance.Instance` into numpy arrays.

Everything after this module works on :class:`CompiledInstance` only and assumes it is clean
(validated once at the boundary, as in scikit-learn's ``check_array`` habit).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from schemas.instance import Instance

from .errors import InstanceTooLarge

DEFAULT_MAX_CELLS = 50_000_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# What one label costs in a tuple of Python strings: the str header (49 bytes for ASCII), its
# characters, and the tuple's pointer, rounded up.
LABEL_OVERHEAD_BYTES = 64
# Deterministic instances with at most this many outcomes per test also keep their answers as bit
# planes (:attr:`CompiledInstance.outcome_bits`, (ℓ − 1)/8 bytes per cell beside the 1 of the
# matrix): beyond it the planes would outgrow what they save.
BIT_PLANE_MAX_OUTCOMES = 4
# Small beliefs (at most DENSE_CELLS alive numbers: rows × tests × outcomes) build α whole; their
# classes' sums are products of the rows padded to the longest class when that class holds at
# most 1/PADDED_RUNS of the rows and the padded table at most PADDED_GROWTH times the rows (many
# singletons beside one long class would make it rows²/PADDED_RUNS rows long).
DENSE_CELLS = 1 << 17
PADDED_RUNS = 16
PADDED_GROWTH = 4


@dataclass(frozen=True, eq=False)
class CompiledInstance:
    """A problem instance as arrays.

    Hypotheses are stored grouped by class, in their given order within a class (decision
    instances: within a class grouped by acceptance row, then in their given order).

    A decision instance also has ``decision_labels`` (D of them) and ``acceptable[h, d]`` (n × D
    bool, every row has a True), plus ``loss[h, d]`` when losses were given. Its classes are the
    paper's section 4 reduction: each hypothesis is in the class of its first acceptable decision,
    labelled by that decision.
    ``outcomes[h, t]`` is the index (into ``outcome_labels[t]``) of the outcome hypothesis ``h``
    gives on test ``t`` (deterministic instances); ``likelihood[h, t, k] = P(X_t = k | h)``
    (likelihood instances). Exactly one of the two is set.

    :func:`compile_instance` stores the likelihood tensor outcome-major, (n, ℓ, N) in memory, and
    exposes it as the (n, N, ℓ) view above: the α pass then reads, for each outcome, rows of N
    contiguous numbers that BLAS takes without a copy (see :attr:`likelihood_by_outcome`).
    """

    test_ids: tuple[str, ...]
    outcome_labels: tuple[tuple[str, ...], ...]
    costs: np.ndarray  # (N,) float64, > 0
    hypothesis_ids: tuple[str, ...]
    class_labels: tuple[str, ...]
    class_index: np.ndarray  # (n,) intp into class_labels
    prior: np.ndarray  # (n,) float64, sums to 1
    outcomes: np.ndarray | None = None  # (n, N) smallest unsigned int dtype
    likelihood: np.ndarray | None = None  # (n, N, ℓ) float64
    warnings: tuple[str, ...] = field(default=())
    decision_labels: tuple[str, ...] = ()
    acceptable: np.ndarray | None = None  # (n, D) bool
    loss: np.ndarray | None = None  # (n, D) float64 >= 0
    # Tests a session may ask again (likelihood instances only); None: none may be.
    repeatable: np.ndarray | None = None  # (N,) bool
    # Whether a skipped test's cost counts towards the cost spent.
    skip_charged: bool = False

    @property
    def kind(self) -> str:
        return "deterministic" if self.outcomes is not None else "likelihood"

    @property
    def n_hypotheses(self) -> int:
        return len(self.hypothesis_ids)

    @property
    def n_tests(self) -> int:
        return len(self.test_ids)

    @property
    def n_classes(self) -> int:
        return len(self.class_labels)

    @property
    def is_decision(self) -> bool:
        return self.acceptable is not None

    @property
    def n_decisions(self) -> int:
        return len(self.decision_labels)

    @cached_property
    def acceptance_patterns(self) -> tuple[np.ndarray, np.ndarray]:
        """(patterns, pattern_of): the distinct rows of ``acceptable`` (G × D bool, sorted) and
        each hypothesis's row among them (n,). The region objectives sum per pattern."""
        patterns, pattern_of = np.unique(self.acceptable, axis=0, return_inverse=True)
        return patterns, pattern_of.reshape(-1)

    @cached_property
    def hyperedge_order(self) -> int:
        """HEC's hyperedge size k = max_h |{d : d acceptable to h}| + 1: then every k surviving
        hypotheses sharing a decision implies all of them share one (a Helly-type argument,
        docs/decisions.md)."""
        return int(self.acceptable.sum(axis=1).max()) + 1

    @cached_property
    def decision_intersections(self) -> tuple[np.ndarray, np.ndarray]:
        """(subsets, signs): every nonempty set S of decisions some hypothesis accepts all of
        (S × D bool), with the inclusion-exclusion sign (-1)^(|S|+1). Hypotheses sharing a
        decision are counted over these sets only: a set nobody accepts holds no mass."""
        subsets = np.unique(np.concatenate([_nonempty_subsets(p) for p in self.acceptance_patterns[0]]), axis=0)
        signs = np.where(subsets.sum(axis=1) % 2 == 1, 1.0, -1.0)
        return subsets, signs

    @cached_property
    def max_outcomes(self) -> int:
        return max(len(labels) for labels in self.outcome_labels)

    @cached_property
    def log_prior(self) -> np.ndarray:
        """log P(h), −∞ where the prior is 0: where every likelihood posterior starts."""
        with np.errstate(divide="ignore"):
            log_prior = np.log(self.prior)
        log_prior.setflags(write=False)  # shared by every belief that starts from it
        return log_prior

    @cached_property
    def class_runs(self) -> ClassRuns:
        """:func:`class_runs` of every hypothesis."""
        runs = class_runs(self.class_index)
        for array in (runs.run, runs.slot):
            array.setflags(write=False)  # shared by every belief of the whole version space
        return runs

    @cached_property
    def arity(self) -> np.ndarray:
        """(N,) intp: each test's number of outcomes (≤ max_outcomes)."""
        arity = np.array([len(labels) for labels in self.outcome_labels], dtype=np.intp)
        arity.setflags(write=False)
        return arity

    @cached_property
    def largest_label_bytes(self) -> tuple[int, int]:
        """The bytes of the largest test id and of the largest outcome label, as Python strings."""
        return (max(map(sys.getsizeof, self.test_ids), default=0),
                max((sys.getsizeof(label) for labels in self.outcome_labels for label in labels), default=0))

    @cached_property
    def test_index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.test_ids)}

    @cached_property
    def outcome_index(self) -> tuple[dict[str, int], ...]:
        return tuple({label: k for k, label in enumerate(labels)} for labels in self.outcome_labels)

    @cached_property
    def repeatable_tests(self) -> np.ndarray:
        """(N,) bool: the tests a session may ask again."""
        if self.repeatable is None:
            return np.zeros(self.n_tests, dtype=bool)
        return self.repeatable

    @cached_property
    def likelihood_by_outcome(self) -> np.ndarray:
        """``likelihood`` as a C-contiguous (n, ℓ, N) array: a free view for compiled instances,
        a one-off copy (cached) for a tensor built another way, e.g. decoded (n, N, ℓ) bytes."""
        by_outcome = self.likelihood.transpose(0, 2, 1)
        return by_outcome if by_outcome.flags.c_contiguous else np.ascontiguousarray(by_outcome)

    @cached_property
    def packed_outcomes(self) -> np.ndarray | None:
        """``outcomes`` one bit per cell (each row padded to whole bytes, np.packbits) when every
        test has at most two outcomes, else None: how the store keeps them, and rows small
        enough to compare for the warnings."""
        if self.outcomes is None or self.outcomes.dtype != np.uint8 or self.max_outcomes > 2:
            return None
        return np.packbits(self.outcomes, axis=1)

    @cached_property
    def outcome_bits(self) -> np.ndarray | None:
        """The answers as bit planes, eight hypotheses to a byte: (ℓ − 1, ⌈n/8⌉, N) uint8 whose
        byte (k − 1, g, t) has bit j set when X_{8g+j, t} = k, for the outcomes k ≥ 1 (outcome
        0 is what is left). The engine's singleton-class pass looks up each byte in a table of
        the eight hypotheses' weights (belief.py). None for likelihood instances and beyond
        BIT_PLANE_MAX_OUTCOMES. Built on first use; :attr:`derived_nbytes` counts it."""
        if self.outcomes is None or self.max_outcomes > BIT_PLANE_MAX_OUTCOMES:
            return None
        n, n_tests = self.outcomes.shape
        planes = np.zeros((self.max_outcomes - 1, -(-n // 8), n_tests), dtype=np.uint8)
        for k, plane in enumerate(planes, start=1):
            for bit in range(8):
                rows = self.outcomes[bit::8]  # hypotheses bit, bit + 8, …: one per byte
                plane[: len(rows)] |= (rows == k).view(np.uint8) << bit
        planes.setflags(write=False)
        return planes

    @cached_property
    def padded_answers(self) -> np.ndarray:
        """Every row's answers — P(X_t = x | h), one-hot for deterministic instances — laid out in
        the (runs × longest) table of :attr:`class_runs`, zeros in the padding: (count, longest,
        ℓ·N) float64, read-only. The dense pass over a whole version space multiplies it by the
        rows' weights instead of building it again every step. Built on first use;
        :attr:`derived_nbytes` counts it where that pass uses it."""
        padded = padded_by_runs(self.outcome_probabilities(slice(None)), self.class_runs)
        padded.setflags(write=False)
        return padded

    @cached_property
    def outcome_entropy(self) -> np.ndarray | None:
        """(n, N): H(X_t | h) = −Σ_x P(x | h, t) log₂ P(x | h, t) in bits, None for deterministic
        instances (0 everywhere): what infogain reads for hypotheses alone in their class
        (statistics.py), so a step takes no logarithm of the tensor. Built on first use;
        :attr:`derived_nbytes` counts it."""
        if self.outcomes is not None:
            return None
        by_outcome = self.likelihood_by_outcome
        entropy = np.empty((self.n_hypotheses, self.n_tests))
        step = max(1, (1 << 17) // (self.n_tests * self.max_outcomes))
        for start in range(0, self.n_hypotheses, step):
            cells = by_outcome[start:start + step]
            positive = cells > 0
            logs = np.log2(np.where(positive, cells, 1.0))
            entropy[start:start + step] = -(cells * logs).sum(axis=1)
        entropy.setflags(write=False)
        return entropy

    @cached_property
    def largest_likelihood_ratios(self) -> np.ndarray:
        """(N, ℓ): max over every hypothesis θ of λ(θ, t, x) = P(X_t = x | θ) / max_x′ P(X_t = x′ | θ),
        each likelihood divided by the largest of its test (1 where some hypothesis gives x for
        sure on a deterministic instance, else 0): the offset of ECED (statistics.py). Built on
        first use; :attr:`derived_nbytes` counts it."""
        if self.outcomes is not None:
            given = np.zeros((self.n_tests, self.max_outcomes))
            for k in range(self.max_outcomes):
                given[:, k] = (self.outcomes == k).any(axis=0)
            largest = given
        else:
            largest = np.zeros((self.max_outcomes, self.n_tests))
            by_outcome = self.likelihood_by_outcome
            step = max(1, (1 << 17) // (self.n_tests * self.max_outcomes))
            for start in range(0, self.n_hypotheses, step):
                cells = by_outcome[start:start + step]
                np.maximum(largest, (cells / cells.max(axis=1, keepdims=True)).max(axis=0), out=largest)
            largest = np.ascontiguousarray(largest.T)
        largest.setflags(write=False)
        return largest

    @property
    def uses_padded_answers(self) -> bool:
        """Whether the dense pass over the whole version space reads :attr:`padded_answers`."""
        n = self.n_hypotheses
        return n * self.n_tests * self.max_outcomes <= DENSE_CELLS and pads_runs(n, self.class_runs)

    def outcome_probabilities(self, rows) -> np.ndarray:
        """(rows, ℓ, N): P(X_t = x | h) of ``rows`` (one-hot answers, or the likelihood rows)."""
        if self.outcomes is not None:
            cells = self.outcomes[rows]
            # The comparison's inner loop runs along the N tests, not the ℓ outcomes.
            return cells[:, None, :] == np.arange(self.max_outcomes, dtype=cells.dtype)[:, None]
        return self.likelihood_by_outcome[rows]

    @property
    def derived_nbytes(self) -> int:
        """Bytes of what the engine derives from the instance and keeps on it (:attr:`outcome_bits`,
        :attr:`packed_outcomes`, :attr:`padded_answers`, :attr:`log_prior`, :attr:`class_runs`,
        :attr:`arity`, :attr:`largest_likelihood_ratios`, :attr:`outcome_entropy`), counted whether
        built yet or not: a cache's budget must hold them from the start."""
        n, n_tests = self.n_hypotheses, self.n_tests
        derived = 24 * n + 8 * n_tests + 8 * n_tests * self.max_outcomes
        if self.uses_padded_answers:
            runs = self.class_runs
            derived += 8 * runs.count * runs.longest * self.max_outcomes * n_tests
        if self.outcomes is None:
            return derived + 8 * n * n_tests
        if self.outcomes.dtype == np.uint8 and self.max_outcomes <= 2:
            derived += n * -(-n_tests // 8)
        if self.max_outcomes <= BIT_PLANE_MAX_OUTCOMES:
            derived += (self.max_outcomes - 1) * -(-n // 8) * n_tests
        return derived

    @cached_property
    def p_min(self) -> float:
        return float(self.prior[self.prior > 0].min())

    @cached_property
    def nbytes(self) -> int:
        arrays = (self.costs, self.class_index, self.prior, self.outcomes, self.likelihood,
                  self.acceptable, self.loss)
        return sum(a.nbytes for a in arrays if a is not None)

    @cached_property
    def content_hash(self) -> str:
        """sha256 over the canonical compiled arrays and labels: same content, same id."""
        digest = hashlib.sha256()

        def put(chunk: bytes | memoryview) -> None:
            digest.update(memoryview(chunk).nbytes.to_bytes(8, "little"))
            digest.update(chunk)

        put(self.kind.encode())
        for labels in (self.test_ids, self.hypothesis_ids, self.class_labels):
            put("\x1f".join(labels).encode())
        for labels in self.outcome_labels:
            put("\x1f".join(labels).encode())
        # Answers of at most two outcomes per test are hashed as the bits they are stored as: an
        # eighth of the bytes (a tenth of a big instance's compile time went to sha256).
        packed = self.packed_outcomes
        outcomes = self.outcomes if packed is None else packed
        for array in (self.costs, self.class_index.astype("<i8"), self.prior, outcomes, self.likelihood):
            if array is not None:
                dtype = array.dtype.newbyteorder("<")
                put((f"bits{self.outcomes.shape}" if array is packed else f"{dtype.str}{array.shape}").encode())
                # The C-order bytes, a block of rows at a time: the likelihood is stored
                # outcome-major, and one contiguous copy of it would double the memory.
                digest.update((array.size * array.itemsize).to_bytes(8, "little"))
                rows = max(1, (1 << 20) // max(1, array[:1].nbytes))
                for start in range(0, max(len(array), 1), rows):
                    digest.update(np.ascontiguousarray(array[start:start + rows], dtype=dtype).data)
        if self.is_decision:  # class instances hash as they always did
            put("\x1f".join(self.decision_labels).encode())
            for array in (self.acceptable.astype("|u1"), self.loss):
                if array is not None:
                    canonical = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
                    put(f"{canonical.dtype.str}{canonical.shape}".encode())
                    put(canonical.tobytes())
        # Only when set, so instances without them keep the ids they always had.
        if self.repeatable_tests.any():
            put(b"repeatable" + np.flatnonzero(self.repeatable_tests).astype("<i8").tobytes())
        if self.skip_charged:
            put(b"skip_cost=charged")
        return digest.hexdigest()


class ClassRuns(NamedTuple):
    """Rows grouped by class, as contiguous runs: each row's run number 0, 1, … (``run``), the
    number of runs (``count``), the length of the longest (``longest``), and each row's slot in a
    (count × longest) table of the runs padded to the longest (``slot``)."""

    run: np.ndarray
    count: int
    longest: int
    slot: np.ndarray


def class_runs(classes: np.ndarray) -> ClassRuns:
    """The runs of equal values in ``classes`` (each row's class, rows grouped by class)."""
    rows = classes.size
    run = np.zeros(rows, dtype=np.intp)
    np.add.accumulate(classes[1:] != classes[:-1], out=run[1:], dtype=np.intp)
    count = int(run[-1]) + 1 if rows else 0
    place = np.arange(rows) - np.searchsorted(run, np.arange(count))[run]
    longest = int(place.max()) + 1 if rows else 0
    return ClassRuns(run, count, longest, run * longest + place)


def pads_runs(rows: int, runs: ClassRuns, padded_runs: float = PADDED_RUNS, growth: float = PADDED_GROWTH) -> bool:
    """Whether ``rows`` grouped in ``runs`` are summed per class from a table of the runs padded to
    the longest (see DENSE_CELLS): not singletons, the longest run at most 1/``padded_runs`` of
    the rows, and the table at most ``growth`` times the rows."""
    return runs.count < rows and runs.longest * padded_runs <= rows and runs.count * runs.longest <= growth * rows


def padded_by_runs(answers: np.ndarray, runs: ClassRuns) -> np.ndarray:
    """``answers`` (rows, …) laid out in the (runs × longest) table of ``runs``, zeros in the
    padding: (count, longest, the rest flattened)."""
    padded = np.zeros((runs.count * runs.longest, *answers.shape[1:]))
    padded[runs.slot] = answers
    return padded.reshape(runs.count, runs.longest, -1)


def _nonempty_subsets(pattern: np.ndarray) -> np.ndarray:
    """Every nonempty subset of the decisions in ``pattern`` (D bool) as rows (2^s − 1 × D)."""
    members = np.flatnonzero(pattern)
    masks = np.arange(1, 1 << members.size)
    chosen = (masks[:, None] >> np.arange(members.size)[None, :]) & 1 == 1
    subsets = np.zeros((masks.size, pattern.size), dtype=bool)
    subsets[:, members] = chosen
    return subsets


def check_decision_work(acceptable: np.ndarray, n_tests: int, width: int, max_cells: int) -> None:
    """HEC keeps, per step, k power sums per (test, outcome) for V and for each set of decisions
    some hypothesis accepts: at most Σ_patterns (2^|pattern| − 1) sets. Refuse before building
    them when that many numbers would exceed the cell limit."""
    patterns = np.unique(acceptable, axis=0)
    sizes = patterns.sum(axis=1)
    sets = int(((1 << sizes.astype(np.int64)) - 1).sum())
    numbers = (1 + sets) * (int(sizes.max()) + 1) * n_tests * width
    if numbers > max_cells:
        raise InstanceTooLarge(
            f"the hec objective on this instance keeps {numbers} numbers per step ({sets} sets of "
            f"decisions × {int(sizes.max()) + 1} powers × {n_tests} tests × {width} outcomes); the limit is "
            f"{max_cells} cells (max_cells): fewer overlapping decisions per hypothesis, or fewer tests"
        )


def smallest_uint_dtype(max_value: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def compile_instance(instance: Instance, max_cells: int = DEFAULT_MAX_CELLS,
                     max_bytes: int = DEFAULT_MAX_BYTES) -> CompiledInstance:
    """Turn a validated wire instance into arrays (the one place where labels become indices).

    Refuses (:class:`InstanceTooLarge`) before allocating when the compiled tensor would hold
    more than ``max_cells`` numbers — n·N outcomes, n·N·ℓ likelihoods (given, or made from
    ``noise``), n·(copies)·N after ``max_flips`` — or the instance would take more than
    ``max_bytes`` (arrays and labels; building it holds about twice that for a moment)."""
    test_ids = tuple(t.id for t in instance.tests)
    n_tests = len(test_ids)
    n = instance.n_hypotheses
    _check_size(n, n_tests, 1, 1, max_cells, max_bytes, "the instance")

    decision_labels, acceptable, loss = _decision_arrays(instance)
    if instance.hypotheses is not None:
        hyps = instance.hypotheses
        hypothesis_ids = tuple(h.id for h in hyps)
        classes = [h.class_ if h.class_ is not None else h.id for h in hyps]
        raw_prior = [h.prior for h in hyps] if hyps[0].prior is not None else None
        outcome_labels = _per_hypothesis_outcome_labels(instance)
        positions = [{label: k for k, label in enumerate(labels)} for labels in outcome_labels]
        width = max(len(o) for o in outcome_labels)
        deterministic = not any(h.likelihoods for h in hyps)
        if deterministic:
            matrix = np.array(
                [[positions[j][h.outcomes[t]] for j, t in enumerate(test_ids)] for h in hyps],
                dtype=smallest_uint_dtype(width),
            ).reshape(n, n_tests)
            likelihood = None
        else:
            matrix = None
            _check_size(n, n_tests, width, 8, max_cells, max_bytes, "the likelihood tensor")
            likelihood = np.zeros((n, n_tests, width))
            for i, h in enumerate(hyps):
                for j, t in enumerate(test_ids):
                    if h.outcomes and t in h.outcomes:
                        likelihood[i, j, positions[j][h.outcomes[t]]] = 1.0
                    else:
                        for label, p in h.likelihoods[t].items():
                            likelihood[i, j, positions[j][label]] = p
    else:
        hypothesis_ids = tuple(instance.hypothesis_ids or map(str, range(n)))
        classes = list(instance.classes) if instance.classes is not None else []
        raw_prior = instance.priors
        # The arrays validation built (either wire form), in their wire dtype: a uint8 matrix
        # stays uint8, so a big instance is never widened to int64 on its way in.
        if instance.matrix is not None:
            matrix = instance.matrix_array()
            used = matrix.max(axis=0).astype(np.int64) + 1  # one pass over the cells
            widest = int(used.max()) - 1
            unlisted = sum(t.outcomes is None for t in instance.tests)
            if unlisted * (widest + 1) * LABEL_OVERHEAD_BYTES > max_bytes:
                raise InstanceTooLarge(f"outcome index {widest} would make {widest + 1} outcome labels per "
                                       f"test; the limit is {max_bytes} bytes (MAX_COMPILED_BYTES)")
            matrix = matrix.astype(smallest_uint_dtype(widest), copy=False)
            likelihood = None
        else:
            matrix = None
            given = instance.likelihood_array()
            _check_size(n, n_tests, given.shape[2], 8, max_cells, max_bytes, "the likelihood tensor")
            likelihood = np.array(given, dtype=np.float64)  # a copy: it is normalised in place
            nonzero = likelihood.reshape(-1, likelihood.shape[2]).any(axis=0)
            used = np.full(n_tests, int(np.flatnonzero(nonzero).max()) + 1)
        outcome_labels = [
            tuple(t.outcomes) if t.outcomes is not None else tuple(str(k) for k in range(int(used[j])))
            for j, t in enumerate(instance.tests)
        ]

    prior = np.full(n, 1.0 / n) if raw_prior is None else np.asarray(raw_prior, dtype=np.float64)
    prior = prior / prior.sum()
    if acceptable is not None:
        # Section 4's reduction: the class of a hypothesis is its first acceptable decision.
        first = acceptable.argmax(axis=1)
        classes = [decision_labels[d] for d in first]
        class_labels = tuple(decision_labels[d] for d in np.unique(first))  # in decision order
    else:
        class_labels = tuple(dict.fromkeys(classes))
    class_position = {c: i for i, c in enumerate(class_labels)}
    class_index = np.array([class_position[c] for c in classes], dtype=np.intp)
    costs = np.array([float(t.cost) for t in instance.tests])

    if likelihood is not None:
        width = max(len(o) for o in outcome_labels)
        _check_size(n, n_tests, width, 8, max_cells, max_bytes, "the likelihood tensor")
        likelihood = _normalise_rows(likelihood, outcome_labels)
    error_rates = _error_rates(instance)
    if likelihood is None and instance.max_flips is not None:
        matrix, prior, class_index, hypothesis_ids, origin = _expand_noisy_copies(
            matrix, prior, class_index, hypothesis_ids, outcome_labels, test_ids,
            instance.max_flips, error_rates, max_cells, max_bytes,
        )
        if acceptable is not None:  # a noisy copy accepts what its hypothesis accepts
            acceptable = acceptable[origin]
            loss = None if loss is None else loss[origin]

    # Store hypotheses grouped by class (stable within a class): each class is then a contiguous
    # block of rows, which is what makes the α(i, x) statistics one pass (Belief.outcome_stats).
    order = np.argsort(class_index, kind="stable")
    if acceptable is not None:
        # Decision instances: within a class, by acceptance row (stable), so each row's
        # hypotheses are a contiguous run the region sums read without a copy (regions.py).
        _, pattern = np.unique(acceptable, axis=0, return_inverse=True)
        order = np.lexsort((pattern.reshape(-1), class_index))
    class_index, prior = class_index[order], prior[order]
    hypothesis_ids = tuple(map(hypothesis_ids.__getitem__, order.tolist()))
    if likelihood is not None:
        # One copy, straight into the outcome-major layout (mode="clip": the indices are valid,
        # and "raise" would buffer another copy).
        by_outcome = likelihood.transpose(0, 2, 1)
        likelihood = np.take(by_outcome, order, axis=0, out=np.empty(by_outcome.shape), mode="clip")
        likelihood = likelihood.transpose(0, 2, 1)
    if acceptable is not None:
        acceptable = np.ascontiguousarray(acceptable[order])
        loss = None if loss is None else np.ascontiguousarray(loss[order])
    if matrix is not None and (order[1:] < order[:-1]).any():
        # Rows already grouped by class (the usual case) are kept as they came: a compact uint8
        # matrix then stays a view of its decoded bytes, never copied.
        matrix = matrix[order]
    same_rows = None  # rows equal exactly when the hypotheses' likelihood rows are (noise only)
    if matrix is not None and instance.max_flips is None and error_rates.any():
        width = max(len(o) for o in outcome_labels)
        _check_size(n, n_tests, width, 8, max_cells, max_bytes, "noise's likelihood tensor")
        likelihood = _symmetric_noise(matrix, outcome_labels, error_rates)  # built in its final order
        # Two noisy rows are equal exactly when their stated outcomes agree on every test whose
        # noise leaves the outcome informative: compare those, not n·N·ℓ floats.
        widths = np.array([len(o) for o in outcome_labels])
        informative = (widths > 1) & (1.0 - error_rates != error_rates / np.maximum(widths - 1, 1))
        same_rows = matrix[:, informative]
        matrix = None
    outcomes = matrix
    if matrix is not None and matrix.dtype != np.uint8:  # uint8 is as small as it gets: no pass over the cells
        outcomes = matrix.astype(smallest_uint_dtype(int(matrix.max(initial=0))), copy=False)
    compiled = CompiledInstance(
        test_ids=test_ids,
        outcome_labels=tuple(tuple(o) for o in outcome_labels),
        costs=costs,
        hypothesis_ids=tuple(hypothesis_ids),
        class_labels=class_labels,
        class_index=class_index,
        prior=prior,
        outcomes=outcomes,
        likelihood=likelihood,
        decision_labels=decision_labels,
        acceptable=acceptable,
        loss=loss,
        repeatable=np.array([t.repeatable for t in instance.tests]) if any(t.repeatable for t in instance.tests)
        else None,
        skip_charged=instance.skip_cost == "charged",
    )
    if acceptable is not None:
        check_decision_work(acceptable, n_tests, compiled.max_outcomes, max_cells)
    object.__setattr__(compiled, "warnings", tuple(_warnings(compiled, same_rows)))
    return compiled


def _decision_arrays(instance: Instance) -> tuple[tuple[str, ...], np.ndarray | None, np.ndarray | None]:
    """(decision labels, acceptable n × D bool, loss n × D or None) of a decision instance;
    ((), None, None) otherwise. Losses define acceptability through ``loss_tolerance``."""
    if instance.decisions is None:
        return (), None, None
    labels = tuple(instance.decisions)
    position = {d: j for j, d in enumerate(labels)}
    loss = None
    if instance.hypotheses is not None:
        hyps = instance.hypotheses
        if hyps[0].loss is not None:
            loss = np.array([[float(h.loss[d]) for d in labels] for h in hyps]).reshape(len(hyps), len(labels))
        else:
            acceptable = np.zeros((len(hyps), len(labels)), dtype=bool)
            for i, h in enumerate(hyps):
                acceptable[i, [position[d] for d in h.acceptable]] = True
            return labels, acceptable, None
    elif instance.loss_matrix is not None:
        loss = np.array(instance.loss_matrix, dtype=np.float64).reshape(-1, len(labels))
    else:
        return labels, np.array(instance.acceptable_matrix, dtype=bool).reshape(-1, len(labels)), None
    tolerance = float(instance.loss_tolerance or 0.0)
    acceptable = loss <= loss.min(axis=1, keepdims=True) + tolerance
    return labels, acceptable, loss


def _check_size(rows: int, n_tests: int, width: int, itemsize: int, max_cells: int, max_bytes: int,
                what: str, label_bytes: int | None = None) -> None:
    """Refuse before allocating: ``rows × n_tests × width`` numbers of ``itemsize`` bytes, plus
    each row's prior, class index and id (``label_bytes`` in all, else an estimate)."""
    cells = rows * n_tests * width
    shape = f"{rows}×{n_tests}" + (f"×{width}" if width > 1 else "")
    if cells > max_cells:
        raise InstanceTooLarge(f"{what} has {shape} = {cells} cells; the limit is {max_cells} (MAX_CELLS)")
    if label_bytes is None:
        label_bytes = rows * LABEL_OVERHEAD_BYTES
    size = cells * itemsize + rows * 16 + label_bytes
    if size > max_bytes:
        raise InstanceTooLarge(f"{what} ({shape}) would take {size} bytes compiled; the limit is "
                               f"{max_bytes} (MAX_COMPILED_BYTES)")


def _per_hypothesis_outcome_labels(instance: Instance) -> list[tuple[str, ...]]:
    labels: list[tuple[str, ...]] = []
    for test in instance.tests:
        if test.outcomes is not None:
            labels.append(tuple(test.outcomes))
            continue
        used: set[str] = set()
        for h in instance.hypotheses:
            if h.outcomes and test.id in h.outcomes:
                used.add(h.outcomes[test.id])
            if h.likelihoods and test.id in h.likelihoods:
                used.update(h.likelihoods[test.id])
        labels.append(tuple(sorted(used)))
    return labels


def _normalise_rows(likelihood: np.ndarray, outcome_labels) -> np.ndarray:
    # Rows were checked to sum to 1 within 1e-6; make them exact so posteriors stay normalised.
    widths = np.array([len(o) for o in outcome_labels])
    if likelihood.shape[2] < widths.max():
        likelihood = np.concatenate(
            [likelihood, np.zeros((*likelihood.shape[:2], widths.max() - likelihood.shape[2]))], axis=2
        )
    likelihood /= likelihood.sum(axis=2, keepdims=True)  # in place: no second tensor
    return likelihood


def _error_rates(instance: Instance) -> np.ndarray:
    default = float(instance.noise or 0.0)
    return np.array([default if t.error_rate is None else float(t.error_rate) for t in instance.tests])


def _symmetric_noise(matrix: np.ndarray, outcome_labels, error_rates: np.ndarray) -> np.ndarray:
    """P(stated outcome) = 1−ε; the other ℓ−1 outcomes share ε equally. Built outcome-major,
    (n, ℓ, N), the layout compile_instance keeps; returned as the (n, N, ℓ) view."""
    n, n_tests = matrix.shape
    widths = np.array([len(o) for o in outcome_labels])
    width = int(widths.max())
    share = np.where(widths > 1, error_rates / np.maximum(widths - 1, 1), 0.0)
    by_outcome = np.empty((n, width, n_tests))
    valid = np.arange(width)[:, None] < widths[None, :]  # (ℓ, N)
    by_outcome[:] = np.where(valid, share[None, :], 0.0)[None]
    stated = np.where(widths > 1, 1.0 - error_rates, 1.0)
    by_outcome[np.arange(n)[:, None], matrix, np.arange(n_tests)[None, :]] = stated[None, :]
    return by_outcome.transpose(0, 2, 1)


def count_noisy_copies(widths: np.ndarray, max_flips: int, cap: int | None = None) -> int:
    """Σ_{|S| ≤ k} Π_{t∈S} (ℓ_t − 1): the number of noisy copies of one hypothesis.

    With ``cap``, returns early with some number > cap once the count is known to exceed it, so
    the work is bounded by the cap, not by ``max_flips`` or the number of tests."""
    factors = [int(w) - 1 for w in widths if w > 1]
    k = min(max_flips, len(factors))
    if cap is not None:
        # Each factor is ≥ 1, so the count is at least Σ_{j ≤ k} C(m, j): refuse on that first.
        total, binomial = 1, 1
        for j in range(1, k + 1):
            binomial = binomial * (len(factors) - j + 1) // j
            total += binomial
            if total > cap:
                return total
    # Elementary symmetric polynomials of (ℓ_t − 1), by dynamic programming over tests.
    counts = [1] + [0] * k
    for factor in factors:
        for j in range(k, 0, -1):
            counts[j] += counts[j - 1] * factor
        if cap is not None and sum(counts) > cap:
            return sum(counts)
    return sum(counts)


def _expand_noisy_copies(matrix, prior, class_index, hypothesis_ids, outcome_labels, test_ids,
                         max_flips, error_rates, max_cells, max_bytes):
    """Section 3's reduction: every way of changing up to ``max_flips`` outcomes is a copy of the
    hypothesis in the same class; the copies share its prior (weighted by the error model).

    Copies of hypothesis h come in a fixed order: h itself, then by number of changed tests k,
    the sets of k tests in lexicographic order, and for each the other outcomes in increasing
    order. A change is the same for every hypothesis up to which outcome it skips (its own), so
    the copies are built for all hypotheses at once, one array operation per change."""
    n, n_tests = matrix.shape
    widths = np.array([len(o) for o in outcome_labels])
    cap = max_cells // max(n * n_tests, 1)
    per_hypothesis = count_noisy_copies(widths, max_flips, cap=cap)
    if per_hypothesis > cap:  # a lower bound past the cap: enough to refuse
        raise InstanceTooLarge(
            f"max_flips={max_flips} expands {n} hypotheses into at least {n * per_hypothesis} noisy copies "
            f"({n * per_hypothesis * n_tests} cells); the limit is {max_cells} (MAX_CELLS)")
    total = n * per_hypothesis
    longest_test = max(map(len, test_ids))
    longest_label = max(len(label) for labels in outcome_labels for label in labels)
    longest_id = max(map(len, hypothesis_ids))
    name_bytes = LABEL_OVERHEAD_BYTES + longest_id + min(max_flips, n_tests) * (longest_test + longest_label + 2)
    _check_size(total, n_tests, 1, matrix.dtype.itemsize, max_cells, max_bytes,
                f"max_flips={max_flips}, expanding {n} hypotheses into {total} noisy copies,",
                label_bytes=total * name_bytes)

    flippable = [t for t in range(n_tests) if widths[t] > 1]
    # Weight of one flip of test t to a given other outcome: ε_t/(ℓ_t−1) against 1−ε_t kept.
    # With no error rate given every copy weighs the same.
    weighted = bool(error_rates.any())
    changes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (tests, which other outcome)
    weights = [1.0]
    for k in range(1, min(max_flips, len(flippable)) + 1):
        for flipped in itertools.combinations(flippable, k):
            for choice in itertools.product(*(range(widths[t] - 1) for t in flipped)):
                changes.append((flipped, choice))
                w = 1.0
                if weighted:
                    for t in flipped:
                        w *= (error_rates[t] / (widths[t] - 1)) / (1.0 - error_rates[t])
                weights.append(w)
    copies = np.repeat(matrix[:, None, :], len(changes) + 1, axis=1)  # (n, copies, N)
    for c, (flipped, choice) in enumerate(changes, start=1):
        columns = list(flipped)
        others = np.array(choice, dtype=matrix.dtype)
        # The choice-th outcome other than the hypothesis's own.
        copies[:, c, columns] = others + (others >= matrix[:, columns])
    names = []
    for h in range(n):
        names.append(hypothesis_ids[h])
        row = copies[h]
        names.extend(
            hypothesis_ids[h] + "~" + ",".join(f"{test_ids[t]}={outcome_labels[t][row[c, t]]}" for t in flipped)
            for c, (flipped, _) in enumerate(changes, start=1)
        )
    weights_arr = np.array(weights)
    prior_out = (prior[:, None] * weights_arr[None, :] / weights_arr.sum()).reshape(-1)
    return (copies.reshape(-1, n_tests), prior_out / prior_out.sum(),
            np.repeat(class_index, len(changes) + 1), tuple(names), np.repeat(np.arange(n), len(changes) + 1))


def _warnings(inst: CompiledInstance, rows: np.ndarray | None = None) -> list[str]:
    """Hypotheses of different classes (decision instances: sharing no acceptable decision)
    that no test can tell apart (legal, but worth saying).
    ``rows``: a smaller array whose rows are equal exactly when the hypotheses' are."""
    if rows is None and inst.packed_outcomes is not None:
        rows = inst.packed_outcomes  # equal exactly when the 0/1 rows are, and 8× smaller
    if rows is None:
        rows = inst.outcomes if inst.outcomes is not None else np.round(
            inst.likelihood.reshape(inst.n_hypotheses, -1), 12) + 0.0  # + 0.0: no −0.0
    group = _equal_row_groups(rows)
    if inst.is_decision:
        return _decision_warnings(inst, group)
    # Groups holding more than one class: sort by (group, class) and look for changes inside groups.
    order = np.lexsort((inst.class_index, group))
    g, c = group[order], inst.class_index[order]
    mixed = np.unique(g[1:][(g[1:] == g[:-1]) & (c[1:] != c[:-1])])
    # In the order of each group's first hypothesis, whatever array the rows were compared in.
    first = np.full(group.max(initial=0) + 1, inst.n_hypotheses)
    np.minimum.at(first, group, np.arange(inst.n_hypotheses))
    mixed = mixed[np.argsort(first[mixed], kind="stable")]
    messages = []
    for gid in mixed[:10]:
        members = np.flatnonzero(group == gid)
        names = ", ".join(f"'{inst.hypothesis_ids[i]}' ({inst.class_labels[inst.class_index[i]]})"
                          for i in members[:5])
        messages.append(f"indistinguishable: no test tells apart {names}")
    if len(mixed) > 10:
        messages.append(f"... and {len(mixed) - 10} more groups of indistinguishable hypotheses")
    return messages


def _equal_row_groups(rows: np.ndarray) -> np.ndarray:
    """A group number per row; rows in one group are byte-for-byte equal.

    Linear time, unlike ``np.unique(axis=0)``'s lexicographic sort of whole rows (seconds at
    10⁴ × 10³): each row's bytes, as 64-bit words, are hashed with fixed random odd multipliers
    (Σ w_j·x_j mod 2⁶⁴); rows are sorted by hash and neighbours with equal hashes are compared in
    full. A hash collision between different rows can only split a group (miss a warning),
    never merge different rows."""
    n = rows.shape[0]
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(n, -1)
    width = -(-raw.shape[1] // 8) * 8
    if width != raw.shape[1]:
        raw = np.pad(raw, ((0, 0), (0, width - raw.shape[1])))
    words = raw.view("<u8")
    multipliers = np.random.default_rng(0x5EED).integers(1, 2**63, size=words.shape[1], dtype=np.uint64) | 1
    digest = (words * multipliers).sum(axis=1, dtype=np.uint64)  # wraps around mod 2⁶⁴
    order = np.argsort(digest, kind="stable")
    sorted_digest = digest[order]
    candidates = np.flatnonzero(sorted_digest[1:] == sorted_digest[:-1])
    equal = (raw[order[candidates + 1]] == raw[order[candidates]]).all(axis=1)
    starts = np.ones(n, dtype=bool)
    starts[candidates[equal] + 1] = False
    group = np.empty(n, dtype=np.intp)
    group[order] = np.cumsum(starts) - 1
    return group


def log_p_min_bound(inst: CompiledInstance) -> float:
    """The paper's Theorem 2 factor 2 ln(1/p_min) + 1."""
    return 2.0 * math.log(1.0 / inst.p_min) + 1.0


def _decision_warnings(inst: CompiledInstance, group: np.ndarray) -> list[str]:
    messages = []
    for gid in np.unique(group):
        members = np.flatnonzero(group == gid)
        if members.size > 1 and not inst.acceptable[members].all(axis=0).any():
            names = ", ".join(
                f"'{inst.hypothesis_ids[i]}' ({'/'.join(inst.decision_labels[d] for d in np.flatnonzero(inst.acceptable[i]))})"
                for i in members[:5])
            messages.append(f"indistinguishable: no test tells apart {names}, which share no acceptable decision")
    if len(messages) > 10:
        messages = messages[:10] + [f"... and {len(messages) - 10} more groups of indistinguishable hypotheses"]
    return messages
