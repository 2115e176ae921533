"""POST /v1/select: stateless steps; nothing is stored."""

from __future__ import annotations

import pytest

from api_support import QUAD, TRIAGE, assert_problem


def test_select_without_observations_names_the_first_test(client):
    response = client.post("/v1/select", json={"instance": TRIAGE})
    assert response.status_code == 200 and "ETag" not in response.headers
    state = response.get_json()
    assert "session_id" not in state and "expires_at" not in state
    assert state["next_test"]["id"] == "ecg" and state["step"] == 0
    assert state["class_posterior"] == pytest.approx({"home": 0.6, "admit": 0.4})


def test_select_with_observations(client):
    state = client.post("/v1/select?explain=1", json={
        "instance": QUAD, "observations": [{"test": "a", "outcome": "0"}]}).get_json()
    assert state["next_test"]["id"] == "b" and state["version_space_size"] == 2
    assert state["candidates"][0]["test"] == "b"
    done = client.post("/v1/select", json={"instance": QUAD, "observations": [
        {"test": "a", "outcome": "0"}, {"test": "b", "outcome": "0"}]}).get_json()
    assert done["done"] and done["map_class"] == "X" and done["stop_reason"] == "determined"


def test_select_stores_nothing(client):
    client.post("/v1/select", json={"instance": TRIAGE})
    assert client.post("/v1/instances", json=TRIAGE).status_code == 201  # was not stored before


def test_select_by_instance_id(client):
    instance_id = client.post("/v1/instances", json=QUAD).get_json()["instance_id"]
    state = client.post("/v1/select", json={"instance_id": instance_id, "policy": "gbs"}).get_json()
    assert state["policy"] == "gbs" and state["next_test"] is not None


@pytest.mark.parametrize("observations, status, code", [
    ([{"test": "a", "outcome": "0"}, {"test": "a", "outcome": "1"}], 409, "conflicting-observation"),
    ([{"test": "a", "outcome": "0"}, {"test": "c", "outcome": "1"}], 409, "inconsistent"),
    ([{"test": "q", "outcome": "0"}], 422, "unknown-test"),
    ([{"test": "a", "outcome": "9"}], 422, "unknown-outcome"),
])
def test_select_refuses_bad_observations(client, observations, status, code):
    assert_problem(client.post("/v1/select", json={"instance": QUAD, "observations": observations}), status, code)


def test_select_with_unknown_instance_is_404(client):
    assert_problem(client.post("/v1/select", json={"instance_id": "f" * 64}), 404, "instance-not-found")


def test_one_tenants_steps_are_never_another_tenants_cache_hits(app_config):
    # A hit is answered in microseconds, a miss computes the step: were steps shared, one tenant
    # would learn another's answers from how fast its own identical request returns.
    from service.api.context import EXTENSION
    from service.app import create_app

    keys = {"alpha": "alpha-key-0123456789abcdef", "bravo": "bravo-key-0123456789abcdef"}
    app = create_app({**app_config, "api_keys": ", ".join(f"{t}:{k}" for t, k in keys.items())})
    client = app.test_client()
    auth = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
    cache = app.extensions[EXTENSION].sessions.steps.cache
    ids = {t: client.post("/v1/instances", json=QUAD, headers=auth[t]).get_json()["instance_id"] for t in keys}
    assert ids["alpha"] == ids["bravo"]  # the same content, held by each tenant
    sid = client.post("/v1/sessions", json={"instance_id": ids["alpha"]}, headers=auth["alpha"]).get_json()["session_id"]
    answered = client.post(f"/v1/sessions/{sid}/observations", json={"test": "a", "outcome": "0"},
                           headers=auth["alpha"])
    assert answered.status_code == 200
    select = {"instance_id": ids["alpha"], "observations": [{"test": "a", "outcome": "0"}]}

    hits, misses = cache.hits, cache.misses
    assert client.post("/v1/select", json=select, headers=auth["bravo"]).status_code == 200
    assert (cache.hits, cache.misses) == (hits, misses + 1)  # alpha's step is no hit for bravo
    assert client.post("/v1/select", json=select, headers=auth["alpha"]).status_code == 200
    assert (cache.hits, cache.misses) == (hits + 1, misses + 1)  # but is alpha's own
