"""The one place where errors become RFC 9457 ``application/problem+json`` responses.

Every error the service can raise carries a stable ``code`` (engine errors, service errors,
request errors); :data:`PROBLEMS` maps each code to its status and title, and the problem's
``type`` is ``urn:edgecut:problem:<code>``. Anything else is a bug: it is logged with its
traceback and answered as a bare 500, never with details.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flask import Flask, Response, g, has_request_context, request
from werkzeug.exceptions import HTTPException

from schemas.responses import Problem
from service.engine import EngineError, StopRuleNotApplicable
from service.errors import ServiceError
from service.store import QuotaExceeded, StoreFull, StoreUnavailable

from .responses import json_response

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:edgecut:problem:"

# code → (status, title, when a client gets it). openapi.yaml names every code, and docs/api.md's
# table is generated from this one (python3 -m service.api.reference).
PROBLEMS: dict[str, tuple[int, str, str]] = {
    "bad-request": (400, "Bad request",
                    "the request is malformed at the HTTP level: a bad `Content-Length`, both `Content-Length` "
                    "and `Transfer-Encoding`, a malformed chunk, a control character in a header"),
    "malformed-json": (400, "Malformed JSON",
                       "the body is not JSON (NaN, Infinity, invalid UTF-8 and nesting deeper than 1024 included)"),
    "invalid-header": (400, "Invalid header", "a bad `Idempotency-Key` or `If-Match`"),
    "invalid-parameter": (400, "Invalid query parameter",
                          "`explain`, `occurrence`, `limit`, `cursor` (or a tree parameter) not of its type"),
    "unauthorized": (401, "Unauthorized",
                     "API keys are on (`API_KEYS`) and no valid `Authorization: Bearer` key came"),
    "not-found": (404, "Not found", "no such route"),
    "instance-not-found": (404, "Instance not found",
                           "no such instance for this tenant (unknown, expired or deleted)"),
    "session-not-found": (404, "Session not found", "no such session for this tenant"),
    "section-not-found": (404, "Section not found", "a CAT section identifier that names no section"),
    "observation-not-found": (404, "Observation not found",
                              "a correction or withdrawal names a test with no recorded observation"),
    "method-not-allowed": (405, "Method not allowed", "with an `Allow` header"),
    "conflicting-observation": (409, "Conflicting observation",
                                "the test was already observed with another outcome; nothing is stored"),
    "inconsistent": (409, "Inconsistent observation",
                     "the observation contradicts every remaining hypothesis; nothing is stored"),
    "session-done": (409, "Session is done", "a new observation after the session stopped"),
    "concurrent-update": (409, "Concurrent update", "other writers kept winning; retry"),
    "idempotency-key-reused": (409, "Idempotency key reused",
                               "an `Idempotency-Key` already used for a different session request"),
    "ambiguous-observation": (409, "Ambiguous observation",
                              "a correction of a test answered several times without `?occurrence=`"),
    "instance-expired": (410, "Instance expired",
                         "the session's instance is no longer stored: post it again and start a new session"),
    "session-unreadable": (410, "Session unreadable",
                           "the stored session record is damaged (logged with the request id); start a new session"),
    "instance-gone": (410, "Instance deleted", "the session's instance was deleted (`DELETE /v1/instances/{id}`)"),
    "request-timeout": (408, "Request timeout",
                        "the whole request did not arrive within `REQUEST_READ_TIMEOUT` seconds; the connection is "
                        "closed"),
    "precondition-failed": (412, "Precondition failed", "`If-Match` names a stale version, or is empty"),
    "precondition-required": (428, "Precondition required",
                              "an answer to a repeatable test, or the withdrawal of one, without `If-Match`"),
    "body-too-large": (413, "Request body too large",
                       "the body is over `MAX_BODY_BYTES`, announced by `Content-Length` or as chunks arrive"),
    "instance-too-large": (413, "Instance too large",
                           "the compiled tensor (n·N, n·N·ℓ with likelihoods or `noise`, copies·N with "
                           "`max_flips`) over `MAX_CELLS`, or its bytes over `MAX_COMPILED_BYTES`"),
    "uri-too-long": (414, "Request line too long", "a request line over 4 094 bytes (e.g. an id of thousands of "
                                                   "characters)"),
    "unsupported-media-type": (415, "Unsupported media type",
                               "the body is not `application/json` (or `application/*+json`; `POST /v1/instances` "
                               "also takes `multipart/form-data`)"),
    "expectation-failed": (417, "Expectation failed", "an `Expect` header other than `100-continue`"),
    "limit-exceeded": (413, "Over a service limit", "over a `MAX_*` limit, named in `detail`"),
    "rate-limited": (429, "Too many requests",
                     "over the tenant's rate limit (`RATE_LIMIT`), or too many failed authentications from this "
                     "address (`AUTH_FAILURE_LIMIT`); retry after `Retry-After` seconds"),
    "quota-exceeded": (429, "Tenant quota exceeded",
                       "over `TENANT_MAX_INSTANCES` or `TENANT_MAX_SESSIONS`, named in `detail`; nothing is stored"),
    "headers-too-large": (431, "Request headers too large", "the header section is over gunicorn's limits"),
    "validation-error": (422, "Invalid request",
                         "the body breaks the wire schema; `errors` lists each problem with its JSON path"),
    "unknown-test": (422, "Unknown test",
                     "an observation or `exclude_tests` names a test the instance does not have"),
    "unknown-outcome": (422, "Unknown outcome", "an observation names an outcome its test does not have"),
    "item-not-asked": (422, "Item not asked", "CAT results answer an item that is not of the current stage"),
    "invalid-session-state": (422, "Invalid session state",
                              "a CAT `sessionState` missing, or not the one the CAT session's last results post returned"),
    "unknown-policy": (422, "Unknown policy", "no policy of that name"),
    "policy-not-applicable": (422, "Policy not applicable", "the policy needs another kind of instance"),
    "infeasible": (422, "Infeasible computation", "the exact computation asked for is beyond its limit"),
    "evaluation-limit": (422, "Evaluation beyond its limits", "an evaluation over an `EVALUATION_*` limit"),
    "tree-too-large": (422, "Policy tree too large", "a tree over `TREE_MAX_NODES` or `TREE_MAX_DEPTH`"),
    "engine-error": (422, "Request refused", "the engine refused the request (`detail` says why)"),
    "service-error": (400, "Request refused", "the service refused the request (`detail` says why)"),
    "internal-error": (500, "Internal server error", "a bug: logged with the request id, no details given"),
    "graphviz-missing": (501, "Graphviz not installed", "an SVG/PNG tree without Graphviz installed"),
    "unsupported-transfer-coding": (501, "Transfer coding not implemented",
                                    "a transfer coding other than chunked (refused 400 by the worker first)"),
    "store-unavailable": (503, "Store unavailable",
                          "Redis does not answer, or is loading, busy or read-only; `Retry-After` says when to retry"),
    "server-busy": (503, "Server busy",
                    "the worker already buffers `REQUEST_BUFFER_BYTES` of unfinished requests, or serves another "
                    "body of `BIG_REQUEST_BYTES` or more; retry after `Retry-After` seconds"),
    "store-full": (507, "Store full",
                   "Redis is at its `maxmemory`; nothing was written, reads go on; retry after `Retry-After` seconds"),
    "storage-quota-exceeded": (507, "Tenant storage quota exceeded",
                               "the tenant's stored instances would pass `TENANT_MAX_STORED_BYTES`; nothing is stored"),
}

# Werkzeug's own HTTP errors (routing, body limit) by status.
_HTTP_CODES = {400: "bad-request", 404: "not-found", 405: "method-not-allowed", 408: "request-timeout",
               413: "body-too-large", 415: "unsupported-media-type"}


def problem_response(code: str, detail: str, errors: list[dict[str, str]] | None = None,
                     headers: dict[str, str] | None = None, status: int | None = None) -> Response:
    known_status, title, _ = PROBLEMS.get(code, (status or 500, "Error", ""))
    status = status or known_status
    request_id = g.get("request_id") if has_request_context() else None
    body = Problem(type=TYPE_PREFIX + code, title=title, status=status, detail=detail, errors=errors,
                   request_id=request_id)
    return json_response(body, status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def answer_problems_as(app: Flask, prefix: str, rewrite: Callable[[Response], Response]) -> None:
    """Refusals under ``prefix`` (and at the prefix without its last slash) leave in another
    standard's error shape: ``rewrite`` turns the problem+json response into it. One hook for every
    façade, so only refusals pay for the check."""
    dialects = app.extensions.setdefault("problem_dialects", {})
    if not dialects:
        @app.after_request
        def _in_dialect(response: Response) -> Response:
            if response.mimetype != PROBLEM_MEDIA_TYPE:
                return response
            for known, rewrite_problem in dialects.items():
                if request.path.startswith(known) or request.path == known.rstrip("/"):
                    return rewrite_problem(response)
            return response
    dialects[prefix] = rewrite


def register_problems(app: Flask, retry_after_seconds: int = 1) -> None:
    @app.errorhandler(EngineError)
    @app.errorhandler(ServiceError)
    def _domain(error: EngineError | ServiceError) -> Response:
        errors = error.errors if isinstance(error, ServiceError) else None
        if isinstance(error, StopRuleNotApplicable) and error.path is not None:
            errors = [{"path": error.path, "message": str(error)}]
        return problem_response(error.code if error.code in PROBLEMS else "service-error", str(error), errors=errors)

    @app.errorhandler(StoreUnavailable)
    def _store_unavailable(error: StoreUnavailable) -> Response:
        log.warning("store unavailable: %s", error)
        if isinstance(error, StoreFull):
            return problem_response("store-full", "the session store is full; nothing was stored; retry later",
                                    headers={"Retry-After": str(retry_after_seconds)})
        return problem_response("store-unavailable", "the session store is unavailable; retry shortly",
                                headers={"Retry-After": str(retry_after_seconds)})

    @app.errorhandler(QuotaExceeded)
    def _quota(error: QuotaExceeded) -> Response:
        code = "storage-quota-exceeded" if error.setting == "TENANT_MAX_STORED_BYTES" else "quota-exceeded"
        return problem_response(code, f"{error}; stored instances expire after 2 × SESSION_TTL unused, sessions "
                                      "after SESSION_TTL, or delete sessions you no longer need")

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
