"""Running a policy: against one true hypothesis, as a whole decision tree, and the exact optimum.

* :func:`run_policy` plays a policy against a given true hypothesis (sampling answers from the
  likelihood model when the instance is noisy).
* :func:`policy_tree` walks the policy's decision tree: every reachable observation vector,
  with the probability of reaching it. Its :func:`expected_cost` is exact, no sampling.
* :func:`optimal_expected_cost` is the minimum expected cost of any policy that determines the
  class, by dynamic programming over the reachable version spaces (small instances only).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import numpy as np

from .belief import Belief, Observation, observe
from .compiled import CompiledInstance
from .errors import InfeasibleComputation
from .policies import Policy
from .regions import choose_decision, decision_posterior, expected_loss
from .restricted import Restriction
from .select import Decision, StopReason, StopRules, decide

DEFAULT_MAX_TREE_NODES = 100_000
DEFAULT_MAX_DP_STATES = 50_000

# Called before each unit of work (a step, a tree node, a version space of the optimum); it may
# raise to stop the computation, e.g. at a deadline. The engine itself keeps no clock.
Check = Callable[[], None]


@dataclass(frozen=True)
class RunResult:
    true_hypothesis: int
    observations: tuple[Observation, ...]
    cost: float
    stop_reason: StopReason
    # MAP class before any test and after each observation: len(observations) + 1 entries.
    map_classes: tuple[int, ...]
    # Decision instances: the decision reported at the stop (regions.choose_decision).
    decision: int | None = None

    @property
    def final_class(self) -> int:
        return self.map_classes[-1]


def run_policy(
    inst: CompiledInstance,
    true_hypothesis: int,
    policy: Policy,
    rules: StopRules = StopRules(),
    seed: int = 0,
    rng: np.random.Generator | None = None,
    check: Check | None = None,
    restriction: Restriction | None = None,
) -> RunResult:
    """Play ``policy`` until it stops, answering each test as ``true_hypothesis`` would
    (drawn from P(x | h, t) with ``rng`` on likelihood instances); ``restriction``: what
    restricted exposure control keeps from this run (:func:`decide`)."""
    if inst.kind == "likelihood" and rng is None:
        rng = np.random.default_rng(seed)
    observations: list[Observation] = []
    map_classes: list[int] = []
    while True:
        if check is not None:
            check()
        decision = decide(observe(inst, observations), policy, rules, seed, restriction=restriction)
        map_classes.append(int(np.argmax(decision.belief.class_mass)))
        if decision.done:
            return RunResult(true_hypothesis, tuple(observations), decision.belief.cost_spent,
                             decision.stop_reason, tuple(map_classes), final_decision(decision.belief))
        t = decision.next_test
        if inst.outcomes is not None:
            outcome = int(inst.outcomes[true_hypothesis, t])
        else:
            row = inst.likelihood[true_hypothesis, t]
            outcome = int(rng.choice(row.size, p=row))
        observations.append((t, outcome))


@dataclass(eq=False)
class TreeNode:
    """A node of a policy's decision tree: the observations that lead here, the probability
    of reaching it, the cost paid so far, and either the next test or why the policy stops."""

    decision: Decision
    probability: float
    cost: float
    depth: int
    children: dict[int, TreeNode] = field(default_factory=dict)  # outcome index -> child

    @property
    def belief(self) -> Belief:
        return self.decision.belief

    @property
    def test(self) -> int | None:
        return self.decision.next_test

    @property
    def is_leaf(self) -> bool:
        return self.decision.done or not self.children

    def leaves(self):
        stack = [self]
        while stack:
            node = stack.pop()
            if node.is_leaf:
                yield node
            else:
                stack.extend(reversed(list(node.children.values())))

    def nodes(self):
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(list(node.children.values())))


def policy_tree(
    inst: CompiledInstance,
    policy: Policy,
    rules: StopRules = StopRules(),
    seed: int = 0,
    max_nodes: int = DEFAULT_MAX_TREE_NODES,
    check: Check | None = None,
) -> TreeNode:
    """The whole adaptive policy as a tree. A child exists for every outcome with positive
    probability p(x | x_A) = Σ_{h ∈ V} w(h) P(x | h) / M; leaves are where the policy stops
    (likelihood instances: give ``rules.max_tests`` to bound the depth). Built with an explicit
    stack: a chain of n hypotheses makes a tree n deep."""
    root = TreeNode(decide(observe(inst, ()), policy, rules, seed), 1.0, 0.0, 0)
    count = 1
    stack = [root]
    while stack:
        node = stack.pop()
        if node.decision.done:
            continue
        if check is not None:
            check()
        t = node.test
        belief = node.belief
        outcome_probability = _outcome_probability(inst, belief, t)
        for k in np.flatnonzero(outcome_probability > 0):
            count += 1
            if count > max_nodes:
                raise InfeasibleComputation(
                    f"the policy tree has more than {max_nodes} nodes; bound it with max_tests "
                    "or a smaller instance"
                )
            child_belief = observe(inst, (*belief.observations, (t, int(k))))
            child = TreeNode(
                decide(child_belief, policy, rules, seed),
                node.probability * float(outcome_probability[k]),
                node.cost + float(inst.costs[t]),
                node.depth + 1,
            )
            node.children[int(k)] = child
            stack.append(child)
    return root


def final_decision(belief: Belief) -> int | None:
    """The decision a run reports where it stops (None on class instances)."""
    if not belief.instance.is_decision:
        return None
    return choose_decision(decision_posterior(belief), expected_loss(belief))


def _outcome_probability(inst: CompiledInstance, belief: Belief, t: int) -> np.ndarray:
    """p(x | x_A) summed from the hypotheses themselves, not from α: α's last outcome is
    β − Σ(others), whose round-off (1e-17) would open a branch no hypothesis can answer."""
    if inst.outcomes is not None:
        mass = np.bincount(inst.outcomes[belief.alive, t], weights=belief.mass, minlength=inst.max_outcomes)
    else:
        mass = belief.mass @ inst.likelihood[belief.alive, t, :]
    return mass / belief.total_mass


def expected_cost(tree: TreeNode) -> float:
    """Σ_leaves P(leaf) · cost(path): the policy's exact expected cost c(π) under the prior."""
    return sum(leaf.probability * leaf.cost for leaf in tree.leaves())


def expected_tests(tree: TreeNode) -> float:
    return sum(leaf.probability * leaf.depth for leaf in tree.leaves())


def worst_case_cost(tree: TreeNode) -> float:
    return max(leaf.cost for leaf in tree.leaves())


def _visit(solved: int, max_states: int, check: Check | None) -> None:
    """The exact optimum is about to solve one more version space: refuse past ``max_states``
    of them, or past the caller's time limit (``check``)."""
    if solved >= max_states:
        raise InfeasibleComputation(
            f"the optimum needs more than {max_states} version spaces; it is exact only for "
            "small instances (about 20 hypotheses and 10 binary tests)"
        )
    if check is not None:
        check()


def optimal_expected_cost(inst: CompiledInstance, max_states: int = DEFAULT_MAX_DP_STATES,
                          check: Check | None = None) -> float:
    """min over feasible policies of the expected cost to determine the class.

    OPT(V) = 0 when V lies in one class (or no test separates its classes); otherwise
    min_t c(t) + Σ_x P(V_x)/P(V) · OPT(V_x) over tests that split V. Version spaces are memoised
    by their member set; refuses (``InfeasibleComputation``) past ``max_states`` of them. Measured
    on random binary instances with 4 classes (docs/engine.md): 32 hypotheses × 14 tests in 1 s,
    48 × 18 in 6 s, 64 × 20 refused (after ~13 s); the state count grows like 3^N at worst.

    The recursion runs on an explicit stack of generators (each yields the version spaces it
    needs and is sent their values), so its depth — n − 1 on a chain — never meets Python's
    recursion limit.
    """
    if inst.outcomes is None:
        raise InfeasibleComputation("the exact optimum is defined for deterministic instances only")
    outcomes, costs, prior, classes = inst.outcomes, inst.costs, inst.prior, inst.class_index
    memo: dict[bytes, float] = {}

    def solve(members: np.ndarray) -> Generator[np.ndarray, float, float]:
        _visit(len(memo), max_states, check)
        best = 0.0
        if np.unique(classes[members]).size > 1:
            best = np.inf
            rows = outcomes[members]
            mass = prior[members].sum()
            for t in range(inst.n_tests):
                column = rows[:, t]
                if (column == column[0]).all():
                    continue
                if costs[t] >= best:
                    continue
                value = costs[t]
                for k in np.unique(column):
                    part = members[column == k]
                    value += prior[part].sum() / mass * (yield part)
                    if value >= best:
                        break
                best = min(best, value)
            if best == np.inf:
                best = 0.0  # indistinguishable: no test separates what is left
        memo[members.tobytes()] = best
        return best

    root = np.flatnonzero(prior > 0)
    frames = [solve(root)]
    value: float | None = None
    while frames:
        try:
            needed = frames[-1].send(value)
        except StopIteration as finished:
            frames.pop()
            value = finished.value
            continue
        value = memo.get(needed.tobytes())
        if value is None:
            frames.append(solve(needed))
    return value


def optimal_decision_cost(inst: CompiledInstance, max_states: int = DEFAULT_MAX_DP_STATES,
                          check: Check | None = None) -> float:
    """min over feasible policies of the expected cost until a decision suits every hypothesis
    left (decision instances; :func:`optimal_expected_cost` is the optimum over the classes).

    OPT(V) = 0 when one decision is acceptable to all of V (or no test splits V); otherwise
    min_t c(t) + Σ_x P(V_x)/P(V) · OPT(V_x) over tests that split V. Version spaces are memoised
    by their member set and solved bottom-up from an explicit stack (no recursion, whatever the
    depth); refuses (``InfeasibleComputation``) past ``max_states`` of them.
    """
    if inst.outcomes is None:
        raise InfeasibleComputation("the exact optimum is defined for deterministic instances only")
    outcomes, costs, prior, acceptable = inst.outcomes, inst.costs, inst.prior, inst.acceptable

    def splits(members: np.ndarray) -> list[tuple[int, list[np.ndarray]]]:
        """(test, the parts of V by its outcome) for every test that splits V."""
        rows = outcomes[members]
        out = []
        for t in range(inst.n_tests):
            column = rows[:, t]
            if (column != column[0]).any():
                out.append((t, [members[column == k] for k in np.unique(column)]))
        return out

    memo: dict[bytes, float] = {}
    root = np.flatnonzero(prior > 0)
    # (members, expanded): a version space is expanded once (its parts pushed above it), then
    # solved when popped again, by which time every part is in the memo.
    stack: list[tuple[np.ndarray, bool]] = [(root, False)]
    while stack:
        members, expanded = stack.pop()
        key = members.tobytes()
        if not expanded:
            if key in memo:
                continue
            _visit(len(memo), max_states, check)
            options = [] if acceptable[members].all(axis=0).any() else splits(members)
            if not options:
                memo[key] = 0.0  # decided, or indistinguishable: no test separates what is left
                continue
            stack.append((members, True))
            stack.extend((part, False) for _, parts in options for part in parts if part.tobytes() not in memo)
            continue
        mass = prior[members].sum()
        memo[key] = min(
            costs[t] + sum(prior[part].sum() / mass * memo[part.tobytes()] for part in parts)
            for t, parts in splits(members)
        )
    return memo[root.tobytes()]
