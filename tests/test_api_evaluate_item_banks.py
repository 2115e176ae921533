"""``POST /v1/instances/{id}/evaluate`` on item banks: ``max_se`` and ``exposure`` with a session's
names and meaning (and ``edgecut evaluate``'s --max-se, --randomesque, --sympson-hetter), bad
values refused at their paths."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.instance import Instance
from service import engine
from service.evaluation import evaluate

from api_support import PROBLEM, TRIAGE


def bank_of(n_items=40, seed=3, first_parameter=None):
    """40 3PL items, one cut; ``first_parameter``: the exposure parameter of the item infogain
    asks first (the others get none, K = 1)."""
    rng = np.random.default_rng(seed)
    body = {"item_bank": {"items": [{"id": f"q{j}", "model": "3PL", "a": float(rng.lognormal(0, 0.25)),
                                     "b": float(rng.normal()), "c": float(rng.uniform(0, 0.25))}
                                    for j in range(n_items)], "cut_scores": [0.0]}}
    inst = engine.compile_instance(Instance.model_validate(body))
    first = engine.decide(engine.observe(inst, []), engine.resolve_policy(inst, "infogain")).next_test
    if first_parameter is not None:
        body["item_bank"]["items"][first]["exposure_parameter"] = first_parameter
    return body, inst.test_ids[first]


def stored(client, body) -> str:
    return client.post("/v1/instances", json=body).get_json()["instance_id"]


def evaluated(client, instance_id, **request):
    response = client.post(f"/v1/instances/{instance_id}/evaluate",
                           json={"policies": ["infogain"], "optimum": False, **request})
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def test_max_se_stops_runs_as_it_stops_sessions(client):
    instance_id = stored(client, bank_of()[0])
    # The prior's SD of θ is 1 (a standard normal on the grid): a max_se of 5 holds before any item.
    report = evaluated(client, instance_id, max_se=5.0, samples=50)
    (policy,) = report["policies"]
    assert policy["stop_reasons"] == {"max_se": 1.0} and policy["expected_tests"] == 0
    assert report["rules"]["max_se"] == 5.0
    # Out of reach in 3 items: max_tests stops every run instead.
    (policy,) = evaluated(client, instance_id, max_se=0.01, max_tests=3, samples=50)["policies"]
    assert policy["stop_reasons"] == {"max_tests": 1.0} and policy["expected_tests"] == 3


def test_randomesque_draws_per_simulated_examinee(client):
    body, first = bank_of()
    instance_id = stored(client, body)
    (plain,) = evaluated(client, instance_id, max_tests=1, samples=300)["policies"]
    assert (plain["top_exposure"], plain["top_exposure_item"]) == (1.0, first)
    report = evaluated(client, instance_id, max_tests=1, samples=300, exposure={"method": "randomesque", "k": 5})
    # One item each, drawn among the five best: the most-used of them goes to about 1/5.
    assert 0.1 < report["policies"][0]["top_exposure"] < 0.35
    assert report["rules"]["randomesque"] == 5
    # What edgecut evaluate --randomesque 5 reports for the same seed.
    inst = engine.compile_instance(Instance.model_validate(body))
    cli = evaluate(inst, ["infogain"], engine.StopRules(max_tests=1, randomesque=5), samples=300).policies[0]
    assert report["policies"][0]["top_exposure"] == cli.top_exposure


def test_sympson_hetter_gives_the_first_choice_at_its_parameter(client):
    body, first = bank_of(first_parameter=0.3)
    report = evaluated(client, stored(client, body), max_tests=1, samples=400, exposure={"method": "sympson_hetter"})
    (policy,) = report["policies"]
    # The best first item is given to 30 % of examinees (K = 0.3), the next best to the other 70 %
    # (within four standard errors: 0.09 on 400).
    assert policy["top_exposure_item"] != first and policy["top_exposure"] == pytest.approx(0.7, abs=0.09)
    assert report["rules"]["sympson_hetter"] is True


@pytest.mark.parametrize("request_body, path", [
    ({"max_se": 0}, "max_se"),
    ({"max_se": "0.3"}, "max_se"),
    ({"exposure": {"method": "randomesque"}}, "exposure"),
    ({"exposure": {"method": "randomesque", "k": 0}}, "exposure.k"),
    ({"exposure": {"method": "shuffle"}}, "exposure.method"),
    ({"exposure": {"method": "sympson_hetter", "k": 5}}, "exposure"),
])
def test_bad_values_are_422_at_their_paths(client, request_body, path):
    instance_id = stored(client, bank_of()[0])
    response = client.post(f"/v1/instances/{instance_id}/evaluate", json=request_body)
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert path in [error["path"] for error in response.get_json()["errors"]]


@pytest.mark.parametrize("body, request_body, named", [
    (TRIAGE, {"max_se": 0.3}, "max_se"),  # no θ
    (bank_of()[0], {"exposure": {"method": "sympson_hetter"}}, "exposure_parameter"),  # no parameters
])
def test_rules_an_instance_cannot_apply_are_422(client, body, request_body, named):
    instance_id = stored(client, body)
    response = client.post(f"/v1/instances/{instance_id}/evaluate",
                           json={"policies": ["infogain"], "max_tests": 2, "samples": 10, **request_body})
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert named in response.get_json()["detail"]
