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
