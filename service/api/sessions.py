"""``/v1/sessions``: create, read, delete a session; post observations to it; correct
(``PUT``) or withdraw (``DELETE``) one recorded observation.

Every session response carries ``ETag: "<version>"``; ``If-Match`` is honoured on every write
(412 on a stale tag, except for a replay of a change already applied, which RFC 9110 §13.1.1
allows to answer 200), and required (428) where a retry could apply a change twice: answers to
repeatable tests and withdrawals of one of their answers.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, Response, request, url_for

from schemas.api import MAX_OBSERVATIONS_PER_REQUEST, ObservationCorrection, ObservationsRequest, SessionCreate
from service.errors import PreconditionFailed
from service.sessions import SessionResult

from .context import no_content, sessions, tenant
from .contract import EXPLAIN, HEADER, TRIAGE_EXAMPLE, json_body, operation, problems, ref, request_body
from .bodies import parse_body
from .errors import InvalidHeaderValue, InvalidParameter
from .query import flag
from .responses import json_response

bp = Blueprint("sessions", __name__, url_prefix="/v1/sessions")

IDEMPOTENCY_KEY_MAX = 255
# Far above any session's answers to one test (MAX_OBSERVATIONS_PER_REQUEST per request).
MAX_OCCURRENCE = 10**9

SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
TEST_ID = {"name": "test", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "The test whose recorded observation is corrected or withdrawn"}
OCCURRENCE = {"name": "occurrence", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1},
              "description": "Which answer of a test answered several times (repeatable tests): 1 is the first"}
IF_MATCH = {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string", "minLength": 1},
            "description": 'A previous ETag (e.g. `"3"`); 412 when the session has moved on'}
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX,
                              "pattern": "^[\\x20-\\x7e]+$"},
                   "description": "A retried create with the same key answers the same session"}
SESSION = json_body(ref("SessionState"), "The session's state", {"ETag": HEADER["ETag"]})


def _etag(version: int) -> str:
    return f'"{version}"'


def _if_match() -> Callable[[int], bool] | None:
    given = request.environ.get("HTTP_IF_MATCH")
    if given is None:
        return None
    if not given.strip():
        # Names no version at all: refused whatever the session holds (the contract says minLength 1).
        raise PreconditionFailed("If-Match is empty; send the ETag of the version you read, or leave it out")
    tags = request.if_match  # werkzeug's parse: "*", strong and weak tags
    if tags.star_tag:
        # "*" matches any current representation, and every write here needs the session to
        # exist anyway: it names no version, so it cannot make a repeated write safe either.
        return None

    def matches(version: int) -> bool:
        return tags.contains(str(version))  # strong comparison (RFC 9110 §13.1.1)

    return matches


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not (0 < len(key) <= IDEMPOTENCY_KEY_MAX) or not key.isascii() or not key.isprintable():
        raise InvalidHeaderValue(f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters")
    return key


def _respond(result: SessionResult, status: int = 200) -> Response:
    headers = {"ETag": _etag(result.version), "Cache-Control": "no-store"}
    if status == 201:
        headers["Location"] = url_for(".show", session_id=result.state["session_id"])
    if result.replayed:
        headers["Idempotent-Replayed"] = "true"
    return json_response(result.body, status, headers=headers)


@bp.post("")
@operation("createSession", "sessions", "Start a session on a stored or inline instance",
           parameters=[IDEMPOTENCY_KEY, EXPLAIN],
           body=request_body("SessionCreate", "Exactly one of instance_id and instance; policy and stop rules",
                             {"instance": TRIAGE_EXAMPLE, "policy": "ec2"}),
           responses={"201": json_body(ref("SessionState"), "Created; the session's first state",
                                       {"ETag": HEADER["ETag"], "Location": HEADER["Location"],
                                        "Idempotent-Replayed": HEADER["Idempotent-Replayed"]}),
                      **problems(400, 404, 409, 410, 413, 415, 422, 500, 503)})
def create() -> Response:
    request_body = parse_body(SessionCreate)
    result = sessions().create(request_body, _idempotency_key(), tenant(), explain=flag("explain"))
    return _respond(result, 201)


@bp.get("/<session_id>")
@operation("getSession", "sessions", "A session's state", parameters=[SESSION_ID, EXPLAIN],
           responses={"200": SESSION, **problems(400, 404, 410, 500, 503)})
def show(session_id: str) -> Response:
    return _respond(sessions().get(session_id, tenant(), explain=flag("explain")))


@bp.delete("/<session_id>")
@operation("deleteSession", "sessions", "Delete a session", parameters=[SESSION_ID, IF_MATCH],
           responses={"204": {"description": "Deleted"}, **problems(404, 412, 500, 503)})
def delete(session_id: str) -> Response:
    sessions().delete(session_id, tenant(), if_match=_if_match())
    return no_content()


@bp.post("/<session_id>/observations")
@operation("postObservations", "sessions", "Record one observation or several (in order, all or nothing)",
           description=("An observation is an answer {test, outcome} or a skip {test, skip: true}. "
                        "Re-posting a recorded observation is a no-op (200), except an answer to a repeatable "
                        "test, which counts again and so requires If-Match (428 without it). The same test "
                        "with another outcome, anything new after the session is done (but the rest of a "
                        "batch session's last page), and an observation contradicting every remaining "
                        "hypothesis are 409, and nothing is stored. At most "
                        f"{MAX_OBSERVATIONS_PER_REQUEST} observations per request; a session holds at most "
                        "SESSION_MAX_OBSERVATIONS (413 naming the first posted past it), and a batch is refused "
                        "422 infeasible once it has worked SESSION_TIME_LIMIT seconds."),
           parameters=[SESSION_ID, IF_MATCH, EXPLAIN],
           body=request_body("ObservationsRequest", "{test, outcome}, {test, skip: true} or {observations: [...]} "
                             "of those", {"test": "ecg", "outcome": "abnormal"}),
           responses={"200": SESSION, **problems(400, 404, 409, 410, 412, 413, 415, 422, 428, 500, 503)})
def observe(session_id: str) -> Response:
    posted = parse_body(ObservationsRequest)
    result = sessions().observe(session_id, posted.labelled(), tenant(), if_match=_if_match(),
                                explain=flag("explain"), listed=posted.observations is not None)
    return _respond(result)


def _occurrence() -> int | None:
    raw = request.args.get("occurrence")
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_OCCURRENCE:
        raise InvalidParameter(f"occurrence must be a whole number from 1 to {MAX_OCCURRENCE}, got {raw!r}")
    return int(raw)


@bp.put("/<session_id>/observations/<path:test>")
@operation("correctObservation", "sessions", "Replace a recorded observation's outcome (or make it a skip)",
           description=("Everything is recomputed from the corrected facts; a done session may go on "
                        "again. Idempotent: the same correction again changes nothing (200). 409 "
                        "inconsistent when no hypothesis would be left, and nothing is stored."),
           parameters=[SESSION_ID, TEST_ID, OCCURRENCE, IF_MATCH, EXPLAIN],
           body=request_body("ObservationCorrection", "{outcome} or {skip: true}", {"outcome": "normal"}),
           responses={"200": SESSION, **problems(400, 404, 409, 410, 412, 413, 415, 422, 500, 503)})
def correct(session_id: str, test: str) -> Response:
    correction = parse_body(ObservationCorrection)
    result = sessions().correct(session_id, test, correction, _occurrence(), tenant(), if_match=_if_match(),
                                explain=flag("explain"))
    return _respond(result)


@bp.delete("/<session_id>/observations/<path:test>")
@operation("withdrawObservation", "sessions", "Withdraw a recorded observation; the state is recomputed without it",
           description=("A retry answers 404 observation-not-found (nothing changes). Withdrawing "
                        "one answer of a repeatable test requires If-Match (428 without it)."),
           parameters=[SESSION_ID, TEST_ID, OCCURRENCE, IF_MATCH, EXPLAIN],
           responses={"200": SESSION, **problems(400, 404, 409, 410, 412, 422, 428, 500, 503)})
def withdraw(session_id: str, test: str) -> Response:
    result = sessions().withdraw(session_id, test, _occurrence(), tenant(), if_match=_if_match(),
                                 explain=flag("explain"))
    return _respond(result)
