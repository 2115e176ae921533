"""The wire form of a problem instance: hypotheses, classes, priors, tests, outcomes.

Two equivalent shapes are accepted (see docs/instances.md):

* per-hypothesis: ``hypotheses: [{id, class, prior, outcomes | likelihoods}]``;
* columnar: ``matrix`` (n×N outcome indices) or ``likelihood_matrix`` (n×N×ℓ), ``classes``,
  optional ``priors`` and ``hypothesis_ids``; each array as nested lists, in the compact
  base64 form, or (from Python, or the binary body's ``.npy`` part) a numpy array
  (schemas/arrays.py), checked whole with numpy;
* item bank: ``item_bank: {items, prior, cut_scores, levels}``, IRT items compiled to likelihoods
  on a grid of θ (schemas/item_bank.py, docs/item-banks.md).

A *decision instance* names ``decisions`` instead of classes: each hypothesis says which decisions
are acceptable for it (``acceptable``, or ``loss`` per decision within ``loss_tolerance`` of its
least; columnar ``acceptable_matrix`` / ``loss_matrix``), and regions may overlap (docs/decisions.md).

Pydantic checks types here; the cross-field rules (unknown test ids, labels outside a test's
outcomes, rows not summing to 1, …) live in :func:`~.rules.validate_instance_rules` (schemas/rules.py), which reports every
problem with the JSON path of its place, e.g. ``hypotheses[3].outcomes.ecg``.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    InstanceOf,
    PrivateAttr,
    StrictBool,
    StrictInt,
    Tag,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from .arrays import EncodedArray
from .item_bank import ItemBank
from .labels import (  # noqa: F401 (re-exported)
    LABEL_MAX_LENGTH,
    TEXT_MAX_LENGTH,
    DisplayText,
    Label,
    Labels,
    LabelText,
    Number,
)

LIKELIHOOD_TOLERANCE = 1e-6
# HEC sums over every set of decisions some hypothesis accepts (2^|acceptable| per distinct row),
# so one hypothesis may accept at most this many; the number of decisions is bounded the same way.
MAX_DECISIONS = 32
MAX_ACCEPTABLE_PER_HYPOTHESIS = 12
# A positive prior below this share of the total is refused: the engine's gains are computed
# with an absolute round-off near 1e-16 and a zero tolerance of 1e-12 (service/engine/select.py),
# so a hypothesis this light would be invisible to every policy (docs/engine.md).
MIN_PRIOR_SHARE = 1e-9
# Costs below the smallest normal float make gain / cost overflow (1 / 1e-320 is inf), and
# costs summing past MAX_TOTAL_COST would overflow a sum of sampled run costs (evaluation).
MIN_COST = sys.float_info.min
MAX_TOTAL_COST = 1e300
# Each rule reports at most this many problems: the first ones say enough, and a hostile body
# must not make a megabyte of errors.
MAX_PROBLEMS = 50


def _array_form(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return "numpy"
    return "compact" if isinstance(value, dict | EncodedArray) else "lists"


# Nested lists or the compact form in JSON; a numpy array from Python or a binary body's .npy
# part (no JSON document can make one, so it is not in the JSON schema). json_path drops the
# tag from error locations.
ARRAY_FORMS = ("lists", "compact", "numpy")


def _array_field(lists: Any) -> Any:
    return Annotated[Union[Annotated[lists, Tag("lists")], Annotated[EncodedArray, Tag("compact")],
                           SkipJsonSchema[Annotated[InstanceOf[np.ndarray], Tag("numpy")]]],
                     Discriminator(_array_form)]


class _DerivedArrays(dict):
    """Arrays computed from a model's fields. Equal fields make equal arrays, so they never
    decide model equality (pydantic compares private attributes; arrays cannot be ==-tested)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _DerivedArrays)

    __hash__ = None  # type: ignore[assignment]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TestSpec(_Wire):
    __test__ = False  # not a pytest test class

    id: Label
    cost: Number = 1.0
    outcomes: Labels | None = None
    error_rate: Number | None = None
    # May be asked again in a session, each answer a new independent observation (likelihood
    # instances only: a deterministic answer cannot change, so asking twice tells nothing).
    repeatable: StrictBool = False
    # What people are shown: the question, and a wording per outcome label (keys among
    # ``outcomes``, which must then be listed). Clients fall back to the id and the labels.
    text: DisplayText | None = None
    outcome_text: dict[Label, DisplayText] | None = None


class HypothesisSpec(_Wire):
    id: Label
    class_: Label | None = Field(default=None, alias="class")
    prior: Number | None = None
    outcomes: dict[Label, Label] | None = None
    likelihoods: dict[Label, dict[Label, Number]] | None = None
    # Decision instances: the acceptable decisions, or a loss per decision.
    acceptable: Labels | None = None
    loss: dict[Label, Number] | None = None


class Instance(_Wire):
    """A problem instance as clients post it. Every rule is checked on construction."""

    # Required, except in the item-bank form, whose items are the tests.
    tests: list[TestSpec] | None = Field(default=None, min_length=1)
    hypotheses: list[HypothesisSpec] | None = None
    # Columnar form.
    matrix: _array_field(list[list[StrictInt]]) | None = None
    likelihood_matrix: _array_field(list[list[list[Number]]]) | None = None
    classes: Labels | None = None
    priors: list[Number] | None = None
    hypothesis_ids: Labels | None = None
    # Noise.
    noise: Number | None = None
    max_flips: StrictInt | None = None
    # Decisions (instead of classes).
    decisions: Labels | None = None
    loss_tolerance: Number | None = None
    acceptable_matrix: list[list[StrictInt]] | None = None
    loss_matrix: list[list[Number]] | None = None
    # Whether a skipped test's cost counts towards what a session spent (default: free).
    skip_cost: Literal["free", "charged"] = "free"
    # The item-bank form (schemas/item_bank.py): IRT items, an ability prior, cut scores; instead
    # of tests and hypotheses.
    item_bank: ItemBank | None = None
    # The columnar arrays as numpy, filled once by validation (see matrix_array()).
    _arrays: _DerivedArrays = PrivateAttr(default_factory=_DerivedArrays)

    @model_validator(mode="after")
    def _check_rules(self) -> Instance:
        problems = validate_instance_rules(self)
        if problems:
            raise ValidationError.from_exception_data(
                "Instance",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("instance_rule", message),
                        loc=loc,
                        input=None,
                    )
                    for loc, message in problems
                ],
            )
        return self

    @property
    def n_hypotheses(self) -> int:
        if self.hypotheses is not None:
            return len(self.hypotheses)
        rows = self.matrix if self.matrix is not None else self.likelihood_matrix
        if isinstance(rows, EncodedArray | np.ndarray):
            return rows.shape[0]
        return len(rows or [])

    def matrix_array(self) -> np.ndarray | None:
        """``matrix`` as an (n, N) integer array, whichever wire form it came in."""
        return self._arrays.get("matrix")

    def likelihood_array(self) -> np.ndarray | None:
        """``likelihood_matrix`` as an (n, N, ℓ) float array, whichever wire form it came in."""
        return self._arrays.get("likelihood_matrix")


Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]


def json_path(loc: Loc) -> str:
    """``("hypotheses", 3, "outcomes", "ecg")`` → ``hypotheses[3].outcomes.ecg``."""
    path = ""
    for i, part in enumerate(loc):
        if part in ARRAY_FORMS and i and loc[i - 1] in ("matrix", "likelihood_matrix"):
            continue  # the union's tag, not a place in the body
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


# Last: the rules read this module's limits and types, and the model above calls them.
from .rules import validate_instance_rules  # noqa: E402
