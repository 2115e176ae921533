"""Compilation of a validated wire :class:`~schemas.instance.Instance` into a
:class:`~.compiled.CompiledInstance`: outcome indices or likelihoods as numpy arrays, classes,
priors, costs, decision regions; noisy copies expanded (``max_flips``) or symmetric noise applied;
every size checked against what will really be allocated before it is; the instance's warnings
(indistinguishable.py)."""

from __future__ import annotations

import itertools

import numpy as np

from schemas.instance import Instance

from . import blocks
from .compiled import CompiledInstance
from .errors import InstanceTooLarge
from .indistinguishable import instance_warnings
from .item_bank import DEFAULT_GRID_POINTS, bank_as_columns, with_theta

DEFAULT_MAX_CELLS = 50_000_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# What one label costs in a tuple of Python strings: the str header (49 bytes for ASCII), its
# characters, and the tuple's pointer, rounded up.
LABEL_OVERHEAD_BYTES = 64


def check_decision_work(acceptable: np.ndarray, n_tests: int, width: int, max_cells: int) -> None:
    """HEC keeps, per step, k power sums per (test, outcome) for V and for each set of decisions
    some hypothesis accepts: at most Σ_patterns (2^|pattern| − 1) sets. Refuse before building
    them when that many numbers would exceed the cell limit."""
    patterns = acceptable[np.unique(_row_keys(acceptable), return_index=True)[1]]
    sizes = patterns.sum(axis=1)
    sets = int(((1 << sizes.astype(np.int64)) - 1).sum())
    numbers = (1 + sets) * (int(sizes.max()) + 1) * n_tests * width
    if numbers > max_cells:
        raise InstanceTooLarge(
            f"the hec objective on this instance keeps {numbers} numbers per step ({sets} sets of "
            f"decisions × {int(sizes.max()) + 1} powers × {n_tests} tests × {width} outcomes); the limit is "
            f"{max_cells} cells (max_cells): fewer overlapping decisions per hypothesis, or fewer tests"
        )


def _row_keys(acceptable: np.ndarray) -> np.ndarray:
    """Each 0/1 row (at most MAX_DECISIONS = 32 columns) as one integer, in the rows' lexicographic
    order: np.unique(axis=0) sorts rows as opaque bytes, a call per comparison (seconds at 10⁵)."""
    return acceptable.astype(np.uint64) @ (np.uint64(1) << np.arange(acceptable.shape[1] - 1, -1, -1, dtype=np.uint64))


def smallest_uint_dtype(max_value: int) -> np.dtype:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


# Over 60 lines: one pass of steps that each reorder or replace the same eight arrays in turn;
# cut further, each piece would take and give back all of them.
def compile_instance(instance: Instance, max_cells: int = DEFAULT_MAX_CELLS, max_bytes: int = DEFAULT_MAX_BYTES,
                     grid_points: int = DEFAULT_GRID_POINTS) -> CompiledInstance:
    """Turn a validated wire instance into arrays (the one place where labels become indices).

    Refuses (:class:`InstanceTooLarge`) before allocating when the compiled tensor would hold
    more than ``max_cells`` numbers — n·N outcomes, n·N·ℓ likelihoods (given, or made from
    ``noise``), n·(copies)·N after ``max_flips`` — or the instance would take more than
    ``max_bytes`` (arrays and labels; building it holds about twice that for a moment)."""
    if instance.item_bank is not None:  # the likelihood instance it stands for, on grid_points θ
        columnar, theta_of = bank_as_columns(instance, grid_points, max_cells)
        return with_theta(compile_instance(columnar, max_cells, max_bytes), theta_of, instance.item_bank)
    test_ids, n_tests = tuple(t.id for t in instance.tests), len(instance.tests)
    n = instance.n_hypotheses
    _check_size(n, n_tests, 1, 1, max_cells, max_bytes, "the instance")

    decision_labels, acceptable, loss = _decision_arrays(instance)
    hypothesis_ids, classes, raw_prior, outcome_labels, matrix, likelihood = (
        _per_hypothesis_arrays(instance, test_ids, max_cells, max_bytes) if instance.hypotheses is not None
        else _columnar_arrays(instance, max_cells, max_bytes))

    prior = np.full(n, 1.0 / n) if raw_prior is None else np.asarray(raw_prior, dtype=np.float64)
    prior = prior / prior.sum()
    class_labels, class_index = _class_index(classes, decision_labels, acceptable)
    costs = np.array([float(t.cost) for t in instance.tests])

    if likelihood is not None:
        width = max(len(o) for o in outcome_labels)
        _check_size(n, n_tests, width, 8, max_cells, max_bytes, "the likelihood tensor")
        likelihood, row_sums = _padded_rows(likelihood, outcome_labels)
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
        _, pattern = np.unique(_row_keys(acceptable), return_inverse=True)
        order = np.lexsort((pattern.reshape(-1), class_index))
    class_index, prior = class_index[order], prior[order]
    hypothesis_ids = blocks.mapped(hypothesis_ids.__getitem__, order)
    if likelihood is not None:
        # One copy, straight into the outcome-major layout (mode="clip": the indices are valid,
        # and "raise" would buffer another copy).
        by_outcome = likelihood.transpose(0, 2, 1)
        likelihood = np.take(by_outcome, order, axis=0, out=np.empty(by_outcome.shape), mode="clip")
        likelihood = likelihood.transpose(0, 2, 1)
        likelihood /= row_sums[order]  # in place in the one copy: rows made to sum to 1 exactly
    if acceptable is not None:
        acceptable = np.ascontiguousarray(acceptable[order])
        loss = None if loss is None else np.ascontiguousarray(loss[order])
    if matrix is not None and (order[1:] < order[:-1]).any():
        # Rows already grouped by class (the usual case) are kept as they came: a compact uint8
        # matrix then stays a view of its decoded bytes, never copied.
        matrix = matrix[order]
    same_rows = None  # rows equal exactly when the hypotheses' likelihood rows are (noise only)
    if matrix is not None and instance.max_flips is None and error_rates.any():
        likelihood, same_rows = _noisy(matrix, outcome_labels, error_rates, max_cells, max_bytes)
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
        **display_text(instance, outcome_labels),
    )
    if acceptable is not None:
        check_decision_work(acceptable, n_tests, compiled.max_outcomes, max_cells)
    object.__setattr__(compiled, "warnings", tuple(instance_warnings(compiled, same_rows)))
    return compiled


def _class_index(classes: list[str], decision_labels: tuple[str, ...],
                 acceptable: np.ndarray | None) -> tuple[tuple[str, ...], np.ndarray]:
    """The class labels (in order of first appearance) and each hypothesis's class index."""
    if acceptable is not None:
        # Section 4's reduction: the class of a hypothesis is its first acceptable decision.
        first = acceptable.argmax(axis=1)
        classes = [decision_labels[d] for d in first]
        class_labels = tuple(decision_labels[d] for d in np.unique(first))  # in decision order
    else:
        class_labels = blocks.first_appearances(classes)
    class_position = {c: i for i, c in enumerate(class_labels)}
    return class_labels, np.array([class_position[c] for c in classes], dtype=np.intp)


def _noisy(matrix: np.ndarray, outcome_labels, error_rates: np.ndarray, max_cells: int,
           max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """The likelihood tensor symmetric noise makes of ``matrix`` (built in the matrix's row
    order), and the columns that tell its rows apart."""
    n, n_tests = matrix.shape
    width = max(len(o) for o in outcome_labels)
    _check_size(n, n_tests, width, 8, max_cells, max_bytes, "noise's likelihood tensor")
    likelihood = _symmetric_noise(matrix, outcome_labels, error_rates)
    # Two noisy rows are equal exactly when their stated outcomes agree on every test whose
    # noise leaves the outcome informative: compare those, not n·N·ℓ floats.
    widths = np.array([len(o) for o in outcome_labels])
    informative = (widths > 1) & (1.0 - error_rates != error_rates / np.maximum(widths - 1, 1))
    return likelihood, matrix[:, informative]


def _per_hypothesis_arrays(instance: Instance, test_ids: tuple[str, ...], max_cells: int, max_bytes: int):
    """The per-hypothesis form's ids, classes, prior (None: uniform), outcome labels, and its
    outcome matrix or likelihood tensor (test-major: n × N × ℓ)."""
    n, n_tests = instance.n_hypotheses, len(test_ids)
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
    return hypothesis_ids, classes, raw_prior, outcome_labels, matrix, likelihood


def _columnar_arrays(instance: Instance, max_cells: int, max_bytes: int):
    """As :func:`_per_hypothesis_arrays`, for the columnar forms (matrix or likelihood tensor)."""
    n, n_tests = instance.n_hypotheses, len(instance.tests)
    hypothesis_ids = tuple(instance.hypothesis_ids or blocks.mapped(str, range(n)))
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
        likelihood = given.astype(np.float64, copy=False)  # maybe a read-only view: normalised as reordered
        nonzero = likelihood.reshape(-1, likelihood.shape[2]).any(axis=0)
        used = np.full(n_tests, int(np.flatnonzero(nonzero).max()) + 1)
    outcome_labels = [
        tuple(t.outcomes) if t.outcomes is not None else tuple(str(k) for k in range(int(used[j])))
        for j, t in enumerate(instance.tests)
    ]
    return hypothesis_ids, classes, raw_prior, outcome_labels, matrix, likelihood


def display_text(instance: Instance, outcome_labels) -> dict:
    """The tests' and outcomes' display text, aligned with the test ids and outcome labels (the
    keys of :class:`CompiledInstance`'s fields); nothing when no test has any."""
    if not any(t.text is not None or t.outcome_text for t in instance.tests):
        return {}
    return {"test_text": tuple(t.text for t in instance.tests),
            "outcome_text": tuple(tuple((t.outcome_text or {}).get(label) for label in labels)
                                  for t, labels in zip(instance.tests, outcome_labels))}


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


def _padded_rows(likelihood: np.ndarray, outcome_labels) -> tuple[np.ndarray, np.ndarray]:
    """The tensor padded to every test's outcomes, and each row's sum. Rows were checked to sum
    to 1 within 1e-6; dividing by the sums makes them exact so posteriors stay normalised."""
    widths = np.array([len(o) for o in outcome_labels])
    if likelihood.shape[2] < widths.max():
        likelihood = np.concatenate(
            [likelihood, np.zeros((*likelihood.shape[:2], widths.max() - likelihood.shape[2]))], axis=2
        )
    return likelihood, likelihood.sum(axis=2, keepdims=True)


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
