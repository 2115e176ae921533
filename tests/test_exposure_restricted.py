"""Restricted exposure control (Revuelta & Ponsoda 1998) in simulation: which tests it holds back,
how ``decide`` passes them over, ``simulate``'s counts kept across examinees (``edgecut evaluate
--max-rate``), and ``POST /v1/instances/{id}/evaluate`` with ``exposure.method`` "restricted".
The references are written from the definition: a test is held back while it has been given in
``max_rate`` of the sessions counted so far or more (the current one counted), unless that would
leave no informative test."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from service import engine
from service.cli import main
from service.engine.item_bank import restricted_held_back
from service.evaluation import evaluate
from service.evaluation.exposure import calibrate_exposure
from service.evaluation.report import items_given, simulate

from builders import compile_wire, section3
from exposure_support import bank_of, compiled

RULES = engine.StopRules(max_tests=5)
EXAMINEES = 300
INFORMATIVE = 1e-12  # a gain above this is informative (the engine's ZERO_GAIN)


def held_back_by_definition(given, sessions, max_rate) -> list[bool]:
    """Exact arithmetic on the decimal rate: given / sessions ≥ max_rate, nothing before a session."""
    rate = Fraction(str(max_rate))
    return [sessions > 0 and Fraction(int(count), sessions) >= rate for count in given]


@pytest.mark.parametrize("seed", range(5))
def test_held_back_are_the_tests_given_in_max_rate_of_the_sessions_or_more(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        sessions = int(rng.integers(0, 50))
        given = rng.integers(0, sessions + 1, size=12).astype(float)
        max_rate = float(rng.choice([0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0]))
        assert restricted_held_back(given, sessions, max_rate).tolist() == \
            held_back_by_definition(given, sessions, max_rate)


def test_three_of_ten_sessions_at_a_rate_of_three_tenths_is_held_back():
    # 0.3 * 10 is 3.0000000000000004 in floating point: the product would let the test through.
    assert restricted_held_back(np.array([3.0, 2.0]), 10, 0.3).tolist() == [True, False]
    assert held_back_by_definition([3, 2], 10, 0.3) == [True, False]


def some_belief(inst, policy, answers=(1, 0, 1)):
    observations: list = []
    for answer in answers:
        observations.append((engine.decide(engine.observe(inst, observations), policy, RULES).next_test, answer))
    return engine.observe(inst, observations)


@pytest.mark.parametrize("seed", range(4))
def test_decide_asks_the_best_informative_test_not_held_back(seed):
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    belief = some_belief(inst, policy)
    scores = engine.decide(belief, policy, RULES).scores
    held_back = np.random.default_rng(seed).uniform(size=inst.n_tests) < 0.5
    held_back[int(np.nanargmax(scores))] = True  # the best without control is always held back here
    best, best_score = None, -math.inf
    for j, score in enumerate(scores.tolist()):
        if score > INFORMATIVE and not held_back[j] and score > best_score:  # NaN: not eligible; ties: the earliest
            best, best_score = j, score
    assert best is not None
    assert engine.decide(belief, policy, RULES, held_back=held_back).next_test == best


def test_decide_ignores_held_back_when_it_holds_back_every_informative_test():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    belief = some_belief(inst, policy)
    plain = engine.decide(belief, policy, RULES)
    informative = np.nan_to_num(plain.scores, nan=0.0) > INFORMATIVE
    for held_back in (informative, np.ones(inst.n_tests, dtype=bool)):
        assert engine.decide(belief, policy, RULES, held_back=held_back).next_test == plain.next_test


def truths_of(inst, examinees, seed=0):
    return np.random.default_rng(seed).choice(inst.n_hypotheses, size=examinees, p=inst.prior)


def test_simulate_holds_every_test_to_its_share_of_the_examinees():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    truths = truths_of(inst, EXAMINEES)
    rules = RULES._replace(max_rate=0.3)
    runs = simulate(inst, policy, rules, 0, truths)
    cap = math.ceil(Fraction("0.3") * EXAMINEES)
    assert items_given(inst, runs).max() <= cap
    # After every examinee, not only at the end: each prefix is a sequence of sessions of its own.
    given = np.zeros(inst.n_tests)
    for n, run in enumerate(runs, start=1):
        given[[t for t, _ in run.observations]] += 1
        assert given.max() <= math.ceil(Fraction("0.3") * n)
    # Without control the best first item goes to everyone: the cap is not a property of the bank.
    plain = simulate(inst, policy, RULES, 0, truths)
    assert items_given(inst, plain).max() == EXAMINEES > cap


def test_simulate_counts_as_sessions_in_order():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    truths = truths_of(inst, 200, seed=4)
    rules = RULES._replace(max_rate=0.25)
    runs = simulate(inst, policy, rules, 7, truths)
    given = [0] * inst.n_tests
    for i, h in enumerate(truths.tolist()):
        held_back = np.array([count / (i + 1) >= 0.25 for count in given])
        expected = engine.run_policy(inst, h, policy, rules, 7, rng=np.random.default_rng([7, i]), held_back=held_back)
        assert runs[i].observations == expected.observations
        for t in {t for t, _ in expected.observations}:
            given[t] += 1
    # The control did hold tests back: the runs differ from those without it.
    assert [run.observations for run in runs] != [run.observations for run in simulate(inst, policy, RULES, 7, truths)]


def test_evaluate_reports_the_restricted_rate_and_its_top_exposure():
    inst = compiled(bank_of())
    report = evaluate(inst, ["infogain"], RULES._replace(max_rate=0.3), samples=EXAMINEES)
    assert report.rules["max_rate"] == 0.3
    assert report.policies[0].top_exposure <= math.ceil(Fraction("0.3") * EXAMINEES) / EXAMINEES


def test_deterministic_instances_are_simulated_under_restricted_control():
    inst = compile_wire(section3(4))
    rules = engine.StopRules(max_rate=0.5)
    assert evaluate(inst, ["gbs"], rules, samples=50, optimum=False).policies[0].method == "monte_carlo"
    with pytest.raises(engine.InfeasibleComputation):
        evaluate(inst, ["gbs"], rules, samples=50, method="exact", optimum=False)


def test_calibration_refuses_restricted_control():
    with pytest.raises(ValueError, match="max_rate"):
        calibrate_exposure(compiled(bank_of()), 0.3, RULES._replace(max_rate=0.3), examinees=10, iterations=1)


def test_the_command_takes_max_rate(tmp_path, capsys):
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(bank_of()))
    arguments = ["--policies", "infogain", "--samples", "200", "--max-tests", "5", "--format", "json", "--no-progress"]
    assert main(["evaluate", str(path), *arguments, "--max-rate", "0.3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rules"]["max_rate"] == 0.3 and report["policies"][0]["top_exposure"] <= 0.3
    expected = evaluate(compiled(bank_of()), ["infogain"], RULES._replace(max_rate=0.3), samples=200)
    assert report["policies"][0]["accuracy"] == expected.policies[0].accuracy
    with pytest.raises(SystemExit):
        main(["evaluate", str(path), *arguments, "--max-rate", "0"])


def test_the_api_evaluates_restricted_control(client):
    instance_id = client.post("/v1/instances", json=bank_of()).get_json()["instance_id"]

    def top_exposure(**request) -> float:
        response = client.post(f"/v1/instances/{instance_id}/evaluate",
                               json={"policies": ["infogain"], "optimum": False, "max_tests": 5,
                                     "samples": EXAMINEES, **request})
        assert response.status_code == 200, response.get_json()
        (policy,) = response.get_json()["policies"]
        return policy["top_exposure"]

    assert top_exposure(exposure={"method": "restricted", "max_rate": 0.3}) <= 0.3
    assert top_exposure() == 1.0
