"""The 1EdTech CAT façade (/ims/cat/v1p0) over the memory store and Redis: both session modes
(stored; stateless, the answers in sessionState), stages of several items, replays, refusals in
the standard's shape. Every response is checked against the CAT payload schema
(tests/cat/cat_v1p0_rest_binding.schema.json); expected items and classes are worked out by
hand from the instances (tests/api_support.py) or are what /v1/select answers for the same
answers, the path the façade must not differ from.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tests.api_support import QUAD, TRIAGE

BASE = "/ims/cat/v1p0"
SCHEMA = json.loads((Path(__file__).parent / "cat" / "cat_v1p0_rest_binding.schema.json").read_text())


def conforms(body: dict, definition: str) -> dict:
    errors = list(Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{definition}"}).iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


def refused(response, status: int, problem: str) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    body = conforms(response.get_json(), "imsx_StatusInfo")
    assert body["imsx_codeMajor"] == "failure" and body["imsx_severity"] == "error"
    fields = {f["imsx_codeMinorFieldName"]: f["imsx_codeMinorFieldValue"]
              for f in body["imsx_CodeMinor"]["imsx_codeMinorField"]}
    assert fields["problem"] == problem
    return fields


def result(test: str, outcome: str | None) -> dict:
    """A QTI item result answering ``test`` with ``outcome`` (None: the RESPONSE variable with no
    value, a skip)."""
    values = [] if outcome is None else [{"value": outcome}]
    return {"identifier": test, "sessionStatus": "final",
            "responseVariable": [{"identifier": "RESPONSE", "cardinality": "single", "baseType": "identifier",
                                  "candidateResponse": {"value": values}}]}


def results(*answers: tuple[str, str | None], state: str | None = None) -> dict:
    body = conforms({"assessmentResult": {"itemResult": [result(t, o) for t, o in answers]}}, "SubmitResultsRequest")
    if state is not None:
        body["sessionState"] = state
    return body


def outcomes(body: dict) -> dict[str, str]:
    return {v["identifier"]: v["value"][0]["value"] for v in body["assessmentResult"]["testResult"]["outcomeVariable"]}


def section(client, config: dict, status: int = 201) -> str:
    response = client.post(f"{BASE}/sections", json={"sectionConfiguration": config})
    assert response.status_code == status, response.get_data(as_text=True)
    return conforms(response.get_json(), "CreateSectionResponse")["sectionIdentifier"]


class Session:
    """One CAT session as a delivery system runs it: it keeps the last sessionState."""

    def __init__(self, client, section_id: str):
        self.client, self.section_id = client, section_id
        response = client.post(f"{BASE}/sections/{section_id}/sessions")
        assert response.status_code == 201, response.get_data(as_text=True)
        body = conforms(response.get_json(), "CreateSessionResponse")
        self.id, self.items, self.state = body["sessionIdentifier"], body["nextItems"]["itemIdentifiers"], body["sessionState"]
        assert body["nextItems"]["stageLength"] == len(self.items)

    @property
    def url(self) -> str:
        return f"{BASE}/sections/{self.section_id}/sessions/{self.id}/results"

    def post(self, *answers: tuple[str, str | None], state: str | None = None):
        return self.client.post(self.url, json=results(*answers, state=self.state if state is None else state))

    def answer(self, *answers: tuple[str, str | None]) -> dict:
        response = self.post(*answers)
        assert response.status_code == 200, response.get_data(as_text=True)
        body = conforms(response.get_json(), "SubmitResultsResponse")
        self.items, self.state = body["nextItems"]["itemIdentifiers"], body["sessionState"]
        assert body["nextItems"]["stageLength"] == len(self.items)
        return body


@pytest.fixture(params=[False, True], ids=["stored", "stateless"])
def stateless(request) -> bool:
    return request.param


def stored_steps(client, session: Session) -> int | None:
    """How many observations the store holds for the session (None: a stateless one, not stored)."""
    response = client.get(f"/v1/sessions/{session.id}")
    return response.get_json()["step"] if response.status_code == 200 else None


def test_a_triage_session_runs_to_its_class(client, stateless):
    # By hand (tests/api_support.py): EC² asks the ECG first; a normal ECG leaves only reflux: home.
    section_id = section(client, {"instance": TRIAGE, "stateless": stateless})
    shown = conforms(client.get(f"{BASE}/sections/{section_id}").get_json(), "SectionDType")
    config = json.loads(base64.b64decode(shown["sectionConfiguration"]))
    assert config.get("stateless", False) is stateless and len(config["instance_id"]) == 64
    session = Session(client, section_id)
    assert session.items == ["ecg"]
    body = session.answer(("ecg", "normal"))
    assert session.items == []
    assert outcomes(body) == {"CLASS": "home", "CLASS_PROBABILITY": "1.0", "COMPLETION_STATUS": "completed",
                              "ITEMS_ANSWERED": "1", "COST_SPENT": "2.0", "STOP_REASON": "determined"}
    assert stored_steps(client, session) == (None if stateless else 1)


def test_items_and_stages_are_the_v1_select_steps(client, stateless):
    """QUAD in stages of two items: each stage is what /v1/select proposes after the same answers."""
    section_id = section(client, {"instance": QUAD, "batch_size": 2, "stateless": stateless})
    session = Session(client, section_id)
    assert len(session.items) == 2  # a stage of two: stageLength 2
    truth = {"a": "0", "b": "1", "c": "0"}  # h2, of class Y
    answered: list[dict] = []
    while True:
        selected = client.post("/v1/select", json={"instance": QUAD, "batch_size": 2, "observations": answered})
        assert session.items == [test["id"] for test in selected.get_json()["next_tests"]]
        if not session.items:
            break
        stage = list(session.items)
        body = session.answer(*[(test, truth[test]) for test in stage])
        answered += [{"test": test, "outcome": truth[test]} for test in stage]
    assert outcomes(body)["CLASS"] == "Y"
    assert outcomes(body)["ITEMS_ANSWERED"] == str(len(answered))


def test_a_repeated_post_changes_nothing(client, stateless):
    session = Session(client, section(client, {"instance": QUAD, "stateless": stateless}))
    first_state = session.state
    assert session.items == ["a"]  # by hand (tests/api_support.py): a scores highest
    once = session.answer(("a", "0"))
    again = session.post(("a", "0"), state=first_state)  # a retry, with the state it was sent with
    assert again.status_code == 200
    assert again.get_json()["nextItems"] == once["nextItems"] == {"itemIdentifiers": ["b"], "stageLength": 1}
    assert outcomes(again.get_json())["ITEMS_ANSWERED"] == "1"
    assert stored_steps(client, session) == (None if stateless else 1)


def test_a_stateless_state_can_be_replayed_from_any_point(client):
    section_id = section(client, {"instance": QUAD, "stateless": True})
    session = Session(client, section_id)
    start = session.state
    session.answer(("a", "0"))
    assert session.answer(("b", "0"))["nextItems"]["itemIdentifiers"] == []  # h1: X
    # Back to the start: another respondent's answers from the same state, nothing of the first kept.
    other = Session.__new__(Session)
    other.client, other.section_id, other.id, other.state = client, section_id, session.id, start
    assert outcomes(other.answer(("a", "1")))["CLASS"] == "Z"


def test_an_item_not_asked_is_refused_and_nothing_is_stored(client, stateless):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    fields = refused(session.post(("troponin", "low")), 422, "item-not-asked")
    assert fields["TargetEndSystem"] == "invalid_data"
    refused(session.post(("ecg", "normal"), ("troponin", "low")), 422, "item-not-asked")  # all or nothing
    assert stored_steps(client, session) == (None if stateless else 0)
    assert outcomes(session.answer(("ecg", "abnormal")))["CLASS"] == "admit"  # mi and angina: both admit


def test_an_unknown_outcome_is_refused_and_nothing_is_stored(client, stateless):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    refused(session.post(("ecg", "purple")), 422, "unknown-outcome")
    assert stored_steps(client, session) == (None if stateless else 0)


def test_a_stopped_session_refuses_new_answers_and_takes_a_replay(client, stateless):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    session.answer(("ecg", "normal"))
    refused(session.post(("troponin", "low")), 409, "session-done")
    replay = session.post(("ecg", "normal"))
    assert replay.status_code == 200 and replay.get_json()["nextItems"]["itemIdentifiers"] == []
    refused(session.post(("ecg", "abnormal")), 409, "session-done")
    assert stored_steps(client, session) == (None if stateless else 1)


def test_no_response_is_a_skip(client, stateless):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    body = session.answer(("ecg", None))
    assert session.items == ["troponin"] and outcomes(body)["ITEMS_ANSWERED"] == "0"  # a skip answers nothing
    if not stateless:
        assert client.get(f"/v1/sessions/{session.id}").get_json()["history"][0]["skipped"] is True


def test_bad_requests_are_refused_in_the_standards_shape_and_store_nothing(client, stateless):
    instances = len(client.get("/v1/instances").get_json()["items"])
    post = client.post
    refused(post(f"{BASE}/sections", data="{not json", content_type="application/json"), 400, "malformed-json")
    refused(post(f"{BASE}/sections", data="x", content_type="text/plain"), 415, "unsupported-media-type")
    refused(post(f"{BASE}/sections", json={"sectionConfiguration": "%%%"}), 400, "malformed-json")
    refused(post(f"{BASE}/sections", json={"sectionConfiguration": {"instance": TRIAGE, "policy": "nope"}}),
            422, "unknown-policy")
    refused(post(f"{BASE}/sections", json={"sectionConfiguration": {"instance": TRIAGE, "exclude_tests": ["x"]}}),
            422, "unknown-test")
    encoded = base64.b64encode(json.dumps({"instance": TRIAGE, "max_tests": -1}).encode()).decode()
    refused(post(f"{BASE}/sections", json={"sectionConfiguration": encoded}), 422, "validation-error")
    assert len(client.get("/v1/instances").get_json()["items"]) == instances  # nothing stored
    refused(client.get(f"{BASE}/sections/not-a-section"), 404, "section-not-found")
    refused(client.get(f"{BASE}/nowhere"), 404, "not-found")

    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    refused(post(session.url, data="[1,", content_type="application/json"), 400, "malformed-json")
    refused(post(session.url, json={"assessmentResult": {"itemResult": []}}), 422, "validation-error")
    refused(session.post(("ecg", "normal"), state="garbage"), 422, "invalid-session-state")
    other = Session(client, session.section_id)
    refused(session.post(("ecg", "normal"), state=other.state), 422, "invalid-session-state")
    if stateless:
        refused(post(session.url, json={"assessmentResult": {"itemResult": [result("ecg", "normal")]}}),
                422, "invalid-session-state")
    assert stored_steps(client, session) == (None if stateless else 0)


def test_a_stale_state_is_refused_by_a_stored_session(client):
    session = Session(client, section(client, {"instance": QUAD}))
    first_state = session.state
    session.answer(("a", "0"))
    refused(session.post(("b", "1"), state=first_state), 412, "precondition-failed")
    assert stored_steps(client, session) == 1


def test_ending_sessions_and_sections(client):
    inline = section(client, {"instance": TRIAGE})
    stored = Session(client, inline)
    assert client.delete(f"{BASE}/sections/{inline}/sessions/{stored.id}").status_code == 204
    refused(stored.post(("ecg", "normal")), 404, "session-not-found")
    refused(client.delete(f"{BASE}/sections/{inline}/sessions/{stored.id}"), 404, "session-not-found")

    instance_id = client.post("/v1/instances", json=QUAD).get_json()["instance_id"]
    by_id = section(client, {"instance_id": instance_id})
    assert client.delete(f"{BASE}/sections/{by_id}").status_code == 204  # not the section's: kept
    assert client.get(f"/v1/instances/{instance_id}").status_code == 200

    assert client.delete(f"{BASE}/sections/{inline}").status_code == 204  # brought inline: deleted
    refused(client.get(f"{BASE}/sections/{inline}"), 404, "instance-not-found")


def test_api_keys_guard_the_cat_paths(app_config):
    from service.app import create_app

    key = "k" * 32
    client = create_app({**app_config, "api_keys": f"alpha:{key}"}).test_client()
    fields = refused(client.post(f"{BASE}/sections", json={"sectionConfiguration": {"instance": TRIAGE}}),
                     401, "unauthorized")
    assert fields["TargetEndSystem"] == "unauthorisedrequest"
    response = client.post(f"{BASE}/sections", json={"sectionConfiguration": {"instance": TRIAGE}},
                           headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 201


def test_results_meet_the_limits_v1_observations_meet(client, app):
    session = Session(client, section(client, {"instance": TRIAGE}))
    long_label = "x" * (app.extensions["edgecut"].settings.max_label_length + 1)
    refused(session.post((long_label, "normal")), 413, "limit-exceeded")
    refused(session.post(("ecg", long_label)), 413, "limit-exceeded")
    assert stored_steps(client, session) == 0


def test_sessions_of_an_ended_section_answer_not_found(client, stateless):
    section_id = section(client, {"instance": TRIAGE, "stateless": stateless})
    session = Session(client, section_id)
    assert client.delete(f"{BASE}/sections/{section_id}").status_code == 204
    refused(session.post(("ecg", "normal")), 404, "instance-not-found")
    refused(client.post(f"{BASE}/sections/{section_id}/sessions"), 404, "instance-not-found")


# One repeatable test whose answers cancel in pairs (tests/test_api_observations.py): asked again and again.
COIN = {"tests": [{"id": "swab", "outcomes": ["neg", "pos"], "repeatable": True}],
        "hypotheses": [{"id": "well", "class": "well", "likelihoods": {"swab": {"neg": 0.8, "pos": 0.2}}},
                       {"id": "ill", "class": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}}}]}


def test_a_repeatable_item_counts_each_time_it_is_asked_and_a_retry_once(client, stateless):
    session = Session(client, section(client, {"instance": COIN, "max_tests": 5, "stateless": stateless}))
    first_state = session.state
    session.answer(("swab", "neg"))
    assert session.items == ["swab"]  # asked again
    retry = session.post(("swab", "neg"), state=first_state)  # the first post again
    if stateless:  # the first state's replay: one answer, as before
        assert outcomes(retry.get_json())["ITEMS_ANSWERED"] == "1"
    else:  # the stored session has moved on: the stale state is refused, nothing counted twice
        refused(retry, 412, "precondition-failed")
        body = {"assessmentResult": {"itemResult": [result("swab", "neg")]}}
        refused(client.post(session.url, json=body), 428, "precondition-required")
        assert stored_steps(client, session) == 1
    assert outcomes(session.answer(("swab", "neg")))["ITEMS_ANSWERED"] == "2"


def test_browser_players_may_call_the_cat_paths_when_cors_is_on(app_config):
    from service.app import create_app

    origin = "https://player.example"
    key = "k" * 32
    client = create_app({**app_config, "cors_origins": origin, "api_keys": f"alpha:{key}"}).test_client()
    keyed = {"Origin": origin, "Authorization": f"Bearer {key}"}
    created = client.post(f"{BASE}/sections", json={"sectionConfiguration": {"instance": TRIAGE}}, headers=keyed)
    assert created.status_code == 201 and created.headers["Access-Control-Allow-Origin"] == origin
    assert "Location" in {h.strip() for h in created.headers["Access-Control-Expose-Headers"].split(",")}
    section_id = created.get_json()["sectionIdentifier"]
    results = f"{BASE}/sections/{section_id}/sessions/some-session/results"
    preflight = client.options(results, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                 "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200  # no key needed for a preflight
    assert preflight.headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert {"authorization", "content-type"} <= \
        {h.strip().lower() for h in preflight.headers["Access-Control-Allow-Headers"].split(",")}
    # A refusal in the standard's shape is readable by the page too; another origin gets no grant.
    missing = client.post(results, json={"assessmentResult": {"itemResult": [result("ecg", "normal")]}}, headers=keyed)
    refused(missing, 404, "session-not-found")
    assert missing.headers["Access-Control-Allow-Origin"] == origin
    other = client.get(f"{BASE}/sections/{section_id}", headers={**keyed, "Origin": "https://evil.example"})
    assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other.headers


def test_no_cors_headers_on_the_cat_paths_by_default(client):
    response = client.post(f"{BASE}/sections", json={"sectionConfiguration": {"instance": TRIAGE}},
                           headers={"Origin": "https://player.example"})
    assert response.status_code == 201 and "Access-Control-Allow-Origin" not in response.headers


def test_a_session_answers_only_under_the_section_that_started_it(client, stateless):
    own = section(client, {"instance": TRIAGE, "stateless": stateless})
    session = Session(client, own)
    others = [({"instance": TRIAGE, "max_tests": 1}, stateless),  # the same instance, other rules
              ({"instance": TRIAGE, "policy": "infogain"}, stateless),
              ({"instance": QUAD}, stateless),
              ({"instance": TRIAGE}, not stateless)]  # the other kind of section
    before = client.get(f"/v1/sessions/{session.id}")
    for config, other_stateless in others:
        url = f"{BASE}/sections/{section(client, {**config, 'stateless': other_stateless})}/sessions/{session.id}"
        refused(client.post(url + "/results", json=results(("ecg", "normal"), state=session.state)),
                404, "session-not-found")
        if not other_stateless:  # a stateless section holds no session to end: 204 whatever the id
            refused(client.delete(url), 404, "session-not-found")
        refused(client.get(url), 405, "method-not-allowed")  # the binding has no read of a session
    after = client.get(f"/v1/sessions/{session.id}")
    if stateless:
        assert before.status_code == after.status_code == 404  # nothing stored, nothing made
    else:
        assert after.headers["ETag"] == before.headers["ETag"]  # the same version: nothing changed
        assert after.get_json()["history"] == [] and after.get_json()["step"] == 0
    # Under its own section the session goes on (by hand: a normal ECG leaves reflux, home).
    assert outcomes(session.answer(("ecg", "normal")))["CLASS"] == "home"
