"""The ``item_bank`` form of an instance: items calibrated with item response theory, an ability
prior, and the cut scores between performance levels (docs/item-banks.md).

The engine compiles it to a likelihood instance on a grid of θ (service/engine/item_bank.py):
each grid point is a hypothesis, in the class of the level that holds it. Pydantic checks the
types here; :func:`item_bank_problems` the rules, each with the JSON path of its place
(``item_bank.items[3].a``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from .labels import DisplayText, Label, Labels, Number

ItemModel = Literal["1PL", "2PL", "3PL", "GRM", "GPCM"]
DICHOTOMOUS = frozenset({"1PL", "2PL", "3PL"})
# A normal prior's grid spans its mean ± this many standard deviations (a θ beyond it is read as
# the grid's end point: the normal prior gives it less than 1e-4 of its mass).
NORMAL_GRID_SDS = 4.0
# A positive grid weight below this share of the total is refused, as every prior is (instance.py).
MIN_WEIGHT_SHARE = 1e-9
# Numbers on the θ scale (b, thresholds, cut scores, the prior's mean, sd and grid) and a, D lie
# within this bound: calibrations are logits of a few units, and within it D·a·(θ − b) and its
# sums over thresholds stay finite, so every accepted bank compiles to finite likelihoods.
SCALE_LIMIT = 1e6
# A normal prior's sd is at least this share of max(1, |mean|), so its grid's points stay distinct
# numbers (and distinct hypotheses) however fine the grid.
MIN_SD_SHARE = 1e-6


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ItemSpec(_Wire):
    """One item. Dichotomous (outcomes "0" wrong, "1" right): 1PL takes ``b``; 2PL ``a``, ``b``;
    3PL ``a``, ``b``, ``c``. Polytomous (outcomes "0" … "m"): GRM and GPCM take ``a`` and the m
    ``thresholds``."""

    id: Label
    model: ItemModel
    a: Number | None = None
    b: Number | None = None
    c: Number | None = None
    thresholds: list[Number] | None = None
    content_area: Label | None = None
    # What people are shown, as a test's (schemas/instance.py): the question, and a wording per
    # outcome label ("0" … "m").
    text: DisplayText | None = None
    outcome_text: dict[Label, DisplayText] | None = None
    # Sympson–Hetter: the probability that the item is given when chosen (default 1).
    exposure_parameter: Number | None = None

    @property
    def n_outcomes(self) -> int:
        return 2 if self.model in DICHOTOMOUS else len(self.thresholds or ()) + 1


class PriorSpec(_Wire):
    """A normal prior (``mean``, ``sd``) on a grid of ITEM_BANK_GRID_POINTS points over mean ±
    4 sd, or a given ``grid`` of θ values and their ``weights``."""

    mean: Number | None = None
    sd: Number | None = None
    grid: list[Number] | None = None
    weights: list[Number] | None = None

    @property
    def is_grid(self) -> bool:
        return self.grid is not None


class ContentBalance(_Wire):
    """Shares of the items asked per ``content_area`` (summing to 1), and optionally the least and
    most items of an area in one session."""

    targets: dict[Label, Number]
    min: dict[Label, StrictInt] | None = None
    max: dict[Label, StrictInt] | None = None


class ItemBank(_Wire):
    items: list[ItemSpec] = Field(min_length=1)
    prior: PriorSpec = PriorSpec(mean=0, sd=1)
    # Classes are the performance levels between cut scores (a θ at a cut is in the level above);
    # without cut scores every grid point is its own class (θ estimation).
    cut_scores: list[Number] | None = None
    levels: Labels | None = None
    # D in the logistic 1 / (1 + exp(-D a (θ - b))): 1, or 1.702 to approximate the normal ogive.
    scaling: Number = 1.0
    # Groups of item ids of which a session asks at most one (items that give each other away).
    enemies: list[Labels] | None = None
    content_balance: ContentBalance | None = None

    def level_labels(self) -> tuple[str, ...]:
        """The classes' labels: ``levels``, else "level 1" … "level k+1" (cut scores given)."""
        if self.levels is not None:
            return tuple(self.levels)
        return tuple(f"level {i + 1}" for i in range(len(self.cut_scores or ()) + 1))


Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]


def _finite(x: float | None) -> bool:
    return x is not None and (isinstance(x, int) or math.isfinite(x))


def _on_scale(x: float | None) -> bool:
    return _finite(x) and abs(x) <= SCALE_LIMIT


def item_bank_problems(bank: ItemBank, where: Loc = ("item_bank",)) -> list[Problem]:
    """Every rule of the item bank, each as ``(location, message)``."""
    problems = _item_problems(bank.items, where + ("items",))
    problems += _prior_problems(bank.prior, where + ("prior",))
    if not (_on_scale(bank.scaling) and bank.scaling > 0):
        problems.append((where + ("scaling",), f"scaling (D) must be a number in (0, {SCALE_LIMIT:g}]"))
    problems += _level_problems(bank, where)
    problems += _enemy_problems(bank, where + ("enemies",))
    if bank.content_balance is not None:
        problems += _content_problems(bank, where)
    return problems


def _content_problems(bank: ItemBank, where: Loc) -> list[Problem]:
    balance, at = bank.content_balance, where + ("content_balance",)
    targets = balance.targets
    problems: list[Problem] = [(where + ("items", i, "content_area"), "content balancing needs every item's "
                                "content_area, one of the targets") for i, item in enumerate(bank.items)
                               if item.content_area not in targets]
    problems += [(at + ("targets", area), "a target share must be a finite number in [0, 1]")
                 for area, share in targets.items() if not (_finite(share) and 0 <= share <= 1)]
    if not problems and abs(math.fsum(targets.values()) - 1) > 1e-6:
        problems.append((at + ("targets",), f"the target shares sum to {math.fsum(targets.values()):g}, not 1"))
    for name in ("min", "max"):
        for area, count in (getattr(balance, name) or {}).items():
            if area not in targets or count < 0:
                problems.append((at + (name, area), f"{name} counts are numbers >= 0 of areas in targets"))
    for area, most in (balance.max or {}).items():
        if most < (balance.min or {}).get(area, 0):
            problems.append((at + ("max", area), "max is below min"))
    return problems


def _enemy_problems(bank: ItemBank, at: Loc) -> list[Problem]:
    ids = {item.id for item in bank.items}
    problems: list[Problem] = []
    for g, group in enumerate(bank.enemies or ()):
        problems += [(at + (g, k), f"unknown item '{item}'") for k, item in enumerate(group) if item not in ids]
        if len(set(group)) < 2:
            problems.append(((at + (g,)), "a group of enemies names at least two different items"))
    return problems


def _item_problems(items: Sequence[ItemSpec], where: Loc) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        at = where + (i,)
        if item.id in seen:
            problems.append((at + ("id",), f"duplicate item id '{item.id}' (also items[{seen[item.id]}])"))
        seen.setdefault(item.id, i)
        wanted = {"1PL": ("b",), "2PL": ("a", "b"), "3PL": ("a", "b", "c")}.get(item.model, ("a", "thresholds"))
        for name in ("a", "b", "c", "thresholds"):
            given = getattr(item, name) is not None
            if given and name not in wanted:
                problems.append((at + (name,), f"a {item.model} item takes {', '.join(wanted)}, not {name}"
                                 + (" (use 2PL for a discrimination)" if item.model == "1PL" and name == "a" else "")))
            elif not given and name in wanted:
                problems.append((at + (name,), f"a {item.model} item needs {name}"))
        if item.a is not None and not (_on_scale(item.a) and item.a > 0):
            problems.append((at + ("a",), f"a (discrimination) must be a number in (0, {SCALE_LIMIT:g}]"))
        if item.b is not None and not _on_scale(item.b):
            problems.append((at + ("b",), f"b (difficulty) must be a number within ±{SCALE_LIMIT:g}"))
        if item.c is not None and not (_finite(item.c) and 0 <= item.c < 1):
            problems.append((at + ("c",), "c (guessing) must be in [0, 1)"))
        k = item.exposure_parameter
        if k is not None and not (_finite(k) and 0 < k <= 1):
            problems.append((at + ("exposure_parameter",), "exposure_parameter (Sympson–Hetter) must be in (0, 1]"))
        if item.thresholds is not None:
            problems += _threshold_problems(item, at + ("thresholds",))
        allowed = [str(k) for k in range(item.n_outcomes)]
        problems += [(at + ("outcome_text", label), f"'{label}' is not one of the item's outcomes {allowed}")
                     for label in item.outcome_text or () if label not in allowed]
    return problems


def _threshold_problems(item: ItemSpec, at: Loc) -> list[Problem]:
    thresholds = item.thresholds
    if not thresholds:
        return [(at, "a polytomous item needs at least one threshold (m thresholds: outcomes 0 … m)")]
    bad = [k for k, t in enumerate(thresholds) if not _on_scale(t)]
    if bad:
        return [(at + (k,), f"a threshold must be a number within ±{SCALE_LIMIT:g}") for k in bad]
    # GRM's cumulative curves cross unless its thresholds increase; GPCM's step difficulties may
    # be reversed (a legitimate finding of a partial-credit calibration).
    if item.model == "GRM":
        return [(at + (k,), f"GRM thresholds must increase: {thresholds[k]} follows {thresholds[k - 1]}")
                for k in range(1, len(thresholds)) if not thresholds[k] > thresholds[k - 1]]
    return []


def _prior_problems(prior: PriorSpec, at: Loc) -> list[Problem]:
    normal = prior.mean is not None or prior.sd is not None
    if normal and prior.is_grid or prior.weights is not None and not prior.is_grid:
        return [(at, "give either mean and sd (a normal prior) or grid and weights, not both")]
    if normal:
        problems = [] if _on_scale(prior.mean) else [(at + ("mean",), f"mean must be a number within ±{SCALE_LIMIT:g}")]
        least = MIN_SD_SHARE * max(1.0, abs(prior.mean)) if not problems else 0.0
        if not (_on_scale(prior.sd) and prior.sd > least):
            problems.append((at + ("sd",), f"sd must be a number in ({least:g}, {SCALE_LIMIT:g}] "
                                           f"({MIN_SD_SHARE:g} × max(1, |mean|) at least, so the grid's points differ)"))
        return problems
    if not prior.is_grid:
        return [(at, "give mean and sd (a normal prior) or grid and weights")]
    grid, weights = prior.grid, prior.weights
    if weights is None:
        return [(at + ("weights",), "a grid prior needs weights, one per grid point")]
    if len(grid) < 2 or len(weights) != len(grid):
        return [(at + ("weights",), f"give at least two grid points and one weight per point "
                                    f"({len(grid)} points, {len(weights)} weights)")]
    problems = [(at + ("grid", k), f"a grid point must be a number within ±{SCALE_LIMIT:g}") for k, x in enumerate(grid)
                if not _on_scale(x)]
    problems += [(at + ("grid", k), f"grid points must increase: {grid[k]} follows {grid[k - 1]}")
                 for k in range(1, len(grid)) if _on_scale(grid[k]) and _on_scale(grid[k - 1]) and grid[k] <= grid[k - 1]]
    bad = [k for k, w in enumerate(weights) if not (_finite(w) and w >= 0)]
    problems += [(at + ("weights", k), "a weight must be a finite number >= 0") for k in bad]
    if not bad:
        total = math.fsum(weights)
        if not 0 < total < math.inf:
            problems.append((at + ("weights",), "the weights must have a positive, finite sum"))
        else:
            problems += [(at + ("weights", k), f"a positive weight must be at least {MIN_WEIGHT_SHARE:g} of "
                          "the total (give 0 to rule the point out)")
                         for k, w in enumerate(weights) if 0 < w < MIN_WEIGHT_SHARE * total]
    return problems


def grid_range(prior: PriorSpec) -> tuple[float, float]:
    """The lowest and highest θ of the prior's grid."""
    if prior.is_grid:
        return float(prior.grid[0]), float(prior.grid[-1])
    return (float(prior.mean) - NORMAL_GRID_SDS * float(prior.sd),
            float(prior.mean) + NORMAL_GRID_SDS * float(prior.sd))


def _level_problems(bank: ItemBank, where: Loc) -> list[Problem]:
    cuts, levels = bank.cut_scores, bank.levels
    if cuts is None:
        if levels is not None:
            return [(where + ("levels",), "levels name the classes between cut_scores: give cut_scores too")]
        return []
    at = where + ("cut_scores",)
    if not cuts:
        return [(at, "give at least one cut score, or leave cut_scores out to estimate θ")]
    problems = [(at + (k,), f"a cut score must be a number within ±{SCALE_LIMIT:g}") for k, x in enumerate(cuts) if not _on_scale(x)]
    if problems:
        return problems
    problems += [(at + (k,), f"cut scores must increase: {cuts[k]} follows {cuts[k - 1]}")
                 for k in range(1, len(cuts)) if not cuts[k] > cuts[k - 1]]
    low, high = grid_range(bank.prior) if not _prior_problems(bank.prior, ()) else (-math.inf, math.inf)
    problems += [(at + (k,), f"cut score {x} is outside the prior's θ grid [{low:g}, {high:g}]: a level "
                  "beyond it could never be the answer") for k, x in enumerate(cuts) if not low < x <= high]
    if levels is not None:
        if len(levels) != len(cuts) + 1:
            problems.append((where + ("levels",), f"{len(cuts)} cut scores make {len(cuts) + 1} levels; "
                                                  f"{len(levels)} are named"))
        seen: set[str] = set()
        for k, label in enumerate(levels):
            if label in seen:
                problems.append((where + ("levels", k), f"duplicate level '{label}'"))
            seen.add(label)
    return problems
