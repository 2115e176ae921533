"""The one place where errors become RFC 9457 ``application/problem+json`` responses.

Every error the service can raise carries a stable ``code`` (engine errors, service errors,
request errors); :data:`PROBLEMS` maps each code to its status and title, and the problem's
``type`` is ``urn:edgecut:problem:<code>``. Anything else is a bug: it is logged with its
traceback and answered as a bare 500, never with details.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from schemas.api import Problem
from service.engine import EngineError
from service.errors import ServiceError
from service.store import StoreUnavailable

from .encoding import RequestValidationFailed, json_response

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:edgecut:problem:"

# code → (status, title). docs/api.md and openapi.yaml list the same table.
PROBLEMS: dict[str, tuple[int, str]] = {
    "bad-request": (400, "Bad request"),
    "malformed-json": (400, "Malformed JSON"),
    "invalid-header": (400, "Invalid header"),
    "invalid-parameter": (400, "Invalid query parameter"),
    "unauthorized": (401, "Unauthorized"),
    "not-found": (404, "Not found"),
    "instance-not-found": (404, "Instance not found"),
    "session-not-found": (404, "Session not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "conflicting-observation": (409, "Conflicting observation"),
    "inconsistent": (409, "Inconsistent observation"),
    "session-done": (409, "Session is done"),
    "concurrent-update": (409, "Concurrent update"),
    "idempotency-key-reused": (409, "Idempotency key reused"),
    "instance-expired": (410, "Instance expired"),
    "precondition-failed": (412, "Precondition failed"),
    "body-too-large": (413, "Request body too large"),
    "instance-too-large": (413, "Instance too large"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "limit-exceeded": (413, "Over a service limit"),
    "rate-limited": (429, "Too many requests"),
    "validation-error": (422, "Invalid request"),
    "unknown-test": (422, "Unknown test"),
    "unknown-outcome": (422, "Unknown outcome"),
    "unknown-policy": (422, "Unknown policy"),
    "policy-not-applicable": (422, "Policy not applicable"),
    "infeasible": (422, "Infeasible computation"),
    "evaluation-limit": (422, "Evaluation beyond its limits"),
    "tree-too-large": (422, "Policy tree too large"),
    "engine-error": (422, "Request refused"),
    "service-error": (400, "Request refused"),
    "internal-error": (500, "Internal server error"),
    "graphviz-missing": (501, "Graphviz not installed"),
    "store-unavailable": (503, "Store unavailable"),
}

# Werkzeug's own HTTP errors (routing, body limit) by status.
_HTTP_CODES = {400: "bad-request", 404: "not-found", 405: "method-not-allowed", 413: "body-too-large",
               415: "unsupported-media-type"}


def problem_response(code: str, detail: str, errors: list[dict[str, str]] | None = None,
                     headers: dict[str, str] | None = None, status: int | None = None) -> Response:
    known_status, title = PROBLEMS.get(code, (status or 500, "Error"))
    status = status or known_status
    body = Problem(type=TYPE_PREFIX + code, title=title, status=status, detail=detail, errors=errors)
    return json_response(body, status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def register_problems(app: Flask, retry_after_seconds: int = 1) -> None:
    @app.errorhandler(RequestValidationFailed)
    def _validation(error: RequestValidationFailed) -> Response:
        return problem_response(error.code, str(error), errors=error.errors)

    @app.errorhandler(EngineError)
    @app.errorhandler(ServiceError)
    def _domain(error: EngineError | ServiceError) -> Response:
        return problem_response(error.code if error.code in PROBLEMS else "service-error", str(error))

    @app.errorhandler(StoreUnavailable)
    def _store_unavailable(error: StoreUnavailable) -> Response:
        log.warning("store unavailable: %s", error)
        return problem_response("store-unavailable", "the session store is unavailable; retry shortly",
                                headers={"Retry-After": str(retry_after_seconds)})

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException) -> Response:
        status = error.code or 500
        code = _HTTP_CODES.get(status)
        headers = {}
        if status == 405:
            headers = {k: v for k, v in error.get_headers() if k.lower() == "allow"}
        if code == "not-found":
            detail = f"no resource at {request.path}"
        elif code == "method-not-allowed":
            detail = f"{request.method} is not allowed on {request.path}"
        elif code == "body-too-large":
            detail = f"the body exceeds the limit of {request.max_content_length} bytes"
        else:
            detail = error.description or error.name
        if code is None:
            return problem_response("http-error", detail, status=status, headers=headers)
        return problem_response(code, detail, headers=headers)

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return problem_response("internal-error", "an unexpected error occurred; it has been logged")
