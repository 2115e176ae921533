"""POST/GET /v1/instances over both stores."""

from __future__ import annotations

import copy

from api_support import NOISY, TRIAGE, TRIAGE_COLUMNAR, assert_problem

from service import engine


def test_posting_an_instance_answers_its_summary_and_location(client):
    response = client.post("/v1/instances", json=TRIAGE)
    assert response.status_code == 201
    body = response.get_json()
    assert body["kind"] == "deterministic"
    assert (body["n_hypotheses"], body["n_tests"], body["n_classes"]) == (3, 2, 2)
    assert body["warnings"] == []
    assert len(body["instance_id"]) == 64 and int(body["instance_id"], 16) >= 0
    assert response.headers["Location"] == f"/v1/instances/{body['instance_id']}"
    shown = client.get(response.headers["Location"]).get_json()
    assert shown.pop("auto")["policy"] in engine.POLICIES  # what auto resolves to: tests/test_api_auto.py
    assert shown == body


def test_posting_the_same_content_again_answers_200_with_the_same_id(client):
    first = client.post("/v1/instances", json=TRIAGE)
    again = client.post("/v1/instances", json=TRIAGE)
    other_form = client.post("/v1/instances", json=TRIAGE_COLUMNAR)
    assert (first.status_code, again.status_code, other_form.status_code) == (201, 200, 200)
    assert first.get_json()["instance_id"] == again.get_json()["instance_id"] == other_form.get_json()["instance_id"]


def test_different_content_has_a_different_id(client):
    changed = copy.deepcopy(TRIAGE)
    changed["hypotheses"][0]["prior"] = 0.2
    ids = {client.post("/v1/instances", json=body).get_json()["instance_id"] for body in (TRIAGE, changed)}
    assert len(ids) == 2


def test_likelihood_instance_summary(client):
    body = client.post("/v1/instances", json=NOISY).get_json()
    assert body["kind"] == "likelihood"
    assert (body["n_hypotheses"], body["n_tests"], body["n_classes"]) == (2, 1, 2)


def test_indistinguishable_hypotheses_of_different_classes_are_warned_about(client):
    twins = {"tests": [{"id": "t", "outcomes": ["x", "y"]}],
             "hypotheses": [{"id": "p", "class": "A", "outcomes": {"t": "x"}},
                            {"id": "q", "class": "B", "outcomes": {"t": "x"}},
                            {"id": "r", "class": "B", "outcomes": {"t": "y"}}]}
    warnings = client.post("/v1/instances", json=twins).get_json()["warnings"]
    assert len(warnings) == 1 and "'p'" in warnings[0] and "'q'" in warnings[0]


def test_unknown_instance_is_404(client):
    assert_problem(client.get("/v1/instances/" + "0" * 64), 404, "instance-not-found")
    assert_problem(client.get("/v1/instances/not-a-hash"), 404, "instance-not-found")


def test_invalid_instance_lists_each_problem_with_its_json_path(client):
    bad = copy.deepcopy(TRIAGE)
    bad["hypotheses"][1]["outcomes"]["ecg"] = "sideways"
    bad["tests"][1]["cost"] = 0
    body = assert_problem(client.post("/v1/instances", json=bad), 422, "validation-error")
    paths = {error["path"] for error in body["errors"]}
    assert paths == {"hypotheses[1].outcomes.ecg", "tests[1].cost"}
    assert all(error["message"] for error in body["errors"])
    # Nothing was stored under the valid instance's id either way.
    valid_id = client.post("/v1/instances", json=TRIAGE)
    assert valid_id.status_code == 201


def test_instance_over_the_cell_limit_is_413_and_not_stored(app_config):
    from service.app import create_app

    client = create_app({**app_config, "max_cells": 5}).test_client()
    assert_problem(client.post("/v1/instances", json=TRIAGE), 413, "instance-too-large")
    small = client.post("/v1/instances", json={"tests": [{"id": "t"}], "hypotheses": [
        {"id": "a", "outcomes": {"t": "x"}}, {"id": "b", "outcomes": {"t": "y"}}]})
    assert small.status_code == 201
