"""What every request leaves behind: a request id (the client's ``X-Request-ID`` when it sends
a sane one, else a new one) echoed in the response header and in problem+json bodies, one
access-log line, and the Prometheus counters by route template (bounded label values, not raw
paths)."""

from __future__ import annotations

import logging
import os
import re
import time

from flask import Flask, Response, g, request

from service.metrics import REQUEST_SECONDS, REQUESTS
from service.settings import Settings
from service.store import DEFAULT_TENANT

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID_ENVIRON = "HTTP_X_REQUEST_ID"  # the header as WSGI names it
# Sane: short, and only characters that cannot forge log lines or headers.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

access_log = logging.getLogger("service.access")


def request_id() -> str | None:
    return g.get("request_id")


def install(app: Flask, settings: Settings) -> None:
    """Register first, so the id exists before any other hook can refuse the request."""
    # The labelled series, looked up once each: prometheus_client's labels() costs as much as the
    # increment itself. Keys are bounded (route templates × methods × statuses).
    counters: dict[tuple[str, str, str], object] = {}
    histograms: dict[tuple[str, str], object] = {}

    @app.before_request
    def _start() -> None:
        context = g
        context.request_started = time.perf_counter()
        given = request.environ.get(_REQUEST_ID_ENVIRON, "")
        # 128 random bits as 32 hex digits (a uuid4's hex, without uuid's own overhead).
        context.request_id = given if _SANE_REQUEST_ID.fullmatch(given) else os.urandom(16).hex()
        context.tenant = DEFAULT_TENANT  # an API key, when keys are on, names another (security.py)

    @app.after_request
    def _finish(response: Response) -> Response:
        context, served = g, request
        started = context.pop("request_started", None)
        route = served.url_rule.rule if served.url_rule is not None else "<unmatched>"
        status = response.status_code
        key = (route, served.method, str(status))
        counter = counters.get(key) or counters.setdefault(key, REQUESTS.labels(*key))
        counter.inc()
        if started is None:
            return response
        seconds = time.perf_counter() - started
        histogram = histograms.get(key[:2]) or histograms.setdefault(key[:2], REQUEST_SECONDS.labels(*key[:2]))
        histogram.observe(seconds)
        request_id = context.get("request_id")
        if request_id is not None:
            response.headers[REQUEST_ID_HEADER] = request_id
        if settings.access_log and access_log.isEnabledFor(logging.INFO):
            access_log.info("%s %s %d", served.method, served.path, status,
                            extra={"status": status, "duration_ms": round(seconds * 1000, 3)})
        return response
