"""Restricted exposure control (Revuelta & Ponsoda 1998) in simulation: which tests it holds back,
how ``decide`` passes them over, ``simulate``'s counts kept across examinees (``edgecut evaluate
--max-rate``), and ``POST /v1/instances/{id}/evaluate`` with ``exposure.method`` "restricted".
The references are written from the definition: a test is held back while it has been given in
``max_rate`` of the sessions counted so far or more (the current one counted), and reserved from a
session sure of its class (largest class posterior 0.7 or more) from 9/10 of that share, unless
that would leave no informative test."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from service import engine
from service.cli import main
from service.engine.restricted import restriction
from service.evaluation import evaluate
from service.evaluation.exposure import calibrate_exposure
from service.evaluation.report import items_given, simulate

from builders import compile_wire, section3
from exposure_support import bank_of, compiled

RULES = engine.StopRules(max_tests=5)
EXAMINEES = 300
INFORMATIVE = 1e-12  # a gain above this is informative (the engine's ZERO_GAIN)


def restriction_by_definition(given, sessions, max_rate) -> tuple[list[bool], list[bool]]:
    """Exact arithmetic on the decimal rate, nothing before a session: held back, given / sessions
    ≥ max_rate; reserved, not held back and given / sessions ≥ 9/10 · max_rate."""
    rate = Fraction(str(max_rate))
    share = [Fraction(int(count), sessions) if sessions > 0 else Fraction(-1) for count in given]
    held = [s >= rate for s in share]
    return held, [s >= Fraction(9, 10) * rate and not h for s, h in zip(share, held)]


@pytest.mark.parametrize("seed", range(5))
def test_held_back_and_reserved_are_the_tests_given_in_their_share_of_the_sessions(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        sessions = int(rng.integers(0, 60))
        given = rng.integers(0, sessions + 1, size=12).astype(float)
        max_rate = float(rng.choice([0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0]))
        held, reserved = restriction(given, sessions, max_rate)
        assert (held.tolist(), reserved.tolist()) == restriction_by_definition(given, sessions, max_rate)


def test_the_shares_are_exact_where_the_rates_are_equal():
    # 0.3 * 10 is 3.0000000000000004 in floating point: the product would let the test through.
    assert restriction(np.array([3.0, 2.0]), 10, 0.3).held_back.tolist() == [True, False]
    # 0.9 * 0.2 is 0.18000000000000002, above 9 of 50 sessions: the product would not reserve it.
    assert restriction(np.array([9.0, 8.0]), 50, 0.2).reserved.tolist() == [True, False]
    assert restriction_by_definition([3, 2], 10, 0.3)[0] == [True, False]
    assert restriction_by_definition([9, 8], 50, 0.2)[1] == [True, False]


def some_belief(inst, policy, answers=(1, 0, 1)):
    observations: list = []
    for answer in answers:
        observations.append((engine.decide(engine.observe(inst, observations), policy, RULES).next_test, answer))
    return engine.observe(inst, observations)


def chosen_by_definition(belief, scores, held, reserved):
    """The best informative test, ties to the earliest, among those not held back (unless that
    leaves none) and, once the largest class posterior is 0.7 or more, not reserved (unless that
    leaves none)."""
    informative = np.nan_to_num(scores, nan=-1.0) > INFORMATIVE
    allowed = informative
    for kept_from, applies in ((held, True), (reserved, belief.class_posterior.max() >= 0.7)):
        if applies and (allowed & ~kept_from).any():
            allowed = allowed & ~kept_from
    best, best_score = None, -math.inf
    for j, score in enumerate(scores.tolist()):
        if allowed[j] and score > best_score:
            best, best_score = j, score
    return best


def test_decide_asks_the_best_informative_test_the_restriction_leaves():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    confident = set()
    for seed, answers in enumerate([(), (1,), (0, 0), (1, 0, 1), (1, 1, 1, 1), (0, 0, 0, 0)] * 3):
        belief = some_belief(inst, policy, answers)
        scores = engine.decide(belief, policy, RULES).scores
        rng = np.random.default_rng(seed)
        held = rng.uniform(size=inst.n_tests) < 0.4
        held[int(np.nanargmax(scores))] = True  # the best without control is always held back here
        reserved = (rng.uniform(size=inst.n_tests) < 0.4) & ~held
        expected = chosen_by_definition(belief, scores, held, reserved)
        restricted = engine.restricted.Restriction(held, reserved)
        assert engine.decide(belief, policy, RULES, restriction=restricted).next_test == expected
        confident.add(bool(belief.class_posterior.max() >= 0.7))
    assert confident == {True, False}  # both the reserve's cases were met


def test_decide_ignores_what_would_leave_no_informative_test():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    for answers in ((1, 0, 1), (1, 1, 1, 1)):
        belief = some_belief(inst, policy, answers)
        plain = engine.decide(belief, policy, RULES)
        informative = np.nan_to_num(plain.scores, nan=0.0) > INFORMATIVE
        none = np.zeros(inst.n_tests, dtype=bool)
        for held, reserved in ((informative, none), (np.ones(inst.n_tests, dtype=bool), none),
                               (none, informative), (none, np.ones(inst.n_tests, dtype=bool))):
            restricted = engine.restricted.Restriction(held, reserved)
            assert engine.decide(belief, policy, RULES, restriction=restricted).next_test == plain.next_test


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
        held, reserved = restriction_by_definition(given, i + 1, 0.25)
        restricted = engine.restricted.Restriction(np.array(held), np.array(reserved))
        expected = engine.run_policy(inst, h, policy, rules, 7, rng=np.random.default_rng([7, i]),
                                     restriction=restricted)
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
