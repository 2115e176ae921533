"""How good is a policy on an instance, before anyone is tested with it.

For each policy: the expected cost c(π) and expected number of tests over the prior, the worst
case, the cost per class, how runs end (determined, or stopped early and why), the accuracy of the
MAP class, and — where the dynamic programme fits — the ratio c(π)/c(π*) to the exact optimum,
shown beside EC²'s guarantee 2 ln(1/p_min) + 1 (Theorem 2 of Golovin, Krause & Ray 2010).

* Deterministic instances are evaluated **exactly**: the policy's decision tree is walked once
  (:func:`service.engine.policy_tree`); a leaf reached with prior mass P(V_leaf) contributes
  P(V_leaf) · cost(path). No sampling, no error bars.
* Decision instances (docs/decisions.md): accuracy is the probability that the decision reported
  at the stop is acceptable to the true hypothesis, the expected loss is that of the reported
  decision (the given losses, else 1 for an unacceptable decision and 0 otherwise), and the
  optimum is the cheapest policy that reaches a decision (:func:`optimal_decision_cost`).
* Likelihood instances cannot be walked to the end (every outcome stays possible), so they are
  evaluated by **seeded Monte Carlo**: true hypotheses drawn from the prior, answers drawn from
  P(x | h, t) by :func:`service.engine.run_policy`, with 95 % confidence intervals; so is any
  instance under restricted exposure control, whose runs depend on the runs before them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from service.engine import (
    AUTO,
    CompiledInstance,
    InfeasibleComputation,
    RunResult,
    Recommendation,
    StopReason,
    StopRules,
    TreeNode,
    applicable_policies,
    final_decision,
    log_p_min_bound,
    mean_interval,
    observe,
    optimal_decision_cost,
    optimal_expected_cost,
    policy_tree,
    recommend,
    resolve_policy,
    run_policy,
    theta_estimate,
    wilson_interval,
)
from service.engine.restricted import restriction

from .limits import EvaluationLimitExceeded, EvaluationLimits, check_deadline, check_size

Progress = Callable[[int], None]  # called with the number of work units just finished


@dataclass(frozen=True)
class ClassCost:
    """The cost paid when the true hypothesis lies in one class."""

    label: str
    probability: float  # P(class) under the prior
    mean_cost: float
    min_cost: float
    max_cost: float
    mean_tests: float
    accuracy: float  # share of that class's mass whose MAP class at the stop is the class


@dataclass(frozen=True)
class PolicyEvaluation:
    policy: str
    method: str  # "exact" or "monte_carlo"
    expected_cost: float
    expected_tests: float
    worst_case_cost: float  # Monte Carlo: the largest cost seen
    worst_case_tests: int
    accuracy: float  # P(MAP class at the stop = true class); decisions: P(decision acceptable)
    stop_reasons: dict[str, float]  # stop reason -> share of runs (probability mass)
    per_class: list[ClassCost]
    # Monte Carlo only: sample size and 95 % intervals (normal for the means, Wilson for accuracy).
    samples: int | None = None
    expected_cost_ci: tuple[float, float] | None = None
    expected_tests_ci: tuple[float, float] | None = None
    accuracy_ci: tuple[float, float] | None = None
    # accuracy_by_tests[k]: P(MAP class after min(k, tests run) tests = true class), k = 0, 1, ...
    accuracy_by_tests: list[float] | None = None
    ratio_to_optimum: float | None = None
    nodes: int | None = None  # exact only: size of the walked tree
    # Decision instances: E[loss(true hypothesis, reported decision)] (Monte Carlo: with its interval).
    expected_loss: float | None = None
    expected_loss_ci: tuple[float, float] | None = None
    # Item banks (Monte Carlo): the root mean square of EAP − true θ at the stop, with a 95 %
    # interval, and the share of runs that gave the most-used item (which one).
    theta_rmse: float | None = None
    theta_rmse_ci: tuple[float, float] | None = None
    top_exposure: float | None = None
    top_exposure_item: str | None = None

    @property
    def determined_share(self) -> float:
        return self.stop_reasons.get(StopReason.DETERMINED.value, 0.0)


@dataclass(frozen=True)
class EvaluationReport:
    instance_kind: str
    n_hypotheses: int
    n_tests: int
    n_classes: int
    p_min: float
    rules: dict[str, float | int | bool | None]
    seed: int
    policies: list[PolicyEvaluation]
    # The exact optimum c(π*) (deterministic instances, when the DP fits), or why it is missing.
    optimum: float | None = None
    optimum_note: str | None = None
    # EC²'s guarantee factor 2 ln(1/p_min) + 1 (deterministic instances).
    ec2_bound: float | None = None
    elapsed_seconds: float = 0.0
    # When "auto" was among the policies: what it resolved to and the evidence
    # (:meth:`~service.engine.Recommendation.to_dict`); its evaluation is the chosen policy's.
    auto: dict | None = None

    def to_dict(self) -> dict:
        """Plain JSON types only (tuples become lists, NaN never appears)."""
        out = asdict(self)
        for evaluation, policy in zip(out["policies"], self.policies):
            evaluation["determined_share"] = policy.determined_share
        return out


def default_policies(inst: CompiledInstance) -> list[str]:
    """Every registered policy that applies to the instance, in registry order (decision
    instances: the decision policies first)."""
    return [policy.name for policy in applicable_policies(inst)]


def decision_loss(inst: CompiledInstance) -> np.ndarray:
    """loss[h, d]: the given losses, else 0 for an acceptable decision and 1 otherwise."""
    return inst.loss if inst.loss is not None else (~inst.acceptable).astype(float)


def evaluate(
    inst: CompiledInstance,
    policies: Sequence[str] | None = None,
    rules: StopRules = StopRules(),
    *,
    samples: int = 2000,
    seed: int = 0,
    method: str = "auto",
    optimum: bool = True,
    limits: EvaluationLimits = EvaluationLimits(),
    progress: Progress | None = None,
    auto: Recommendation | None = None,
) -> EvaluationReport:
    """Evaluate ``policies`` (names; default: all that apply) on ``inst`` under ``rules``.

    "auto" among them is the policy ``auto`` chooses (``auto``, a recommendation made for
    ``rules``; else the engine's, :func:`~service.engine.recommend`), evaluated once; the report
    carries the recommendation whenever it was given or made.

    ``method``: "exact" (tree walk; deterministic instances only), "monte_carlo", or "auto"
    (exact when deterministic). The same ``seed`` gives the same report; each policy sees the
    same true hypotheses and, sample by sample, the same answer stream (common random numbers),
    so differences between policies are not sampling noise in the choice of patients.
    """
    started = time.monotonic()
    deadline = started + limits.time_limit if limits.time_limit is not None else None
    names = list(policies) if policies else default_policies(inst)
    if AUTO in names:
        auto = recommend(inst, rules) if auto is None else auto
        names = list(dict.fromkeys(auto.policy if name == AUTO else name for name in names))
    resolved = [resolve_policy(inst, name, rules) for name in names]  # refuse unknown names up front
    method = _method(inst, method, rules)
    check_size(inst, len(resolved), method, samples, limits)

    def check() -> None:
        check_deadline(deadline, limits)

    if method == "exact":
        results = [_exact(inst, policy, rules, seed, limits, check, progress) for policy in resolved]
    else:
        truths = np.random.default_rng(seed).choice(inst.n_hypotheses, size=samples, p=inst.prior)
        results = [_monte_carlo(inst, policy, rules, seed, truths, check, progress) for policy in resolved]
    opt, note = _optimum(inst, optimum, limits, check)
    if opt is not None and opt > 0:
        results = [_with_ratio(r, _ratio(r.expected_cost, opt)) for r in results]
    return EvaluationReport(
        instance_kind=inst.kind, n_hypotheses=inst.n_hypotheses, n_tests=inst.n_tests, n_classes=inst.n_classes,
        p_min=inst.p_min,
        rules={"max_tests": rules.max_tests, "max_cost": rules.max_cost,
               "confidence": rules.effective_confidence(inst), "max_expected_loss": rules.max_expected_loss,
               **({} if rules.max_se is None else {"max_se": rules.max_se}),
               **({} if rules.randomesque is None else {"randomesque": rules.randomesque}),
               **({"sympson_hetter": True} if rules.sympson_hetter else {}),
               **({"progressive": True} if rules.progressive else {}),
               **({} if rules.max_rate is None else {"max_rate": rules.max_rate})},
        seed=seed, policies=results, optimum=opt, optimum_note=note,
        ec2_bound=log_p_min_bound(inst) if inst.kind == "deterministic" and not inst.is_decision else None,
        elapsed_seconds=time.monotonic() - started,
        auto=None if auto is None else auto.to_dict(),
    )


def _method(inst: CompiledInstance, method: str, rules: StopRules = StopRules()) -> str:
    """"exact" or "monte_carlo" for ``method`` ("auto": exact when deterministic and without
    restricted exposure control, whose runs depend on the runs before them: no one tree)."""
    if method == "auto":
        method = "exact" if inst.kind == "deterministic" and rules.max_rate is None else "monte_carlo"
    if method == "exact" and inst.kind != "deterministic":
        raise InfeasibleComputation(
            "exact evaluation walks the policy tree to its leaves, which exists for deterministic "
            "instances only; use Monte Carlo for a likelihood instance"
        )
    if method == "exact" and rules.max_rate is not None:
        raise InfeasibleComputation(
            "restricted exposure control holds tests back by what earlier sessions were given, so "
            "runs differ by their place in the sequence and there is no one tree to walk; use Monte Carlo"
        )
    if method not in ("exact", "monte_carlo"):
        raise ValueError(f"unknown evaluation method '{method}'")
    return method


def _exact(inst: CompiledInstance, policy, rules: StopRules, seed: int, limits: EvaluationLimits,
           check: Callable[[], None], progress: Progress | None) -> PolicyEvaluation:
    tree = policy_tree(inst, policy, rules, seed, max_nodes=limits.max_tree_nodes, check=check)
    if progress:
        progress(1)
    return _from_tree(inst, policy.name, tree)


def _optimum(inst: CompiledInstance, optimum: bool, limits: EvaluationLimits,
             check: Callable[[], None]) -> tuple[float | None, str | None]:
    """The optimal expected cost (deterministic instances, when asked for) or the note saying
    why it is not in the report."""
    if inst.kind != "deterministic":
        return None, "the exact optimum is defined for deterministic instances only"
    if not optimum:
        return None, "not computed"
    check()
    try:
        solve = optimal_decision_cost if inst.is_decision else optimal_expected_cost
        return solve(inst, max_states=limits.max_dp_states, check=check), None
    except EvaluationLimitExceeded:
        # The policies' figures are done; only the optional optimum is left out.
        return None, (f"not computed: the optimum did not finish within the {limits.time_limit:g} s "
                      "limit (EVALUATION_TIME_LIMIT)")
    except InfeasibleComputation as error:
        return None, str(error)


def work_units(inst: CompiledInstance, n_policies: int, samples: int, method: str = "auto",
               rules: StopRules = StopRules()) -> int:
    """How many ``progress`` units an evaluation reports: one per policy (exact) or per run."""
    exact = _method(inst, method, rules) == "exact"
    return n_policies if exact else n_policies * samples


def _ratio(cost: float, optimum: float) -> float | None:
    """cost / optimum, or None past the largest float: costs may span 600 orders of magnitude
    (2e-308 … 1e300), and JSON has no infinity."""
    with np.errstate(over="ignore"):
        ratio = cost / optimum
    return float(ratio) if math.isfinite(ratio) else None


def _with_ratio(result: PolicyEvaluation, ratio: float | None) -> PolicyEvaluation:
    return replace(result, ratio_to_optimum=ratio)


def _from_tree(inst: CompiledInstance, name: str, tree: TreeNode) -> PolicyEvaluation:
    """Exact figures from the leaves. On a deterministic instance a leaf's class masses are the
    prior masses P(H_i ∩ V_leaf); they sum to the leaf's probability, and over all leaves to 1."""
    leaves = list(tree.leaves())
    mass = np.stack([leaf.belief.class_mass for leaf in leaves])  # (L, C)
    cost = np.array([leaf.cost for leaf in leaves])
    depth = np.array([leaf.depth for leaf in leaves], dtype=float)
    reasons = [_reason(leaf) for leaf in leaves]
    leaf_mass = mass.sum(axis=1)
    # MAP at the leaf is right exactly for the mass of the leaf's heaviest class.
    correct = mass.max(axis=1)
    accuracy, loss = float(correct.sum()), None
    if inst.is_decision:
        # The leaf's decision, against each hypothesis alive there (prior masses).
        losses = decision_loss(inst)
        accuracy = loss = 0.0
        for leaf in leaves:
            d = final_decision(leaf.belief)
            alive, weight = leaf.belief.alive, inst.prior[leaf.belief.alive]
            accuracy += float(weight @ inst.acceptable[alive, d])
            loss += float(weight @ losses[alive, d])
    return PolicyEvaluation(
        policy=name,
        method="exact",
        expected_cost=float(leaf_mass @ cost),
        expected_tests=float(leaf_mass @ depth),
        worst_case_cost=float(cost.max()),
        worst_case_tests=int(depth.max()),
        accuracy=accuracy,
        stop_reasons=_shares(reasons, leaf_mass),
        per_class=_per_class(inst, mass, cost, depth, correct_mass=_map_mass(mass)),
        nodes=sum(1 for _ in tree.nodes()),
        expected_loss=loss,
    )


def _map_mass(mass: np.ndarray) -> np.ndarray:
    """(L, C) → the part of each class's mass at each leaf that the leaf's MAP class gets right."""
    correct = np.zeros_like(mass)
    rows = np.arange(mass.shape[0])
    top = mass.argmax(axis=1)
    correct[rows, top] = mass[rows, top]
    return correct


def _per_class(inst: CompiledInstance, weight: np.ndarray, cost: np.ndarray, tests: np.ndarray,
               correct_mass: np.ndarray) -> list[ClassCost]:
    """``weight`` (runs, C): how much of each class each run (leaf or sample) carries."""
    total = weight.sum(axis=0)  # (C,)
    present = weight > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_cost = (cost @ weight) / total
        mean_tests = (tests @ weight) / total
        accuracy = correct_mass.sum(axis=0) / total
    low = np.where(present, cost[:, None], np.inf).min(axis=0)
    high = np.where(present, cost[:, None], -np.inf).max(axis=0)
    grand = total.sum()
    out = []
    for c, label in enumerate(inst.class_labels):
        if total[c] <= 0:
            continue  # a class the prior (or the sample) never produces
        out.append(ClassCost(label, float(total[c] / grand), float(mean_cost[c]), float(low[c]),
                             float(high[c]), float(mean_tests[c]), float(accuracy[c])))
    return out


def _reason(leaf: TreeNode) -> str:
    reason = leaf.decision.stop_reason
    return reason.value if reason is not None else "unfinished"


def _shares(reasons: Sequence[str], weight: np.ndarray) -> dict[str, float]:
    labels, index = np.unique(np.array(reasons, dtype=object).astype(str), return_inverse=True)
    share = np.bincount(index.reshape(-1), weights=weight, minlength=len(labels)) / weight.sum()
    # Ordered as the engine orders its stop reasons (determined first).
    order = {r.value: i for i, r in enumerate(StopReason)}
    pairs = sorted(zip(labels.tolist(), share.tolist()), key=lambda p: order.get(p[0], len(order)))
    return {label: value for label, value in pairs}


def simulate(inst: CompiledInstance, policy, rules: StopRules, seed: int, truths: np.ndarray,
             check: Callable[[], None] | None = None, progress: Progress | None = None) -> list[RunResult]:
    """One run of ``policy`` per true hypothesis in ``truths``, in order, answers drawn from the
    likelihoods.

    One generator per sample, keyed by (seed, sample): a policy's result does not depend on which
    other policies are evaluated, or in which order. Exposure control draws per examinee, so each
    run then has its own seed for it. Restricted exposure control (``rules.max_rate``) counts
    across the runs as a store counts across sessions: run i (from 0) holds back the tests given in
    ``max_rate`` of i + 1 sessions or more (and reserves those near it: service/engine/restricted.py),
    the earlier runs' tests counted, so each restricted run depends on the examinees before it, and
    on their order."""
    runs = []
    tick = max(1, truths.size // 100)
    given = np.zeros(inst.n_tests) if rules.max_rate is not None else None
    for i, h in enumerate(truths.tolist()):
        run_seed = (seed << 32) + i if rules.draws_for_exposure else seed
        restricted = None if given is None else restriction(given, i + 1, rules.max_rate)
        run = run_policy(inst, h, policy, rules, run_seed, rng=np.random.default_rng([seed, i]), check=check,
                         restriction=restricted)
        runs.append(run)
        if given is not None:
            given += items_given(inst, [run])
        if progress and (i + 1) % tick == 0:
            progress(tick)
    if progress and truths.size % tick:
        progress(truths.size % tick)
    return runs


def items_given(inst: CompiledInstance, runs: Sequence[RunResult]) -> np.ndarray:
    """(N,): how many of ``runs`` gave each test (a repeated test counted once per run)."""
    given = np.zeros(inst.n_tests)
    for run in runs:
        given[list({t for t, _ in run.observations})] += 1
    return given


def _monte_carlo(inst, policy, rules, seed, truths, check, progress) -> PolicyEvaluation:
    samples = truths.size
    runs = simulate(inst, policy, rules, seed, truths, check, progress)
    cost = np.array([run.cost for run in runs])
    tests = np.array([len(run.observations) for run in runs], dtype=float)
    reasons = [run.stop_reason.value for run in runs]
    trajectories = [run.map_classes for run in runs]
    decisions = [run.decision for run in runs]

    true_class = inst.class_index[truths]
    # MAP class after k tests, held at its final value once the run has stopped: (samples, K+1).
    longest = max(len(t) for t in trajectories)
    map_by_step = np.array([t + (t[-1],) * (longest - len(t)) for t in trajectories])
    right_by_step = map_by_step == true_class[:, None]
    right = right_by_step[:, -1]
    one_hot = np.zeros((samples, inst.n_classes))
    one_hot[np.arange(samples), true_class] = 1.0
    accuracy = float(right.mean())
    loss = loss_ci = None
    if inst.is_decision:
        chosen = np.array(decisions, dtype=np.intp)
        accuracy = float(inst.acceptable[truths, chosen].mean())
        run_loss = decision_loss(inst)[truths, chosen]
        loss, loss_ci = float(run_loss.mean()), mean_interval(run_loss)
    return PolicyEvaluation(
        policy=policy.name,
        method="monte_carlo",
        expected_cost=float(cost.mean()),
        expected_tests=float(tests.mean()),
        worst_case_cost=float(cost.max()),
        worst_case_tests=int(tests.max()),
        accuracy=accuracy,
        stop_reasons=_shares(reasons, np.ones(samples)),
        per_class=_per_class(inst, one_hot, cost, tests, one_hot * right[:, None]),
        samples=samples,
        expected_cost_ci=mean_interval(cost),
        expected_tests_ci=mean_interval(tests),
        accuracy_ci=wilson_interval(accuracy, samples),
        accuracy_by_tests=right_by_step.mean(axis=0).tolist(),
        expected_loss=loss,
        expected_loss_ci=loss_ci,
        **({} if inst.theta is None else _item_bank_figures(inst, runs)),
    )


def _item_bank_figures(inst: CompiledInstance, runs: list) -> dict:
    """θ RMSE (EAP at the stop against the simulated examinee's θ) and the top exposure rate."""
    squared = np.array([(theta_estimate(observe(inst, run.observations))[0] - inst.theta[run.true_hypothesis]) ** 2
                        for run in runs])
    low, high = mean_interval(squared)
    given = items_given(inst, runs)
    top = int(np.argmax(given))
    return {"theta_rmse": math.sqrt(squared.mean()), "theta_rmse_ci": (math.sqrt(max(low, 0.0)), math.sqrt(high)),
            "top_exposure": float(given[top] / len(runs)), "top_exposure_item": inst.test_ids[top]}
