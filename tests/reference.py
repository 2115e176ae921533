"""A naive reference for the engine, written from the paper's definitions with plain Python loops.

Nothing here imports the engine: the tests compare the fast numpy policies against these loops.
A model is a plain :class:`Model` (lists, not arrays); hypotheses are indexed in the order given,
tests in instance order. Units follow the paper:

* Δ_EC (section 3) is the expected weight of the edges cut, w({h, h'}) = P(h)·P(h') with the prior
  P normalised over all hypotheses but *not* renormalised to the version space;
* Δ_GBS (section 2) is P(V) − Σ_x P(x | x_A)·P(V ∩ {X_t = x}), same unnormalised P; on likelihood
  instances P(V) is the posterior mass (1) and P(V ∩ {X_t = x}) = Σ_h P(h | x_A) P(x | h);
* every other criterion is a function of the posterior (class entropy in bits, 0–1 risk, …).

The stop rules are re-stated in :func:`decide` in their documented order (docs/engine.md).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field

Observation = tuple[int, int]  # (test index, outcome index)


@dataclass
class Model:
    arity: list[int]  # per test
    costs: list[float]  # per test
    classes: list[str]  # per hypothesis
    prior: list[float]  # per hypothesis, any positive scale (normalised here)
    outcomes: list[list[int]] | None = None  # [h][t] deterministic outcome index
    likelihood: list[list[list[float]]] | None = None  # [h][t][k] = P(X_t = k | h)
    hypothesis_ids: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.classes)

    @property
    def n_tests(self) -> int:
        return len(self.arity)

    @property
    def deterministic(self) -> bool:
        return self.outcomes is not None

    def p_outcome(self, h: int, t: int, k: int) -> float:
        """P(X_t = k | h)."""
        if self.outcomes is not None:
            return 1.0 if self.outcomes[h][t] == k else 0.0
        return self.likelihood[h][t][k]

    def normalised_prior(self) -> list[float]:
        total = sum(self.prior)
        return [p / total for p in self.prior]


# --- beliefs -------------------------------------------------------------------------------


def version_space_mass(model: Model, observations: list[Observation]) -> list[float]:
    """Deterministic: P(h) for h consistent with every observation, else 0 (not renormalised).
    Likelihood: the Bayes posterior P(h | x_A), normalised (computed with logs: long runs)."""
    prior = model.normalised_prior()
    if model.deterministic:
        return [
            prior[h] if all(model.outcomes[h][t] == k for t, k in observations) else 0.0
            for h in range(model.n)
        ]
    logs = []
    for h in range(model.n):
        value = math.log(prior[h]) if prior[h] > 0 else -math.inf
        for t, k in observations:
            p = model.likelihood[h][t][k]
            value += math.log(p) if p > 0 else -math.inf
        logs.append(value)
    top = max(logs)
    if top == -math.inf:
        raise ValueError("inconsistent")
    weights = [math.exp(v - top) if v > -math.inf else 0.0 for v in logs]
    total = sum(weights)
    return [w / total for w in weights]


def posterior(mass: list[float]) -> list[float]:
    total = sum(mass)
    return [m / total for m in mass]


def class_distribution(model: Model, post: list[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for h, p in enumerate(post):
        out[model.classes[h]] = out.get(model.classes[h], 0.0) + p
    return out


def outcome_probability(model: Model, post: list[float], t: int, k: int) -> float:
    """P(X_t = k | x_A) = Σ_h P(h | x_A) P(X_t = k | h)."""
    return sum(post[h] * model.p_outcome(h, t, k) for h in range(model.n))


def bayes_update(model: Model, post: list[float], t: int, k: int) -> list[float]:
    """P(h | x_A, X_t = k) by Bayes' rule."""
    joint = [post[h] * model.p_outcome(h, t, k) for h in range(model.n)]
    total = sum(joint)
    return [j / total for j in joint]


def entropy_bits(distribution) -> float:
    return -sum(p * math.log2(p) for p in distribution if p > 0)


# --- the criteria, one test at a time -------------------------------------------------------


def ec2_gain(model: Model, observations: list[Observation], t: int) -> float:
    """Δ_EC(t | x_A) = E_h[f_EC(A ∪ {t}, h) − f_EC(A, h) | x_A] with an explicit edge list.

    f_EC(A, h) is the weight of the edges cut by A under h. The edges still uncut after x_A are
    those with both ends in the version space V; running t under the true h additionally cuts
    those of them with an end that disagrees with h on t.
    """
    assert model.deterministic
    mass = version_space_mass(model, observations)
    alive = [h for h in range(model.n) if mass[h] > 0]
    edges = [
        (h, g, mass[h] * mass[g])
        for i, h in enumerate(alive)
        for g in alive[i + 1:]
        if model.classes[h] != model.classes[g]
    ]
    total = sum(mass)
    gain = 0.0
    # E_h[…]: the true h enters only through its answer x = h(t), so group the truths by x.
    for x in range(model.arity[t]):
        p_x = sum(mass[h] for h in alive if model.outcomes[h][t] == x) / total
        if p_x > 0:
            newly_cut = sum(w for h, g, w in edges if model.outcomes[h][t] != x or model.outcomes[g][t] != x)
            gain += p_x * newly_cut
    return gain


def gbs_gain(model: Model, observations: list[Observation], t: int) -> float:
    """Δ_GBS = P(V) − Σ_x P(x | x_A) P(V ∩ {X_t = x}) (posterior-weighted on likelihoods)."""
    mass = version_space_mass(model, observations)
    total = sum(mass)
    post = posterior(mass)
    gain = total
    for k in range(model.arity[t]):
        p_x = outcome_probability(model, post, t, k)
        kept = sum(mass[h] * model.p_outcome(h, t, k) for h in range(model.n))
        gain -= p_x * kept
    return gain


def _expected_after(model: Model, observations: list[Observation], t: int, value_of) -> float:
    """E_{x ~ X_t | x_A}[value_of(class distribution after x)]."""
    post = posterior(version_space_mass(model, observations))
    expected = 0.0
    for k in range(model.arity[t]):
        p_x = outcome_probability(model, post, t, k)
        if p_x > 0:
            expected += p_x * value_of(class_distribution(model, bayes_update(model, post, t, k)))
    return expected


def _now(model: Model, observations: list[Observation], value_of) -> float:
    return value_of(class_distribution(model, posterior(version_space_mass(model, observations))))


def infogain_gain(model, observations, t) -> float:
    """H(class | x_A) − E_x H(class | x_A, x), Shannon entropy in bits."""
    value = lambda dist: entropy_bits(dist.values())  # noqa: E731
    return _now(model, observations, value) - _expected_after(model, observations, t, value)


def voi_gain(model, observations, t) -> float:
    """min_d risk(d | x_A) − E_x min_d risk(d | x_A, x), 0–1 loss ℓ(d, h) = [h ∉ class d]."""
    def min_risk(dist):
        return min(sum(p for c, p in dist.items() if c != d) for d in dist)
    return _now(model, observations, min_risk) - _expected_after(model, observations, t, min_risk)


def effecxtive_gain(model, observations, t) -> float:
    """Section 4's Δ_Eff on classes: Σ_x P(x) Σ_i P(i | x)² − Σ_i P(i)²."""
    collision = lambda dist: sum(p * p for p in dist.values())  # noqa: E731
    return _expected_after(model, observations, t, collision) - _now(model, observations, collision)


def uncertainty_gain(model, observations, t) -> float:
    """H(X_t | x_A) in bits."""
    post = posterior(version_space_mass(model, observations))
    return entropy_bits(outcome_probability(model, post, t, k) for k in range(model.arity[t]))


def likelihood_ratio(model: Model, h: int, t: int, k: int) -> float:
    """λ_{h,k} = P(X_t = k | h) / max_k′ P(X_t = k′ | h)."""
    return model.p_outcome(h, t, k) / max(model.p_outcome(h, t, j) for j in range(model.arity[t]))


def eced_gain(model: Model, observations: list[Observation], t: int) -> float:
    """Δ_ECED(t | ψ) = Σ_x P(x | ψ) [δ_BS − δ_OFFSET] (Chen, Hassani & Krause, AISTATS 2017,
    section 4) with an explicit edge list: every two hypotheses of different classes, weighted by
    P(h, ψ)·P(h′, ψ) (the posterior on likelihood instances: P(ψ)² is the same for every test),
    δ_BS = Σ_edges w (1 − λ_{h,x} λ_{h′,x}), δ_OFFSET = Σ_edges w (1 − max_g λ_{g,x}²), the max
    over every hypothesis of the model."""
    mass = version_space_mass(model, observations)
    post = posterior(mass)
    edges = [(h, g, mass[h] * mass[g]) for h in range(model.n) for g in range(h + 1, model.n)
             if model.classes[h] != model.classes[g]]
    gain = 0.0
    for x in range(model.arity[t]):
        p_x = outcome_probability(model, post, t, x)
        largest = max(likelihood_ratio(model, g, t, x) for g in range(model.n))
        basic = sum(w * (1 - likelihood_ratio(model, h, t, x) * likelihood_ratio(model, g, t, x)) for h, g, w in edges)
        offset = sum(w * (1 - largest ** 2) for _, _, w in edges)
        gain += p_x * (basic - offset)
    return gain


def random_gain(model, observations, t) -> float:
    """1 when the outcome of t is still uncertain (two outcomes possible), else 0."""
    post = posterior(version_space_mass(model, observations))
    possible = sum(1 for k in range(model.arity[t]) if outcome_probability(model, post, t, k) > 1e-12)
    return 1.0 if possible >= 2 else 0.0


# Units of each gain: Δ_EC and Δ_ECED are sums of P(h)P(h′), GBS a mass (normalised: divided by
# P(V) to this power); the rest are posterior quantities.
POWER = {"ec2": 2, "eced": 2, "gbs": 1}

GAINS = {
    "ec2": ec2_gain,
    "eced": eced_gain,
    "effecxtive": effecxtive_gain,
    "gbs": gbs_gain,
    "infogain": infogain_gain,
    "voi": voi_gain,
    "uncertainty": uncertainty_gain,
    "random": random_gain,
}


def scores(model: Model, observations: list[Observation], policy: str) -> list[float | None]:
    """gain / cost for every test not yet run (None for the ones already run)."""
    ran = {t for t, _ in observations}
    return [
        None if t in ran else GAINS[policy](model, observations, t) / model.costs[t]
        for t in range(model.n_tests)
    ]


# --- stop rules and the choice ---------------------------------------------------------------

ZERO = 1e-12  # a normalised gain at or below this is round-off


@dataclass
class Choice:
    test: int | None
    stop: str | None
    scores: list[float | None]


def separable(model: Model, mass: list[float], unrun: list[int]) -> bool:
    """Is there an unrun test on which two alive hypotheses of different classes differ?"""
    alive = [h for h in range(model.n) if mass[h] > 0]
    return any(
        model.classes[h] != model.classes[g] and model.outcomes[h][t] != model.outcomes[g][t]
        for t in unrun
        for i, h in enumerate(alive)
        for g in alive[i + 1:]
    )


def decide(model: Model, observations: list[Observation], policy: str, max_tests=None,
           max_cost=None, confidence=None, seed: int = 0, unavailable=frozenset()) -> Choice:
    """The stop rules in order: determined, confidence_reached, max_tests,
    indistinguishable (deterministic), tests_exhausted, budget_exhausted, no_informative_test;
    else the best gain / cost, the earliest test among ties within relative 1e-9.

    ``unavailable``: unrun tests that may not be proposed (skipped or excluded). They still
    count as unrun for indistinguishable and tests_exhausted (they could have told)."""
    mass = version_space_mass(model, observations)
    post = posterior(mass)
    dist = class_distribution(model, post)
    none = [None] * model.n_tests
    if sum(1 for p in dist.values() if p > 0) <= 1:
        return Choice(None, "determined", none)
    if confidence is None and not model.deterministic and max_tests is None and max_cost is None:
        confidence = 0.95
    if confidence is not None and max(dist.values()) >= confidence:
        return Choice(None, "confidence_reached", none)
    if max_tests is not None and len(observations) >= max_tests:
        return Choice(None, "max_tests", none)
    ran = {t for t, _ in observations}
    unrun = [t for t in range(model.n_tests) if t not in ran]
    if model.deterministic and not separable(model, mass, unrun):
        return Choice(None, "indistinguishable", none)
    if not unrun:
        return Choice(None, "tests_exhausted", none)
    spent = sum(model.costs[t] for t in ran)
    available = [t for t in unrun if t not in unavailable]
    # Within relative 1e-12 of the budget: round-off of the sum, not an overrun.
    eligible = [t for t in available if max_cost is None or spent + model.costs[t] <= max_cost * (1 + 1e-12)]
    if available and not eligible:
        return Choice(None, "budget_exhausted", none)
    gain_of = GAINS[policy]
    total = sum(mass)
    # Zero is judged in normalised units (masses over P(V)): Δ_EC scales with P(V)², GBS with P(V).
    power = POWER.get(policy, 0)
    gains = {t: gain_of(model, observations, t) for t in unrun}
    score = [None] * model.n_tests
    for t in eligible:
        score[t] = max(gains[t], 0.0) / model.costs[t]
    informative = [t for t in eligible if gains[t] / total ** power > ZERO]
    if not informative:
        beyond = [t for t in available if t not in eligible and gains[t] / total ** power > ZERO]
        return Choice(None, "budget_exhausted" if beyond else "no_informative_test", score)
    if policy == "random":
        return Choice(informative, None, score)  # type: ignore[arg-type]  (any of these)
    best = max(score[t] for t in informative)
    chosen = next(t for t in informative if score[t] >= best - 1e-9 * abs(best))
    return Choice(chosen, None, score)


# --- random instances -----------------------------------------------------------------------


def random_model(rng: random.Random, kind: str, max_hypotheses: int = 10, max_tests: int = 6) -> Model:
    """A small instance with multi-valued outcomes, non-uniform priors and costs, several classes."""
    n = rng.randint(2, max_hypotheses)
    n_tests = rng.randint(1, max_tests)
    arity = [rng.choice((2, 2, 3, 4)) for _ in range(n_tests)]
    costs = [rng.choice((1.0, 1.0, 2.0, 0.5, rng.uniform(0.2, 3.0))) for _ in range(n_tests)]
    n_classes = rng.randint(2, min(4, n))
    classes = [f"c{rng.randrange(n_classes)}" for _ in range(n)]
    prior = [rng.uniform(0.05, 1.0) for _ in range(n)]
    ids = [f"h{i}" for i in range(n)]
    if kind == "deterministic":
        outcomes = [[rng.randrange(arity[t]) for t in range(n_tests)] for _ in range(n)]
        return Model(arity, costs, classes, prior, outcomes=outcomes, hypothesis_ids=ids)
    likelihood = []
    for _ in range(n):
        row = []
        for t in range(n_tests):
            if rng.random() < 0.15:
                cell = [0.0] * arity[t]
                cell[rng.randrange(arity[t])] = 1.0  # some exact answers: zero likelihoods happen
            else:
                raw = [rng.uniform(0.02, 1.0) for _ in range(arity[t])]
                cell = [x / sum(raw) for x in raw]
            row.append(cell)
        likelihood.append(row)
    return Model(arity, costs, classes, prior, likelihood=likelihood, hypothesis_ids=ids)


def to_payload(model: Model) -> dict:
    """The per-hypothesis wire form of ``model``; outcome labels are 'o0', 'o1', … in order."""
    tests = [
        {"id": f"t{t}", "cost": model.costs[t], "outcomes": [f"o{k}" for k in range(model.arity[t])]}
        for t in range(model.n_tests)
    ]
    hypotheses = []
    for h in range(model.n):
        spec = {"id": model.hypothesis_ids[h], "class": model.classes[h], "prior": model.prior[h]}
        if model.deterministic:
            spec["outcomes"] = {f"t{t}": f"o{model.outcomes[h][t]}" for t in range(model.n_tests)}
        else:
            spec["likelihoods"] = {
                f"t{t}": {f"o{k}": model.likelihood[h][t][k] for k in range(model.arity[t])}
                for t in range(model.n_tests)
            }
        hypotheses.append(spec)
    return {"tests": tests, "hypotheses": hypotheses}


def sample_outcome(model: Model, rng: random.Random, h: int, t: int) -> int:
    if model.deterministic:
        return model.outcomes[h][t]
    u, acc = rng.random(), 0.0
    for k in range(model.arity[t]):
        acc += model.likelihood[h][t][k]
        if u < acc and model.likelihood[h][t][k] > 0:
            return k
    return max(range(model.arity[t]), key=lambda k: model.likelihood[h][t][k])


# --- whole runs and the optimum -------------------------------------------------------------


def run(model: Model, truth: int, policy: str) -> float:
    """The cost the greedy policy pays when ``truth`` is the true hypothesis (deterministic)."""
    observations: list[Observation] = []
    while True:
        choice = decide(model, observations, policy)
        if choice.test is None:
            return sum(model.costs[t] for t, _ in observations)
        observations.append((choice.test, model.outcomes[truth][choice.test]))


def expected_cost(model: Model, policy: str) -> float:
    """c(π) = Σ_h P(h) c(A(π, h)) (section 2), by playing every hypothesis."""
    prior = model.normalised_prior()
    return sum(prior[h] * run(model, h, policy) for h in range(model.n) if prior[h] > 0)


def optimal_cost(model: Model) -> float:
    """min over policies of the expected cost to pin the class, by exhaustive recursion.

    OPT(V) = 0 when V is within one class or no test splits it (indistinguishable), else
    min over tests t splitting V of c(t) + Σ_x P(V_x)/P(V) OPT(V_x)."""
    prior = model.normalised_prior()
    memo: dict[frozenset, float] = {}

    def solve(members: frozenset) -> float:
        if members in memo:
            return memo[members]
        best = 0.0
        if len({model.classes[h] for h in members}) > 1:
            options = []
            mass = sum(prior[h] for h in members)
            for t in range(model.n_tests):
                parts: dict[int, set] = {}
                for h in members:
                    parts.setdefault(model.outcomes[h][t], set()).add(h)
                if len(parts) > 1:
                    options.append(model.costs[t] + sum(
                        sum(prior[h] for h in part) / mass * solve(frozenset(part)) for part in parts.values()
                    ))
            best = min(options) if options else 0.0
        memo[members] = best
        return best

    return solve(frozenset(h for h in range(model.n) if prior[h] > 0))


# --- a page of tests: the objective of a set observed together (Chen & Krause, ICML 2013) ----


def joint_probability(model: Model, h: int, tests: list[int], outcomes: tuple[int, ...]) -> float:
    """P(X_S = x_S | h): the tests' answers are independent given the hypothesis."""
    return math.prod(model.p_outcome(h, t, k) for t, k in zip(tests, outcomes))


def joint_gain(model: Model, observations: list[Observation], tests: list[int], policy: str) -> float:
    """f(S), the policy's objective when the tests S are observed at once, by enumerating every
    joint outcome x_S (the single-test criteria above with X_t replaced by X_S)."""
    mass = version_space_mass(model, observations)
    total = sum(mass)
    post = posterior(mass)
    joint = []  # (P(x_S | x_A), P(h | x_A, x_S) or None, Σ_h mass(h) P(x_S | h))
    for outcomes in itertools.product(*(range(model.arity[t]) for t in tests)):
        likelihood = [joint_probability(model, h, tests, outcomes) for h in range(model.n)]
        p_x = sum(post[h] * likelihood[h] for h in range(model.n))
        after = None if p_x <= 0 else [post[h] * likelihood[h] / p_x for h in range(model.n)]
        joint.append((p_x, after, sum(mass[h] * likelihood[h] for h in range(model.n)), likelihood))
    if policy == "ec2":
        alive = [h for h in range(model.n) if mass[h] > 0]
        edges = [(h, g, mass[h] * mass[g]) for i, h in enumerate(alive) for g in alive[i + 1:]
                 if model.classes[h] != model.classes[g]]
        # An edge stays uncut under x_S only when both ends agree with x_S.
        return sum(p_x * sum(w for h, g, w in edges if likelihood[h] == 0 or likelihood[g] == 0)
                   for p_x, _, _, likelihood in joint if p_x > 0)
    if policy == "gbs":
        return total - sum(p_x * kept for p_x, _, kept, _ in joint)
    if policy == "uncertainty":
        return entropy_bits(p_x for p_x, _, _, _ in joint)
    value_of = {
        "effecxtive": lambda dist: sum(p * p for p in dist.values()),
        "infogain": lambda dist: -entropy_bits(dist.values()),
        "voi": lambda dist: -min(sum(p for c, p in dist.items() if c != d) for d in dist),
    }[policy]
    expected = sum(p_x * value_of(class_distribution(model, after)) for p_x, after, _, _ in joint if p_x > 0)
    return expected - value_of(class_distribution(model, post))


def greedy_batch(model: Model, observations: list[Observation], policy: str, size: int) -> list[int]:
    """The first test as :func:`decide` chooses it, then each next one maximising the marginal
    joint gain [f(B ∪ {t}) − f(B)] / c(t) among the unrun tests, earliest among ties; a member
    must add a positive (normalised) gain."""
    first = decide(model, observations, policy)
    if first.test is None:
        return []
    batch = [first.test]
    total = sum(version_space_mass(model, observations))
    power = POWER.get(policy, 0)
    ran = {t for t, _ in observations}
    while len(batch) < size:
        base = joint_gain(model, observations, batch, policy)
        ratio = {}
        for t in range(model.n_tests):
            if t in ran or t in batch:
                continue
            marginal = joint_gain(model, observations, [*batch, t], policy) - base
            if marginal / total ** power > ZERO:
                ratio[t] = marginal / model.costs[t]
        if not ratio:
            break
        best = max(ratio.values())
        batch.append(next(t for t in sorted(ratio) if ratio[t] >= best - 1e-9 * abs(best)))
    return batch
