"""Session lifecycle over both stores: create, read, drive to done, delete, idempotent create."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from api_support import NOISY, QUAD, TRIAGE, assert_problem, new_session, observe, stored

STATE_FIELDS = {"session_id", "policy", "step", "next_test", "next_tests", "done", "stop_reason", "cost_spent", "history",
                "class_posterior", "map_class", "version_space_size", "expires_at"}


def test_a_new_session_answers_the_first_test_and_the_prior(client):
    instance_id = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    response = client.post("/v1/sessions", json={"instance_id": instance_id})
    assert response.status_code == 201
    state = response.get_json()
    assert set(state) == STATE_FIELDS
    assert response.headers["ETag"] == '"1"'
    assert response.headers["Location"] == f"/v1/sessions/{state['session_id']}"
    assert state["policy"] == "ec2" and state["step"] == 0 and state["history"] == []
    assert state["next_test"] == {"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]}
    assert state["done"] is False and state["stop_reason"] is None and state["cost_spent"] == 0
    assert list(state["class_posterior"]) == ["home", "admit"]  # most probable first
    assert state["class_posterior"] == pytest.approx({"home": 0.6, "admit": 0.4})
    assert state["map_class"] == "home" and state["version_space_size"] == 3
    expires = datetime.fromisoformat(state["expires_at"].replace("Z", "+00:00")).timestamp()
    assert abs(expires - (time.time() + 3600)) < 60


def test_an_inline_instance_is_stored_under_its_content_hash(client):
    new_session(client)
    again = client.post("/v1/instances", json=TRIAGE)
    assert again.status_code == 200  # already there: the session stored it


def test_driving_a_session_to_done(client):
    session = new_session(client, QUAD)
    sid = session["session_id"]
    assert session["next_test"]["id"] == "a" and session["version_space_size"] == 4
    first = observe(client, sid, {"test": "a", "outcome": "0"})
    assert first.status_code == 200 and first.headers["ETag"] == '"2"'
    state = first.get_json()
    assert state["next_test"]["id"] == "b" and state["version_space_size"] == 2
    assert state["class_posterior"] == pytest.approx({"X": 0.5, "Y": 0.5})
    last = observe(client, sid, {"test": "b", "outcome": 1}).get_json()  # integer labels are their string
    assert last["done"] is True and last["stop_reason"] == "determined" and last["next_test"] is None
    assert last["map_class"] == "Y" and last["class_posterior"] == {"Y": 1.0}
    assert last["history"] == [{"test": "a", "outcome": "0", "cost": 1.0}, {"test": "b", "outcome": "1", "cost": 1.0}]
    assert last["step"] == 2 and last["cost_spent"] == 2.0
    again = client.get(f"/v1/sessions/{sid}")
    assert again.status_code == 200 and again.headers["ETag"] == '"3"'
    assert {k: v for k, v in again.get_json().items() if k != "expires_at"} == \
        {k: v for k, v in last.items() if k != "expires_at"}
    assert stored(client.application, sid).observations == (("a", "0"), ("b", "1"))


def test_explain_lists_candidates_best_first_with_their_scores(client):
    state = client.post("/v1/sessions?explain=true", json={"instance": TRIAGE}).get_json()
    # By hand: Δ(ecg) = 0.24 per cost 2; Δ(troponin) = 0.24 − 0.9·0.18 = 0.078 per cost 1.
    assert [c["test"] for c in state["candidates"]] == ["ecg", "troponin"]
    assert state["candidates"][0]["score"] == pytest.approx(0.12)
    assert state["candidates"][1]["score"] == pytest.approx(0.078)
    assert "candidates" not in client.get(f"/v1/sessions/{state['session_id']}").get_json()


def test_policy_and_stop_rules_are_applied(client):
    assert new_session(client, policy="gbs")["policy"] == "gbs"
    stopped = new_session(client, max_tests=0)
    assert stopped["done"] is True and stopped["stop_reason"] == "max_tests"
    budget = new_session(client, max_cost=1.5)  # the ECG (cost 2) is beyond it; troponin informs
    assert budget["next_test"]["id"] == "troponin"
    noisy = new_session(client, NOISY)
    assert noisy["policy"] == "infogain" and noisy["version_space_size"] is None
    assert noisy["class_posterior"] == pytest.approx({"well": 0.5, "ill": 0.5})
    # By hand: P(well | pos) = 0.5·0.1 / (0.5·0.1 + 0.5·0.8) = 1/9.
    after = observe(client, noisy["session_id"], {"test": "swab", "outcome": "pos"}).get_json()
    assert after["class_posterior"] == pytest.approx({"ill": 8 / 9, "well": 1 / 9})
    assert after["done"] and after["stop_reason"] == "tests_exhausted"


@pytest.mark.parametrize("body, status, code", [
    ({"instance": TRIAGE, "policy": "oracle"}, 422, "unknown-policy"),
    ({"instance": NOISY, "policy": "ec2"}, 422, "policy-not-applicable"),
    ({"instance": TRIAGE, "instance_id": "0" * 64}, 422, "validation-error"),
    ({}, 422, "validation-error"),
    ({"instance": TRIAGE, "confidence": 1.5}, 422, "validation-error"),
    ({"instance": TRIAGE, "max_tests": -1}, 422, "validation-error"),
    ({"instance": TRIAGE, "seed": -1}, 422, "validation-error"),
    ({"instance": TRIAGE, "max_test": 3}, 422, "validation-error"),
    ({"instance_id": "0" * 64}, 404, "instance-not-found"),
])
def test_bad_session_requests_are_refused(client, body, status, code):
    assert_problem(client.post("/v1/sessions", json=body), status, code)


def test_idempotency_key_makes_a_retried_create_answer_the_same_session(client):
    key = {"Idempotency-Key": "create-7f3a"}
    first = client.post("/v1/sessions", json={"instance": TRIAGE}, headers=key)
    retry = client.post("/v1/sessions", json={"instance": TRIAGE}, headers=key)
    assert first.status_code == retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert retry.get_json()["session_id"] == first.get_json()["session_id"]
    other = client.post("/v1/sessions", json={"instance": TRIAGE}, headers={"Idempotency-Key": "another"})
    assert other.get_json()["session_id"] != first.get_json()["session_id"]
    # The same key for a different request is refused, and the first session is untouched.
    before = stored(client.application, first.get_json()["session_id"])
    assert_problem(client.post("/v1/sessions", json={"instance": TRIAGE, "policy": "gbs"}, headers=key),
                   409, "idempotency-key-reused")
    assert stored(client.application, first.get_json()["session_id"]) == before


def test_an_invalid_idempotency_key_is_400(client):
    assert_problem(client.post("/v1/sessions", json={"instance": TRIAGE}, headers={"Idempotency-Key": "k" * 300}),
                   400, "invalid-header")


def test_delete(client):
    sid = new_session(client)["session_id"]
    response = client.delete(f"/v1/sessions/{sid}")
    assert response.status_code == 204 and response.data == b""
    assert "Content-Type" not in response.headers  # no body, so no media type
    assert stored(client.application, sid) is None
    assert_problem(client.get(f"/v1/sessions/{sid}"), 404, "session-not-found")
    assert_problem(client.delete(f"/v1/sessions/{sid}"), 404, "session-not-found")
    assert_problem(observe(client, sid, {"test": "ecg", "outcome": "normal"}), 404, "session-not-found")


def test_delete_honours_if_match(client):
    sid = new_session(client)["session_id"]
    assert_problem(client.delete(f"/v1/sessions/{sid}", headers={"If-Match": '"7"'}), 412, "precondition-failed")
    assert stored(client.application, sid) is not None
    assert client.delete(f"/v1/sessions/{sid}", headers={"If-Match": '"1"'}).status_code == 204


def test_unknown_session_is_404(client):
    assert_problem(client.get("/v1/sessions/nope"), 404, "session-not-found")
