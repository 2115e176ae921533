"""Display text: ``tests[].text`` and ``tests[].outcome_text`` reach the state as posted, in every
instance form, over both stores; they are part of the instance (and of its id when given)."""

from __future__ import annotations

import copy

import pytest
from api_support import TRIAGE, TRIAGE_COLUMNAR

from schemas.instance import Instance
from service.engine import compile_instance
from service.store import codec

TEXT = {"ecg": ("Is the ECG abnormal?", {"abnormal": "Abnormal: ST elevation"}),
        "troponin": ("Troponin level?", {"high": "High (> 14 ng/L)", "low": "Low"})}


def worded(instance: dict, tests=("ecg", "troponin")) -> dict:
    instance = copy.deepcopy(instance)
    for test in instance["tests"]:
        if test["id"] in tests:
            test["text"], test["outcome_text"] = TEXT[test["id"]][0], dict(TEXT[test["id"]][1])
            test.setdefault("outcomes", ["high", "low"])  # outcome_text needs the outcomes listed
    return instance


@pytest.mark.parametrize("form", [TRIAGE, TRIAGE_COLUMNAR], ids=["per-hypothesis", "columnar"])
def test_the_state_shows_the_text_as_posted(client, form):
    instance = worded(form)
    session = client.post("/v1/sessions", json={"instance": instance, "policy": "ec2"}).get_json()
    first = session["next_test"]
    assert (first["text"], first["outcome_text"]) == TEXT[first["id"]]
    answered = client.post(f"/v1/sessions/{session['session_id']}/observations",
                           json={"test": first["id"], "outcome": "abnormal" if first["id"] == "ecg" else "low"})
    state = answered.get_json()
    if state["next_test"] is not None:
        assert (state["next_test"]["text"], state["next_test"]["outcome_text"]) == TEXT[state["next_test"]["id"]]
    stateless = client.post("/v1/select", json={"instance": instance, "policy": "ec2"}).get_json()
    assert stateless["next_test"] == first


def test_without_text_nothing_is_added(client):
    state = client.post("/v1/select", json={"instance": TRIAGE, "policy": "ec2"}).get_json()
    assert set(state["next_test"]) == {"id", "cost", "outcomes"}


def test_a_test_without_text_beside_one_with():
    compiled = compile_instance(Instance.model_validate(worded(TRIAGE, tests=("ecg",))))
    assert compiled.test_text == ("Is the ECG abnormal?", None)
    assert compiled.outcome_text == ((None, "Abnormal: ST elevation"), (None, None))


def test_text_is_part_of_the_id_only_when_given():
    plain = compile_instance(Instance.model_validate(TRIAGE)).content_hash
    # The id TRIAGE had before instances could carry text: an instance without any keeps it.
    assert plain == compile_instance(Instance.model_validate(TRIAGE_COLUMNAR)).content_hash
    one = compile_instance(Instance.model_validate(worded(TRIAGE))).content_hash
    other = worded(TRIAGE)
    other["tests"][0]["outcome_text"]["abnormal"] = "Abnormal"
    assert len({plain, one, compile_instance(Instance.model_validate(other)).content_hash}) == 3


def test_the_stored_form_keeps_the_text():
    compiled = compile_instance(Instance.model_validate(worded(TRIAGE)))
    header, body = codec.encode(compiled)
    decoded = codec.decode(header, body, compiled.content_hash)
    assert (decoded.test_text, decoded.outcome_text) == (compiled.test_text, compiled.outcome_text)
    assert decoded.content_hash == compiled.content_hash


@pytest.mark.parametrize("change, path", [
    (lambda t: t[0]["outcome_text"].update(maybe="Maybe"), "tests[0].outcome_text.maybe"),
    (lambda t: t[1].pop("outcomes"), "tests[1].outcome_text"),
    (lambda t: t[0].update(text=""), "tests[0].text"),
    (lambda t: t[0].update(text="x" * 2001), "tests[0].text"),
])
def test_bad_text_is_refused_with_its_path(client, change, path):
    instance = worded(TRIAGE)
    change(instance["tests"])
    response = client.post("/v1/instances", json=instance)
    assert response.status_code == 422
    assert path in [e["path"] for e in response.get_json()["errors"]]
    assert client.get("/v1/instances").get_json()["items"] == []


BANK = {"item_bank": {"items": [
    {"id": "num01", "model": "2PL", "a": 1.2, "b": 0.0, "text": "What is 3 × 4?", "outcome_text": {"1": "12"}},
    {"id": "geo01", "model": "GPCM", "a": 0.9, "thresholds": [-0.5, 0.5], "text": "Name the triangle's angles."}],
    "cut_scores": [0.0]}}


def test_an_item_bank_shows_its_items_text(client):
    state = client.post("/v1/select", json={"instance": BANK, "policy": "infogain"}).get_json()
    items = {item["id"]: item for item in BANK["item_bank"]["items"]}
    shown = state["next_test"]
    assert shown["text"] == items[shown["id"]]["text"]
    assert shown.get("outcome_text") == items[shown["id"]].get("outcome_text")


def test_an_item_banks_outcome_text_names_its_outcomes(client):
    bank = copy.deepcopy(BANK)
    bank["item_bank"]["items"][1]["outcome_text"] = {"3": "full marks"}  # GPCM with 2 thresholds: 0, 1, 2
    response = client.post("/v1/instances", json=bank)
    assert response.status_code == 422
    assert [e["path"] for e in response.get_json()["errors"]] == ["item_bank.items[1].outcome_text.3"]
