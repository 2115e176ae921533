"""Compilation of a validated wire :class:`~schemas.instance.Instance` into numpy arrays.

Everything after this module works on :class:`CompiledInstance` only and assumes it is clean
(validated once at the boundary, as in scikit-learn's ``check_array`` habit).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from schemas.instance import Instance

from .errors import InstanceTooLarge

DEFAULT_MAX_CELLS = 50_000_000


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

    @property
    def max_outcomes(self) -> int:
        return max(len(labels) for labels in self.outcome_labels)

    @cached_property
    def test_index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.test_ids)}

    @cached_property
    def outcome_index(self) -> tuple[dict[str, int], ...]:
        return tuple({label: k for k, label in enumerate(labels)} for labels in self.outcome_labels)

    @cached_property
    def likelihood_by_outcome(self) -> np.ndarray:
        """``likelihood`` as a C-contiguous (n, ℓ, N) array: a free view for compiled instances,
        a one-off copy (cached) for a tensor built another way, e.g. decoded (n, N, ℓ) bytes."""
        by_outcome = self.likelihood.transpose(0, 2, 1)
        return by_outcome if by_outcome.flags.c_contiguous else np.ascontiguousarray(by_outcome)

    @cached_property
    def log_likelihood(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(self.likelihood)

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

        def put(chunk: bytes) -> None:
            digest.update(len(chunk).to_bytes(8, "little"))
            digest.update(chunk)

        put(self.kind.encode())
        for labels in (self.test_ids, self.hypothesis_ids, self.class_labels):
            put("\x1f".join(labels).encode())
        for labels in self.outcome_labels:
            put("\x1f".join(labels).encode())
        for array in (self.costs, self.class_index.astype("<i8"), self.prior, self.outcomes, self.likelihood):
            if array is not None:
                canonical = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
                put(f"{canonical.dtype.str}{canonical.shape}".encode())
                put(canonical.tobytes())
        if self.is_decision:  # class instances hash as they always did
            put("\x1f".join(self.decision_labels).encode())
            for array in (self.acceptable.astype("|u1"), self.loss):
                if array is not None:
                    canonical = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
                    put(f"{canonical.dtype.str}{canonical.shape}".encode())
                    put(canonical.tobytes())
        return digest.hexdigest()


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


def compile_instance(instance: Instance, max_cells: int = DEFAULT_MAX_CELLS) -> CompiledInstance:
    """Turn a validated wire instance into arrays (the one place where labels become indices)."""
    test_ids = tuple(t.id for t in instance.tests)
    n_tests = len(test_ids)
    n = instance.n_hypotheses
    if n * n_tests > max_cells:
        raise InstanceTooLarge(f"instance has {n}×{n_tests} = {n * n_tests} cells; the limit is {max_cells}")

    decision_labels, acceptable, loss = _decision_arrays(instance)
    if instance.hypotheses is not None:
        hyps = instance.hypotheses
        hypothesis_ids = tuple(h.id for h in hyps)
        classes = [h.class_ if h.class_ is not None else h.id for h in hyps]
        raw_prior = [h.prior for h in hyps] if hyps[0].prior is not None else None
        outcome_labels = _per_hypothesis_outcome_labels(instance)
        deterministic = not any(h.likelihoods for h in hyps)
        if deterministic:
            matrix = np.array(
                [[outcome_labels[j].index(h.outcomes[t]) for j, t in enumerate(test_ids)] for h in hyps],
                dtype=np.int64,
            ).reshape(n, n_tests)
            likelihood = None
        else:
            matrix = None
            likelihood = np.zeros((n, n_tests, max(len(o) for o in outcome_labels)))
            for i, h in enumerate(hyps):
                for j, t in enumerate(test_ids):
                    if h.outcomes and t in h.outcomes:
                        likelihood[i, j, outcome_labels[j].index(h.outcomes[t])] = 1.0
                    else:
                        for label, p in h.likelihoods[t].items():
                            likelihood[i, j, outcome_labels[j].index(label)] = p
    else:
        hypothesis_ids = tuple(instance.hypothesis_ids or (str(i) for i in range(n)))
        classes = list(instance.classes) if instance.classes is not None else []
        raw_prior = instance.priors
        if instance.matrix is not None:
            matrix = np.array(instance.matrix, dtype=np.int64).reshape(n, n_tests)
            likelihood = None
            used = matrix.max(axis=0) + 1
        else:
            matrix = None
            likelihood = np.array(instance.likelihood_matrix, dtype=np.float64).reshape(n, n_tests, -1)
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
        likelihood = _normalise_rows(likelihood, outcome_labels)
    else:
        error_rates = _error_rates(instance)
        if instance.max_flips is not None:
            matrix, prior, class_index, hypothesis_ids, origin = _expand_noisy_copies(
                matrix, prior, class_index, hypothesis_ids, outcome_labels, test_ids,
                instance.max_flips, error_rates, max_cells,
            )
            if acceptable is not None:  # a noisy copy accepts what its hypothesis accepts
                acceptable = acceptable[origin]
                loss = None if loss is None else loss[origin]
        elif error_rates.any():
            likelihood = _symmetric_noise(matrix, outcome_labels, error_rates)
            matrix = None

    # Store hypotheses grouped by class (stable within a class): each class is then a contiguous
    # block of rows, which is what makes the α(i, x) statistics one pass (Belief.outcome_stats).
    order = np.argsort(class_index, kind="stable")
    if acceptable is not None:
        # Decision instances: within a class, by acceptance row (stable), so each row's
        # hypotheses are a contiguous run the region sums read without a copy (regions.py).
        _, pattern = np.unique(acceptable, axis=0, return_inverse=True)
        order = np.lexsort((pattern.reshape(-1), class_index))
    class_index, prior = class_index[order], prior[order]
    hypothesis_ids = tuple(hypothesis_ids[i] for i in order)
    if matrix is not None:
        matrix = matrix[order]
    if likelihood is not None:
        likelihood = np.ascontiguousarray(likelihood[order].transpose(0, 2, 1)).transpose(0, 2, 1)
    if acceptable is not None:
        acceptable = np.ascontiguousarray(acceptable[order])
        loss = None if loss is None else np.ascontiguousarray(loss[order])
    outcomes = matrix.astype(smallest_uint_dtype(int(matrix.max(initial=0)))) if matrix is not None else None
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
    )
    if acceptable is not None:
        check_decision_work(acceptable, n_tests, compiled.max_outcomes, max_cells)
    object.__setattr__(compiled, "warnings", tuple(_warnings(compiled)))
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
    return np.ascontiguousarray(likelihood / likelihood.sum(axis=2, keepdims=True))


def _error_rates(instance: Instance) -> np.ndarray:
    default = float(instance.noise or 0.0)
    return np.array([default if t.error_rate is None else float(t.error_rate) for t in instance.tests])


def _symmetric_noise(matrix: np.ndarray, outcome_labels, error_rates: np.ndarray) -> np.ndarray:
    """P(stated outcome) = 1−ε; the other ℓ−1 outcomes share ε equally."""
    n, n_tests = matrix.shape
    widths = np.array([len(o) for o in outcome_labels])
    width = int(widths.max())
    share = np.where(widths > 1, error_rates / np.maximum(widths - 1, 1), 0.0)
    likelihood = np.zeros((n, n_tests, width))
    valid = np.arange(width)[None, :] < widths[:, None]  # (N, ℓ)
    likelihood[:] = np.where(valid, share[:, None], 0.0)[None]
    stated = np.where(widths > 1, 1.0 - error_rates, 1.0)
    likelihood[np.arange(n)[:, None], np.arange(n_tests)[None, :], matrix] = stated[None, :]
    return likelihood


def count_noisy_copies(widths: np.ndarray, max_flips: int) -> int:
    """Σ_{|S| ≤ k} Π_{t∈S} (ℓ_t − 1): the number of noisy copies of one hypothesis."""
    # Elementary symmetric polynomials of (ℓ_t − 1), by dynamic programming over tests.
    counts = [1] + [0] * max_flips
    for w in widths:
        for j in range(max_flips, 0, -1):
            counts[j] += counts[j - 1] * (int(w) - 1)
    return sum(counts)


def _expand_noisy_copies(matrix, prior, class_index, hypothesis_ids, outcome_labels, test_ids,
                         max_flips, error_rates, max_cells):
    """Section 3's reduction: every way of changing up to ``max_flips`` outcomes is a copy of the
    hypothesis in the same class; the copies share its prior (weighted by the error model)."""
    n, n_tests = matrix.shape
    widths = np.array([len(o) for o in outcome_labels])
    per_hypothesis = count_noisy_copies(widths, max_flips)
    total = n * per_hypothesis
    if total * n_tests > max_cells:
        raise InstanceTooLarge(
            f"max_flips={max_flips} expands {n} hypotheses into {total} noisy copies "
            f"({total * n_tests} cells); the limit is {max_cells} cells"
        )
    # Weight of one flip of test t to a given other outcome: ε_t/(ℓ_t−1) against 1−ε_t kept.
    # With no error rate given every copy weighs the same.
    weighted = bool(error_rates.any())
    rows, priors, classes, ids, origin = [], [], [], [], []
    for h in range(n):
        copies, weights, names = [matrix[h]], [1.0], [hypothesis_ids[h]]
        for k in range(1, max_flips + 1):
            for flipped in itertools.combinations(range(n_tests), k):
                alternatives = [
                    [o for o in range(widths[t]) if o != matrix[h, t]] for t in flipped
                ]
                for choice in itertools.product(*alternatives):
                    row = matrix[h].copy()
                    row[list(flipped)] = choice
                    copies.append(row)
                    if weighted:
                        w = 1.0
                        for t in flipped:
                            w *= (error_rates[t] / (widths[t] - 1)) / (1.0 - error_rates[t])
                        weights.append(w)
                    else:
                        weights.append(1.0)
                    names.append(
                        hypothesis_ids[h] + "~" + ",".join(
                            f"{test_ids[t]}={outcome_labels[t][o]}" for t, o in zip(flipped, choice)
                        )
                    )
        weights_arr = np.array(weights)
        rows.extend(copies)
        priors.append(prior[h] * weights_arr / weights_arr.sum())
        classes.extend([class_index[h]] * len(copies))
        origin.extend([h] * len(copies))
        ids.extend(names)
    prior_out = np.concatenate(priors)
    return (np.array(rows, dtype=np.int64).reshape(-1, n_tests), prior_out / prior_out.sum(),
            np.array(classes, dtype=np.intp), tuple(ids), np.array(origin, dtype=np.intp))


def _warnings(inst: CompiledInstance) -> list[str]:
    """Hypotheses of different classes (decision instances: sharing no acceptable decision)
    that no test can tell apart (legal, but worth saying)."""
    if inst.outcomes is not None:
        rows = inst.outcomes
    else:
        rows = np.round(inst.likelihood.reshape(inst.n_hypotheses, -1), 12)
    _, group = np.unique(rows, axis=0, return_inverse=True)
    group = group.reshape(-1)
    if inst.is_decision:
        return _decision_warnings(inst, group)
    # Groups holding more than one class: sort by (group, class) and look for changes inside groups.
    order = np.lexsort((inst.class_index, group))
    g, c = group[order], inst.class_index[order]
    mixed = np.unique(g[1:][(g[1:] == g[:-1]) & (c[1:] != c[:-1])])
    messages = []
    for gid in mixed[:10]:
        members = np.flatnonzero(group == gid)
        names = ", ".join(f"'{inst.hypothesis_ids[i]}' ({inst.class_labels[inst.class_index[i]]})"
                          for i in members[:5])
        messages.append(f"indistinguishable: no test tells apart {names}")
    if len(mixed) > 10:
        messages.append(f"... and {len(mixed) - 10} more groups of indistinguishable hypotheses")
    return messages


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
