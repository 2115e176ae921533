"""Errors on ``/fhir`` paths as FHIR ``OperationOutcome`` resources, never problem+json.

Two sources: :class:`FhirError`, raised by the adapter itself with a FHIRPath ``expression``
naming the place in the posted resource; and every other refusal of the service (body limits,
media type, malformed JSON, API keys, rate limits, unknown instance, routing, a bug's 500), which
the service answers as problem+json and :func:`as_operation_outcome` rewrites: the same status
(but where FHIR's HTTP rules say otherwise, below), the problem's code mapped onto FHIR's
``IssueType`` (http://hl7.org/fhir/R4/valueset-issue-type.html).
"""

from __future__ import annotations

from typing import Any

import orjson
from flask import Response

FHIR_MEDIA_TYPE = "application/fhir+json"
PROBLEM_PREFIX = "urn:edgecut:problem:"

# Problem code → FHIR issue type, and the status on /fhir when it is not the problem's own. FHIR's
# HTTP rules: 400 for what cannot be parsed, 422 for what breaks a business rule (where /v1 says
# 409 for answers that contradict each other).
ISSUE_TYPES: dict[str, tuple[str, int | None]] = {
    "bad-request": ("structure", None),
    "malformed-json": ("structure", None),
    "validation-error": ("structure", 400),
    "invalid-header": ("value", None),
    "invalid-parameter": ("value", None),
    "unauthorized": ("login", None),
    "not-found": ("not-found", None),
    "instance-not-found": ("not-found", None),
    "method-not-allowed": ("not-supported", None),
    "unsupported-media-type": ("not-supported", None),
    "conflicting-observation": ("business-rule", 422),
    "inconsistent": ("business-rule", 422),
    "unknown-test": ("code-invalid", None),
    "unknown-outcome": ("code-invalid", None),
    "unknown-policy": ("not-supported", None),
    "policy-not-applicable": ("not-supported", None),
    "instance-expired": ("deleted", None),
    "instance-gone": ("deleted", None),
    "request-timeout": ("timeout", None),
    "body-too-large": ("too-costly", None),
    "instance-too-large": ("too-costly", None),
    "limit-exceeded": ("too-costly", None),
    "infeasible": ("too-costly", None),
    "rate-limited": ("throttled", None),
    "quota-exceeded": ("throttled", None),
    "store-unavailable": ("transient", None),
    "server-busy": ("transient", None),
    "store-full": ("transient", None),
    "internal-error": ("exception", None),
}


class FhirError(Exception):
    """A refusal of the FHIR adapter: HTTP ``status``, FHIR issue ``code``, what went wrong, and
    where (FHIRPath expressions into the posted resource)."""

    def __init__(self, status: int, code: str, diagnostics: str, *expression: str):
        super().__init__(diagnostics)
        self.status, self.code, self.diagnostics, self.expression = status, code, diagnostics, expression


def issue(code: str, diagnostics: str, expression: tuple[str, ...] | list[str] = (),
          severity: str = "error") -> dict[str, Any]:
    found: dict[str, Any] = {"severity": severity, "code": code, "diagnostics": diagnostics}
    if expression:
        found["expression"] = list(expression)
    return found


def outcome_response(status: int, issues: list[dict[str, Any]], headers: Any = None) -> Response:
    body = {"resourceType": "OperationOutcome", "issue": issues}
    return Response(orjson.dumps(body), status=status, headers=headers, content_type=FHIR_MEDIA_TYPE)


def error_response(error: FhirError) -> Response:
    return outcome_response(error.status, [issue(error.code, error.diagnostics, error.expression)])


def as_operation_outcome(response: Response) -> Response:
    """A problem+json response rewritten as an OperationOutcome (its headers kept: Allow,
    Retry-After, WWW-Authenticate, X-Request-ID)."""
    try:
        problem = orjson.loads(response.get_data())
    except orjson.JSONDecodeError:  # not ours to read: answered as what it says it is
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    code = str(problem.get("type", "")).removeprefix(PROBLEM_PREFIX)
    issue_type, status = ISSUE_TYPES.get(code, ("processing", None))
    detail = str(problem.get("detail") or problem.get("title") or "the request was refused")
    if problem.get("request_id"):
        detail += f" (request id {problem['request_id']})"
    errors = problem.get("errors") if isinstance(problem.get("errors"), list) else []
    issues = [issue(issue_type, detail)] + [
        issue(issue_type, str(e.get("message")), [str(e.get("path"))] if e.get("path") else ())
        for e in errors if isinstance(e, dict)]
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-type", "content-length")}
    return outcome_response(status or response.status_code, issues, headers)
