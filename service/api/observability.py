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
        g.request_started = time.perf_counter()
        given = request.headers.get(REQUEST_ID_HEADER, "")
        # 128 random bits as 32 hex digits (a uuid4's hex, without uuid's own overhead).
        g.request_id = given if _SANE_REQUEST_ID.fullmatch(given) else os.urandom(16).hex()
        g.tenant = DEFAULT_TENANT  # an API key, when keys are on, names another (security.py)

    @app.after_request
    def _finish(response: Response) -> Response:
        started = g.pop("request_started", None)
        route = request.url_rule.rule if request.url_rule is not None else "<unmatched>"
        key = (route, request.method, str(response.status_code))
        counter = counters.get(key) or counters.setdefault(key, REQUESTS.labels(*key))
        counter.inc()
        if started is None:
            return response
        seconds = time.perf_counter() - started
        histogram = histograms.get(key[:2]) or histograms.setdefault(key[:2], REQUEST_SECONDS.labels(*key[:2]))
        histogram.observe(seconds)
        if "request_id" in g:
            response.headers[REQUEST_ID_HEADER] = g.request_id
        if settings.access_log:
            access_log.info("%s %s %d", request.method, request.path, response.status_code,
                            extra={"status": response.status_code, "duration_ms": round(seconds * 1000, 3)})
        return response
