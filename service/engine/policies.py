"""Selection policies: each scores every test at once from reductions of the masses α(i, t, x).

A policy is one small object registered by name in :data:`POLICIES` (the only place that knows
them all; :data:`DEFAULT_POLICIES` names the default for each kind of instance). It declares what
it needs (:class:`Policy`), and the selection loop (select.py) reads those declarations, never a
policy's name. ``gain`` returns the expected benefit of each test in *normalised* units (masses
divided by the current total ``M``), so one zero-tolerance serves every policy; ``score_power``
says how the paper's own units scale with ``M`` (Δ_EC is a sum of products P(h)P(h′) of the
unnormalised prior, so it scales with M²; GBS's version-space mass with M).

Notation, per test t: a(i, x) = α(i, t, x)/M, b(i) = Σ_x a(i, x) (the class posterior),
p(x) = Σ_i a(i, x) (the outcome distribution). No gain needs a(i, x) itself, only p, b and the
sums over classes Σ_i a², Σ_i a log a, max_i a (:class:`~.belief.OutcomeStats`), or statistics
registered in statistics.py; ``statistics`` names those a policy reads beyond p and b, so
:meth:`~.belief.Belief.outcome_stats` computes only them (O(|V|·N) time, O(N·ℓ) memory even when
every hypothesis is its own class).

Adding a policy: a gain function with its objective in the paper's symbols, a row of
:data:`POLICIES` declaring its statistics and kind, a naive reference in tests/reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from .belief import OutcomeStats, xlog2x
from .compiled import CompiledInstance
from .errors import PolicyNotApplicable, UnknownPolicy
from .regions import hyperedge_weight, region_edge_weights

if TYPE_CHECKING:
    from .select import StopRules

GainFunction = Callable[[OutcomeStats], np.ndarray]


@dataclass(frozen=True)
class Policy:
    """A selection policy and what it declares it needs; :func:`~.select.decide` reads only these."""

    name: str
    gain: GainFunction  # OutcomeStats -> (N,) expected benefit, normalised units
    # The gain in the paper's units is gain · M^score_power (M = P(V), 1 on likelihood instances).
    score_power: int = 0
    # Refused on likelihood instances.
    deterministic_only: bool = False
    summary: str = ""
    # Read by gain beyond p and b: names of CLASS_REDUCTIONS (belief.py) or of STATISTICS
    # (statistics.py).
    statistics: frozenset[str] = frozenset()
    # Its kind. A decision policy reads decision regions: it runs on decision instances only and
    # stops when decided. A class policy (the others) stops when one class is determined.
    decision: bool = False
    # Draws its choice from the seed; every other policy's step depends on the observations alone.
    seeded: bool = False


# What Δ_EC reads: also the indistinguishability stop rule of class policies on deterministic
# instances (select.py), whichever policy runs.
EDGE_CUTTING_STATISTICS = frozenset({"sum_sq"})


def edge_cutting_gain(stats: OutcomeStats) -> np.ndarray:
    """Δ_EC(t) = w(E ∩ V) − Σ_x p(x) w(E ∩ V(x)), with w(E') = ½[(Σ_i a_i)² − Σ_i a_i²]
    (the paper's fast implementation: no O(n²) edge list)."""
    b, p = stats.b, stats.p
    remaining = 0.5 * (1.0 - np.dot(b, b))
    after = 0.5 * (p * p - stats.sum_sq)  # w(E ∩ V(x)) per (t, x)
    return remaining - (p * after).sum(axis=1)


def effecxtive_gain(stats: OutcomeStats) -> np.ndarray:
    """Δ_Eff(t) = Σ_x p(x) Σ_i P(i | x)² − Σ_i b(i)² on class posteriors (Rényi-2 gain)."""
    p = stats.p
    # An outcome of probability 0 adds 0 (sum_sq / ∞): exactly what skipping it would, without
    # a masked division.
    expected = (stats.sum_sq / np.where(p > 0, p, np.inf)).sum(axis=1)
    return expected - np.dot(stats.b, stats.b)


def gbs_gain(stats: OutcomeStats) -> np.ndarray:
    """Δ_GBS(t) = P(V) − Σ_x P(x) P(V ∩ {X_t = x}) = M(1 − Σ_x p(x)²).

    On likelihood instances the version-space mass becomes the posterior mass each outcome
    keeps, Σ_h P(h) P(x | h) = p(x), giving the same formula (docs/policies.md)."""
    p = stats.p
    return 1.0 - (p * p).sum(axis=1)


def infogain_gain(stats: OutcomeStats) -> np.ndarray:
    """H(class) − E_x H(class | x) in bits = H(b) + Σ_{i,x} a log a − Σ_x p log p
    (:class:`~.statistics.EntropySums`: O(|V|·N·ℓ), no logarithm of the tensor for a hypothesis
    alone in its class)."""
    class_entropy = -xlog2x(stats.b).sum()
    return class_entropy + stats.derived["entropy_sums"].sum_xlogx - xlog2x(stats.p).sum(axis=1)


def voi_gain(stats: OutcomeStats) -> np.ndarray:
    """Value of information under 0–1 loss over classes: E_x max_i P(i | x) − max_i b(i)."""
    return stats.max.sum(axis=1) - stats.b.max()


def uncertainty_gain(stats: OutcomeStats) -> np.ndarray:
    """Shannon entropy (bits) of the test's outcome distribution p."""
    return -xlog2x(stats.p).sum(axis=1)


def eced_gain(stats: OutcomeStats) -> np.ndarray:
    """ECED, equivalence class edge discounting (Chen, Hassani & Krause, *Near-optimal Bayesian
    Active Learning with Correlated and Noisy Tests*, AISTATS 2017, section 4: the ECED algorithm).

    Root causes θ (the hypotheses) map to equivalence classes y = r(θ) (the classes); an edge joins
    every two root causes of different classes, E = {{θ, θ′} : r(θ) ≠ r(θ′)}, weighted by the
    product of their probabilities with the observations ψ, w_ψ({θ, θ′}) = P(θ, ψ)·P(θ′, ψ) (the
    prior product, multiplied by P(x | θ)P(x | θ′) at each observation). An outcome x_e of test e
    discounts each edge instead of cutting it, by λ_{θ,x_e}·λ_{θ′,x_e} with the likelihood ratio
    λ_{θ,x_e} = P(x_e | θ) / max_x P(x | θ). The score is the expected discount less an offset,
    the discount a test's noise alone would give, so that a test every root cause answers alike
    scores 0 however noisy:

        Δ_ECED(e | ψ) = Σ_x P(X_e = x | ψ) [δ_BS(x) − δ_OFFSET(x)],
        δ_BS(x) = Σ_{{θ,θ′} ∈ E} w_ψ({θ, θ′}) (1 − λ_{θ,x} λ_{θ′,x}),
        δ_OFFSET(x) = Σ_{{θ,θ′} ∈ E} w_ψ({θ, θ′}) (1 − max_θ″ λ²_{θ″,x}),

    the max over every root cause of the instance (a constant per test and outcome). Each edge
    gains w_ψ(max λ² − λλ′) ≥ 0. With a(h) = P(θ | ψ) the normalised masses (edge weights divided by
    P(ψ)², the same for every test: ``score_power`` 2), sums over E take EC²'s fast form (no O(n²)
    edge list):
    Σ_E w = ½(1 − Σ_i b_i²) and Σ_E w λλ′ = ½[(Σ_h a λ)² − Σ_i (Σ_{h ∈ H_i} a λ)²]
    (:class:`~.statistics.LikelihoodRatioSums`), so a step costs O(|V|·N·ℓ) time and O(N·ℓ)
    memory (the ratios λ kept on an instance of up to RATIO_TABLE_MAX_BYTES, compiled.py). On a
    deterministic instance λ is 0 or 1, the offset is 0 wherever p(x) > 0, and Δ_ECED = Δ_EC."""
    sums = stats.derived["likelihood_ratio_sums"]
    remaining = 0.5 * (1.0 - np.dot(stats.b, stats.b))
    discounted = 0.5 * (sums.ratio_mass * sums.ratio_mass - sums.ratio_sum_sq)
    offset = sums.largest * sums.largest
    return (stats.p * (offset * remaining - discounted)).sum(axis=1)


def random_gain(stats: OutcomeStats) -> np.ndarray:
    """1 for every test whose outcome is still uncertain; the choice among them is seeded."""
    return ((stats.p > 1e-12).sum(axis=1) >= 2).astype(float)


def _per_outcome(stats: OutcomeStats, power: int) -> tuple[np.ndarray, np.ndarray]:
    """(p(x), 1/p(x)^power where p(x) > 0 else 0): how the posterior π(· | x) = a_x / p(x)
    rescales a degree-``power`` sum."""
    p = stats.p
    with np.errstate(divide="ignore", over="ignore"):
        inverse = np.where(p > 0, 1.0 / np.where(p > 0, p, 1.0) ** power, 0.0)
    return p, np.where(np.isfinite(inverse), inverse, 0.0)


def _splitting(stats: OutcomeStats, gain: np.ndarray) -> np.ndarray:
    """0 for a test with one possible outcome: it cuts nothing, though the alternating sums above
    may leave round-off of the order of 1e-16 / (remaining share) there."""
    return np.where((stats.p > 0).sum(axis=1) >= 2, gain, 0.0)


def hec_gain(stats: OutcomeStats) -> np.ndarray:
    """HEC (hyperedge cutting): the expected share of the remaining hyperedge weight a test cuts.

    Hyperedges are the multisets of k = max_h |acceptable(h)| + 1 hypotheses sharing no acceptable
    decision, w(e) = Π_{h ∈ e} P(h); with W(A) their weight inside A (:func:`hyperedge_weight`,
    inclusion-exclusion over the decision sets, no enumeration):

    * deterministic: Δ_HEC(t) = [W(V) − Σ_x p(x) W(V ∩ {X_t = x})] / W(V);
    * likelihood, on the posterior: [W(π) − Σ_x p(x) W(π(· | x))] / W(π), where W(π(· | x))
      = W(a_x)/p(x)^k since W is homogeneous of degree k.

    Dividing by W(V) (constant over tests) makes the zero tolerance relative."""
    sums, k, signs = stats.derived["hyperedge_sums"]
    remaining = float(hyperedge_weight(sums.now, signs, k))
    if sums.decided or remaining <= 0:
        return np.zeros(stats.p.shape[0])
    after = hyperedge_weight(sums.after, signs, k)  # (N, ℓ): W(a_x), unnormalised
    p, inverse = _per_outcome(stats, k)
    kept = p * after * inverse if sums.posterior else p * after
    return _splitting(stats, 1.0 - kept.sum(axis=1) / remaining)


def direct_gain(stats: OutcomeStats) -> np.ndarray:
    """DiRECt: a noisy-OR of one edge-cutting problem per decision region.

    Problem d joins every two distinct hypotheses that are not both in R_d, w({h, h′}) =
    P(h)P(h′); it is solved when the survivors lie in R_d (or one is left), and the run is
    decided exactly when some problem is solved. With w_d(A) the weight of problem d's edges
    inside A (:func:`region_edge_weights`) the objective is 1 − Π_d w_d(V)/w_d(H), and the
    expected gain relative to what remains is

    * deterministic: Δ_DiRECt(t) = 1 − Σ_x p(x) Π_d w_d(V ∩ {X_t = x}) / w_d(V);
    * likelihood, on the posterior: 1 − Σ_x p(x) Π_d w_d(π(· | x)) / w_d(π), where
      w_d(π(· | x)) = w_d(a_x)/p(x)²."""
    sums = stats.derived["region_sums"]
    now = region_edge_weights(sums.now)  # (D,)
    if sums.decided or (now <= 0).any():
        return np.zeros(stats.p.shape[0])
    after = region_edge_weights(sums.after)  # (D, N, ℓ)
    p, inverse = _per_outcome(stats, 2)
    ratio = after / now[:, None, None]
    if sums.posterior:
        ratio = ratio * inverse[None]
    return _splitting(stats, 1.0 - (p * np.prod(ratio, axis=0)).sum(axis=1))


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy("ec2", edge_cutting_gain, score_power=2, deterministic_only=True,
               summary="EC²: expected weight of edges cut between classes, per unit cost",
               statistics=EDGE_CUTTING_STATISTICS),
        Policy("effecxtive", effecxtive_gain,
               summary="EffECXtive: expected gain in Σ P(class)² (Rényi-2), per unit cost",
               statistics=frozenset({"sum_sq"})),
        Policy("eced", eced_gain, score_power=2,
               summary="ECED: expected weight of edges between classes discounted by the likelihoods, per unit cost",
               statistics=frozenset({"likelihood_ratio_sums"})),
        Policy("gbs", gbs_gain, score_power=1,
               summary="generalised binary search: expected reduction of version-space mass"),
        Policy("infogain", infogain_gain,
               summary="information gain (bits) about the class",
               statistics=frozenset({"entropy_sums"})),
        Policy("voi", voi_gain,
               summary="value of information under 0-1 loss over classes",
               statistics=frozenset({"max"})),
        Policy("uncertainty", uncertainty_gain,
               summary="uncertainty sampling: entropy of the test's outcome"),
        Policy("random", random_gain,
               summary="a uniformly random informative test (seeded)", seeded=True),
        Policy("hec", hec_gain, decision=True,
               summary="HEC: expected share of hyperedges (hypotheses sharing no decision) cut, per unit cost",
               statistics=frozenset({"hyperedge_sums"})),
        Policy("direct", direct_gain, decision=True,
               summary="DiRECt: noisy-OR of one edge-cutting problem per decision region, per unit cost",
               statistics=frozenset({"region_sums"})),
    )
}

# Not a row of the table: the policy that does best on sessions simulated from the instance's own
# model, chosen per instance and stop rules (recommend.py).
AUTO = "auto"
# The policy an instance gets when it names none, by its kind (:func:`instance_kind`).
# The likelihood default is the one the real-data suite (docs/quality.md) found within the best
# policy's interval nearly everywhere; auto and effecxtive each fell behind on the many-class table.
DEFAULT_POLICIES: dict[str, str] = {"decision": "hec", "deterministic": "ec2", "likelihood": "infogain"}


def instance_kind(inst: CompiledInstance) -> str:
    """"decision" for an instance with decision regions, else "deterministic" or "likelihood"."""
    return "decision" if inst.is_decision else inst.kind


def policy_names() -> list[str]:
    """Every name a request may give for a policy: the registered ones and :data:`AUTO`, sorted."""
    return sorted([*POLICIES, AUTO])


def default_policy(inst: CompiledInstance) -> str:
    """The name an instance's sessions run when they give none (:data:`AUTO` included)."""
    return DEFAULT_POLICIES[instance_kind(inst)]


def resolve_policy(inst: CompiledInstance, name: str | None, rules: StopRules | None = None) -> Policy:
    """The policy called ``name`` (the instance's default when None), if it applies to ``inst``;
    :data:`AUTO` is the one :func:`~.recommend.recommend` ranks first under ``rules`` (once per
    process for each instance and rules)."""
    if name is None:
        name = default_policy(inst)
    if name == AUTO:
        from .recommend import recommended  # it plays this module's policies

        return POLICIES[recommended(inst, rules)]
    policy = POLICIES.get(name)
    if policy is None:
        raise UnknownPolicy(f"unknown policy '{name}'; choose one of {policy_names()}")
    if policy.decision and not inst.is_decision:
        raise PolicyNotApplicable(
            f"policy '{name}' needs a decision instance (top-level 'decisions' and per-hypothesis "
            "'acceptable' or 'loss'); this instance has classes")
    if policy.deterministic_only and inst.kind != "deterministic":
        raise PolicyNotApplicable(
            f"policy '{name}' needs deterministic outcomes; for a likelihood instance use "
            f"'{DEFAULT_POLICIES['likelihood']}' (or give max_flips to expand noisy copies)"
        )
    return policy
