"""A compiled instance: the numpy arrays that compilation.py makes from a validated wire instance,
and what the engine derives from them once and keeps on it.

Everything after compilation works on :class:`CompiledInstance` only and assumes it is clean
(validated once at the boundary, as in scikit-learn's ``check_array`` habit).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import NamedTuple

import numpy as np

from .blocks import update_joined

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
# ECED's ratios λ (CompiledInstance.likelihood_ratios) are kept up to this many bytes: a step reads
# them instead of a max and a division over the tensor (~1.9× effecxtive's step, bench/engine.py
# --policies); past it a step computes them, and a big instance's cache entry holds no second tensor.
RATIO_TABLE_MAX_BYTES = 1 << 25


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
    # What people are shown, per test (None: its id), and per outcome label (None: the label);
    # both None when no test has any. The engine never reads them.
    test_text: tuple[str | None, ...] | None = None
    outcome_text: tuple[tuple[str | None, ...], ...] | None = None
    theta: np.ndarray | None = None  # (n,) item banks (item_bank.py): each hypothesis's θ
    exposure_parameters: np.ndarray | None = None  # (N,) item banks: Sympson–Hetter's P(given | chosen)
    enemies: np.ndarray | None = None  # (E, 2) item banks: pairs of tests never both asked
    content_area: np.ndarray | None = None  # (N,) item banks with content balancing: each test's area
    content_balance: np.ndarray | None = None  # (A, 3) each area's target share, least and most tests

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
        """(patterns, pattern_of): distinct rows of ``acceptable`` (G × D, sorted), each hypothesis's (n,)."""
        patterns, pattern_of = np.unique(self.acceptable, axis=0, return_inverse=True)
        return patterns, pattern_of.reshape(-1)

    @cached_property
    def hyperedge_order(self) -> int:
        """HEC's hyperedge size k = max_h |{d : d acceptable to h}| + 1: then every k survivors sharing
        a decision implies all of them share one (a Helly-type argument, docs/decisions.md)."""
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
        the eight hypotheses' weights (alpha.py). None for likelihood instances and beyond
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
    def likelihood_ratios(self) -> np.ndarray | None:
        """(n, ℓ, N), read-only: λ(h, t, x) = P(X_t = x | h) / max_x′ P(X_t = x′ | h), what ECED reads
        (statistics.py); None for deterministic instances and past RATIO_TABLE_MAX_BYTES. Built on
        first use; :attr:`derived_nbytes` counts it."""
        if self.outcomes is not None or 8 * self.likelihood.size > RATIO_TABLE_MAX_BYTES:
            return None
        by_outcome = self.likelihood_by_outcome
        ratios, step = np.empty(by_outcome.shape), max(1, (1 << 17) // (self.n_tests * self.max_outcomes))
        for start in range(0, self.n_hypotheses, step):  # rows sum to 1: the largest is ≥ 1/ℓ
            cells = by_outcome[start:start + step]
            np.divide(cells, cells.max(axis=1, keepdims=True), out=ratios[start:start + step])
        ratios.setflags(write=False)
        return ratios

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
        :attr:`arity`, :attr:`largest_likelihood_ratios`, :attr:`outcome_entropy`, :attr:`likelihood_ratios`),
        counted whether built yet or not: a cache's budget must hold them from the start."""
        n, n_tests = self.n_hypotheses, self.n_tests
        derived = 24 * n + 8 * n_tests + 8 * n_tests * self.max_outcomes
        if self.uses_padded_answers:
            runs = self.class_runs
            derived += 8 * runs.count * runs.longest * self.max_outcomes * n_tests
        if self.outcomes is None:
            ratios = 8 * self.likelihood.size
            return derived + 8 * n * n_tests + (ratios if ratios <= RATIO_TABLE_MAX_BYTES else 0)
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
        return sum(a.nbytes for a in (getattr(self, f.name) for f in fields(self)) if isinstance(a, np.ndarray))

    @cached_property
    def content_hash(self) -> str:
        """sha256 over the canonical compiled arrays and labels: same content, same id."""
        digest = hashlib.sha256()

        def put(chunk: bytes | memoryview) -> None:
            digest.update(memoryview(chunk).nbytes.to_bytes(8, "little"))
            digest.update(chunk)

        put(self.kind.encode())
        for labels in (self.test_ids, self.hypothesis_ids, self.class_labels, *self.outcome_labels):
            update_joined(digest, "\x1f", labels)  # a block of labels at a time (blocks.py)
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
        if self.test_text is not None:  # what a client shows is part of what was posted
            put(b"text" + json.dumps([self.test_text, self.outcome_text], ensure_ascii=False).encode())
        for name in ("theta", "exposure_parameters", "enemies", "content_area", "content_balance"):
            if getattr(self, name) is not None:
                put(name.encode() + getattr(self, name).astype("<f8").tobytes())
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


def log_p_min_bound(inst: CompiledInstance) -> float:
    """The paper's Theorem 2 factor 2 ln(1/p_min) + 1."""
    return 2.0 * math.log(1.0 / inst.p_min) + 1.0


# Runs up to this many rows are summed position by position (sum_runs).
_SHORT_RUN = 8


def sum_runs(values: np.ndarray, firsts: np.ndarray, lengths: np.ndarray | None = None,
             weight: np.ndarray | None = None) -> np.ndarray:
    """Σ over each run of rows of ``values`` (r, K), each row times ``weight`` when given: the
    runs start at ``firsts`` (sorted) and are ``lengths`` long (by default each reaches the next
    first, the last the end, as ``np.add.reduceat(values, firsts, axis=0)`` sums them). Short
    runs cost a fifth of ``np.add.reduceat``'s time (measured at 65 × 2 000, runs of 1–3 rows:
    0.19 against 0.90 ms): the first row of every run, then its second row added where it has
    one, and so on, touching no row outside a run; runs longer than _SHORT_RUN rows are summed
    one by one."""
    if lengths is None:
        lengths = np.diff(np.append(firsts, len(values)))

    def rows(at: np.ndarray) -> np.ndarray:
        return values[at] if weight is None else values[at] * weight[at, None]

    sums = rows(firsts)
    short = lengths <= _SHORT_RUN
    for position in range(1, min(_SHORT_RUN, int(lengths.max(initial=1)))):
        longer = np.flatnonzero(short & (lengths > position))
        if longer.size == 0:
            break
        sums[longer] += rows(firsts[longer] + position)
    for run in np.flatnonzero(~short):
        start, stop = firsts[run], firsts[run] + lengths[run]
        sums[run] = values[start:stop].sum(axis=0) if weight is None else weight[start:stop] @ values[start:stop]
    return sums
