"""How the CAT façade reads an item's response (schemas/cat.py, CatItemResult), over the memory
store and Redis, stored and stateless sections: the two spellings delivery systems send (QTI
results reporting's ``responseVariable`` / ``candidateResponse``, and what OAT's CAT client,
oat-sa/lib-test-cat ``src/ims/v1p3/ResultFormatter.php``, writes: ``responseVariables`` with the
values directly under ``value``) are the same answer; the explicit skip; and every response that
cannot be read refused 422 with nothing stored. Expected classes are worked out by hand from the
triage instance (tests/api_support.py): a normal ECG leaves only reflux (home), an abnormal one
mi and angina (both admit).
"""

from __future__ import annotations

import copy

import pytest

from tests.api_support import TRIAGE
from tests.test_cat import Session, outcomes, refused, section, stateless, stored_steps  # noqa: F401 (a fixture)


def item(variables_key: str, values_key: str, values: list, identifier: str = "RESPONSE", **extra) -> dict:
    """An item result for the ECG with one response variable, spelt with ``variables_key`` and
    ``values_key`` (``candidateResponse`` nests the values one level down, as QTI does)."""
    variable = {"identifier": identifier, "cardinality": "single"}
    variable.update({"candidateResponse": {"value": values}} if values_key == "candidateResponse"
                    else {"value": values})
    return {"identifier": "ecg", "sessionStatus": "final", variables_key: [variable], **extra}


def oat_item(outcome: str) -> dict:
    """An item result as lib-test-cat's ResultFormatter writes it: datestamp, sessionStatus
    FINAL, the variables by kind in plural members, each value with an upper-case baseType."""
    return {"identifier": "ecg", "datestamp": "2026-01-05T10:00:00+0000", "sessionStatus": "FINAL",
            "responseVariables": [{"identifier": "RESPONSE", "cardinality": "single",
                                   "value": [{"baseType": "IDENTIFIER", "value": outcome}]}]}


def post(session: Session, *items: dict):
    body = {"assessmentResult": {"context": {"sourcedId": None, "sessionIdentifiers": []}, "itemResult": list(items)},
            "sessionState": session.state}
    return session.client.post(session.url, json=body)


def history(client, session: Session) -> list | None:
    response = client.get(f"/v1/sessions/{session.id}")
    return response.get_json()["history"] if response.status_code == 200 else None


SPELLINGS = [("responseVariable", "candidateResponse"), ("responseVariable", "value"),
             ("responseVariables", "candidateResponse"), ("responseVariables", "value")]


@pytest.mark.parametrize("variables_key, values_key", SPELLINGS)
@pytest.mark.parametrize("outcome, expected_class", [("normal", "home"), ("abnormal", "admit")])
def test_every_spelling_of_a_response_is_the_same_answer(client, stateless, variables_key, values_key,
                                                         outcome, expected_class):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    response = post(session, item(variables_key, values_key, [{"value": outcome}]))
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert outcomes(body)["CLASS"] == expected_class and outcomes(body)["ITEMS_ANSWERED"] == "1"
    if not stateless:
        assert history(client, session) == [{"test": "ecg", "outcome": outcome, "cost": 2.0}]


def test_what_oats_client_sends_is_read_as_the_answer(client, stateless):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    response = post(session, oat_item("abnormal"))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert outcomes(response.get_json())["CLASS"] == "admit"
    assert stored_steps(client, session) == (None if stateless else 1)


@pytest.mark.parametrize("variables_key, values_key", SPELLINGS)
def test_a_skip_is_the_response_variable_with_no_value(client, stateless, variables_key, values_key):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    response = post(session, item(variables_key, values_key, []))
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    # By hand: a skipped ECG is not asked again; troponin is next, and nothing was answered.
    assert body["nextItems"]["itemIdentifiers"] == ["troponin"] and outcomes(body)["ITEMS_ANSWERED"] == "0"
    if not stateless:
        assert [(h["test"], h.get("skipped"), "outcome" in h) for h in history(client, session)] == [("ecg", True, False)]


def _without(key: str) -> dict:
    body = oat_item("normal")
    del body[key]
    return body


def _variable(**fields) -> dict:
    return {"identifier": "ecg", "responseVariable": [{"identifier": "RESPONSE", **fields}]}


NORMAL = [{"value": "normal"}]
# Responses that cannot be read as an answer, each refused rather than taken for a skip.
UNREADABLE = {
    "no response variable": _without("responseVariables"),
    "outcome variables without a SCORE": {"identifier": "ecg", "outcomeVariables": [
        {"identifier": "COMPLETION", "value": [{"value": "completed"}]}]},
    "two SCORE variables": {"identifier": "ecg", "outcomeVariables": [
        {"identifier": "SCORE", "value": [{"value": 1}]}, {"identifier": "score", "value": [{"value": 0}]}]},
    "both spellings of the outcome variables": {"identifier": "ecg", "outcomeVariable": [],
                                                "outcomeVariables": [{"identifier": "SCORE", "value": [{"value": 1}]}]},
    "both spellings of the variables": {**_variable(candidateResponse={"value": NORMAL}),
                                        "responseVariables": [{"identifier": "RESPONSE", "value": NORMAL}]},
    "an empty list of variables": {"identifier": "ecg", "responseVariable": []},
    "a variable with no values member": _variable(),
    "a null candidate response": _variable(candidateResponse=None),
    "a candidate response with no value member": _variable(candidateResponse={}),
    "both spellings of the values": _variable(candidateResponse={"value": NORMAL}, value=NORMAL),
    "values spelt values/valueString": _variable(values=[{"baseType": "identifier", "valueString": "normal"}]),
    "a value with no value member": _variable(value=[{"baseType": "identifier", "valueString": "normal"}]),
    "values that are not a list": _variable(value="normal"),
    "two values": _variable(candidateResponse={"value": [{"value": "normal"}, {"value": "abnormal"}]}),
    "two variables, none named RESPONSE": {"identifier": "ecg", "responseVariable": [
        {"identifier": "R1", "value": NORMAL}, {"identifier": "R2", "value": NORMAL}]},
    "two variables named RESPONSE": {"identifier": "ecg", "responseVariable": [
        {"identifier": "RESPONSE", "value": NORMAL}, {"identifier": "RESPONSE", "value": [{"value": "abnormal"}]}]},
}


@pytest.mark.parametrize("unreadable", list(UNREADABLE), ids=list(UNREADABLE))
def test_a_response_that_cannot_be_read_is_refused_and_nothing_is_stored(client, stateless, unreadable):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    before = client.get(f"/v1/sessions/{session.id}").get_json() if not stateless else None
    # Alone, and after a readable answer in the same post (all or nothing).
    for items in ([copy.deepcopy(UNREADABLE[unreadable])], [oat_item("normal"), copy.deepcopy(UNREADABLE[unreadable])]):
        response = post(session, *items)
        refused(response, 422, "validation-error")
        assert f"assessmentResult.itemResult[{len(items) - 1}]" in response.get_json()["imsx_description"]
    if not stateless:
        after = client.get(f"/v1/sessions/{session.id}").get_json()
        assert (after["step"], after["history"], after["next_tests"]) == (0, [], before["next_tests"])
    # The session goes on from where it was: the ECG is still the item to answer.
    assert outcomes(session.answer(("ecg", "normal")))["ITEMS_ANSWERED"] == "1"


# A two-point θ grid either side of the cut, with an item so discriminating that its score
# decides the level: by hand, P(right | θ = -1) = 1 / (1 + e^40) ≈ 4e-18, so a right answer
# leaves "pass" with probability 1 - 4e-18 and a wrong one "fail" alike.
SHARP_BANK = {"item_bank": {"items": [{"id": "q1", "model": "2PL", "a": 20, "b": 0}],
                            "prior": {"grid": [-1, 1], "weights": [1, 1]}, "cut_scores": [0],
                            "levels": ["fail", "pass"]}}


def oat_score(item: str, score: float) -> dict:
    """What lib-test-cat posts in practice: CatSession::filterItemResults keeps only the
    variable named score, here an outcome variable with a FLOAT value."""
    return {"identifier": item, "datestamp": "2026-01-05T10:00:00+0000", "sessionStatus": "FINAL",
            "outcomeVariables": [{"identifier": "SCORE", "cardinality": "single",
                                  "value": [{"baseType": "FLOAT", "value": score}]}]}


@pytest.mark.parametrize("score, level", [(1.0, "pass"), (0.0, "fail")])
def test_a_score_is_the_answer_when_no_response_is_sent(client, stateless, score, level):
    session = Session(client, section(client, {"instance": SHARP_BANK, "stateless": stateless}))
    assert session.items == ["q1"]
    response = post(session, oat_score("q1", score))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert outcomes(response.get_json())["CLASS"] == level
    if not stateless:
        assert [(h["test"], h["outcome"]) for h in history(client, session)] == [("q1", str(int(score)))]


def test_a_response_is_read_before_a_score():
    from schemas.cat import CatItemResult

    both = {**oat_score("q1", 0.0), "responseVariables": [{"identifier": "RESPONSE", "value": [{"value": 1.0}]}]}
    assert CatItemResult.model_validate(both).outcome == "1"


def test_a_score_naming_no_outcome_is_refused_and_nothing_is_stored(client, stateless):
    session = Session(client, section(client, {"instance": TRIAGE, "stateless": stateless}))
    refused(post(session, oat_score("ecg", 1.0)), 422, "unknown-outcome")
    assert stored_steps(client, session) == (None if stateless else 0)
