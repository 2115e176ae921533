"""``policy: "auto"`` over HTTP: sessions, select, evaluate and the tree run the policy the
engine's simulation ranks first (itself checked against a plain re-simulation in
test_recommend.py); GET /v1/instances/{id} shows it with the evidence; it is computed once per
instance and stop rules and shared by every worker through the store; refusals are problem+json."""

from __future__ import annotations

import random
import uuid

import orjson
import pytest

from api_support import assert_problem, store_of
from schemas.responses import InstanceDetail
from service import engine
from service.app import create_app
from tests import reference as ref
from tests.builders import compile_wire

# A small likelihood instance whose simulation does not simply keep the registry's first policy.
INSTANCE = ref.to_payload(ref.random_model(random.Random(1), "likelihood", max_hypotheses=9, max_tests=5))
# Generous CPU seconds, so that the respondent count ends every simulation here (no test depends
# on how fast the machine is).
BUDGET = engine.Budget(respondents=30, cpu_seconds=60)


def expected(rules: engine.StopRules = engine.StopRules(), budget: engine.Budget = BUDGET) -> engine.Recommendation:
    return engine.recommend(compile_wire(INSTANCE), rules, seed=0, budget=budget)


@pytest.fixture
def auto_config(app_config) -> dict:
    return {**app_config, "auto_respondents": BUDGET.respondents, "auto_cpu_seconds": BUDGET.cpu_seconds}


@pytest.fixture
def client(auto_config):
    return create_app(auto_config).test_client()


def test_the_instance_is_one_where_auto_chooses():
    pick = expected()
    assert pick.policy != pick.candidates[-1].policy or len(pick.candidates) == 1
    assert pick.policy != engine.applicable_policies(compile_wire(INSTANCE))[0].name


@pytest.mark.parametrize("rules", [{}, {"max_tests": 2}, {"confidence": 0.8}])
def test_a_session_with_auto_runs_what_the_simulation_ranks_first(client, rules):
    response = client.post("/v1/sessions", json={"instance": INSTANCE, "policy": "auto", **rules})
    assert response.status_code == 201, response.get_data(as_text=True)
    assert response.get_json()["policy"] == expected(engine.StopRules(**rules)).policy


def test_a_likelihood_instance_runs_its_default_and_the_default_is_one_switch(client):
    state = client.post("/v1/sessions", json={"instance": INSTANCE}).get_json()
    default = engine.DEFAULT_POLICIES["likelihood"]
    assert state["policy"] == (expected().policy if default == engine.AUTO else default)


def test_select_and_the_tree_resolve_auto_too(client):
    state = client.post("/v1/select", json={"instance": INSTANCE, "policy": "auto", "max_tests": 2}).get_json()
    assert state["policy"] == expected(engine.StopRules(max_tests=2)).policy
    instance_id = client.post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    tree = client.get(f"/v1/instances/{instance_id}/tree?policy=auto&max_tests=2").get_json()
    assert tree["policy"] == expected(engine.StopRules(max_tests=2)).policy


def test_the_instance_shows_what_auto_resolves_to_and_the_evidence(client):
    instance_id = client.post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    response = client.get(f"/v1/instances/{instance_id}")
    assert response.status_code == 200
    detail = InstanceDetail.model_validate(response.get_json())
    want = expected()
    assert detail.auto.policy == want.policy
    assert detail.auto.respondents == BUDGET.respondents and detail.auto.complete
    assert [c.policy for c in detail.auto.candidates] == [c.policy for c in want.candidates]
    for shown, simulated in zip(detail.auto.candidates, want.candidates):
        assert shown.accuracy == pytest.approx(simulated.accuracy, abs=1e-12)
        assert shown.mean_cost == pytest.approx(simulated.mean_cost, abs=1e-12)
        low, high = shown.accuracy_ci
        assert low <= shown.accuracy <= high


def test_evaluate_evaluates_auto_as_the_policy_it_chooses_and_shows_why(client):
    instance_id = client.post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    report = client.post(f"/v1/instances/{instance_id}/evaluate",
                         json={"policies": ["auto", "gbs"], "max_tests": 2, "samples": 50}).get_json()
    pick = expected(engine.StopRules(max_tests=2)).policy
    assert report["auto"]["policy"] == pick
    assert [p["policy"] for p in report["policies"]] == list(dict.fromkeys([pick, "gbs"]))
    plain = client.post(f"/v1/instances/{instance_id}/evaluate", json={"policies": ["gbs"], "samples": 50}).get_json()
    assert plain["auto"] is None


def test_no_respondent_within_the_budget_keeps_registry_order_and_says_so(auto_config):
    client = create_app({**auto_config, "auto_cpu_seconds": 0}).test_client()
    instance_id = client.post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    auto = client.get(f"/v1/instances/{instance_id}").get_json()["auto"]
    assert auto["respondents"] == 0 and not auto["complete"] and "no simulated respondent" in auto["note"]
    assert auto["policy"] == engine.applicable_policies(compile_wire(INSTANCE))[0].name


def test_auto_with_no_applicable_policy_is_refused_and_stores_nothing(client, only_deterministic_policies):
    body = assert_problem(client.post("/v1/sessions", json={"instance": INSTANCE, "policy": "auto"}),
                          422, "policy-not-applicable")
    assert "auto" in body["detail"]
    assert_problem(client.post("/v1/select", json={"instance": INSTANCE, "policy": "auto"}), 422, "policy-not-applicable")
    assert client.post("/v1/instances", json=INSTANCE).status_code == 201  # the session stored none


def test_an_unknown_policy_is_refused_naming_auto_among_the_choices(client):
    body = assert_problem(client.post("/v1/sessions", json={"instance": INSTANCE, "policy": "automatic"}),
                          422, "unknown-policy")
    assert "'auto'" in body["detail"]


def test_the_choice_is_computed_once_and_shared_through_the_store(auto_config, store_kind, monkeypatch):
    # Two workers: apps over one store (memory: the same object; Redis: the same server and prefix).
    first = create_app(auto_config)
    second = create_app(auto_config, store=store_of(first) if store_kind == "memory" else None)
    instance_id = first.test_client().post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    shown = first.test_client().get(f"/v1/instances/{instance_id}").get_json()["auto"]

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated again")

    monkeypatch.setattr(engine, "recommend", no_simulation)
    assert second.test_client().get(f"/v1/instances/{instance_id}").get_json()["auto"] == shown
    state = second.test_client().post("/v1/sessions", json={"instance_id": instance_id, "policy": "auto"}).get_json()
    assert state["policy"] == shown["policy"]


def test_the_first_choice_stored_is_every_workers(auto_config, store_kind):
    # A worker that finds a choice in the store adopts it, whatever its own simulation would say.
    app = create_app(auto_config)
    client = app.test_client()
    instance_id = client.post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    compiled = compile_wire(INSTANCE)
    simulated = expected()
    last = simulated.candidates[-1]
    stored = {**simulated.to_dict(), "policy": last.policy}
    name = app.extensions["edgecut"].sessions.auto.value_name(compiled, engine.StopRules())
    store_of(app).put_value(name, orjson.dumps(stored))
    assert last.policy != simulated.policy
    state = client.post("/v1/sessions", json={"instance_id": instance_id, "policy": "auto"}).get_json()
    assert state["policy"] == last.policy


def test_a_tenant_never_reads_another_tenants_choice(auto_config):
    app = create_app({**auto_config, "api_keys": f"a:{uuid.uuid4().hex},b:{uuid.uuid4().hex}"})
    keys = dict(entry.split(":") for entry in app.extensions["edgecut"].settings.api_keys.split(","))
    client = app.test_client()
    headers = {tenant: {"Authorization": f"Bearer {key}"} for tenant, key in keys.items()}
    instance_id = client.post("/v1/instances", json=INSTANCE, headers=headers["a"]).get_json()["instance_id"]
    client.post("/v1/instances", json=INSTANCE, headers=headers["b"])
    client.get(f"/v1/instances/{instance_id}", headers=headers["a"])
    name = app.extensions["edgecut"].sessions.auto.value_name(compile_wire(INSTANCE), engine.StopRules())
    assert store_of(app).get_value(name, "a") is not None
    assert store_of(app).get_value(name, "b") is None


def test_a_stored_choice_that_does_not_decode_is_simulated_again(auto_config, caplog):
    app = create_app(auto_config)
    client = app.test_client()
    instance_id = client.post("/v1/instances", json=INSTANCE).get_json()["instance_id"]
    name = app.extensions["edgecut"].sessions.auto.value_name(compile_wire(INSTANCE), engine.StopRules())
    store_of(app).put_value(name, b'{"policy": "gbs"}')  # damaged: no evidence
    state = client.post("/v1/sessions", json={"instance_id": instance_id, "policy": "auto"}).get_json()
    assert state["policy"] == expected().policy
    assert "does not decode" in caplog.text
