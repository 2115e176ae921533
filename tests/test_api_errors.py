"""Every error is RFC 9457 problem+json, never a traceback, over both stores."""

from __future__ import annotations

import pytest

from api_support import TRIAGE, assert_problem, new_session, stored
from service.app import create_app


def test_malformed_json_is_400(client):
    sid = new_session(client)["session_id"]
    before = stored(client.application, sid)
    for raw in ("{", "", "{'test': 1}", '{"test": NaN}', "[" * 5000 + "]" * 5000, b"\xff\xfe"):
        response = client.post(f"/v1/sessions/{sid}/observations", data=raw, content_type="application/json")
        assert_problem(response, 400, "malformed-json")
    assert stored(client.application, sid) == before


def test_a_body_that_is_not_an_object_is_422(client):
    body = assert_problem(client.post("/v1/instances", json=[1, 2]), 422, "validation-error")
    assert body["errors"][0]["path"] == ""


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_wrong_content_type_is_415(client, content_type):
    response = client.post("/v1/instances", data=b'{"tests": []}', content_type=content_type)
    assert_problem(response, 415, "unsupported-media-type")


def test_a_json_suffix_media_type_is_accepted(client):
    import orjson

    response = client.post("/v1/instances", data=orjson.dumps(TRIAGE), content_type="application/merge-patch+json")
    assert response.status_code == 201


def test_a_body_over_the_limit_is_413(app_config):
    client = create_app({**app_config, "max_body_bytes": 2048}).test_client()
    response = client.post("/v1/instances", data=b'{"tests": [' + b" " * 4096 + b"]}", content_type="application/json")
    body = assert_problem(response, 413, "body-too-large")
    assert "2048" in body["detail"]


def test_unknown_route_and_method(client):
    assert_problem(client.get("/v1/nothing-here"), 404, "not-found")
    response = client.put("/v1/instances")
    assert_problem(response, 405, "method-not-allowed")
    assert "POST" in response.headers["Allow"]


def test_explain_must_be_a_boolean(client):
    assert_problem(client.post("/v1/sessions?explain=maybe", json={"instance": TRIAGE}), 400, "invalid-parameter")


def test_an_unexpected_error_is_a_bare_500_and_is_logged(app_config, caplog):
    app = create_app(app_config)

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals")

    response = app.test_client().get("/boom")
    body = assert_problem(response, 500, "internal-error")
    assert "secret" not in response.get_data(as_text=True)
    assert set(body) == {"type", "title", "status", "detail", "request_id"}
    assert response.headers["X-Request-ID"] == body["request_id"]
    assert any("secret internals" in (r.exc_text or "") or r.exc_info for r in caplog.records)
