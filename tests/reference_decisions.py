"""A naive reference for the decision-region objectives, from the papers' definitions with plain
loops and explicit edge lists (nothing here imports the engine).

* HEC (Chen et al. 2015): the hyperedges are the multisets of k = max_h |acceptable(h)| + 1
  hypotheses that share no acceptable decision, each weighing the product of its members'
  masses; a test's outcome x cuts a hyperedge when one of its members disagrees with x.
* DiRECt (Javdani et al. 2014): one edge-cutting problem per decision d whose edges join two
  distinct hypotheses not both in R_d; the objective is the noisy-OR 1 − Π_d (uncut_d / all_d).

Both are listed edge by edge; gains are relative to what remains (the service's units), and on
likelihood instances the masses are the posterior, before and after the Bayes update.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from tests import reference as ref

Observation = tuple[int, int]


@dataclass
class DecisionModel:
    base: ref.Model  # classes are ignored
    decisions: list[str]
    acceptable: list[set[int]]  # per hypothesis: indices into decisions

    @property
    def k(self) -> int:
        return max(len(a) for a in self.acceptable) + 1


def hyperedges(model: DecisionModel, members: list[int]) -> list[tuple[int, ...]]:
    """Every multiset of k of ``members`` with no decision acceptable to all of them."""
    return [
        edge for edge in itertools.combinations_with_replacement(members, model.k)
        if not set.intersection(*(model.acceptable[h] for h in edge))
    ]


def region_edges(model: DecisionModel, members: list[int], d: int) -> list[tuple[int, int]]:
    return [(h, g) for i, h in enumerate(members) for g in members[i + 1:]
            if not (d in model.acceptable[h] and d in model.acceptable[g])]


def _weights(model: DecisionModel, observations: list[Observation]) -> list[float]:
    """Deterministic: the prior on the version space (not renormalised); else the posterior."""
    return ref.version_space_mass(model.base, observations)


def _outcomes(model: DecisionModel, weights: list[float], t: int):
    """(x, p(x), weights after x unnormalised w(h)·P(x | h)) for outcomes with p(x) > 0."""
    total = sum(weights)
    for x in range(model.base.arity[t]):
        after = [w * model.base.p_outcome(h, t, x) for h, w in enumerate(weights)]
        if sum(after) > 0:
            yield x, sum(after) / total, after


def hec_gain(model: DecisionModel, observations: list[Observation], t: int) -> float:
    weights = _weights(model, observations)
    alive = [h for h, w in enumerate(weights) if w > 0]
    edges = hyperedges(model, alive)
    weight_of = lambda edge, w: math.prod(w[h] for h in edge)  # noqa: E731
    remaining = sum(weight_of(e, weights) for e in edges)
    if model.base.deterministic:
        # Expected weight cut: the edges with a member that answers otherwise than x.
        cut = sum(p * sum(weight_of(e, weights) for e in edges
                          if any(model.base.outcomes[h][t] != x for h in e))
                  for x, p, _ in _outcomes(model, weights, t))
        return cut / remaining
    after = sum(p * sum(weight_of(e, [w / (p * sum(weights)) for w in post]) for e in edges)
                for x, p, post in _outcomes(model, weights, t))
    return (remaining - after) / remaining


def direct_gain(model: DecisionModel, observations: list[Observation], t: int) -> float:
    weights = _weights(model, observations)
    alive = [h for h, w in enumerate(weights) if w > 0]
    edges = [region_edges(model, alive, d) for d in range(len(model.decisions))]

    def uncut(w: list[float]) -> float:
        return math.prod(sum(w[h] * w[g] for h, g in problem) for problem in edges)

    now = uncut(weights)
    total = sum(weights)
    if model.base.deterministic:
        after = sum(p * uncut([w if model.base.outcomes[h][t] == x else 0.0 for h, w in enumerate(weights)])
                    for x, p, _ in _outcomes(model, weights, t))
    else:
        after = sum(p * uncut([w / (p * total) for w in post]) for x, p, post in _outcomes(model, weights, t))
    return (now - after) / now


GAINS = {"hec": hec_gain, "direct": direct_gain}


def decision_posterior(model: DecisionModel, observations: list[Observation]) -> list[float]:
    post = ref.posterior(_weights(model, observations))
    return [sum(p for h, p in enumerate(post) if d in model.acceptable[h]) for d in range(len(model.decisions))]


def decided(model: DecisionModel, observations: list[Observation], confidence: float | None) -> bool:
    weights = _weights(model, observations)
    alive = [h for h, w in enumerate(weights) if w > 0]
    if set.intersection(*(model.acceptable[h] for h in alive)):
        return True
    return confidence is not None and max(decision_posterior(model, observations)) >= confidence


def stop_or_scores(model: DecisionModel, observations: list[Observation], policy: str):
    """(stop reason, None) or (None, gain / cost per unrun test) under the default rules."""
    base = model.base
    confidence = None if base.deterministic else 0.95
    if decided(model, observations, confidence):
        return "decided", None
    weights = _weights(model, observations)
    alive = [h for h, w in enumerate(weights) if w > 0]
    ran = {t for t, _ in observations}
    unrun = [t for t in range(base.n_tests) if t not in ran]
    if base.deterministic and not any(len({base.outcomes[h][t] for h in alive}) > 1 for t in unrun):
        return "indistinguishable", None
    if not unrun:
        return "tests_exhausted", None
    return None, {t: GAINS[policy](model, observations, t) / base.costs[t] for t in unrun}


def random_decision_model(rng: random.Random, kind: str, max_hypotheses: int = 7) -> DecisionModel:
    base = ref.random_model(rng, kind, max_hypotheses=max_hypotheses, max_tests=5)
    n_decisions = rng.randint(2, 4)
    acceptable = []
    for _ in range(base.n):
        size = rng.choice((1, 1, 1, 2, 2, 3))
        acceptable.append(set(rng.sample(range(n_decisions), min(size, n_decisions))))
    return DecisionModel(base, [f"d{j}" for j in range(n_decisions)], acceptable)


def to_payload(model: DecisionModel) -> dict:
    payload = ref.to_payload(model.base)
    for spec, accepted in zip(payload["hypotheses"], model.acceptable):
        del spec["class"]
        spec["acceptable"] = [model.decisions[d] for d in sorted(accepted)]
    payload["decisions"] = list(model.decisions)
    return payload


def optimal_cost(model: DecisionModel) -> float:
    """min over policies of the expected cost until one decision suits every survivor (or no
    test splits them), by exhaustive recursion over version spaces (deterministic)."""
    base = model.base
    prior = base.normalised_prior()
    memo: dict[frozenset, float] = {}

    def solve(members: frozenset) -> float:
        if members in memo:
            return memo[members]
        best = 0.0
        if not set.intersection(*(model.acceptable[h] for h in members)):
            options = []
            mass = sum(prior[h] for h in members)
            for t in range(base.n_tests):
                parts: dict[int, set] = {}
                for h in members:
                    parts.setdefault(base.outcomes[h][t], set()).add(h)
                if len(parts) > 1:
                    options.append(base.costs[t] + sum(
                        sum(prior[h] for h in part) / mass * solve(frozenset(part)) for part in parts.values()))
            best = min(options) if options else 0.0
        memo[members] = best
        return best

    return solve(frozenset(h for h in range(base.n) if prior[h] > 0))
