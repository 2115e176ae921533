"""Operations: ``/healthz`` (the process answers; no store needed), ``/readyz`` (the store
answers), ``/metrics`` (Prometheus), ``/openapi.yaml`` (the contract). The per-request
instrumentation behind the metrics is in service/api/observability.py."""

from __future__ import annotations

import logging
from importlib import resources

from flask import Blueprint, Response

from service.metrics import render
from service.store import StoreUnavailable

from .context import services
from .contract import json_body, operation, problems
from .problems import problem_response
from .responses import json_response

bp = Blueprint("health", __name__)
log = logging.getLogger(__name__)


@bp.get("/healthz")
@operation("healthz", "operations", "The process answers (no store needed)",
           responses={"200": json_body({"type": "object", "properties": {"status": {"const": "ok"}},
                                        "required": ["status"]}, "Alive"), **problems(500)})
def healthz() -> Response:
    return json_response({"status": "ok"}, headers={"Cache-Control": "no-store"})


@bp.get("/readyz")
@operation("readyz", "operations", "The store answers",
           responses={"200": json_body({"type": "object", "properties": {"status": {"const": "ready"}},
                                        "required": ["status"]}, "Ready"), **problems(500, 503)})
def readyz() -> Response:
    try:
        services().store.ping()
    except StoreUnavailable as error:
        # Open to anyone: say only "not ready"; where the store lives and why goes to the log.
        log.warning("not ready: %s", error)
        return problem_response("store-unavailable", "the session store does not answer",
                                headers={"Retry-After": str(services().settings.retry_after_seconds)})
    return json_response({"status": "ready"}, headers={"Cache-Control": "no-store"})


@bp.get("/metrics")
@operation("metrics", "operations", "Prometheus metrics",
           responses={"200": {"description": "Prometheus text exposition format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}, **problems(500)})
def metrics() -> Response:
    body, content_type = render()
    return Response(body, content_type=content_type)


@bp.get("/openapi.yaml")
@operation("openapi", "operations", "This contract",
           responses={"200": {"description": "OpenAPI 3.1",
                              "content": {"application/yaml": {"schema": {"type": "string"}}}}, **problems(500)})
def openapi() -> Response:
    return Response(openapi_text(), content_type="application/yaml")


def openapi_text() -> bytes:
    """The contract shipped inside the package (service/openapi.yaml; the repo root's
    openapi.yaml is a link to it), so ``pip install .`` serves the same file."""
    return resources.files("service").joinpath("openapi.yaml").read_bytes()

