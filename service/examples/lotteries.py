"""The paper's section 5 study as an instance: which economic theory explains a person's choices
between lotteries (Golovin, Krause & Ray 2010, figure 2a and 2b).

**Lotteries.** Payoffs are x = (−10, 0, +10) dollars; a lottery is a probability triple
p = (p₁, p₂, p₃) over them. The paper draws each p_i from G = {0.01, 0.99} ∪ {0.1, …, 0.9}, but
three values of G alone rarely sum to 1 (0.01 needs a 0 beside 0.99, and no lottery could leave
out a payoff). We complete the grid with 0: every entry is in G ∪ {0} and the entries sum to 1
exactly (checked in integer hundredths, never in floats). That gives 63 lotteries on the 0.1 grid
plus the 6 orderings of (0.01, 0.99, 0): **69 lotteries**. 1.0 is not added, so no lottery is
certain. A test is an unordered pair of distinct lotteries, **C(69, 2) = 2346 tests**; its outcome
is "1" or "2", the lottery the subject prefers.

**Theories** (the classes), each a utility U(L) of a lottery:

* EV, expected value: U = Σ_i p_i x_i.
* PT, prospect theory in the paper's separable form (not the rank-dependent cumulative one):
  U = Σ_i f(x_i) w(p_i), f(x) = x^ρ for x ≥ 0 and −λ(−x)^ρ for x < 0, and Prelec's weighting
  w(p) = exp(−(ln 1/p)^α) with w(0) = 0.
* MVS, mean-variance-skewness: U = w_μ μ − w_σ σ + w_ν ν with ν = E[(X−μ)³]/σ³ the standardised
  skewness, defined as 0 when σ = 0 (a certain payoff is not skewed; no lottery here has σ = 0).
* CRRA, constant relative risk aversion: x^(1−a)/(1−a) is undefined for the payoffs −10 and 0,
  so the subject is given an endowment: wealth W + x with W = :data:`WEALTH_OFFSET` = $11, the
  smallest whole-dollar endowment keeping every wealth level ≥ $1 (log utility ≥ 0). We use
  u(w) = (w^(1−a) − 1)/(1 − a), and ln w at a = 1: the −1 changes no utility difference (so no
  choice probability) and makes u continuous in a. U = Σ_i p_i u(W + x_i).

**Responses** follow the paper's softmax with unit temperature:
P(prefer L₁) = 1 / (1 + exp(U(L₂) − U(L₁))).

**Hypotheses** are (theory, parameters). Study ``fixed`` (figure 2a) has one per theory with
the paper's canonical parameters; study ``uncertain`` (figure 2b) has three values per parameter
over the paper's ranges: EV 1, PT 27, MVS 27, CRRA 3, 58 hypotheses. The prior gives each theory
1/4, split evenly over its parameter values: the same distribution the simulation draws the
true subject from.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from schemas.instance import Instance

PAYOFFS = np.array([-10.0, 0.0, 10.0])
# The paper's probability grid in hundredths, completed with 0 (see the module docstring).
GRID_HUNDREDTHS = (0, 1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99)
WEALTH_OFFSET = 11.0
OUTCOMES = ("1", "2")
THEORIES = ("EV", "PT", "MVS", "CRRA")
THEORY_NAMES = {
    "EV": "Expected Value",
    "PT": "Prospect Theory",
    "MVS": "Mean-Variance-Skewness",
    "CRRA": "Constant Relative Risk Aversion",
}
STUDIES = ("fixed", "uncertain")

# Figure 2a: the paper's canonical parameters.
FIXED_PARAMETERS: dict[str, list[dict[str, float]]] = {
    "EV": [{}],
    "PT": [{"rho": 0.9, "lambda": 2.2, "alpha": 0.9}],
    "MVS": [{"w_mu": 0.8, "w_sigma": 0.25, "w_nu": 0.25}],
    "CRRA": [{"a": 1.0}],
}
# Figure 2b: three values over each of the paper's ranges.
PARAMETER_RANGES: dict[str, dict[str, tuple[float, float, float]]] = {
    "EV": {},
    "PT": {"rho": (0.85, 0.9, 0.95), "lambda": (2.1, 2.2, 2.3), "alpha": (0.9, 0.95, 1.0)},
    "MVS": {"w_mu": (0.8, 0.9, 1.0), "w_sigma": (0.2, 0.25, 0.3), "w_nu": (0.2, 0.25, 0.3)},
    "CRRA": {"a": (0.9, 0.95, 1.0)},
}


# --- lotteries and tests ---------------------------------------------------------------------


@lru_cache(maxsize=1)
def lottery_grid() -> np.ndarray:
    """Every probability triple over PAYOFFS with entries in the completed grid, summing to 1;
    shape (69, 3), in lexicographic order of the hundredths."""
    triples = [
        t for t in itertools.product(GRID_HUNDREDTHS, repeat=3) if sum(t) == 100
    ]
    return np.array(triples, dtype=np.float64) / 100.0


@lru_cache(maxsize=1)
def test_pairs() -> np.ndarray:
    """(N, 2) lottery indices (i < j) of every test, in lexicographic order."""
    return np.array(list(itertools.combinations(range(len(lottery_grid())), 2)), dtype=np.intp)


def lottery_label(p: np.ndarray) -> str:
    """``0.10/0.20/0.70``: P(−$10)/P($0)/P(+$10)."""
    return "/".join(f"{q:.2f}" for q in p)


def test_id(pair: tuple[int, int] | np.ndarray) -> str:
    """Self-describing: ``0.10/0.20/0.70 vs 0.01/0.99/0.00`` (lottery 1 vs lottery 2)."""
    grid = lottery_grid()
    return f"{lottery_label(grid[pair[0]])} vs {lottery_label(grid[pair[1]])}"


def parse_test_id(test: str) -> tuple[np.ndarray, np.ndarray]:
    """The two probability triples named by a :func:`test_id`."""
    first, second = test.split(" vs ")
    return (np.array([float(q) for q in first.split("/")]),
            np.array([float(q) for q in second.split("/")]))


def describe_lottery(p: np.ndarray) -> str:
    """``lose $10 with 10%, $0 with 20%, win $10 with 70%`` (zero-probability payoffs left out)."""
    words = ("lose $10", "$0", "win $10")
    return ", ".join(f"{w} with {q * 100:g}%" for w, q in zip(words, p) if q > 0)


# --- utilities -------------------------------------------------------------------------------


def expected_value(p: np.ndarray) -> np.ndarray:
    """U_EV(L) = Σ_i p_i x_i for each row of ``p`` (shape (L, 3))."""
    return p @ PAYOFFS


def prelec_weight(p: np.ndarray, alpha: float) -> np.ndarray:
    """w(p) = exp(−(ln 1/p)^α), w(0) = 0 (the limit as p → 0)."""
    with np.errstate(divide="ignore"):
        return np.where(p > 0, np.exp(-np.power(-np.log(np.where(p > 0, p, 1.0)), alpha)), 0.0)


def prospect_theory(p: np.ndarray, rho: float, lambda_: float, alpha: float) -> np.ndarray:
    """U_PT(L) = Σ_i f(x_i) w(p_i), f(x) = x^ρ (x ≥ 0), −λ(−x)^ρ (x < 0)."""
    value = np.where(PAYOFFS >= 0, np.abs(PAYOFFS) ** rho, -lambda_ * np.abs(PAYOFFS) ** rho)
    return prelec_weight(p, alpha) @ value


def moments(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean μ, standard deviation σ and standardised skewness ν = E[(X−μ)³]/σ³ (0 where σ = 0)."""
    mu = p @ PAYOFFS
    centred = PAYOFFS[None, :] - mu[:, None]
    sigma = np.sqrt(np.maximum((p * centred**2).sum(axis=1), 0.0))
    third = (p * centred**3).sum(axis=1)
    # Below 1e-9 the lottery is a certain payoff up to round-off: no spread, so no skew.
    with np.errstate(divide="ignore", invalid="ignore"):
        nu = np.where(sigma > 1e-9, third / np.where(sigma > 1e-9, sigma, 1.0) ** 3, 0.0)
    return mu, sigma, nu


def mean_variance_skewness(p: np.ndarray, w_mu: float, w_sigma: float, w_nu: float) -> np.ndarray:
    """U_MVS(L) = w_μ μ − w_σ σ + w_ν ν."""
    mu, sigma, nu = moments(p)
    return w_mu * mu - w_sigma * sigma + w_nu * nu


def crra(p: np.ndarray, a: float, wealth: float = WEALTH_OFFSET) -> np.ndarray:
    """U_CRRA(L) = Σ_i p_i u(W + x_i), u(w) = (w^(1−a) − 1)/(1 − a), ln w at a = 1."""
    w = wealth + PAYOFFS
    u = np.log(w) if math.isclose(a, 1.0) else (w ** (1.0 - a) - 1.0) / (1.0 - a)
    return p @ u


def utility(theory: str, p: np.ndarray, parameters: dict[str, float],
            wealth: float = WEALTH_OFFSET) -> np.ndarray:
    """The utility of each lottery (row of ``p``) under ``theory`` with ``parameters``
    (``wealth``: CRRA's endowment, the one convention the paper leaves open)."""
    if theory == "EV":
        return expected_value(p)
    if theory == "PT":
        return prospect_theory(p, parameters["rho"], parameters["lambda"], parameters["alpha"])
    if theory == "MVS":
        return mean_variance_skewness(p, parameters["w_mu"], parameters["w_sigma"], parameters["w_nu"])
    if theory == "CRRA":
        return crra(p, parameters["a"], wealth)
    raise ValueError(f"unknown theory '{theory}'; expected one of {THEORIES}")


def preference_probability(u_first: np.ndarray, u_second: np.ndarray) -> np.ndarray:
    """The paper's softmax P(prefer L₁) = 1/(1 + exp(U(L₂) − U(L₁))), without overflow."""
    return np.exp(-np.logaddexp(0.0, u_second - u_first))


# --- hypotheses and the instance -------------------------------------------------------------


@dataclass(frozen=True)
class Hypothesis:
    theory: str
    parameters: tuple[tuple[str, float], ...]
    prior: float

    @property
    def id(self) -> str:
        """``PT(rho=0.9, lambda=2.2, alpha=0.9)``; ``EV`` has no parameters."""
        if not self.parameters:
            return self.theory
        return f"{self.theory}(" + ", ".join(f"{k}={v:g}" for k, v in self.parameters) + ")"

    def utilities(self, p: np.ndarray, wealth: float = WEALTH_OFFSET) -> np.ndarray:
        return utility(self.theory, p, dict(self.parameters), wealth)


def hypotheses(study: str) -> list[Hypothesis]:
    """(theory, parameters) pairs of a study, grouped by theory in :data:`THEORIES` order."""
    if study == "fixed":
        grids = {theory: values for theory, values in FIXED_PARAMETERS.items()}
    elif study == "uncertain":
        grids = {
            theory: [dict(zip(ranges, values)) for values in itertools.product(*ranges.values())]
            for theory, ranges in PARAMETER_RANGES.items()
        }
    else:
        raise ValueError(f"unknown study '{study}'; expected one of {STUDIES}")
    result = []
    for theory in THEORIES:
        values = grids[theory]
        for parameters in values:
            # Each theory 1/4, split evenly over its parameter grid (how subjects are drawn).
            result.append(Hypothesis(theory, tuple(parameters.items()), 1.0 / (len(THEORIES) * len(values))))
    return result


def likelihood_matrix(study: str, wealth: float = WEALTH_OFFSET) -> np.ndarray:
    """P(outcome | hypothesis, test), shape (n, 2346, 2): [:, :, 0] prefers lottery 1."""
    grid, pairs = lottery_grid(), test_pairs()
    rows = []
    for h in hypotheses(study):
        u = h.utilities(grid, wealth)
        u1, u2 = u[pairs[:, 0]], u[pairs[:, 1]]
        # Each outcome through its own logistic: 1 − P₁ would lose P₂'s digits when P₁ ≈ 1.
        rows.append(np.stack([preference_probability(u1, u2), preference_probability(u2, u1)], axis=1))
    return np.stack(rows)


def wire_instance(study: str, wealth: float = WEALTH_OFFSET, repeatable: bool = False) -> dict:
    """The study as the service's columnar wire form (``likelihood_matrix``), JSON-ready.
    ``repeatable``: every question may be asked again, each answer a new draw from the softmax."""
    hyps = hypotheses(study)
    again = {"repeatable": True} if repeatable else {}
    return {
        "tests": [{"id": test_id(pair), "outcomes": list(OUTCOMES), **again} for pair in test_pairs()],
        "likelihood_matrix": likelihood_matrix(study, wealth).tolist(),
        "classes": [h.theory for h in hyps],
        "priors": [h.prior for h in hyps],
        "hypothesis_ids": [h.id for h in hyps],
    }


def instance(study: str, wealth: float = WEALTH_OFFSET, repeatable: bool = False) -> Instance:
    """The validated wire model of a study (the public route every client takes)."""
    return Instance.model_validate(wire_instance(study, wealth, repeatable))


@lru_cache(maxsize=4)
def compiled_instance(study: str, wealth: float = WEALTH_OFFSET, repeatable: bool = False):
    """The compiled study, through the public route: wire dict → Instance → compile_instance."""
    from service.engine import compile_instance

    return compile_instance(instance(study, wealth, repeatable))
