"""Each view's part of the HTTP contract, declared beside the view with :func:`operation`;
service/api/openapi.py walks the app's routes and assembles openapi.yaml from them (the path and
its methods come from the route, everything else from here).

Adding an endpoint (tests/test_openapi.py fails until each step is done):

1. write the view in its blueprint's module, under its route, with ``@operation(...)``: its id,
   tag, summary, parameters, body and the statuses it answers (the refusals common to every
   route — 401/429 on ``/v1``, 507 on writes, those below the application — are added for you);
2. register a new blueprint in service/app.py;
3. regenerate: ``python3 -m service.api.openapi > service/openapi.yaml``.

Metadata is a plain dict on the view, not a library's model: the wire schemas already come from
the pydantic models (``models_json_schema``), so all a view adds is what only it knows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

View = TypeVar("View", bound=Callable[..., Any])

OPERATION_ATTRIBUTE = "openapi_operation"
REF = "#/components/schemas/{model}"


def operation(operation_id: str, tag: str, summary: str, *, responses: dict[str, Any],
              description: str | None = None, parameters: Sequence[dict[str, Any]] = (),
              body: dict[str, Any] | None = None) -> Callable[[View], View]:
    """Attach the view's OpenAPI operation object (the keys in the order openapi.yaml lists them)."""
    spec: dict[str, Any] = {"operationId": operation_id, "tags": [tag], "summary": summary}
    if description is not None:
        spec["description"] = description
    if parameters:
        spec["parameters"] = list(parameters)
    if body is not None:
        spec["requestBody"] = body
    spec["responses"] = responses

    def attach(view: View) -> View:
        setattr(view, OPERATION_ATTRIBUTE, spec)
        return view

    return attach


def operation_of(view: Callable[..., Any]) -> dict[str, Any] | None:
    return getattr(view, OPERATION_ATTRIBUTE, None)


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def json_body(schema: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """A response whose content is JSON of ``schema``."""
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def problems(*statuses: int) -> dict[str, Any]:
    """The problem+json responses for ``statuses`` (components/responses/Problem<status>)."""
    return {str(status): {"$ref": f"#/components/responses/Problem{status}"} for status in statuses}


def request_body(name: str, description: str, example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": ref(name)}
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
INSTANCE_ID = {"name": "instance_id", "in": "path", "required": True, "schema": {"type": "string"}}
EXPLAIN = {"name": "explain", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
           "description": "Also list the best-scoring candidate tests with their scores"}
