"""Progressive exposure control (Revuelta & Ponsoda 1998), alone and with Sympson–Hetter: the
engine's choice against the method's formula on the public scores, reproducibility from the seed,
the bound a calibrated bank keeps on fresh examinees counted item by item, and the wire (sessions
over both stores, /v1/select, HTTP evaluate against ``edgecut evaluate``, refusals at their paths)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service import engine
from service.evaluation import evaluate
from service.evaluation.exposure import calibrate_exposure

from api_support import PROBLEM
from exposure_support import bank_of, compiled, rates_given, with_parameters

PROGRESSIVE = engine.StopRules(max_tests=10, progressive=True)


def test_the_choice_is_the_best_blend_of_a_uniform_draw_and_the_gain():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    answered = [(0, 1), (5, 0), (9, 1)]
    belief = engine.observe(inst, answered)
    gain = engine.decide(belief, policy).scores  # gain per cost, NaN where not eligible
    informative = np.nan_to_num(gain) > 0
    weight = len(answered) / PROGRESSIVE.max_tests
    for seed in range(200):
        draw = np.random.default_rng([seed, len(answered), 3]).uniform(size=inst.n_tests) * np.nanmax(gain)
        expected = int(np.argmax(np.where(informative, (1 - weight) * draw + weight * gain, -np.inf)))
        assert engine.decide(belief, policy, PROGRESSIVE, seed=seed).next_test == expected


def test_the_first_item_is_drawn_uniformly_among_the_informative_ones():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    firsts = [engine.decide(engine.observe(inst, []), policy, PROGRESSIVE, seed=s).next_test for s in range(800)]
    counts = np.bincount(firsts, minlength=inst.n_tests)
    # 800 draws over 40 items: 20 expected each; a uniform draw keeps every count within 20 ± 4.5 SD.
    assert (counts > 0).all() and counts.max() < 20 + 4.5 * math.sqrt(20)


def run_of(inst, rules, seed, answers=1):
    policy = engine.resolve_policy(inst, None)
    observations: list = []
    while not (decision := engine.decide(engine.observe(inst, observations), policy, rules, seed=seed)).done:
        observations.append((decision.next_test, answers))
    return [t for t, _ in observations]


def test_a_run_replays_from_its_seed_and_seeds_differ():
    inst = compiled(bank_of())
    assert run_of(inst, PROGRESSIVE, 11) == run_of(inst, PROGRESSIVE, 11)
    assert len({tuple(run_of(inst, PROGRESSIVE, s)) for s in range(10)}) == 10


def test_progressive_needs_max_tests():
    inst = compiled(bank_of())
    with pytest.raises(engine.StopRuleNotApplicable):
        engine.decide(engine.observe(inst, []), engine.resolve_policy(inst, None), engine.StopRules(progressive=True))


def test_progressive_sympson_hetter_calibrated_keeps_every_item_near_the_target_on_fresh_examinees():
    body = bank_of()
    rules = engine.StopRules(max_tests=5, progressive=True, sympson_hetter=True)
    calibration = calibrate_exposure(compiled(body), 0.3, rules, examinees=500, iterations=8, seed=1)
    fresh = rates_given(with_parameters(body, calibration.exposure_parameters), rules, 600, 50_000)
    # The target plus sampling noise (the top of 40 rates: the calibration's on 500 examinees,
    # this count's on 600, one standard error 0.02).
    assert fresh.max() <= 0.3 + 0.08
    assert abs(fresh.sum() - 5) < 1e-9  # every examinee still given five items
    # Progressive alone does not hold the bank's most-used item to the target.
    assert rates_given(body, rules._replace(sympson_hetter=False), 600, 50_000).max() > 0.3 + 0.08


# --- The wire ------------------------------------------------------------------------------------

EXPOSURE = {"method": "progressive"}


def test_sessions_differ_from_each_other_and_replay_themselves(client):
    instance_id = client.post("/v1/instances", json=bank_of()).get_json()["instance_id"]
    create = {"instance_id": instance_id, "exposure": EXPOSURE, "max_tests": 10}
    states = [client.post("/v1/sessions", json=create).get_json() for _ in range(20)]
    assert len({s["next_test"]["id"] for s in states}) >= 8  # the first item: a uniform draw among 40
    for state in states[:3]:
        again = client.get(f"/v1/sessions/{state['session_id']}").get_json()
        assert again["next_test"] == state["next_test"]
    url = f"/v1/sessions/{states[0]['session_id']}/observations"
    answered = client.post(url, json={"observations": [{"test": states[0]["next_test"]["id"],
                                                        "outcome": "1"}]}).get_json()
    assert client.get(f"/v1/sessions/{states[0]['session_id']}").get_json()["next_test"] == answered["next_test"]
    key = {"Idempotency-Key": "progressive-1"}
    made = client.post("/v1/sessions", json=create, headers=key)
    retried = client.post("/v1/sessions", json=create, headers=key)
    assert made.status_code == 201 and retried.status_code == 201
    assert [retried.get_json()[k] for k in ("session_id", "next_test")] == [made.get_json()[k] for k in ("session_id", "next_test")]
    # The same key with another exposure method is another request.
    other = client.post("/v1/sessions", json={**create, "exposure": {"method": "randomesque", "k": 5}}, headers=key)
    assert other.status_code == 409 and other.mimetype == PROBLEM


def test_select_draws_from_its_seed_as_the_engine_does(client):
    body = bank_of()
    inst = compiled(body)
    observations = [{"test": "q0", "outcome": "1"}, {"test": "q5", "outcome": "0"}]
    policy = engine.resolve_policy(inst, None)
    belief = engine.observe(inst, [(0, 1), (5, 0)])
    for seed in (1, 2, 3):
        state = client.post("/v1/select", json={"instance": body, "observations": observations, "seed": seed,
                                                "max_tests": 10, "exposure": EXPOSURE}).get_json()
        assert state["next_test"]["id"] == inst.test_ids[engine.decide(belief, policy, PROGRESSIVE, seed=seed).next_test]


def test_http_evaluate_reports_what_edgecut_evaluate_does(client):
    body = bank_of()
    instance_id = client.post("/v1/instances", json=body).get_json()["instance_id"]
    response = client.post(f"/v1/instances/{instance_id}/evaluate", json={
        "policies": ["infogain"], "optimum": False, "max_tests": 1, "samples": 300, "exposure": EXPOSURE})
    assert response.status_code == 200, response.get_json()
    report = response.get_json()
    assert report["rules"]["progressive"] is True
    # One item each, drawn uniformly among 40: the most-used goes to about 1/40, far below 1.
    assert report["policies"][0]["top_exposure"] < 0.1
    cli = evaluate(compiled(body), ["infogain"], engine.StopRules(max_tests=1, progressive=True), samples=300)
    assert report["policies"][0]["top_exposure"] == cli.policies[0].top_exposure


def test_edgecut_evaluate_reports_the_same(tmp_path, capsys):
    import json

    from service.cli import main

    body = bank_of()
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(body))
    assert main(["evaluate", str(path), "--policies", "infogain", "--samples", "300", "--max-tests", "1",
                 "--progressive", "--format", "json", "--no-progress", "--no-optimum"]) == 0
    report = json.loads(capsys.readouterr().out)
    engine_side = evaluate(compiled(body), ["infogain"], engine.StopRules(max_tests=1, progressive=True), samples=300)
    assert report["rules"]["progressive"] is True
    assert report["policies"][0]["top_exposure"] == engine_side.policies[0].top_exposure < 0.1


@pytest.mark.parametrize("request_body, path", [
    ({"exposure": {"method": "progressive", "k": 5}}, "exposure"),
    ({"exposure": {"method": "progressive_sympson_hetter", "k": 5}}, "exposure"),
    ({"exposure": {"method": "progressive", "w": 1}}, "exposure.w"),
    ({"exposure": {"method": "progressive"}}, "exposure.method"),  # no max_tests
    ({"exposure": {"method": "progressive_sympson_hetter"}, "max_tests": 5}, "exposure.method"),  # no parameters
])
def test_bad_progressive_requests_are_422_at_their_paths(client, request_body, path):
    response = client.post("/v1/sessions", json={"instance": bank_of(5), **request_body})
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert path in [error["path"] for error in response.get_json()["errors"]]
