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
from .encoding import json_response
from .problems import problem_response

bp = Blueprint("health", __name__)
log = logging.getLogger(__name__)


@bp.get("/healthz")
def healthz() -> Response:
    return json_response({"status": "ok"}, headers={"Cache-Control": "no-store"})


@bp.get("/readyz")
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
def metrics() -> Response:
    body, content_type = render()
    return Response(body, content_type=content_type)


@bp.get("/openapi.yaml")
def openapi() -> Response:
    return Response(openapi_text(), content_type="application/yaml")


def openapi_text() -> bytes:
    """The contract shipped inside the package (service/openapi.yaml; the repo root's
    openapi.yaml is a link to it), so ``pip install .`` serves the same file."""
    return resources.files("service").joinpath("openapi.yaml").read_bytes()

