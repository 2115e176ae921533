"""The cross-field rules of the wire contract (unknown test ids, labels outside a test's outcomes,
rows not summing to 1, decision sets, priors and costs in range, …): :func:`validate_instance_rules`
reports every problem with the JSON path of its place, e.g. ``hypotheses[3].outcomes.ecg``; the
:class:`~.instance.Instance` model runs it after pydantic has checked the types."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from .item_bank import item_bank_problems
from .arrays import ArrayProblems, likelihood_problems, outcome_index_problems, to_array
from .instance import (
    LIKELIHOOD_TOLERANCE,
    MAX_ACCEPTABLE_PER_HYPOTHESIS,
    MAX_DECISIONS,
    MAX_PROBLEMS,
    MAX_TOTAL_COST,
    MIN_COST,
    MIN_PRIOR_SHARE,
    Loc,
    Problem,
)

if TYPE_CHECKING:
    from .instance import Instance


def _finite(x: float) -> bool:
    return isinstance(x, int) or math.isfinite(x)


def validate_instance_rules(inst: Instance) -> list[Problem]:
    """Every cross-field rule of the wire contract; returns ``(location, message)`` pairs."""
    if inst.item_bank is not None:
        return _check_item_bank(inst)[:MAX_PROBLEMS]
    if inst.tests is None:
        return [(("tests",), "give tests (or an item_bank)")]
    problems: list[Problem] = []
    problems += _check_tests(inst)
    if inst.hypotheses is not None:
        columnar = [
            name
            for name in ("matrix", "likelihood_matrix", "classes", "priors", "hypothesis_ids",
                         "acceptable_matrix", "loss_matrix")
            if getattr(inst, name) is not None
        ]
        for name in columnar:
            problems.append(((name,), "give either 'hypotheses' or the columnar fields, not both"))
        if not inst.hypotheses:
            problems.append((("hypotheses",), "at least one hypothesis is required"))
        problems += _check_hypotheses(inst)
    else:
        problems += _check_columnar(inst)
    problems += _check_noise(inst)
    problems += _check_decisions(inst)
    problems += _check_repeatable(inst)
    return problems[:MAX_PROBLEMS]


# Fields of the other forms: an item bank's items are its tests and its θ grid its hypotheses.
_NOT_WITH_ITEM_BANK = ("tests", "hypotheses", "matrix", "likelihood_matrix", "classes", "priors", "hypothesis_ids",
                       "noise", "max_flips", "decisions", "loss_tolerance", "acceptable_matrix", "loss_matrix")


def _check_item_bank(inst: Instance) -> list[Problem]:
    problems: list[Problem] = [((name,), "give either an item_bank or tests and hypotheses, not both")
                               for name in _NOT_WITH_ITEM_BANK if getattr(inst, name) is not None]
    return problems + item_bank_problems(inst.item_bank)


def _total(values) -> float:
    """The exact sum rounded once, or inf when it is beyond the largest float."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def _labels_in_message(labels: set[str] | list[str]) -> str:
    """A test's outcome labels for an error message: sorted when few, the first ten otherwise
    (a hostile test may list thousands, and each problem names them)."""
    if len(labels) <= 10:
        return repr(sorted(labels))
    return repr(list(itertools.islice(labels, 10)))[:-1] + ", ...]"


def is_likelihood(inst: Instance) -> bool:
    """Whether the instance compiles to likelihoods (given ones, or symmetric noise without
    max_flips) rather than deterministic outcomes."""
    if inst.likelihood_matrix is not None or any(h.likelihoods for h in inst.hypotheses or []):
        return True
    noisy = bool(inst.noise) or any(t.error_rate for t in inst.tests)
    return noisy and inst.max_flips is None


def _check_repeatable(inst: Instance) -> list[Problem]:
    if is_likelihood(inst):
        return []
    return [(("tests", i, "repeatable"), "only a likelihood instance can repeat a test: a deterministic "
             "answer cannot change, so asking again tells nothing (give noise, error_rate or likelihoods)")
            for i, test in enumerate(inst.tests) if test.repeatable]


def _check_tests(inst: Instance) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, test in enumerate(inst.tests):
        if test.id in seen:
            problems.append((("tests", i, "id"), f"duplicate test id '{test.id}' (also tests[{seen[test.id]}])"))
        seen.setdefault(test.id, i)
        if not _finite(test.cost) or test.cost < MIN_COST:
            problems.append((("tests", i, "cost"), f"cost must be a finite number >= {MIN_COST:.17g} (> 0)"))
        if test.outcomes is not None:
            if not test.outcomes:
                problems.append((("tests", i, "outcomes"), "a test needs at least one outcome"))
            # Counted once (linear): a list.count per label is quadratic in a hostile list. A set
            # first: building a Counter for each of thousands of tests is what costs.
            dupes = [] if len(set(test.outcomes)) == len(test.outcomes) else [
                label for label, count in Counter(test.outcomes).items() if count > 1]
            if dupes:
                problems.append((("tests", i, "outcomes"), f"duplicate outcome labels {_labels_in_message(dupes)}"))
        problems += _check_outcome_text(test, i)
        if test.error_rate is not None and not (_finite(test.error_rate) and 0 <= test.error_rate < 1):
            problems.append((("tests", i, "error_rate"), "error_rate must be in [0, 1)"))
        if len(problems) > MAX_PROBLEMS:
            return problems
    if not problems and not _total(float(t.cost) for t in inst.tests) <= MAX_TOTAL_COST:
        problems.append((("tests",), f"the costs sum to more than {MAX_TOTAL_COST:g}; scale them (and "
                                     "max_cost) down"))
    return problems


def _check_outcome_text(test, i: int) -> list[Problem]:
    if test.outcome_text is None:
        return []
    if test.outcomes is None:
        return [(("tests", i, "outcome_text"), "outcome_text needs the test's outcomes listed in 'outcomes'")]
    allowed = set(test.outcomes)
    return [(("tests", i, "outcome_text", label), f"'{label}' is not one of the test's outcomes "
             f"{_labels_in_message(allowed)}") for label in test.outcome_text if label not in allowed]


def _check_prior_values(values: list[tuple[Loc, float]], where: Loc) -> list[Problem]:
    problems: list[Problem] = []
    for loc, p in values:
        if not _finite(p) or p < 0:
            problems.append((loc, "prior must be a finite number >= 0"))
            if len(problems) > MAX_PROBLEMS:
                return problems
    if not values or problems:
        return problems
    total = _total(float(p) for _, p in values)
    if not math.isfinite(total):
        return [(where, "the priors sum to more than the largest float; scale them down "
                        "(only their ratios matter)")]
    if total <= 0:
        return [(where, "priors are all zero; at least one must be positive")]
    for loc, p in values:
        if 0 < p < MIN_PRIOR_SHARE * total:
            problems.append((loc, f"prior is {p / total:.3g} of the total, below the smallest share "
                                  f"{MIN_PRIOR_SHARE:g} the engine can tell from round-off; give 0 "
                                  "(impossible) or a larger value"))
            if len(problems) > MAX_PROBLEMS:
                break
    return problems


def _check_likelihood_row(row: dict[str, float], loc: Loc, allowed: set[str] | None) -> list[Problem]:
    problems: list[Problem] = []
    for label, p in row.items():
        if allowed is not None and label not in allowed:
            problems.append(((*loc, label), f"'{label}' is not one of the test's outcomes {_labels_in_message(allowed)}"))
        if not _finite(p) or p < 0:
            problems.append(((*loc, label), "a likelihood must be a finite number >= 0"))
        if len(problems) > MAX_PROBLEMS:
            return problems
    if not problems and abs(sum(row.values()) - 1.0) > LIKELIHOOD_TOLERANCE:
        problems.append((loc, f"likelihoods sum to {sum(row.values()):.9g}, not 1"))
    return problems


def _check_hypotheses(inst: Instance) -> list[Problem]:
    problems: list[Problem] = []
    hyps = inst.hypotheses or []
    outcomes_of = {t.id: (set(t.outcomes) if t.outcomes is not None else None) for t in inst.tests}
    seen: dict[str, int] = {}
    given_priors = [(("hypotheses", i, "prior"), h.prior) for i, h in enumerate(hyps) if h.prior is not None]
    if given_priors and len(given_priors) != len(hyps):
        missing = next(i for i, h in enumerate(hyps) if h.prior is None)
        problems.append(
            (("hypotheses", missing, "prior"), "give a prior for every hypothesis or for none (uniform)")
        )
    problems += _check_prior_values(given_priors, ("hypotheses",))
    for i, h in enumerate(hyps):
        here: Loc = ("hypotheses", i)
        if h.id in seen:
            problems.append(((*here, "id"), f"duplicate hypothesis id '{h.id}' (also hypotheses[{seen[h.id]}])"))
        seen.setdefault(h.id, i)
        outcomes = h.outcomes or {}
        likelihoods = h.likelihoods or {}
        for t, label in outcomes.items():
            if t not in outcomes_of:
                problems.append(((*here, "outcomes", t), f"unknown test id '{t}'"))
            elif outcomes_of[t] is not None and label not in outcomes_of[t]:
                problems.append(
                    ((*here, "outcomes", t),
                     f"'{label}' is not one of the test's outcomes {_labels_in_message(outcomes_of[t])}")
                )
        for t, row in likelihoods.items():
            if t not in outcomes_of:
                problems.append(((*here, "likelihoods", t), f"unknown test id '{t}'"))
                continue
            if t in outcomes:
                problems.append(((*here, "likelihoods", t), f"test '{t}' is given both an outcome and likelihoods"))
            problems += _check_likelihood_row(row, (*here, "likelihoods", t), outcomes_of[t])
        for t in outcomes_of:
            if t not in outcomes and t not in likelihoods:
                field = "likelihoods" if likelihoods and not outcomes else "outcomes"
                problems.append(((*here, field, t), f"no outcome given for test '{t}'"))
        if len(problems) > MAX_PROBLEMS:
            break
    return problems


def _check_columnar(inst: Instance) -> list[Problem]:
    problems: list[Problem] = []
    n_tests = len(inst.tests)
    if (inst.matrix is None) == (inst.likelihood_matrix is None):
        return [((), "give 'hypotheses', or exactly one of 'matrix' and 'likelihood_matrix'")]
    name = "matrix" if inst.matrix is not None else "likelihood_matrix"
    try:
        if inst.matrix is not None:
            array = to_array(inst.matrix, name, 2, "int", n_tests)
        else:
            array = to_array(inst.likelihood_matrix, name, 3, "float", n_tests)
    except ArrayProblems as error:
        return error.problems
    n = array.shape[0]
    outcome_counts = np.array([len(t.outcomes) if t.outcomes is not None else -1 for t in inst.tests])
    test_ids = [t.id for t in inst.tests]
    if inst.matrix is not None:
        problems += outcome_index_problems(array, outcome_counts, test_ids)
    else:
        problems += likelihood_problems(array, outcome_counts, test_ids, LIKELIHOOD_TOLERANCE)
    for field in ("classes", "priors", "hypothesis_ids"):
        values = getattr(inst, field)
        if values is not None and len(values) != n:
            problems.append(((field,), f"has {len(values)} entries, expected one per row of '{name}' ({n})"))
    if inst.classes is None and inst.decisions is None:
        problems.append((("classes",), "the columnar form needs 'classes' (one label per row), or 'decisions'"))
    if inst.hypothesis_ids is not None:
        seen: dict[str, int] = {}
        for i, hid in enumerate(inst.hypothesis_ids):
            if hid in seen:
                problems.append((("hypothesis_ids", i), f"duplicate hypothesis id '{hid}'"))
            seen.setdefault(hid, i)
    if inst.priors is not None:
        problems += _check_prior_values([(("priors", i), p) for i, p in enumerate(inst.priors)], ("priors",))
    if not problems:
        inst._arrays[name] = array
    return problems


def _check_noise(inst: Instance) -> list[Problem]:
    problems: list[Problem] = []
    if inst.noise is not None and not (_finite(inst.noise) and 0 <= inst.noise < 1):
        problems.append((("noise",), "noise must be in [0, 1)"))
    has_likelihoods = inst.likelihood_matrix is not None or any(h.likelihoods for h in inst.hypotheses or [])
    if inst.max_flips is not None:
        # Past N nothing changes (a copy cannot flip more tests than there are), so a larger
        # value is a mistake, and refusing it here keeps every later loop bounded by N.
        if not 0 <= inst.max_flips <= len(inst.tests):
            problems.append((("max_flips",), f"max_flips must be between 0 and the number of tests ({len(inst.tests)})"))
        if has_likelihoods:
            problems.append((("max_flips",), "max_flips expands deterministic outcomes; it cannot apply to likelihoods"))
    if has_likelihoods and (inst.noise or any(t.error_rate for t in inst.tests)):
        problems.append((("noise",), "noise / error_rate apply to deterministic outcomes, not to given likelihoods"))
    return problems


def _check_decisions(inst: Instance) -> list[Problem]:
    """A decision instance: ``decisions`` at the top, per hypothesis ``acceptable`` or ``loss``
    (columnar: ``acceptable_matrix`` or ``loss_matrix``), and no classes."""
    problems: list[Problem] = []
    hyps = inst.hypotheses or []
    decision_fields = [
        *((("hypotheses", i, name),) for i, h in enumerate(hyps)
          for name in ("acceptable", "loss") if getattr(h, name) is not None),
        *(((name,),) for name in ("loss_tolerance", "acceptable_matrix", "loss_matrix")
          if getattr(inst, name) is not None),
    ]
    if inst.decisions is None:
        return [(loc, "decision fields need the list of 'decisions'") for (loc,) in decision_fields[:50]]
    if not inst.decisions:
        return [(("decisions",), "at least one decision is required")]
    if len(inst.decisions) > MAX_DECISIONS:
        return [(("decisions",), f"{len(inst.decisions)} decisions; at most {MAX_DECISIONS}")]
    position: dict[str, int] = {}
    for j, d in enumerate(inst.decisions):
        if d in position:
            problems.append((("decisions", j), f"duplicate decision id '{d}' (also decisions[{position[d]}])"))
        position.setdefault(d, j)
    if inst.loss_tolerance is not None and not (_finite(inst.loss_tolerance) and inst.loss_tolerance >= 0):
        problems.append((("loss_tolerance",), "loss_tolerance must be a finite number >= 0"))
    if inst.hypotheses is not None:
        problems += _check_decision_hypotheses(inst, position)
    else:
        problems += _check_decision_matrices(inst)
    return problems


def _check_decision_hypotheses(inst: Instance, position: dict[str, int]) -> list[Problem]:
    problems: list[Problem] = []
    hyps = inst.hypotheses or []
    with_loss = [i for i, h in enumerate(hyps) if h.loss is not None]
    if with_loss and len(with_loss) != len(hyps):
        first = next(i for i, h in enumerate(hyps) if h.loss is None)
        problems.append((("hypotheses", first, "loss"), "give 'loss' for every hypothesis or for none"))
    if not with_loss and inst.loss_tolerance is not None:
        problems.append((("loss_tolerance",), "loss_tolerance applies to losses; no hypothesis gives 'loss'"))
    for i, h in enumerate(hyps):
        here: Loc = ("hypotheses", i)
        if h.class_ is not None:
            problems.append(((*here, "class"), "a decision instance gives no class (decisions replace classes)"))
        if h.acceptable is not None and h.loss is not None:
            problems.append(((*here, "loss"), "give either 'acceptable' or 'loss', not both"))
        elif h.acceptable is None and h.loss is None:
            problems.append(((*here, "acceptable"), "give the acceptable decisions ('acceptable') or 'loss'"))
        if h.acceptable is not None:
            if not h.acceptable:
                problems.append(((*here, "acceptable"), "every hypothesis must accept at least one decision"))
            seen: set[str] = set()
            for j, d in enumerate(h.acceptable):
                if d not in position:
                    problems.append(((*here, "acceptable", j), f"unknown decision id '{d}'"))
                elif d in seen:
                    problems.append(((*here, "acceptable", j), f"decision '{d}' is listed twice"))
                seen.add(d)
            if len(seen) > MAX_ACCEPTABLE_PER_HYPOTHESIS:
                problems.append(((*here, "acceptable"),
                                 f"accepts {len(seen)} decisions; at most {MAX_ACCEPTABLE_PER_HYPOTHESIS}"))
        if h.loss is not None:
            before = len(problems)
            for d, value in h.loss.items():
                if d not in position:
                    problems.append(((*here, "loss", d), f"unknown decision id '{d}'"))
                elif not _finite(value) or value < 0:
                    problems.append(((*here, "loss", d), "a loss must be a finite number >= 0"))
            for d in position:
                if d not in h.loss:
                    problems.append(((*here, "loss", d), f"no loss given for decision '{d}'"))
            if len(problems) == before:
                problems += _check_tolerated(list(h.loss.values()), inst.loss_tolerance, (*here, "loss"))
        if len(problems) > 50:
            break
    return problems


def _check_decision_matrices(inst: Instance) -> list[Problem]:
    problems: list[Problem] = []
    if inst.classes is not None:
        problems.append((("classes",), "a decision instance gives no classes (decisions replace classes)"))
    if (inst.acceptable_matrix is None) == (inst.loss_matrix is None):
        where = "loss_matrix" if inst.loss_matrix is not None else "acceptable_matrix"
        return [*problems, ((where,), "give exactly one of 'acceptable_matrix' and 'loss_matrix'")]
    if inst.acceptable_matrix is not None and inst.loss_tolerance is not None:
        problems.append((("loss_tolerance",), "loss_tolerance applies to 'loss_matrix'"))
    name = "acceptable_matrix" if inst.acceptable_matrix is not None else "loss_matrix"
    rows = inst.acceptable_matrix if inst.acceptable_matrix is not None else inst.loss_matrix
    n, width = inst.n_hypotheses, len(inst.decisions or [])
    if len(rows) != n:
        problems.append(((name,), f"has {len(rows)} rows, expected one per hypothesis ({n})"))
    for i, row in enumerate(rows):
        if len(row) != width:
            problems.append(((name, i), f"row has {len(row)} entries, expected one per decision ({width})"))
        elif name == "acceptable_matrix":
            bad = [j for j, cell in enumerate(row) if cell not in (0, 1)]
            problems += [((name, i, j), "must be 0 or 1") for j in bad]
            if not bad and not any(row):
                problems.append(((name, i), "every hypothesis must accept at least one decision"))
            elif not bad and sum(row) > MAX_ACCEPTABLE_PER_HYPOTHESIS:
                problems.append(((name, i), f"accepts {sum(row)} decisions; at most {MAX_ACCEPTABLE_PER_HYPOTHESIS}"))
        else:
            bad = [((name, i, j), "a loss must be a finite number >= 0")
                   for j, cell in enumerate(row) if not _finite(cell) or cell < 0]
            problems += bad or _check_tolerated(row, inst.loss_tolerance, (name, i))
        if len(problems) > 50:
            break
    return problems


def acceptable_by_loss(losses: list[float], tolerance: float | None) -> list[bool]:
    """A decision is acceptable when its loss is within ``tolerance`` (default 0) of the least."""
    least = min(losses)
    return [value <= least + (tolerance or 0.0) for value in losses]


def _check_tolerated(losses: list[float], tolerance: float | None, loc: Loc) -> list[Problem]:
    if tolerance is not None and not (_finite(tolerance) and tolerance >= 0):
        return []  # reported at loss_tolerance
    count = sum(acceptable_by_loss(losses, tolerance))
    if count > MAX_ACCEPTABLE_PER_HYPOTHESIS:
        return [(loc, f"{count} decisions are within loss_tolerance of the least; at most "
                      f"{MAX_ACCEPTABLE_PER_HYPOTHESIS} may be acceptable to one hypothesis")]
    return []
