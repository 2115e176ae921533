"""Builds openapi.yaml, the HTTP contract, from the app's routes and each view's ``@operation``
(service/api/contract.py), the wire models (schemas/api.py, schemas/instance.py) and the problem
table (problems.py), so the documented paths and schemas cannot drift from what the handlers
accept and answer. tests/test_openapi.py fails when the committed file is stale; regenerate
with::

    python3 -m service.api.openapi > service/openapi.yaml

(the repository root's ``openapi.yaml`` is a link to that file, which ships as package data).
"""

from __future__ import annotations

import copy
import re
import sys
from typing import Any

import yaml
from flask import Flask
from pydantic.json_schema import models_json_schema

from service import __version__
from service.app import create_app
from service.ui import PAGE_BLUEPRINTS

from schemas.api import (
    EvaluateRequest,
    ObservationCorrection,
    ObservationsRequest,
    SelectRequest,
    SessionCreate,
)
from schemas.cat import (
    CatResultsIn,
    CatResultsOut,
    CatSectionCreated,
    CatSectionIn,
    CatSectionOut,
    CatSessionCreated,
    CatSessionIn,
    ImsxStatusInfo,
)
from schemas.responses import InstanceDetail, InstanceList, InstanceSummary, Problem, SessionState, StepState
from schemas.instance import LABEL_MAX_LENGTH, Instance

from service.engine import POLICIES, policy_names

from .contract import HEADER, REF, operation_of, problems, ref
from .problems import PROBLEMS, TYPE_PREFIX
from .security import OPEN_PATHS

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
# Refusals any request can meet before the application sees it (service/worker/), and the
# store's: documented on every operation.
BELOW_THE_APPLICATION = (400, 408, 413, 414, 417, 431, 503)
# FHIR's views list their own refusals, every one an OperationOutcome (service/adapters/fhir/).
FHIR_PREFIX = "/fhir/"


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
    "CatSectionConfig": {"oneOf": [_given(["instance_id"], ["instance"]), _given(["instance"], ["instance_id"])]},
    # The two spellings of a CAT item's response (schemas/cat.py): one of each pair.
    "CatItemResult": {"oneOf": [_given(["responseVariable"], ["responseVariables"]),
                                _given(["responseVariables"], ["responseVariable"])]},
    "CatVariable": {"oneOf": [_given(["candidateResponse"], ["value"]), _given(["value"], ["candidateResponse"])]},
}


def _policy_names(node: Any, names: list[str]) -> None:
    """A policy is one of ``names``, not any string."""
    for option in node.get("anyOf", [node]):
        if option.get("type") == "string":
            option.pop("minLength", None), option.pop("maxLength", None)
            option["enum"] = names
        elif option.get("type") == "array":
            option["items"] = {"type": "string", "enum": names}


# Requests name a registered policy (service/engine/policies.py) or `auto`; responses show the
# registered policy that runs.
REQUESTS_NAMING_POLICIES = ("SessionCreate", "SelectRequest", "EvaluateRequest", "CatSectionConfig")
# The protocol façades (service/adapters/): their refusals are in their standard's shape.
CAT_PREFIX = "/ims/cat/"


def _schemas() -> dict[str, Any]:
    _, schema = models_json_schema(
        [(Instance, "validation"), (SessionCreate, "validation"), (SelectRequest, "validation"),
         (ObservationsRequest, "validation"), (ObservationCorrection, "validation"),
         (InstanceSummary, "serialization"), (InstanceDetail, "serialization"), (InstanceList, "serialization"),
         (SessionState, "serialization"), (StepState, "serialization"), (Problem, "serialization"),
         (EvaluateRequest, "validation"),
         (CatSectionIn, "validation"), (CatSessionIn, "validation"), (CatResultsIn, "validation"),
         (CatSectionCreated, "serialization"), (CatSectionOut, "serialization"),
         (CatSessionCreated, "serialization"), (CatResultsOut, "serialization"), (ImsxStatusInfo, "serialization")],
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
                _policy_names(definition["properties"][field],
                              policy_names() if name in REQUESTS_NAMING_POLICIES else sorted(POLICIES))
    return schemas


# The methods of a path in the order the contract lists them.
METHOD_ORDER = ("get", "put", "post", "delete", "patch")


def paths_of(app: Flask) -> dict[str, Any]:
    """Every route of ``app`` but the pages for people, in the order the app registers them, as
    OpenAPI path items of its views' operations (a copy: the build adds the common refusals).
    A route whose view has no ``@operation`` is an error naming it."""
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.split(".")[0] in PAGE_BLUEPRINTS:
            continue
        spec = operation_of(app.view_functions[rule.endpoint])
        if spec is None:
            raise LookupError(f"the view {rule.endpoint} ({rule.rule}) has no @operation "
                              "(service/api/contract.py says how to add an endpoint)")
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)  # <path:test> is {test}
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = copy.deepcopy(spec)
    return {path: dict(sorted(item.items(), key=lambda entry: METHOD_ORDER.index(entry[0])))
            for path, item in paths.items()}


def cat_refusals(*statuses: int) -> dict[str, Any]:
    return {str(status): {"$ref": f"#/components/responses/CatStatus{status}"} for status in statuses}


def cat_status(status: int, problem: dict[str, Any]) -> dict[str, Any]:
    """A refusal on the CAT paths: imsx_StatusInfo; those made below the application (the
    worker's) are problem+json there too."""
    response = copy.deepcopy(problem)
    content = {"application/json": {"schema": ref("ImsxStatusInfo")}}
    if status in BELOW_THE_APPLICATION:
        content.update(response["content"])
    response["content"] = content
    return response


def build_spec() -> dict[str, Any]:
    paths = paths_of(create_app({"redis_url": None}))
    # With API keys on every /v1 route may answer 401, and with a rate limit 429; every route
    # that writes may meet a full store (507), and any request the refusals below the
    # application. The key is optional (``{}``): a service without API_KEYS takes anonymous
    # requests.
    for path, item in paths.items():
        for method, operation in item.items():
            if path.startswith(FHIR_PREFIX):
                # The views list their refusals (OperationOutcomes); those made below the
                # application, by the worker, are problem+json on every path.
                if path not in OPEN_PATHS:
                    operation["security"] = [{"bearerApiKey": []}, {}]
                below = problems(*BELOW_THE_APPLICATION)
                operation["responses"] = dict(sorted({**below, **operation["responses"]}.items()))
                continue
            refused = cat_refusals if path.startswith(CAT_PREFIX) else problems
            extra = refused(*BELOW_THE_APPLICATION)
            if path.startswith(("/v1/", CAT_PREFIX)):
                extra.update(refused(401, 429))
                operation["security"] = [{"bearerApiKey": []}, {}]
            if method in ("post", "delete"):
                extra.update(refused(507))
            operation["responses"] = dict(sorted({**operation["responses"], **extra}.items()))
    problem_responses = {}
    for status, text in STATUS_TEXT.items():
        response: dict[str, Any] = {"description": text,
                                    "content": {"application/problem+json": {"schema": ref("Problem")}}}
        if status in (429, 503, 507):
            response["headers"] = {"Retry-After": HEADER["Retry-After"]}
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"description": 'Bearer realm="edgecut"',
                                                        "schema": {"type": "string"}}}
        if status == 405:
            response["headers"] = {"Allow": {"description": "The allowed methods", "schema": {"type": "string"}}}
        problem_responses[f"Problem{status}"] = response
        problem_responses[f"CatStatus{status}"] = cat_status(status, response)
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
