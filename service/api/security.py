"""What stands in front of every ``/v1`` handler, installed by :func:`install` from create_app:

1. API keys (service/api/auth.py): 401 without a valid ``Authorization: Bearer``; sets the
   request's tenant. Failed attempts are counted per client address (``AUTH_FAILURE_LIMIT``,
   the same GCRA as rate limits): past it, every ``/v1`` request from that address is 429 with
   ``Retry-After`` *before* its key is looked at, so guessing keys gets no faster by sending more;
2. the tenant's rate limit (GCRA, service/store/ratelimit.py; kept where the store keeps its
   data): 429 with ``Retry-After``;
3. CORS for browser front ends (flask-cors) on the API and its façades (``PROTECTED_PREFIXES``:
   ``/v1``, ``/ims/cat``, ``/fhir``) and ``/openapi.yaml``, exposing ``ETag`` and ``Retry-After``.

Body limits are checked where the body is parsed (service/api/limits.py via parse_body).
``/fhir`` is guarded as ``/v1`` is, but for its CapabilityStatement (``/fhir/metadata``).
Operations routes (/healthz, /readyz, /metrics, /openapi.yaml) stay open: probes and scrapers
carry no keys, and none of them touches tenant data.
"""

from __future__ import annotations

import math

from flask import Flask, Response, g, request
from flask_cors import CORS

from service.settings import Settings
from service.store import SessionStore
from service.store.ratelimit import AUTH_FAILURES, REQUESTS, RateLimiter, parse_rate

from . import auth
from .problems import problem_response

# The API and the protocol façades served over it (service/adapters/).
PROTECTED_PREFIXES = ("/v1/", "/ims/cat/", "/fhir/")
# FHIR's CapabilityStatement is what a client reads before it authenticates; it holds no tenant data.
OPEN_PATHS = ("/fhir/metadata",)
EXPOSED_HEADERS = ["ETag", "Retry-After", "Location", "Idempotent-Replayed", "WWW-Authenticate"]
ALLOWED_HEADERS = ["Authorization", "Content-Type", "If-Match", "Idempotency-Key"]
# Every method a route under PROTECTED_PREFIXES answers (tests/test_security.py checks them against the routes).
ALLOWED_METHODS = ["GET", "PUT", "POST", "DELETE", "OPTIONS"]
CORS_MAX_AGE = 600


def _protected() -> bool:
    # Preflights carry no credentials by design (Fetch standard); flask-cors answers them.
    path = request.path
    return ((path.startswith(PROTECTED_PREFIXES) or path == "/v1") and path not in OPEN_PATHS
            and request.method != "OPTIONS")


def _limiter(store: SessionStore, rate_limit: str | None, burst: int | None, scope: str) -> RateLimiter | None:
    return store.rate_limiter(parse_rate(rate_limit, burst), scope) if rate_limit else None


def install(app: Flask, settings: Settings, store: SessionStore) -> None:
    keyring = auth.load_keyring(settings)
    limiter = _limiter(store, settings.rate_limit, settings.rate_limit_burst, REQUESTS)
    failures = None if keyring is None else _limiter(store, settings.auth_failure_limit, None, AUTH_FAILURES)
    app.extensions["edgecut.security"] = {"keyring": keyring, "limiter": limiter, "auth_failures": failures}

    if keyring is not None:
        @app.before_request
        def _authenticate() -> Response | None:
            if not _protected():
                return None
            address = request.remote_addr or "unknown"
            if failures is not None:
                waited = failures.wait_seconds(address, count=False)
                if waited > 0:
                    return _throttled(f"too many failed authentications from this address "
                                      f"({settings.auth_failure_limit}; AUTH_FAILURE_LIMIT)", waited)
            token = auth.bearer_token(request.headers.get("Authorization"))
            tenant = keyring.tenant_of(token) if token is not None else None
            if tenant is None:
                if failures is not None:
                    failures.wait_seconds(address)  # counts this failure
                detail = ("send Authorization: Bearer <API key>" if token is None
                          else "the API key is not valid")
                return problem_response("unauthorized", detail,
                                        headers={"WWW-Authenticate": auth.challenge(invalid=token is not None)})
            g.tenant = tenant
            return None

    if limiter is not None:
        @app.before_request
        def _rate_limit() -> Response | None:
            if not _protected():
                return None
            from .context import tenant

            waited = limiter.wait_seconds(tenant())
            if waited > 0:
                return _throttled(f"over this tenant's rate limit ({settings.rate_limit}, bursts of "
                                  f"{limiter.rate.burst}; RATE_LIMIT)", waited)
            return None

    if settings.cors_origins:
        origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
        # Every path an API key guards (SMART on FHIR apps and assessment players run in the
        # browser too), and the contract a browser client reads first.
        CORS(app, resources={**{prefix + "*": {} for prefix in PROTECTED_PREFIXES}, "/openapi.yaml": {}},
             origins="*" if "*" in origins else origins, expose_headers=EXPOSED_HEADERS,
             allow_headers=ALLOWED_HEADERS, methods=ALLOWED_METHODS,
             max_age=CORS_MAX_AGE, supports_credentials=False)


def retry_after(seconds: float) -> str:
    """Whole seconds, rounded up, at least 1 (RFC 9110 §10.2.3 allows no fractions)."""
    return str(max(1, math.ceil(seconds)))


def _throttled(why: str, waited: float) -> Response:
    """429 with the seconds to wait, in the detail and in ``Retry-After``."""
    return problem_response("rate-limited", f"{why}; retry after {waited:.3f} s",
                            headers={"Retry-After": retry_after(waited)})
