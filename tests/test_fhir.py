"""The FHIR SDC adapter (/fhir) over the memory store and Redis: a whole adaptive questionnaire
asks what ``/v1/select`` asks given the same answers and ends on its result; every resource it
writes is valid FHIR (R4B's models); every refusal is an OperationOutcome naming its place, and
nothing is stored."""

from __future__ import annotations

import copy
import json

import pytest
from api_support import TRIAGE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from snapshots import snapshot
from fhir_support import (FHIR, NEXT, RESULT_LINK_IDS, answer, last_question, start, truth_answers, valid,
                          worded_triage)


def post(client, resource, content_type=FHIR):
    body = resource if isinstance(resource, (bytes, str)) else json.dumps(resource)
    return client.post(NEXT, data=body, content_type=content_type)


def begin(client, instance) -> tuple[str, dict]:
    instance_id = client.post("/v1/instances", json=instance).get_json()["instance_id"]
    read = client.get(f"/fhir/Questionnaire/{instance_id}")
    assert read.status_code == 200 and read.mimetype == FHIR
    return instance_id, start(valid(read.get_json()))


def select(client, instance_id, observations) -> dict:
    return client.post("/v1/select", json={"instance_id": instance_id, "observations": observations}).get_json()


@pytest.mark.parametrize("truth", [0, 3, 7])
def test_a_whole_questionnaire_asks_what_select_asks(client, truth):
    instance = worded_triage()
    instance_id, response = begin(client, instance)
    truths, observations = truth_answers(instance, truth), []
    tests = {t["id"]: t for t in instance["tests"]}
    for asked in range(len(tests) + 1):
        reply = post(client, response)
        assert reply.status_code == 200 and reply.mimetype == FHIR, reply.get_data()
        response = valid(reply.get_json())
        reference = select(client, instance_id, observations)
        if reference["done"]:
            break
        assert response["status"] == "in-progress"
        item = last_question(response)
        test = tests[reference["next_test"]["id"]]
        assert item["linkId"] == test["id"] and item["text"] == test.get("text", test["id"])
        assert [(o["valueCoding"]["code"], o["valueCoding"]["display"]) for o in item["answerOption"]] == \
            [(label, test.get("outcome_text", {}).get(label, label)) for label in test["outcomes"]]
        label = None if asked == 1 else truths[test["id"]]  # the second question is answered "unknown"
        observations.append({"test": test["id"], "outcome": label} if label else {"test": test["id"], "skip": True})
        response = answer(response, item, label)
    assert response["status"] == "completed"
    questions = response["contained"][0]["item"]
    assert [i["linkId"] for i in questions[:-3]] == [o["test"] for o in observations]
    assert all(i.get("readOnly") and i["extension"][0]["valueBoolean"] for i in questions[-3:])
    results = {i["linkId"]: i["answer"][0] for i in response["item"] if i["linkId"] in RESULT_LINK_IDS}
    assert results == {"$result.decision": {"valueString": reference["decision"]["id"]},
                       "$result.probability": {"valueDecimal": reference["decision"]["probability"]},
                       "$result.stop-reason": {"valueString": reference["stop_reason"]}}
    assert truths  # the decision is one the truth accepts (by the instance's own losses)
    losses = instance["hypotheses"][truth]["loss"]
    assert losses[reference["decision"]["id"]] <= min(losses.values()) + instance["loss_tolerance"]


def test_a_class_instance_ends_on_its_class(client):
    instance_id, response = begin(client, TRIAGE)
    response = valid(post(client, response).get_json())
    response = answer(response, last_question(response), "abnormal")  # ecg: admit, by hand
    done = valid(post(client, response).get_json())
    assert done["status"] == "completed"
    results = {i["linkId"]: i["answer"][0] for i in done["item"] if i["linkId"] in RESULT_LINK_IDS}
    assert results == {"$result.class": {"valueString": "admit"}, "$result.probability": {"valueDecimal": 1.0},
                       "$result.stop-reason": {"valueString": "determined"}}


def test_an_unanswered_question_is_a_skip(client):
    instance_id, response = begin(client, worded_triage())
    first = valid(post(client, response).get_json())
    again = valid(post(client, first).get_json())  # the first question left unanswered
    skipped = last_question(first)["linkId"]
    reference = select(client, instance_id, [{"test": skipped, "skip": True}])
    assert last_question(again)["linkId"] == reference["next_test"]["id"] != skipped


@pytest.mark.parametrize("name", ["questionnaire-response", "in"])
def test_a_parameters_resource_carries_the_response(client, name):
    _, response = begin(client, worded_triage())
    bare = post(client, response).get_json()
    wrapped = post(client, {"resourceType": "Parameters", "parameter": [{"name": name, "resource": response}]})
    assert wrapped.status_code == 200 and wrapped.get_json() == bare


def test_a_replay_answers_the_same_and_stores_nothing(client, app):
    _, response = begin(client, worded_triage())
    before = snapshot(app)
    first = post(client, response).get_json()
    answered = answer(first, last_question(first), "yes")
    assert post(client, answered).get_json() == post(client, answered).get_json()
    assert snapshot(app) == before


def test_the_client_fields_come_back(client):
    _, response = begin(client, worded_triage())
    response.update(id="qr-1", subject={"reference": "Patient/p1"}, authored="2026-11-26T10:00:00Z")
    back = valid(post(client, response).get_json())
    assert (back["id"], back["subject"], back["authored"]) == ("qr-1", {"reference": "Patient/p1"},
                                                                "2026-11-26T10:00:00Z")


def test_an_outcome_label_that_is_no_fhir_code_is_refused_when_asked(client, app):
    spaced = {"tests": [{"id": "q", "outcomes": ["not at all", "more than  half the days"]}],
              "hypotheses": [{"id": "a", "outcomes": {"q": "not at all"}},
                             {"id": "b", "outcomes": {"q": "more than  half the days"}}]}
    _, response = begin(client, spaced)  # the Questionnaire itself has no items: it reads
    before = snapshot(app)
    assert_outcome(post(client, response), 422, "not-supported", None)
    assert snapshot(app) == before


STEP_CONFIG = "urn:edgecut:fhir:step-config"


def configured(response: dict, **parts) -> dict:
    """``response`` whose contained Questionnaire asks for ``parts`` (name → one value or a list)."""
    kinds = {bool: "valueBoolean", int: "valueInteger", float: "valueDecimal", str: "valueString"}
    extension = [{"url": name, kinds[type(v)]: v} for name, value in parts.items()
                 for v in (value if isinstance(value, list) else [value])]
    response = copy.deepcopy(response)
    response["contained"][0].setdefault("extension", []).append({"url": STEP_CONFIG, "extension": extension})
    return response


def test_an_object_field_is_given_as_parts_of_its_own(client):
    instance_id, response = begin(client, worded_triage())
    response = copy.deepcopy(response)
    response["contained"][0]["extension"].append({"url": STEP_CONFIG, "extension": [
        {"url": "policy", "valueString": "ec2"}, {"url": "seed", "valueInteger": 3},
        {"url": "exposure", "extension": [{"url": "method", "valueCode": "randomesque"},
                                          {"url": "k", "valueInteger": 3}]}]})
    page = valid(post(client, response).get_json())
    reference = client.post("/v1/select", json={"instance_id": instance_id, "policy": "ec2", "seed": 3,
                                                "exposure": {"method": "randomesque", "k": 3}}).get_json()
    assert last_question(page)["linkId"] == reference["next_test"]["id"]
    response["contained"][0]["extension"][-1]["extension"][2]["extension"][1]["valueInteger"] = 0
    assert post(client, response).status_code == 422


def test_the_step_config_extension_sets_what_select_takes(client):
    instance_id, response = begin(client, worded_triage())
    config = {"policy": "ec2", "max_tests": 2, "exclude_tests": ["cough", "fever"], "batch_size": 2}
    page = valid(post(client, configured(response, **config)).get_json())
    reference = client.post("/v1/select", json={"instance_id": instance_id, "observations": [], **config}).get_json()
    asked = page["contained"][0]["item"]
    assert [i["linkId"] for i in asked] == [t["id"] for t in reference["next_tests"]] and len(asked) == 2
    assert not {"cough", "fever"} & {i["linkId"] for i in asked}
    for item in asked:
        page = answer(page, item, truth_answers(worded_triage(), 7)[item["linkId"]])
    done = valid(post(client, page).get_json())
    assert done["status"] == "completed"
    results = {i["linkId"]: i["answer"][0] for i in done["item"] if i["linkId"] in RESULT_LINK_IDS}
    assert results["$result.stop-reason"] == {"valueString": "max_tests"}


def test_a_questionnaire_read_with_a_query_carries_it(client):
    instance_id = client.post("/v1/instances", json=worded_triage()).get_json()["instance_id"]
    read = client.get(f"/fhir/Questionnaire/{instance_id}?_format=json&policy=ec2&max_tests=2&exclude_tests=cough"
                      "&exclude_tests=fever&batch_size=2&confidence=0.99")
    questionnaire = valid(read.get_json())
    assert questionnaire["extension"][1] == {"url": STEP_CONFIG, "extension": [
        {"url": "policy", "valueString": "ec2"}, {"url": "max_tests", "valueInteger": 2},
        {"url": "exclude_tests", "valueString": "cough"}, {"url": "exclude_tests", "valueString": "fever"},
        {"url": "batch_size", "valueInteger": 2}, {"url": "confidence", "valueDecimal": 0.99}]}
    page = post(client, start(questionnaire)).get_json()
    reference = client.post("/v1/select", json={
        "instance_id": instance_id, "policy": "ec2", "max_tests": 2, "exclude_tests": ["cough", "fever"],
        "batch_size": 2, "confidence": 0.99}).get_json()
    assert [i["linkId"] for i in page["contained"][0]["item"]] == [t["id"] for t in reference["next_tests"]]


@pytest.mark.parametrize("query", ["colour=red", "max_tests=two", "confidence=2", "policy=nope", "max_tests=-1",
                                   "confidence=nan"])
def test_a_bad_query_is_an_operation_outcome(client, query):
    instance_id = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    assert_outcome(client.get(f"/fhir/Questionnaire/{instance_id}?{query}"), 400, "value", None)


@pytest.mark.parametrize("parts, status", [
    ({"confidence": 2.0}, 422), ({"max_tests": "3"}, 422), ({"colour": "red"}, 422), ({"policy": "nope"}, 422),
    ({"exclude_tests": ["no such test"]}, 422),
])
def test_a_bad_step_config_is_an_operation_outcome(client, app, parts, status):
    _, response = begin(client, worded_triage())
    before = snapshot(app)
    refused = post(client, configured(response, **parts))
    assert refused.status_code == status and refused.mimetype == FHIR
    valid(refused.get_json())
    assert snapshot(app) == before


def test_an_item_bank_ends_on_its_ability_estimate(client):
    from test_display_text import BANK

    instance_id, response = begin(client, BANK)
    response = configured(response, policy="infogain", max_tests=1)
    page = valid(post(client, response).get_json())
    item = last_question(page)
    done = valid(post(client, answer(page, item, "1")).get_json())
    reference = client.post("/v1/select", json={"instance_id": instance_id, "policy": "infogain", "max_tests": 1,
                                                "observations": [{"test": item["linkId"], "outcome": "1"}]}).get_json()
    results = {i["linkId"]: i["answer"][0] for i in done["item"] if i["linkId"] in RESULT_LINK_IDS}
    assert results["$result.theta"] == {"valueDecimal": reference["theta"]["eap"]}
    assert results["$result.theta-sd"] == {"valueDecimal": reference["theta"]["sd"]}
    assert item["text"] == next(i["text"] for i in BANK["item_bank"]["items"] if i["id"] == item["linkId"])


def test_metadata_lists_the_operation(client):
    statement = valid(client.get("/fhir/metadata").get_json())
    operations = statement["rest"][0]["resource"][0]["operation"]
    assert operations == [{"name": "next-question",
                           "definition": "http://hl7.org/fhir/uv/sdc/OperationDefinition/Questionnaire-next-question"}]


def _unknown_outcome(r):
    r["item"][0]["answer"][0]["valueCoding"]["code"] = "maybe"


def _not_asked(r):
    r["item"].append({"linkId": "ct_head", "answer": [{"valueCoding": {"code": "normal"}}]})


def _stopped_again(r):
    r["contained"][0]["item"].append({"linkId": "$result.decision", "type": "string", "readOnly": True})


def _completed(r):
    r["status"] = "completed"


def _no_questionnaire(r):
    r["contained"] = []


def _other_instance(r):
    r["contained"][0]["url"] = "http://x/v1/instances/" + "0" * 64


def _no_instance_url(r):
    r["contained"][0]["url"] = "http://example.org/Questionnaire/phq-9"


def _string_answer(r):
    r["item"][0]["answer"] = [{"valueString": "yes"}]


def _other_system(r):
    r["item"][0]["answer"][0]["valueCoding"]["system"] = "http://loinc.org"


def _two_answers(r):
    r["item"][0]["answer"] *= 2


def _twice(r):
    r["item"].append(copy.deepcopy(r["item"][0]))


def _foreign_question(r):
    r["contained"][0]["item"].append({"linkId": "pain-score", "type": "integer"})


def _items_not_a_list(r):
    r["item"] = {"linkId": "x"}


@pytest.mark.parametrize("change, status, code, expression", [
    (_unknown_outcome, 422, "code-invalid", "QuestionnaireResponse.item[0].answer[0].valueCoding.code"),
    (_not_asked, 422, "invalid", "QuestionnaireResponse.item[1].linkId"),
    (_stopped_again, 422, "business-rule", "QuestionnaireResponse.contained[0].item[1]"),
    (_completed, 422, "business-rule", "QuestionnaireResponse.status"),
    (_no_questionnaire, 400, "required", "QuestionnaireResponse.contained"),
    (_other_instance, 404, "not-found", None),
    (_no_instance_url, 400, "required", "QuestionnaireResponse.contained[0].url"),
    (_string_answer, 422, "invalid", "QuestionnaireResponse.item[0].answer[0]"),
    (_other_system, 422, "code-invalid", "QuestionnaireResponse.item[0].answer[0].valueCoding.system"),
    (_two_answers, 422, "invalid", "QuestionnaireResponse.item[0].answer"),
    (_twice, 400, "structure", "QuestionnaireResponse.item[1]"),
    (_foreign_question, 422, "invalid", "QuestionnaireResponse.contained[0].item[1]"),
    (_items_not_a_list, 400, "structure", "QuestionnaireResponse.item"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_a_bad_response_is_an_operation_outcome(client, app, change, status, code, expression):
    _, response = begin(client, worded_triage())
    first = post(client, response).get_json()
    answered = answer(first, last_question(first), "yes")
    change(answered)
    before = snapshot(app)
    refused = post(client, answered)
    assert_outcome(refused, status, code, expression)
    assert snapshot(app) == before


@pytest.mark.parametrize("body, content_type, status, code", [
    (b"{", FHIR, 400, "structure"),
    (b'{"resourceType": "QuestionnaireResponse", "status": "in-progress", "status": "x"}', FHIR, 400, "structure"),
    (b"[1, 2]", FHIR, 400, "structure"),
    (b'{"resourceType": "Patient"}', FHIR, 400, "structure"),
    (b'{"resourceType": "Parameters", "parameter": [{"name": "other"}]}', FHIR, 400, "required"),
    (b'{"resourceType": "QuestionnaireResponse"}', FHIR, 400, "required"),
    (b'{"resourceType": "QuestionnaireResponse", "status": "in-progress"}', FHIR, 400, "required"),
    (b"not json", "text/plain", 415, "not-supported"),
    (b"\xff\xfe", "application/json", 400, "structure"),
])
def test_bad_fhir_and_bad_json_are_operation_outcomes(client, app, body, content_type, status, code):
    before = snapshot(app)
    assert_outcome(post(client, body, content_type), status, code, None)
    assert snapshot(app) == before


@pytest.mark.parametrize("method, path, status, code", [
    ("get", "/fhir/Questionnaire/nope", 404, "not-found"),
    ("get", "/fhir/Questionnaire/" + "0" * 64, 404, "not-found"),
    ("get", "/fhir/Patient/1", 404, "not-found"),
    ("delete", "/fhir/metadata", 405, "not-supported"),
    ("put", NEXT, 405, "not-supported"),
])
def test_unknown_resources_and_methods_are_operation_outcomes(client, method, path, status, code):
    assert_outcome(getattr(client, method)(path), status, code, None)


def test_api_keys_guard_fhir_as_they_guard_v1(app_config):
    from service.app import create_app

    client = create_app({**app_config, "api_keys": "alpha:" + "k" * 32}).test_client()
    assert client.get("/fhir/metadata").status_code == 200
    assert_outcome(client.get("/fhir/Questionnaire/" + "0" * 64), 401, "login", None)
    assert_outcome(post(client, {"resourceType": "QuestionnaireResponse"}), 401, "login", None)
    keyed = {"Authorization": "Bearer " + "k" * 32}
    instance_id = client.post("/v1/instances", json=TRIAGE, headers=keyed).get_json()["instance_id"]
    assert client.get(f"/fhir/Questionnaire/{instance_id}", headers=keyed).status_code == 200


def test_browser_apps_may_call_fhir_when_cors_is_on(app_config):
    from service.app import create_app

    client = create_app({**app_config, "cors_origins": "https://smart.example"}).test_client()
    preflight = client.options(NEXT, headers={"Origin": "https://smart.example", "Access-Control-Request-Method": "POST",
                                              "Access-Control-Request-Headers": "Content-Type, Authorization"})
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://smart.example"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]


def test_limits_and_rate_limits_are_operation_outcomes(app_config):
    from service.app import create_app

    client = create_app({**app_config, "max_body_bytes": 4096, "rate_limit": "2/minute",
                         "rate_limit_burst": 2}).test_client()
    assert_outcome(post(client, {"resourceType": "QuestionnaireResponse", "text": "x" * 5000}), 413, "too-costly", None)
    assert_outcome(post(client, {"resourceType": "QuestionnaireResponse"}), 400, "required", None)
    refused = post(client, {"resourceType": "QuestionnaireResponse"})
    assert_outcome(refused, 429, "throttled", None)
    assert int(refused.headers["Retry-After"]) > 0


def assert_outcome(response, status, code, expression):
    assert response.status_code == status, response.get_data()
    assert response.mimetype == FHIR
    outcome = valid(response.get_json())
    assert outcome["resourceType"] == "OperationOutcome"
    assert outcome["issue"][0]["code"] == code and outcome["issue"][0]["severity"] == "error"
    if expression is not None:
        assert outcome["issue"][0]["expression"] == [expression]


JUNK = [None, 0, 1.5, "", "x", "#q", "in-progress", "completed", [], {}, [None], [{}], True, "yes",
        "$result.class", "fever#2", "fever"]


def _places(node, here=()):
    if here:
        yield here
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _places(value, (*here, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _places(value, (*here, i))


@pytest.fixture(scope="module")
def answered_once():
    """An app over the memory store and a response that answered its first question."""
    from service.app import create_app

    client = create_app({"redis_url": None}).test_client()
    _, response = begin(client, worded_triage())
    first = post(client, response).get_json()
    return client, answer(first, last_question(first), "yes")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(JUNK), st.booleans()), min_size=1,
                        max_size=3))
def test_no_response_however_broken_makes_a_server_error(answered_once, changes):
    client, response = answered_once
    response = copy.deepcopy(response)
    for where, junk, remove in changes:
        places = list(_places(response))
        *path, last = places[where % len(places)]
        parent = response
        for key in path:
            parent = parent[key]
        if remove and isinstance(parent, dict):
            del parent[last]
        else:
            parent[last] = copy.deepcopy(junk)
    reply = post(client, response)
    assert reply.status_code in (200, 400, 404, 422) and reply.mimetype == FHIR, reply.get_data()
    if reply.status_code != 200:
        valid(reply.get_json())  # an OperationOutcome
