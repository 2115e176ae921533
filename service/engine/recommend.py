"""``auto``: the policy that does best on sessions simulated from the instance's own model.

Every registered policy that applies to the instance (:data:`~.policies.POLICIES`, asked
through :func:`~.policies.resolve_policy`) is a candidate. Simulated respondents are drawn from
the instance itself and every candidate meets the same ones, answer for answer (paired):

* respondent r (0, 1, …) takes ``rng = numpy.random.default_rng([seed, r])``, its true
  hypothesis h = ``rng.choice(n, p=prior)`` and one uniform per test, ``u = rng.random(N)``;
* its first answer to test t is outcome x = the first k with Σ_{j ≤ k} P(x_j | h, t) > u[t]
  (deterministic instances: the outcome h gives); a repeatable test's (j+1)-th answer, j ≥ 1,
  draws its uniform from ``default_rng([seed, r, t, j]).random()``.

Each candidate is played until it stops under the stop rules (with the seed, for a policy that
draws from it). Its *accuracy* is the share of respondents whose MAP class at the stop is h's
class (decision instances: whose reported decision is acceptable to h), with a Wilson 95 %
interval; its *cost* the mean cost paid, with a normal 95 % interval.

Ranking: the higher accuracy first, then the lower mean cost, then registry order. Beside each
candidate, the paired difference of its accuracy from the first-ranked one's, d̄ ± z·s_d/√R over
the respondents' differences d_r ∈ {−1, 0, 1}: an interval reaching 0 says the simulation does
not tell the two apart (under a confidence stop, respondents drawn from the model leave every
policy about equally accurate, and cost is what separates them).

Bounded by a :class:`Budget`: a number of respondents and seconds of CPU read from ``clock``
(the caller's; checked before every simulated step). A respondent is counted once every
candidate has finished it; when the time runs out first the ranking is over the respondents
finished and :attr:`Recommendation.complete` is False. With no respondent finished, the
candidates keep registry order (decision policies first) and the first is the pick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from .belief import Observation, observe
from .compiled import CompiledInstance
from .errors import PolicyNotApplicable
from .evaluate import final_decision
from .intervals import mean_interval, wilson_interval
from .policies import POLICIES, Policy, resolve_policy
from .select import Decision, StopRules, decide

# Recommendations this process made under the default budget and seed, for
# :func:`~.policies.resolve_policy`: (content hash, stop rules) → the pick. The service shares
# its own through the store.
REMEMBERED = 256
_remembered: dict[tuple[str, StopRules], str] = {}


@dataclass(frozen=True)
class Budget:
    """What one recommendation may spend: respondents simulated (each through every candidate)
    and seconds of CPU."""

    respondents: int = 100
    cpu_seconds: float = 2.0


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's simulated sessions: accuracy and cost at the stop, with 95 % intervals."""

    policy: str
    accuracy: float | None  # None: no respondent finished
    accuracy_ci: tuple[float, float] | None
    mean_cost: float | None
    mean_cost_ci: tuple[float, float] | None
    mean_tests: float | None
    # Paired, respondent by respondent: this candidate's accuracy minus the first-ranked one's,
    # with its interval (an interval reaching 0: the simulation does not tell the two apart).
    accuracy_gap: float | None = None
    accuracy_gap_ci: tuple[float, float] | None = None


@dataclass(frozen=True)
class Recommendation:
    """The pick and the evidence: every candidate, best first."""

    policy: str
    candidates: tuple[CandidateResult, ...]
    respondents: int  # finished by every candidate
    seed: int
    budget: Budget
    complete: bool  # False: the CPU budget ran out before ``budget.respondents``
    cpu_seconds: float  # spent
    note: str

    def to_dict(self) -> dict:
        """Plain JSON types (tuples become lists)."""
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> Recommendation:
        """The inverse of :meth:`to_dict`; raises ``TypeError``/``KeyError``/``ValueError`` on
        anything else."""
        budget = Budget(**data["budget"])
        candidates = tuple(CandidateResult(**{key: tuple(value) if key.endswith("_ci") and value is not None
                                               else value for key, value in c.items()})
                           for c in data["candidates"])
        fields = {key: data[key] for key in ("policy", "respondents", "seed", "complete", "cpu_seconds", "note")}
        recommendation = Recommendation(candidates=candidates, budget=budget, **fields)
        if recommendation.policy not in [c.policy for c in candidates]:
            raise ValueError("the pick is not among the candidates")
        return recommendation


def applicable_policies(inst: CompiledInstance) -> list[Policy]:
    """Every registered policy that applies to ``inst``, in registry order, decision policies
    first (on a decision instance they decide directly)."""
    applicable = []
    for name in POLICIES:
        try:
            applicable.append(resolve_policy(inst, name))
        except PolicyNotApplicable:
            continue
    if not applicable:
        raise PolicyNotApplicable("no registered policy applies to this instance, so 'auto' has nothing to choose from")
    return sorted(applicable, key=lambda policy: not policy.decision)


class _OutOfTime(Exception):
    pass


class _Respondent:
    """Respondent r: a true hypothesis and its answers, the same whichever test is asked when."""

    def __init__(self, inst: CompiledInstance, seed: int, index: int):
        rng = np.random.default_rng([seed, index])
        self.inst, self.seed, self.index = inst, seed, index
        self.hypothesis = h = int(rng.choice(inst.n_hypotheses, p=inst.prior))
        uniforms = rng.random(inst.n_tests)
        if inst.outcomes is not None:
            self.first = inst.outcomes[h]
        else:  # every first answer at once: the first k whose cumulative probability passes u
            self.first = _drawn(inst.likelihood[h], uniforms)

    def answer(self, t: int, earlier: int) -> int:
        """The outcome of test t asked for the (earlier + 1)-th time."""
        if earlier == 0 or self.inst.outcomes is not None:
            return int(self.first[t])
        u = np.random.default_rng([self.seed, self.index, t, earlier]).random()
        return int(_drawn(self.inst.likelihood[self.hypothesis, t:t + 1], np.array([u]))[0])


def _drawn(rows: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Per row (a test's outcome distribution), the first outcome k with Σ_{j ≤ k} p_j > u;
    where round-off leaves the whole sum at or under u, the last outcome of positive probability."""
    passed = (np.cumsum(rows, axis=1) <= uniforms[:, None]).sum(axis=1)
    last = rows.shape[1] - 1 - np.argmax(rows[:, ::-1] > 0, axis=1)
    return np.minimum(passed, last)


# Steps remembered across respondents (a policy's decision depends on the observations alone):
# at most this many hypotheses' worth of beliefs, summed over the steps kept.
MAX_REMEMBERED_MASSES = 4_000_000


class _Steps:
    """A policy's decisions by the observations before them, shared by every respondent: on a
    small instance the respondents walk the same few paths of the policy's tree."""

    def __init__(self, inst: CompiledInstance, policy: Policy, rules: StopRules, seed: int):
        self.inst, self.policy, self.rules, self.seed = inst, policy, rules, seed
        self.known: dict[tuple[Observation, ...], Decision] = {}

    def after(self, observations: tuple[Observation, ...], before: Decision | None, room: list[int]) -> Decision:
        decision = self.known.get(observations)
        if decision is None:
            belief = observe(self.inst, observations, None if before is None else before.belief)
            decision = decide(belief, self.policy, self.rules, self.seed)
            if room[0] >= belief.alive.size:
                room[0] -= belief.alive.size
                self.known[observations] = decision
        return decision


def _play(steps: _Steps, respondent: _Respondent, out_of_time: Callable[[], bool],
          room: list[int]) -> tuple[bool, float, int]:
    """(right at the stop, cost paid, tests answered) of ``steps``' policy against ``respondent``."""
    inst = steps.inst
    observations: tuple[Observation, ...] = ()
    decision = None
    asked: dict[int, int] = {}
    while True:
        if out_of_time():
            raise _OutOfTime
        decision = steps.after(observations, decision, room)  # carried forward: one step's work
        if decision.done:
            break
        t = decision.next_test
        observations = (*observations, (t, respondent.answer(t, asked.get(t, 0))))
        asked[t] = asked.get(t, 0) + 1
    belief, h = decision.belief, respondent.hypothesis
    if inst.is_decision:
        right = bool(inst.acceptable[h, final_decision(belief)])
    else:
        right = int(np.argmax(belief.class_mass)) == int(inst.class_index[h])
    return right, float(belief.cost_spent), len(belief.answers)


def recommend(inst: CompiledInstance, rules: StopRules = StopRules(), *, seed: int = 0, budget: Budget = Budget(),
              clock: Callable[[], float] = time.thread_time) -> Recommendation:
    """The candidate the simulation ranks first, and the evidence (module docstring)."""
    pool = applicable_policies(inst)
    started = clock()
    deadline = started + budget.cpu_seconds

    def out_of_time() -> bool:
        return clock() >= deadline

    right = np.zeros((budget.respondents, len(pool)), dtype=bool)
    cost = np.zeros((budget.respondents, len(pool)))
    tests = np.zeros((budget.respondents, len(pool)))
    steps = [_Steps(inst, policy, rules, seed) for policy in pool]
    room = [MAX_REMEMBERED_MASSES]
    finished = 0
    try:
        for r in range(budget.respondents):
            respondent = _Respondent(inst, seed, r)
            for c in range(len(pool)):
                right[r, c], cost[r, c], tests[r, c] = _play(steps[c], respondent, out_of_time, room)
            finished += 1
    except _OutOfTime:
        pass
    spent = clock() - started
    ranked = _rank(pool, right[:finished], cost[:finished], tests[:finished])
    complete = finished == budget.respondents
    if finished == 0:
        note = (f"no simulated respondent finished within {budget.cpu_seconds:g} s of CPU: the first applicable "
                "policy in registry order")
    elif complete:
        note = f"ranked on {finished} simulated respondents, the same for every candidate"
    else:
        note = (f"the CPU budget ({budget.cpu_seconds:g} s) ran out after {finished} of {budget.respondents} "
                "simulated respondents: ranked on those")
    return Recommendation(ranked[0].policy, tuple(ranked), finished, seed, budget, complete, spent, note)


def _rank(pool: list[Policy], right: np.ndarray, cost: np.ndarray, tests: np.ndarray) -> list[CandidateResult]:
    """Candidates best first (module docstring); ``right``, ``cost``, ``tests``: (R, C)."""
    finished = right.shape[0]
    if finished == 0:
        return [CandidateResult(p.name, None, None, None, None, None) for p in pool]
    accuracy = right.mean(axis=0)
    mean_cost = cost.mean(axis=0)
    order = sorted(range(len(pool)), key=lambda c: (-accuracy[c], mean_cost[c], c))
    best = order[0]
    results = []
    for c, policy in enumerate(pool):
        gap = right[:, c].astype(float) - right[:, best]
        results.append(CandidateResult(
            policy.name, float(accuracy[c]), wilson_interval(float(accuracy[c]), finished), float(mean_cost[c]),
            mean_interval(cost[:, c]), float(tests[:, c].mean()), float(gap.mean()), mean_interval(gap)))
    return [results[c] for c in order]


def recommended(inst: CompiledInstance, rules: StopRules | None = None) -> str:
    """The pick of :func:`recommend` under the default budget and seed, computed once per
    process for each instance and stop rules."""
    rules = StopRules() if rules is None else rules
    key = (inst.content_hash, rules)
    pick = _remembered.get(key)
    if pick is None:
        pick = recommend(inst, rules).policy
        if len(_remembered) >= REMEMBERED:
            _remembered.pop(next(iter(_remembered)), None)  # the oldest
        _remembered[key] = pick
    return pick
