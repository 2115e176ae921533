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

from schemas.api import ObservationCorrection, ObservationsRequest, SessionCreate
from service.errors import PreconditionFailed
from service.sessions import SessionResult

from .context import sessions, tenant
from .encoding import InvalidHeaderValue, InvalidParameter, flag, json_response, parse_body

bp = Blueprint("sessions", __name__, url_prefix="/v1/sessions")

IDEMPOTENCY_KEY_MAX = 255
# Far above any session's answers to one test (MAX_OBSERVATIONS_PER_REQUEST per request).
MAX_OCCURRENCE = 10**9


def _etag(version: int) -> str:
    return f'"{version}"'


def _if_match() -> Callable[[int], bool] | None:
    given = request._get_current_object().environ.get("HTTP_IF_MATCH")  # without parsing every header
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
def create() -> Response:
    request_body = parse_body(SessionCreate)
    result = sessions().create(request_body, _idempotency_key(), tenant(), explain=flag("explain"))
    return _respond(result, 201)


@bp.get("/<session_id>")
def show(session_id: str) -> Response:
    return _respond(sessions().get(session_id, tenant(), explain=flag("explain")))


@bp.delete("/<session_id>")
def delete(session_id: str) -> Response:
    sessions().delete(session_id, tenant(), if_match=_if_match())
    return Response(status=204, content_type=None)


@bp.post("/<session_id>/observations")
def observe(session_id: str) -> Response:
    posted = parse_body(ObservationsRequest)
    result = sessions().observe(session_id, posted.labelled(), tenant(), if_match=_if_match(),
                                explain=flag("explain"))
    return _respond(result)


def _occurrence() -> int | None:
    raw = request.args.get("occurrence")
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_OCCURRENCE:
        raise InvalidParameter(f"occurrence must be a whole number from 1 to {MAX_OCCURRENCE}, got {raw!r}")
    return int(raw)


@bp.put("/<session_id>/observations/<path:test>")
def correct(session_id: str, test: str) -> Response:
    correction = parse_body(ObservationCorrection)
    result = sessions().correct(session_id, test, correction, _occurrence(), tenant(), if_match=_if_match(),
                                explain=flag("explain"))
    return _respond(result)


@bp.delete("/<session_id>/observations/<path:test>")
def withdraw(session_id: str, test: str) -> Response:
    result = sessions().withdraw(session_id, test, _occurrence(), tenant(), if_match=_if_match(),
                                 explain=flag("explain"))
    return _respond(result)
