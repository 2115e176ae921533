"""Answers the worker gives below the application: RFC 9457 problem+json, as whole HTTP/1.1
responses, and gunicorn's parse errors mapped to the problem codes of service/api/problems.py."""

from __future__ import annotations

from gunicorn.http import errors as http_errors

from schemas.responses import Problem
from service.api.responses import dumps
from service.api.problems import PROBLEM_MEDIA_TYPE, PROBLEMS, TYPE_PREFIX


def problem_message(code: str, detail: str, headers: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 response carrying the problem ``code`` (service/api/problems.py's
    table), closing the connection: what is left on it cannot be trusted to be a request."""
    status, title, _ = PROBLEMS[code]
    body = dumps(Problem(type=TYPE_PREFIX + code, title=title, status=status, detail=detail, errors=None)
                 .model_dump(exclude_none=True))
    lines = [f"HTTP/1.1 {status} {title}", f"Content-Type: {PROBLEM_MEDIA_TYPE}", f"Content-Length: {len(body)}",
             "Connection: close", "Cache-Control: no-store", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# gunicorn's parse errors → (problem code, detail shown). The detail is gunicorn's own message,
# cut short: it quotes at most a few bytes of what the client sent.
def refusal_for(exc: BaseException) -> tuple[str, str]:
    e = http_errors
    if isinstance(exc, (e.ConfigurationProblem, e.InvalidResponseHeader, e.InvalidResponseHeaderName)):
        return "internal-error", "an unexpected error occurred; it has been logged"  # ours, not the client's
    if isinstance(exc, e.LimitRequestLine):
        return "uri-too-long", f"the request line is too long: {exc}"
    if isinstance(exc, e.LimitRequestHeaders):
        return "headers-too-large", f"the request's headers are too large: {exc}"
    if isinstance(exc, e.UnsupportedTransferCoding):
        return "unsupported-transfer-coding", str(exc)
    if isinstance(exc, e.ExpectationFailed):
        return "expectation-failed", str(exc)
    if isinstance(exc, (e.ParseException, UnicodeError)):
        return "bad-request", f"the request is not valid HTTP/1.1: {exc}"
    return "internal-error", "an unexpected error occurred; it has been logged"
