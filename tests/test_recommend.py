"""``auto`` (service/engine/recommend.py) against a plain re-simulation written here from its
definition: the same respondents, every candidate played step by step from scratch, the ranking
rule applied by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from service import engine
from tests import reference as ref
from tests import reference_decisions as refd
from tests.builders import compile_model, compile_wire


def applicable(inst) -> list:
    """Every registered policy resolve_policy accepts for ``inst``, decision policies first."""
    found = []
    for name in engine.POLICIES:
        try:
            found.append(engine.resolve_policy(inst, name))
        except engine.PolicyNotApplicable:
            pass
    return sorted(found, key=lambda policy: not policy.decision)


def respondent(inst, seed: int, r: int) -> tuple[int, callable]:
    """Respondent r as the module docstring defines it: its hypothesis and its answer function."""
    rng = np.random.default_rng([seed, r])
    h = int(rng.choice(inst.n_hypotheses, p=inst.prior))
    uniforms = rng.random(inst.n_tests)

    def answer(t: int, earlier: int) -> int:
        if inst.outcomes is not None:
            return int(inst.outcomes[h, t])
        u = uniforms[t] if earlier == 0 else np.random.default_rng([seed, r, t, earlier]).random()
        total = 0.0
        for k, p in enumerate(inst.likelihood[h, t]):
            total += p
            if total > u:
                return k
        return max(k for k, p in enumerate(inst.likelihood[h, t]) if p > 0)

    return h, answer


def play(inst, policy, rules, seed, h, answer) -> tuple[bool, float]:
    observations = []
    while True:
        decision = engine.decide(engine.observe(inst, observations), policy, rules, seed)
        if decision.done:
            break
        t = decision.next_test
        observations.append((t, answer(t, sum(1 for u, _ in observations if u == t))))
    belief = decision.belief
    if inst.is_decision:
        right = bool(inst.acceptable[h, engine.final_decision(belief)])
    else:
        right = int(np.argmax(belief.class_mass)) == int(inst.class_index[h])
    return right, float(sum(inst.costs[t] for t, _ in observations))


def resimulate(inst, rules, seed: int, respondents: int) -> list[tuple[str, float, float, float]]:
    """(policy, accuracy, mean cost, paired accuracy gap to the first), ranked: the higher
    accuracy first, then the lower mean cost, then registry order."""
    pool = applicable(inst)
    right = [[0.0] * len(pool) for _ in range(respondents)]
    cost = [[0.0] * len(pool) for _ in range(respondents)]
    for r in range(respondents):
        h, answer = respondent(inst, seed, r)
        for c, policy in enumerate(pool):
            ok, paid = play(inst, policy, rules, seed, h, answer)
            right[r][c], cost[r][c] = float(ok), paid
    accuracy = [sum(row[c] for row in right) / respondents for c in range(len(pool))]
    mean_cost = [sum(row[c] for row in cost) / respondents for c in range(len(pool))]
    order = sorted(range(len(pool)), key=lambda c: (-accuracy[c], mean_cost[c], c))
    return [(pool[c].name, accuracy[c], mean_cost[c], accuracy[c] - accuracy[order[0]]) for c in order]


def assert_agrees(recommendation, expected) -> None:
    assert [c.policy for c in recommendation.candidates] == [name for name, *_ in expected]
    for candidate, (_, accuracy, mean_cost, gap) in zip(recommendation.candidates, expected):
        assert candidate.accuracy == pytest.approx(accuracy, abs=1e-9)
        assert candidate.mean_cost == pytest.approx(mean_cost, abs=1e-9)
        assert candidate.accuracy_gap == pytest.approx(gap, abs=1e-9)
        low, high = candidate.accuracy_gap_ci
        assert low <= gap <= high
    assert recommendation.policy == expected[0][0]


def likelihood_instance(seed: int, repeatable: bool = False):
    payload = ref.to_payload(ref.random_model(random.Random(seed), "likelihood", max_hypotheses=9, max_tests=5))
    if repeatable:
        payload["tests"][0]["repeatable"] = True
    return compile_wire(payload)


CASES = {
    "likelihood, 2 tests at most": (lambda: likelihood_instance(1), engine.StopRules(max_tests=2)),
    "likelihood, confidence": (lambda: likelihood_instance(2), engine.StopRules(confidence=0.9)),
    "likelihood, repeatable test": (lambda: likelihood_instance(3, repeatable=True), engine.StopRules(max_tests=4)),
    "deterministic": (lambda: compile_model(ref.random_model(random.Random(4), "deterministic", 9, 5)),
                      engine.StopRules()),
    "decision": (lambda: compile_wire(refd.to_payload(refd.random_decision_model(random.Random(5), "likelihood"))),
                 engine.StopRules(max_tests=2)),
}


@pytest.mark.parametrize("case", CASES)
def test_auto_picks_what_a_plain_resimulation_ranks_first(case):
    make, rules = CASES[case]
    inst = make()
    budget = engine.Budget(respondents=40, cpu_seconds=1e9)
    recommendation = engine.recommend(inst, rules, seed=7, budget=budget)
    assert recommendation.complete and recommendation.respondents == 40
    assert_agrees(recommendation, resimulate(inst, rules, 7, 40))


def test_the_same_seed_gives_the_same_evidence():
    inst = likelihood_instance(1)
    rules = engine.StopRules(max_tests=2)
    budget = engine.Budget(respondents=30, cpu_seconds=1e9)
    first = engine.recommend(inst, rules, seed=3, budget=budget).to_dict()
    second = engine.recommend(inst, rules, seed=3, budget=budget).to_dict()
    first.pop("cpu_seconds"), second.pop("cpu_seconds")
    assert first == second


class Ticks:
    """A clock that advances one unit per reading: a budget of k units allows k − 1 steps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_cpu_budget_ends_the_simulation_and_ranks_what_was_finished():
    inst = likelihood_instance(1)
    rules = engine.StopRules(max_tests=2)
    recommendation = engine.recommend(inst, rules, seed=7, budget=engine.Budget(respondents=40, cpu_seconds=60),
                                      clock=Ticks())
    assert not recommendation.complete
    assert 0 < recommendation.respondents < 40
    assert "ran out" in recommendation.note and f"after {recommendation.respondents} of 40" in recommendation.note
    assert_agrees(recommendation, resimulate(inst, rules, 7, recommendation.respondents))


def test_no_respondent_finished_keeps_registry_order():
    inst = likelihood_instance(1)
    recommendation = engine.recommend(inst, engine.StopRules(), budget=engine.Budget(respondents=5, cpu_seconds=1),
                                      clock=Ticks())
    assert recommendation.respondents == 0 and not recommendation.complete
    assert [c.policy for c in recommendation.candidates] == [p.name for p in applicable(inst)]
    assert recommendation.policy == applicable(inst)[0].name
    assert all(c.accuracy is None for c in recommendation.candidates)


def test_auto_with_no_applicable_policy_is_refused(only_deterministic_policies):
    inst = likelihood_instance(1)
    with pytest.raises(engine.PolicyNotApplicable, match="auto"):
        engine.recommend(inst)


def test_resolve_policy_resolves_auto_and_the_default_to_the_recommendation():
    inst = likelihood_instance(2)
    rules = engine.StopRules(max_tests=3)
    pick = engine.recommend(inst, rules).policy
    assert engine.resolve_policy(inst, engine.AUTO, rules).name == pick
    assert engine.resolve_policy(inst, None, rules).name == (
        pick if engine.DEFAULT_POLICIES["likelihood"] == engine.AUTO else engine.DEFAULT_POLICIES["likelihood"])


def test_the_evidence_survives_its_json_form():
    recommendation = engine.recommend(likelihood_instance(1), engine.StopRules(max_tests=2),
                                      budget=engine.Budget(respondents=10))
    assert engine.Recommendation.from_dict(recommendation.to_dict()) == recommendation
    broken = recommendation.to_dict() | {"policy": "not-a-candidate"}
    with pytest.raises(ValueError):
        engine.Recommendation.from_dict(broken)


def test_the_command_line_prints_the_ranking_and_the_pick(tmp_path, capsys):
    import json

    from service.cli import main

    payload = ref.to_payload(ref.random_model(random.Random(1), "likelihood", max_hypotheses=9, max_tests=5))
    path = tmp_path / "instance.json"
    path.write_text(json.dumps(payload))
    args = ["evaluate", str(path), "--recommend", "--max-tests", "2", "--respondents", "20", "--cpu-seconds", "60"]
    want = engine.recommend(compile_wire(payload), engine.StopRules(max_tests=2),
                            budget=engine.Budget(respondents=20, cpu_seconds=60))
    assert main([*args, "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["policy"] == want.policy
    assert [c["policy"] for c in shown["candidates"]] == [c.policy for c in want.candidates]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert f"auto → {want.policy}" in table
    assert [line.split()[1] for line in table.splitlines()[2:2 + len(want.candidates)]] == [
        c.policy for c in want.candidates]
