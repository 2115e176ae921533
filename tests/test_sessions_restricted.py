"""Restricted exposure control in sessions, over both stores: counts shared by an instance's
sessions hold a test back once it has been given in ``max_rate`` of them. Each step is checked
against a stateless select told by hand, from counts this test keeps itself, which tests to
exclude and reserve."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from service.api.context import EXTENSION
from service.store import StoreUnavailable

from api_support import PROBLEM, Delegating, app_over

RATE = 0.3
LENGTH = 3
SESSIONS = 16
# Twelve 2PL items, the three most discriminating near the middle: unrestricted, every session
# starts with the same item.
ITEMS = [{"id": f"q{j}", "model": "2PL", "a": round(0.6 + 0.15 * ((7 * j) % 12), 2), "b": round(-1.5 + 0.27 * j, 2)}
         for j in range(12)]
BANK = {"item_bank": {"items": ITEMS, "prior": {"mean": 0, "sd": 1}, "cut_scores": [0.0]}}
RESTRICTED = {"method": "restricted", "max_rate": RATE}


def _answer(theta: float, item: dict, rng: np.random.Generator) -> str:
    right = 1 / (1 + math.exp(-item["a"] * (theta - item["b"])))
    return "1" if rng.uniform() < right else "0"


def _reference_next(client, instance_id: str, observations: list, held: list[str], reserved: list[str],
                    confident: bool) -> str | None:
    """The next test a select proposes with ``held`` excluded and, when the session is
    ``confident`` of its class, ``reserved`` too; each left out again when it leaves nothing
    informative (a cap never ends a session)."""
    body = {"instance_id": instance_id, "max_tests": LENGTH,
            "observations": [{"test": t, "outcome": o} for t, o in observations]}
    tries = [held + reserved, held, []] if confident else [held, []]
    for excluded in tries:
        step = client.post("/v1/select", json={**body, "exclude_tests": excluded}).get_json()
        if step["stop_reason"] != "no_informative_test":
            return _next(step)
    return None


def _next(state: dict) -> str | None:
    return None if state["next_test"] is None else state["next_test"]["id"]


def _run_sessions(client, instance_id: str, exposure: dict | None, check: bool):
    """SESSIONS sessions one after another, answered as simulated examinees; the times each test
    was given. ``check``: compare every step with the reference, from counts kept here."""
    rng = np.random.default_rng(7)
    items = {item["id"]: item for item in ITEMS}
    given = dict.fromkeys(items, 0)
    seen = set()  # (some test reserved, the session confident): the reserve's cases met
    for s in range(1, SESSIONS + 1):
        theta = float(rng.normal())
        body = {"instance_id": instance_id, "max_tests": LENGTH}
        state = client.post("/v1/sessions", json=body if exposure is None else {**body, "exposure": exposure})
        assert state.status_code == 201
        state = state.get_json()
        observations = []
        while _next(state) is not None:
            if check:
                held = [t for t in items if Fraction(given[t], s) >= Fraction(str(RATE))]
                reserved = [t for t in items if t not in held and Fraction(given[t], s) >= Fraction(9, 10) * Fraction(str(RATE))]
                confident = max(state["class_posterior"].values()) >= 0.7
                seen.add((bool(reserved), confident))
                assert _next(state) == _reference_next(client, instance_id, observations, held, reserved, confident)
            test = _next(state)
            outcome = _answer(theta, items[test], rng)
            observations.append((test, outcome))
            given[test] += 1
            state = client.post(f"/v1/sessions/{state['session_id']}/observations",
                                json={"test": test, "outcome": outcome}).get_json()
    return given, seen


def _store(app):
    return app.extensions[EXTENSION].store


def test_sessions_in_turn_keep_every_test_under_its_cap(app, client):
    instance_id = client.post("/v1/instances", json=BANK).get_json()["instance_id"]
    given, seen = _run_sessions(client, instance_id, RESTRICTED, check=True)
    assert (True, True) in seen and (True, False) in seen
    cap = math.ceil(RATE * SESSIONS)
    assert max(given.values()) <= cap
    # The store counted what this test counted.
    assert _store(app).exposure_counts(instance_id, "public") == (SESSIONS, {t: n for t, n in given.items() if n})
    # Unrestricted, the same sessions give the first item to every one: the cap above is the method's doing.
    plain = client.post("/v1/instances", json={"item_bank": {**BANK["item_bank"], "cut_scores": [0.0000001]}})
    assert max(_run_sessions(client, plain.get_json()["instance_id"], None, check=False)[0].values()) > cap


def test_a_session_keeps_the_next_test_it_proposed_while_others_pass_the_cap(client):
    instance_id = client.post("/v1/instances", json=BANK).get_json()["instance_id"]
    body = {"instance_id": instance_id, "max_tests": LENGTH, "exposure": RESTRICTED}
    first = client.post("/v1/sessions", json=body).get_json()
    proposed = _next(first)
    for _ in range(4):  # each gives the same first test, far past 0.3 of five sessions
        other = client.post("/v1/sessions", json=body).get_json()
        client.post(f"/v1/sessions/{other['session_id']}/observations", json={"test": proposed, "outcome": "1"})
    assert _next(client.get(f"/v1/sessions/{first['session_id']}").get_json()) == proposed
    assert _next(client.post("/v1/sessions", json=body).get_json()) != proposed


def test_replays_corrections_and_withdrawals_count_nothing_more(app, client):
    instance_id = client.post("/v1/instances", json=BANK).get_json()["instance_id"]
    body = {"instance_id": instance_id, "max_tests": LENGTH, "exposure": RESTRICTED}
    key = {"Idempotency-Key": "restricted-once"}
    session = client.post("/v1/sessions", json=body, headers=key).get_json()
    assert client.post("/v1/sessions", json=body, headers=key).status_code == 201  # a replay
    url = f"/v1/sessions/{session['session_id']}/observations"
    test = _next(session)
    for _ in range(2):
        assert client.post(url, json={"test": test, "outcome": "1"}).status_code == 200
    assert client.put(f"{url}/{test}", json={"outcome": "0"}).status_code == 200
    assert client.delete(f"{url}/{test}").status_code == 200
    assert _store(app).exposure_counts(instance_id, "public") == (1, {test: 1})


def test_refused_requests_count_nothing(app, client):
    instance_id = client.post("/v1/instances", json=BANK).get_json()["instance_id"]
    body = {"instance_id": instance_id, "max_tests": LENGTH, "exposure": RESTRICTED}
    refused = client.post("/v1/sessions", json={**body, "exclude_tests": ["no-such-item"]})
    assert refused.status_code == 422 and refused.mimetype == PROBLEM
    session = client.post("/v1/sessions", json=body).get_json()
    wrong = client.post(f"/v1/sessions/{session['session_id']}/observations",
                        json={"test": _next(session), "outcome": "7"})
    assert wrong.status_code == 422
    assert _store(app).exposure_counts(instance_id, "public") == (1, {})


def test_a_count_the_store_refuses_after_the_write_is_logged_not_answered_as_a_failure(app_config, caplog):
    class CountsDown(Delegating):
        def count_exposure(self, instance_id, tenant="public", *, sessions=0, tests=()):
            raise StoreUnavailable("connection refused")

    app = app_over(app_config, CountsDown)
    store, client = app.extensions[EXTENSION].store, app.test_client()
    instance_id = client.post("/v1/instances", json=BANK).get_json()["instance_id"]
    created = client.post("/v1/sessions", json={"instance_id": instance_id, "max_tests": LENGTH, "exposure": RESTRICTED})
    assert created.status_code == 201
    session = created.get_json()
    answered = client.post(f"/v1/sessions/{session['session_id']}/observations",
                           json={"test": _next(session), "outcome": "1"})
    assert answered.status_code == 200 and len(answered.get_json()["history"]) == 1
    assert store.exposure_counts(instance_id, "public") == (0, {})
    assert sum("missed a session's use" in r.getMessage() for r in caplog.records) == 2


def test_a_stateless_select_refuses_the_method_and_stores_nothing(client):
    response = client.post("/v1/select", json={"instance": BANK, "exposure": RESTRICTED})
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert [e["path"] for e in response.get_json()["errors"]] == ["exposure.method"]
    assert client.get("/v1/instances").get_json()["items"] == []


@pytest.mark.parametrize("exposure, path", [
    ({"method": "restricted"}, "exposure"),
    ({"method": "randomesque", "k": 3, "max_rate": 0.3}, "exposure"),
    ({"method": "restricted", "max_rate": 0}, "exposure.max_rate"),
    ({"method": "restricted", "max_rate": 1.5}, "exposure.max_rate"),
    ({"method": "restricted", "max_rate": "0.3"}, "exposure.max_rate"),
])
def test_malformed_restricted_exposure_is_a_422_at_its_path(client, exposure, path):
    response = client.post("/v1/sessions", json={"instance": BANK, "exposure": exposure})
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert path in {e["path"] for e in response.get_json()["errors"]}
    assert client.get("/v1/instances").get_json()["items"] == []
