"""Builds openapi.yaml, the HTTP contract, from the wire models (schemas/api.py,
schemas/instance.py) and the problem table (problems.py), so the documented schemas cannot
drift from what the handlers accept and answer. tests/test_openapi.py fails when the committed
file is stale; regenerate with::

    python3 -m service.api.openapi > service/openapi.yaml

(the repository root's ``openapi.yaml`` is a link to that file, which ships as package data).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic.json_schema import models_json_schema

from service import __version__

from schemas.api import (
    MAX_OBSERVATIONS_PER_REQUEST,
    EvaluateRequest,
    InstanceList,
    InstanceSummary,
    ObservationCorrection,
    ObservationsRequest,
    Problem,
    SelectRequest,
    SessionCreate,
    SessionState,
    StepState,
)
from schemas.instance import LABEL_MAX_LENGTH, Instance

from service.engine import POLICIES
from service.settings import Settings

from .evaluation import TREE_FORMATS
from .problems import PROBLEMS, TYPE_PREFIX

REF = "#/components/schemas/{model}"
STATUS_TEXT = {400: ("Bad request: malformed JSON, an invalid header or query parameter, or a request that is "
                    "not valid HTTP/1.1 (bad Content-Length, both Content-Length and Transfer-Encoding, "
                    "a malformed chunk, a control character in a header)"),
               408: "Request timeout: the whole request did not arrive within REQUEST_READ_TIMEOUT seconds",
               414: "Request line too long (over 4094 bytes, e.g. an id of thousands of characters)",
               417: "Expectation failed: an Expect header other than 100-continue",
               431: "Request header fields too large (over gunicorn's limits)",
               507: "The session store is full (Redis maxmemory); nothing was stored; retry after Retry-After seconds",
               404: "Not found", 405: "Method not allowed", 409: "Conflict", 410: "Gone: the instance expired or was deleted",
               412: "Precondition failed: If-Match names a stale version",
               401: "Unauthorized: API keys are on (API_KEYS) and no valid `Authorization: Bearer` key came",
               413: "Content too large: the body, the instance's n·N cells, or another limit (MAX_*, named)",
               415: "Unsupported media type: send application/json", 422: "Invalid content",
               428: "Precondition required: this write is not safe to repeat; send If-Match with the ETag",
               500: "Internal error (logged; no details are given)",
               429: "Too many requests: over the tenant's rate limit (RATE_LIMIT); retry after Retry-After seconds",
               501: "Not implemented here: a rendering tool (Graphviz) is not installed",
               503: ("The session store is unavailable, or the server is receiving too many requests at once "
                     "(server-busy); retry after Retry-After seconds")}
# Refusals any request can meet before the application sees it (service/worker.py), and the
# store's: documented on every operation.
BELOW_THE_APPLICATION = (400, 408, 413, 414, 417, 431, 503)


def _labels_accept_integers(node: Any) -> Any:
    """Labels (test, outcome, class, hypothesis ids) accept an integer as its decimal string
    (schemas/instance.py ``Label``); say so in the schema."""
    if isinstance(node, dict):
        node = {key: _labels_accept_integers(value) for key, value in node.items()}
        if node.get("type") == "string" and node.get("maxLength") == LABEL_MAX_LENGTH:
            label = {key: node.pop(key) for key in ("type", "minLength", "maxLength")}
            node["anyOf"] = [label, {"type": "integer"}]
        return node
    if isinstance(node, list):
        return [_labels_accept_integers(value) for value in node]
    return node


def _not_null() -> dict[str, Any]:
    return {"not": {"type": "null"}}


def _given(present: list[str], absent: list[str]) -> dict[str, Any]:
    """A JSON Schema branch: ``present`` given and not null, ``absent`` missing or null."""
    properties = {name: _not_null() for name in present} | {name: {"type": "null"} for name in absent}
    return {"required": present, "properties": properties}


# The cross-field rules of the wire models' validators (schemas/), in JSON Schema, so the
# contract refuses what the server refuses. Rules that need the data itself (an outcome must be
# one of its test's labels, priors must not all be 0, …) cannot be stated here; the server
# answers them 422 with the JSON path of each problem.
CROSS_FIELD_RULES: dict[str, dict[str, Any]] = {
    "Instance": {"oneOf": [_given(["hypotheses"], ["matrix", "likelihood_matrix"]),
                           _given(["matrix"], ["hypotheses", "likelihood_matrix"]),
                           _given(["likelihood_matrix"], ["hypotheses", "matrix"])]},
    "SessionCreate": {"oneOf": [_given(["instance_id"], ["instance"]), _given(["instance"], ["instance_id"])]},
    "SelectRequest": {"oneOf": [_given(["instance_id"], ["instance"]), _given(["instance"], ["instance_id"])]},
}


def _policy_names(node: Any) -> None:
    """A policy is one of the registered names (service/engine/policies.py), not any string."""
    for option in node.get("anyOf", [node]):
        if option.get("type") == "string":
            option.pop("minLength", None), option.pop("maxLength", None)
            option["enum"] = sorted(POLICIES)
        elif option.get("type") == "array":
            option["items"] = {"type": "string", "enum": sorted(POLICIES)}


def _schemas() -> dict[str, Any]:
    _, schema = models_json_schema(
        [(Instance, "validation"), (SessionCreate, "validation"), (SelectRequest, "validation"),
         (ObservationsRequest, "validation"), (ObservationCorrection, "validation"),
         (InstanceSummary, "serialization"), (InstanceList, "serialization"), (SessionState, "serialization"),
         (StepState, "serialization"), (Problem, "serialization"), (EvaluateRequest, "validation")],
        ref_template=REF,
    )
    schemas = _labels_accept_integers(schema["$defs"])
    for definition in schemas.values():
        definition.pop("title", None)
        for prop in definition.get("properties", {}).values():
            prop.pop("title", None)
    schemas["Problem"]["description"] = (
        "RFC 9457 problem details. `type` is `" + TYPE_PREFIX + "<code>`; the codes: "
        + ", ".join(f"`{code}` ({status})" for code, (status, _, _) in PROBLEMS.items()) + ".")
    schemas["Problem"]["properties"]["type"]["examples"] = [TYPE_PREFIX + "inconsistent"]
    for name, rules in CROSS_FIELD_RULES.items():
        schemas[name].update(rules)
    for name, definition in schemas.items():
        for field in ("policy", "policies"):
            if field in definition.get("properties", {}):
                _policy_names(definition["properties"][field])
    return schemas


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _json(schema: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def _problems(*statuses: int) -> dict[str, Any]:
    return {str(status): {"$ref": f"#/components/responses/Problem{status}"} for status in statuses}


def _body(name: str, description: str, example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": _ref(name)}
    if example is not None:
        media["example"] = example
    return {"required": True, "description": description, "content": {"application/json": media}}


# The README's triage instance: the examples clients (and schemathesis) start from.
TRIAGE_EXAMPLE = {
    "tests": [{"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]}, {"id": "troponin", "cost": 1.0}],
    "hypotheses": [
        {"id": "mi", "class": "admit", "prior": 0.1, "outcomes": {"ecg": "abnormal", "troponin": "high"}},
        {"id": "angina", "class": "admit", "prior": 0.3, "outcomes": {"ecg": "abnormal", "troponin": "low"}},
        {"id": "reflux", "class": "home", "prior": 0.6, "outcomes": {"ecg": "normal", "troponin": "low"}},
    ],
}


HEADER = {
    "ETag": {"description": "The session's version; send it back in If-Match", "schema": {"type": "string"}},
    "Location": {"description": "Where the created resource lives", "schema": {"type": "string"}},
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "string"}},
    "Idempotent-Replayed": {"description": "`true` when an Idempotency-Key replay answered an earlier session",
                            "schema": {"type": "string", "enum": ["true"]}},
}
SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
TEST_ID = {"name": "test", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "The test whose recorded observation is corrected or withdrawn"}
OCCURRENCE = {"name": "occurrence", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1},
              "description": "Which answer of a test answered several times (repeatable tests): 1 is the first"}
LIMIT = {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}}
CURSOR = {"name": "cursor", "in": "query", "required": False, "schema": {"type": "string"},
          "description": "A previous page's next_cursor, unchanged"}
INSTANCE_ID = {"name": "instance_id", "in": "path", "required": True, "schema": {"type": "string"}}
EXPLAIN = {"name": "explain", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
           "description": "Also list the best-scoring candidate tests with their scores"}
IF_MATCH = {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string", "minLength": 1},
            "description": 'A previous ETag (e.g. `"3"`); 412 when the session has moved on'}
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
                   "description": "A retried create with the same key answers the same session"}

TREE_PARAMETERS = [
    {"name": "format", "in": "query", "required": False, "schema": {"type": "string", "enum": list(TREE_FORMATS)}},
    {"name": "policy", "in": "query", "required": False, "schema": {"type": "string", "enum": sorted(POLICIES)}},
    {"name": "max_tests", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "max_cost", "in": "query", "required": False, "schema": {"type": "number", "exclusiveMinimum": 0}},
    {"name": "confidence", "in": "query", "required": False,
     "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
    {"name": "max_expected_loss", "in": "query", "required": False, "schema": {"type": "number", "minimum": 0}},
    {"name": "seed", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "depth", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 0, "maximum": Settings.model_fields["tree_max_depth"].default},
     "description": "At most TREE_MAX_DEPTH (the default shown); deeper is 422"},
]


def build_spec() -> dict[str, Any]:
    session = _json(_ref("SessionState"), "The session's state", {"ETag": HEADER["ETag"]})
    created = _json(_ref("SessionState"), "Created; the session's first state",
                    {"ETag": HEADER["ETag"], "Location": HEADER["Location"],
                     "Idempotent-Replayed": HEADER["Idempotent-Replayed"]})
    summary = _json(_ref("InstanceSummary"), "The instance's summary")
    paths = {
        "/v1/instances": {"get": {
            "operationId": "listInstances", "tags": ["instances"],
            "summary": "The tenant's stored instances, oldest first, a page at a time",
            "parameters": [LIMIT, CURSOR],
            "responses": {"200": _json(_ref("InstanceList"), "A page; next_cursor is null on the last"),
                          **_problems(400, 500, 503)}}, "post": {
            "operationId": "postInstance", "tags": ["instances"],
            "summary": "Validate, compile and store an instance under its content hash",
            "requestBody": _body("Instance", "An instance, per-hypothesis or columnar (docs/instances.md)",
                                 TRIAGE_EXAMPLE),
            "responses": {"200": _json(_ref("InstanceSummary"), "Already stored: the same content has the same id",
                                       {"Location": HEADER["Location"]}),
                          "201": _json(_ref("InstanceSummary"), "Stored", {"Location": HEADER["Location"]}),
                          **_problems(400, 413, 415, 422, 500, 503)}}},
        "/v1/instances/{instance_id}": {"get": {
            "operationId": "getInstance", "tags": ["instances"], "summary": "An instance's summary",
            "parameters": [INSTANCE_ID],
            "responses": {"200": summary, **_problems(404, 500, 503)}},
            "delete": {
                "operationId": "deleteInstance", "tags": ["instances"],
                "summary": "Delete an instance; its sessions then answer 410 instance-gone",
                "description": ("A retried delete answers 204 again while the deletion is remembered (the "
                                "instance's TTL). Posting the same content again stores it anew."),
                "parameters": [INSTANCE_ID],
                "responses": {"204": {"description": "Deleted"}, **_problems(404, 500, 503)}}},
        "/v1/instances/{instance_id}/evaluate": {"post": {
            "operationId": "evaluateInstance", "tags": ["instances"],
            "summary": "Expected cost, tests and accuracy of policies on a stored instance (docs/evaluation.md)",
            "description": "Bounded by time, samples and size limits; past one the answer is 422 naming it.",
            "parameters": [INSTANCE_ID],
            "requestBody": _body("EvaluateRequest", "Policies (default: all that apply), stop rules, samples"),
            "responses": {"200": _json({"type": "object", "properties": {"instance_id": {"type": "string"}},
                                        "required": ["instance_id"], "additionalProperties": True},
                                       "The evaluation report"),
                          **_problems(400, 404, 413, 415, 422, 500, 503)}}},
        "/v1/instances/{instance_id}/tree": {"get": {
            "operationId": "getPolicyTree", "tags": ["instances"],
            "summary": "A policy's decision tree as JSON, DOT, SVG or PNG (docs/evaluation.md)",
            "parameters": [INSTANCE_ID, *TREE_PARAMETERS],
            "responses": {"200": {"description": "The tree in the requested format", "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/vnd.graphviz": {"schema": {"type": "string"}},
                "image/svg+xml": {"schema": {"type": "string"}},
                "image/png": {"schema": {"type": "string", "format": "binary"}}}},
                **_problems(400, 404, 422, 500, 501, 503)}}},
        "/v1/sessions": {"post": {
            "operationId": "createSession", "tags": ["sessions"],
            "summary": "Start a session on a stored or inline instance",
            "parameters": [IDEMPOTENCY_KEY, EXPLAIN],
            "requestBody": _body("SessionCreate", "Exactly one of instance_id and instance; policy and stop rules",
                                 {"instance": TRIAGE_EXAMPLE, "policy": "ec2"}),
            "responses": {"201": created, **_problems(400, 404, 409, 410, 413, 415, 422, 500, 503)}}},
        "/v1/sessions/{session_id}": {
            "get": {"operationId": "getSession", "tags": ["sessions"], "summary": "A session's state",
                    "parameters": [SESSION_ID, EXPLAIN],
                    "responses": {"200": session, **_problems(400, 404, 410, 500, 503)}},
            "delete": {"operationId": "deleteSession", "tags": ["sessions"], "summary": "Delete a session",
                       "parameters": [SESSION_ID, IF_MATCH],
                       "responses": {"204": {"description": "Deleted"}, **_problems(404, 412, 500, 503)}}},
        "/v1/sessions/{session_id}/observations": {"post": {
            "operationId": "postObservations", "tags": ["sessions"],
            "summary": "Record one observation or several (in order, all or nothing)",
            "description": ("An observation is an answer {test, outcome} or a skip {test, skip: true}. "
                            "Re-posting a recorded observation is a no-op (200), except an answer to a repeatable "
                            "test, which counts again and so requires If-Match (428 without it). The same test "
                            "with another outcome, anything new after the session is done (but the rest of a "
                            "batch session's last page), and an observation contradicting every remaining "
                            "hypothesis are 409, and nothing is stored. At most "
                            f"{MAX_OBSERVATIONS_PER_REQUEST} observations per request."),
            "parameters": [SESSION_ID, IF_MATCH, EXPLAIN],
            "requestBody": _body("ObservationsRequest",
                                 "{test, outcome}, {test, skip: true} or {observations: [...]} of those",
                                 {"test": "ecg", "outcome": "abnormal"}),
            "responses": {"200": session,
                          **_problems(400, 404, 409, 410, 412, 413, 415, 422, 428, 500, 503)}}},
        "/v1/sessions/{session_id}/observations/{test}": {
            "put": {"operationId": "correctObservation", "tags": ["sessions"],
                    "summary": "Replace a recorded observation's outcome (or make it a skip)",
                    "description": ("Everything is recomputed from the corrected facts; a done session may go on "
                                    "again. Idempotent: the same correction again changes nothing (200). 409 "
                                    "inconsistent when no hypothesis would be left, and nothing is stored."),
                    "parameters": [SESSION_ID, TEST_ID, OCCURRENCE, IF_MATCH, EXPLAIN],
                    "requestBody": _body("ObservationCorrection", "{outcome} or {skip: true}",
                                         {"outcome": "normal"}),
                    "responses": {"200": session,
                                  **_problems(400, 404, 409, 410, 412, 413, 415, 422, 500, 503)}},
            "delete": {"operationId": "withdrawObservation", "tags": ["sessions"],
                       "summary": "Withdraw a recorded observation; the state is recomputed without it",
                       "description": ("A retry answers 404 observation-not-found (nothing changes). Withdrawing "
                                       "one answer of a repeatable test requires If-Match (428 without it)."),
                       "parameters": [SESSION_ID, TEST_ID, OCCURRENCE, IF_MATCH, EXPLAIN],
                       "responses": {"200": session,
                                     **_problems(400, 404, 409, 410, 412, 422, 428, 500, 503)}}},
        "/v1/select": {"post": {
            "operationId": "select", "tags": ["select"],
            "summary": "Stateless: the step after the given observations; nothing is stored",
            "parameters": [EXPLAIN],
            "requestBody": _body("SelectRequest", "The instance (or its id), the observations so far, the policy",
                                 {"instance": TRIAGE_EXAMPLE, "observations": [{"test": "ecg", "outcome": "abnormal"}]}),
            "responses": {"200": _json(_ref("StepState"), "The step"),
                          **_problems(400, 404, 409, 413, 415, 422, 500, 503)}}},
        "/healthz": {"get": {
            "operationId": "healthz", "tags": ["operations"], "summary": "The process answers (no store needed)",
            "responses": {"200": _json({"type": "object", "properties": {"status": {"const": "ok"}},
                                        "required": ["status"]}, "Alive"), **_problems(500)}}},
        "/readyz": {"get": {
            "operationId": "readyz", "tags": ["operations"], "summary": "The store answers",
            "responses": {"200": _json({"type": "object", "properties": {"status": {"const": "ready"}},
                                        "required": ["status"]}, "Ready"), **_problems(500, 503)}}},
        "/metrics": {"get": {
            "operationId": "metrics", "tags": ["operations"], "summary": "Prometheus metrics",
            "responses": {"200": {"description": "Prometheus text exposition format",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                          **_problems(500)}}},
        "/openapi.yaml": {"get": {
            "operationId": "openapi", "tags": ["operations"], "summary": "This contract",
            "responses": {"200": {"description": "OpenAPI 3.1",
                                  "content": {"application/yaml": {"schema": {"type": "string"}}}},
                          **_problems(500)}}},
    }
    # With API keys on every /v1 route may answer 401, and with a rate limit 429; every route
    # that writes may meet a full store (507), and any request the refusals below the
    # application. The key is optional (``{}``): a service without API_KEYS takes anonymous
    # requests.
    for path, item in paths.items():
        for method, operation in item.items():
            extra = _problems(*BELOW_THE_APPLICATION)
            if path.startswith("/v1/"):
                extra.update(_problems(401, 429))
                operation["security"] = [{"bearerApiKey": []}, {}]
            if method in ("post", "delete"):
                extra.update(_problems(507))
            operation["responses"] = dict(sorted({**operation["responses"], **extra}.items()))
    problem_responses = {}
    for status, text in STATUS_TEXT.items():
        response: dict[str, Any] = {"description": text,
                                    "content": {"application/problem+json": {"schema": _ref("Problem")}}}
        if status in (429, 503, 507):
            response["headers"] = {"Retry-After": HEADER["Retry-After"]}
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"description": 'Bearer realm="edgecut"',
                                                        "schema": {"type": "string"}}}
        if status == 405:
            response["headers"] = {"Allow": {"description": "The allowed methods", "schema": {"type": "string"}}}
        problem_responses[f"Problem{status}"] = response
    return {
        "openapi": "3.1.0",
        "info": {"title": "edgecut", "version": __version__,
                 "description": ("Adaptive testing with EC² (Golovin, Krause & Ray, NIPS 2010): post an instance, "
                                  "start a session, post what you observe; each answer names the next test "
                                  "until the equivalence class is determined. Errors are RFC 9457 "
                                  "application/problem+json. See docs/api.md.")},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": _schemas(), "responses": problem_responses,
                       "securitySchemes": {"bearerApiKey": {
                           "type": "http", "scheme": "bearer",
                           "description": "An API key (API_KEYS), as `Authorization: Bearer <key>`"}}},
    }


def render() -> str:
    header = "# Generated by `python3 -m service.api.openapi` from schemas/api.py; do not edit by hand.\n"
    return header + yaml.safe_dump(build_spec(), sort_keys=False, allow_unicode=True, width=110)


if __name__ == "__main__":
    sys.stdout.write(render())
