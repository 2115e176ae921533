"""What every request leaves behind: a request id (the client's ``X-Request-ID`` when it sends
a sane one, else a new one) echoed in the response header and in problem+json bodies, one
access-log line, and the Prometheus counters by route template (bounded label values, not raw
paths)."""

from __future__ import annotations

import logging
import re
import time
import uuid

from flask import Flask, Response, g, request

from service.metrics import REQUEST_SECONDS, REQUESTS
from service.settings import Settings
from service.store import DEFAULT_TENANT

REQUEST_ID_HEADER = "X-Request-ID"
# Sane: short, and only characters that cannot forge log lines or headers.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

access_log = logging.getLogger("service.access")


def request_id() -> str | None:
    return g.get("request_id")


def install(app: Flask, settings: Settings) -> None:
    """Register first, so the id exists before any other hook can refuse the request."""

    @app.before_request
    def _start() -> None:
        g.request_started = time.perf_counter()
        given = request.headers.get(REQUEST_ID_HEADER, "")
        g.request_id = given if _SANE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        g.tenant = DEFAULT_TENANT  # an API key, when keys are on, names another (security.py)

    @app.after_request
    def _finish(response: Response) -> Response:
        started = g.pop("request_started", None)
        route = request.url_rule.rule if request.url_rule is not None else "<unmatched>"
        REQUESTS.labels(route, request.method, str(response.status_code)).inc()
        if started is None:
            return response
        seconds = time.perf_counter() - started
        REQUEST_SECONDS.labels(route, request.method).observe(seconds)
        if "request_id" in g:
            response.headers[REQUEST_ID_HEADER] = g.request_id
        if settings.access_log:
            access_log.info("%s %s %d", request.method, request.path, response.status_code,
                            extra={"status": response.status_code, "duration_ms": round(seconds * 1000, 3)})
        return response
