"""Item banks (schemas/item_bank.py) as likelihood instances, and what a posterior says of θ.

An item bank is compiled on a grid of θ: each grid point is a hypothesis whose prior is the
ability prior's weight there (a normal prior: its density at the point, normalised) and whose
class is the performance level holding it; each item is a test with P(X = k | θ) from its IRT
model. The result is an ordinary columnar likelihood instance, compiled and hashed as any other
(compilation.py), with the grid kept beside it (:attr:`CompiledInstance.theta`) for the EAP
estimate and its posterior SD (:func:`theta_estimate`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from schemas.instance import Instance, TestSpec
from schemas.item_bank import DICHOTOMOUS, NORMAL_GRID_SDS, ItemBank, ItemSpec

from .belief import Belief
from .compiled import CompiledInstance
from .errors import InstanceTooLarge, StopRuleNotApplicable

DEFAULT_GRID_POINTS = 61


def _logistic(z: np.ndarray) -> np.ndarray:
    # 1 / (1 + e^(−z)) without overflow for large |z|.
    return np.exp(-np.logaddexp(0.0, -z))


def item_probabilities(item: ItemSpec, theta: np.ndarray, scaling: float = 1.0) -> np.ndarray:
    """(G, m + 1): P(X = k | θ) of ``item`` at each θ; dichotomous items have outcomes 0 (wrong)
    and 1 (right)."""
    theta = np.asarray(theta, dtype=np.float64)
    if item.model in DICHOTOMOUS:
        a = 1.0 if item.a is None else float(item.a)
        c = 0.0 if item.c is None else float(item.c)
        z = scaling * a * (theta - float(item.b))
        # Each outcome from its own tail, so neither rounds to 0 before it must.
        return np.stack([(1.0 - c) * _logistic(-z), c + (1.0 - c) * _logistic(z)], axis=1)
    steps = scaling * float(item.a) * (theta[:, None] - np.asarray(item.thresholds, dtype=np.float64)[None, :])
    if item.model == "GRM":
        # P(X ≥ k) for k = 0 … m + 1 (1 and 0 at the ends); each outcome is the difference.
        at_least = np.concatenate([np.ones((theta.size, 1)), _logistic(steps), np.zeros((theta.size, 1))], axis=1)
        return np.maximum(at_least[:, :-1] - at_least[:, 1:], 0.0)
    # GPCM: P(X = k) ∝ exp(Σ_{v ≤ k} D a (θ − b_v)), the empty sum 0 for k = 0.
    sums = np.concatenate([np.zeros((theta.size, 1)), np.cumsum(steps, axis=1)], axis=1)
    sums -= sums.max(axis=1, keepdims=True)
    weights = np.exp(sums)
    return weights / weights.sum(axis=1, keepdims=True)


def theta_grid(bank: ItemBank, points: int = DEFAULT_GRID_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(θ, prior weights, summing to 1): the given grid, or ``points`` evenly spaced over the
    normal prior's mean ± 4 sd with its density there."""
    prior = bank.prior
    if prior.is_grid:
        theta, weights = np.asarray(prior.grid, dtype=np.float64), np.asarray(prior.weights, dtype=np.float64)
    else:
        mean, sd = float(prior.mean), float(prior.sd)
        theta = np.linspace(mean - NORMAL_GRID_SDS * sd, mean + NORMAL_GRID_SDS * sd, points)
        # A point meant to sit on a cut score (0.8 as -4 + 36·(8/60)) may round to just below it
        # and fall in the level under it: points within a billionth of a step of a cut are the cut.
        step = 2 * NORMAL_GRID_SDS * sd / max(points - 1, 1)
        for cut in bank.cut_scores or ():
            theta[np.abs(theta - float(cut)) <= 1e-9 * step] = float(cut)
        weights = np.exp(-0.5 * ((theta - mean) / sd) ** 2)
    return theta, weights / weights.sum()


def _grid_labels(theta: np.ndarray) -> list[str]:
    labels = [f"theta={x:.6g}" for x in theta.tolist()]
    if len(set(labels)) < len(labels):  # points closer than 6 digits tell apart: in full
        labels = [f"theta={x!r}" for x in theta.tolist()]
    return labels


def bank_as_columns(instance: Instance, points: int, max_cells: int) -> tuple[Instance, dict[str, float]]:
    """The columnar likelihood instance an item-bank instance stands for, and each hypothesis's θ
    by its id. Refuses (:class:`InstanceTooLarge`) before building a tensor past ``max_cells``."""
    bank = instance.item_bank
    theta, prior = theta_grid(bank, points)
    width = max(item.n_outcomes for item in bank.items)
    cells = theta.size * len(bank.items) * width
    if cells > max_cells:
        raise InstanceTooLarge(f"the item bank's likelihood tensor has {theta.size}×{len(bank.items)}×{width} = "
                               f"{cells} cells (θ points × items × outcomes); the limit is {max_cells} (MAX_CELLS)")
    likelihood = np.zeros((theta.size, len(bank.items), width))
    for j, item in enumerate(bank.items):
        likelihood[:, j, :item.n_outcomes] = item_probabilities(item, theta, float(bank.scaling))
    ids = _grid_labels(theta)
    if bank.cut_scores is None:
        classes = ids  # θ estimation: every grid point is its own class
    else:
        # The level holding θ: the number of cut scores at or below it.
        level = np.searchsorted(np.asarray(bank.cut_scores, dtype=np.float64), theta, side="right")
        labels = bank.level_labels()
        classes = [labels[k] for k in level.tolist()]
    tests = [TestSpec(id=item.id, outcomes=[str(k) for k in range(item.n_outcomes)], text=item.text,
                      outcome_text=item.outcome_text) for item in bank.items]
    columnar = Instance(tests=tests, likelihood_matrix=likelihood, classes=classes, priors=prior.tolist(),
                        hypothesis_ids=ids, skip_cost=instance.skip_cost)
    return columnar, dict(zip(ids, theta.tolist()))


def with_theta(compiled: CompiledInstance, theta_of: dict[str, float], bank: ItemBank) -> CompiledInstance:
    """``compiled`` with each hypothesis's θ kept beside it, and a warning per level that holds
    no grid point (it can never be the answer)."""
    warnings = list(compiled.warnings)
    if bank.cut_scores is not None:
        empty = [label for label in bank.level_labels() if label not in compiled.class_labels]
        warnings += [f"level '{label}' holds no θ grid point and can never be the answer: cut scores further "
                     "apart, or more ITEM_BANK_GRID_POINTS" for label in empty]
    theta = np.array([theta_of[h] for h in compiled.hypothesis_ids])
    theta.setflags(write=False)
    exposure = None
    if any(item.exposure_parameter is not None for item in bank.items):
        exposure = np.array([1.0 if item.exposure_parameter is None else float(item.exposure_parameter)
                             for item in bank.items])
        exposure.setflags(write=False)
    enemies = None
    if bank.enemies:
        index = compiled.test_index
        pairs = {(index[a], index[b]) for group in bank.enemies for a in group for b in group if index[a] < index[b]}
        enemies = np.array(sorted(pairs), dtype=np.intp).reshape(-1, 2)
        enemies.setflags(write=False)
    return dataclasses.replace(compiled, theta=theta, exposure_parameters=exposure, enemies=enemies,
                               warnings=tuple(warnings), **_content_arrays(bank))


def _content_arrays(bank: ItemBank) -> dict:
    """Content balancing's arrays: each item's area (in the targets' order), each area's target
    share, least and most items (no most: every item)."""
    balance = bank.content_balance
    if balance is None:
        return {}
    areas = list(balance.targets)
    rows = [[float(balance.targets[a]), float((balance.min or {}).get(a, 0)),
             float((balance.max or {}).get(a, len(bank.items)))] for a in areas]
    arrays = {"content_area": np.array([areas.index(item.content_area) for item in bank.items], dtype=np.intp),
              "content_balance": np.array(rows).reshape(-1, 3)}
    for array in arrays.values():
        array.setflags(write=False)
    return arrays


def balanced(inst: CompiledInstance, asked: np.ndarray, informative: np.ndarray) -> np.ndarray:
    """The informative tests content balancing allows next, by the constrained CAT rule of
    Kingsbury & Zara (1989): areas at their most are closed; an area below its least comes
    first (the furthest below); otherwise the area furthest below its target share of the tests
    asked so far, one item more counted (ties: the earlier area). Areas with no informative test
    left are passed over."""
    if inst.content_area is None:
        return informative
    share, least, most = inst.content_balance.T
    count = np.bincount(inst.content_area[asked], minlength=share.size)
    open_area = (count < most) & (np.bincount(inst.content_area[informative], minlength=share.size) > 0)
    if not open_area.any():
        return np.zeros_like(informative)
    short = open_area & (count < least)
    deficit = np.where(short, least - count, share * (count.sum() + 1) - count)
    area = int(np.argmax(np.where(short if short.any() else open_area, deficit, -np.inf)))
    return informative & (inst.content_area == area)


def enemies_of(inst: CompiledInstance, asked: np.ndarray) -> np.ndarray:
    """(N,) bool: the tests that are enemies of a test ``asked`` ((N,) bool) and so never asked."""
    blocked = np.zeros(inst.n_tests, dtype=bool)
    if inst.enemies is not None and inst.enemies.size:
        first, second = inst.enemies[:, 0], inst.enemies[:, 1]
        blocked[second[asked[first]]] = True
        blocked[first[asked[second]]] = True
    return blocked


def sympson_hetter_blocked(inst: CompiledInstance, seed: int) -> np.ndarray:
    """(N,) bool: the items Sympson–Hetter keeps from this run. Each item gets one coin per run,
    keyed by (seed, 2): the first time it is the best choice it is given with probability K_j and
    otherwise never again, the classic rule's distribution, reproducible from the seed alone."""
    if inst.exposure_parameters is None:
        return np.zeros(inst.n_tests, dtype=bool)
    return np.random.default_rng([seed, 2]).uniform(size=inst.n_tests) >= inst.exposure_parameters


def theta_estimate(belief: Belief) -> tuple[float, float]:
    """(EAP, posterior SD) of θ: the posterior mean of the grid's θ and its standard deviation."""
    theta = belief.instance.theta
    if theta is None:
        raise StopRuleNotApplicable("θ is estimated on item-bank instances only ('item_bank')")
    values = theta[belief.alive]
    weights = belief.mass / belief.mass.sum()
    eap = float(weights @ values)
    variance = float(weights @ (values - eap) ** 2)
    return eap, float(np.sqrt(max(variance, 0.0)))
