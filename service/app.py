"""The application factory: ``create_app(config)`` builds one Flask app with its own settings,
store and blueprints. Nothing is connected at import time; gunicorn calls
``service.app:create_app()`` in each worker."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from schemas.arrays import encode
from schemas.instance import Instance

from service.sessions import Sessions
from service.settings import Settings, load_settings
from service import engine
from service.store import Quotas, SessionStore, StoreUnavailable, codec, create_store
from service.store.cache import resident_bytes

from .api import evaluation, health, instances, isolation, limits, observability, security, select, sessions
from .api.context import EXTENSION, Services
from .api.responses import OrjsonProvider
from .api.problems import register_problems
from .adapters import cat, fhir
from . import ui

log = logging.getLogger(__name__)


def quotas_of(settings: Settings) -> Quotas:
    """The per-tenant quotas the settings ask for (0: no limit)."""
    return Quotas(instances=settings.tenant_max_instances or None,
                  stored_bytes=settings.tenant_max_stored_bytes or None, sessions=settings.tenant_max_sessions or None)


def create_app(config: Settings | dict[str, Any] | None = None, *, store: SessionStore | None = None) -> Flask:
    """``config``: a :class:`Settings`, a dict of overrides (keys as the environment variables,
    any case), or None for the environment alone. ``store``: inject one (tests); by default the
    settings choose (Redis when ``REDIS_URL`` is set, else in memory)."""
    settings = load_settings(config)
    logging.getLogger("service").setLevel(settings.log_level)

    app = Flask(__name__)
    if settings.trusted_proxies:
        # werkzeug's ProxyFix takes the address that many proxies from the right of
        # X-Forwarded-For: the nearest ones are ours, what a client wrote itself lies further left.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=settings.trusted_proxies, x_proto=0)
    app.json = OrjsonProvider(app)
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes, JSON_SORT_KEYS=False)
    if store is None:
        store = create_store(settings.redis_url, session_ttl=settings.session_ttl, key_prefix=settings.key_prefix,
                             instance_cache_bytes=settings.instance_cache_bytes, quotas=quotas_of(settings),
                             redis_cluster=settings.redis_cluster, redis_wait_replicas=settings.redis_wait_replicas,
                             redis_wait_timeout_ms=settings.redis_wait_timeout_ms)
    domain = Sessions(store, session_ttl=settings.session_ttl, max_cells=settings.max_cells,
                      max_compiled_bytes=settings.max_compiled_bytes, step_cache_bytes=settings.step_cache_bytes,
                      grid_points=settings.item_bank_grid_points,
                      max_observations=settings.session_max_observations, time_limit=settings.session_time_limit,
                      auto_budget=engine.Budget(settings.auto_respondents, settings.auto_cpu_seconds))
    app.extensions[EXTENSION] = Services(settings=settings, store=store, sessions=domain)

    register_problems(app, retry_after_seconds=settings.retry_after_seconds)
    observability.install(app, settings)  # first: every later hook's refusal carries the request id
    security.install(app, settings, store)  # API keys, rate limits (kept by the store), CORS
    limits.install(app, settings, store)  # one big request per worker at a time
    for blueprint in (instances.bp, sessions.bp, select.bp, health.bp, evaluation.bp):
        app.register_blueprint(blueprint)
    cat.install(app)  # /ims/cat/v1p0: the 1EdTech CAT façade over the same domain
    fhir.install(app)  # /fhir: SDC adaptive questionnaires over the same domain
    ui.install(app)  # /ui and /docs, from package files
    return app


def warm_up(app: Any) -> None:
    """Set up before any request what a new worker's first request would otherwise pay for: the
    store's connections. Never raises (it runs on a thread the worker waits for only briefly,
    and the worker must boot whether or not Redis answers): an unreachable store is logged and
    connected to on demand, as before, and /readyz says 503 meanwhile. Anything but an edgecut
    app is left alone."""
    services = getattr(app, "extensions", {}).get(EXTENSION)
    if not isinstance(services, Services):
        return
    try:
        services.store.warm()
    except StoreUnavailable as error:
        log.warning("the store did not answer before the first request: %s", error)
    except Exception:  # a bug here must not cost the worker: its requests connect on their own
        log.exception("warming up the store failed")
    isolated = app.extensions.get(isolation.EXTENSION)
    if isolated is not None:
        try:
            isolated.warm()
        except Exception:  # started again by the first big request
            log.exception("starting the isolated process failed")


def rehearse() -> None:
    """Once, before a new worker's first request: two small made-up instances (one deterministic,
    big enough for the engine's streamed pass; one of likelihoods) validated, compiled, through
    the Redis codec, and a step and an observation on each, each with its first applicable policy
    (not ``auto``, whose simulation would hold the boot for its whole CPU budget). A
    worker's memory is mostly its master's, shared copy-on-write until written, and the first
    run of each function writes to it (reference counts, the interpreter's specialised bytecode):
    a fresh worker's first step on a 10⁴ × 10³ instance took ~500 page faults more without a
    rehearsal (docs/scaling.md). Nothing is stored or counted. Never raises: a failure is logged
    and the first requests run unrehearsed, as they would have."""
    try:
        for payload in _rehearsal_instances():
            compiled = engine.compile_instance(Instance.model_validate(payload))
            decoded = codec.decode(*codec.encode(compiled), compiled.content_hash)
            resident_bytes(decoded)
            policy = engine.applicable_policies(decoded)[0]
            belief = engine.observe(decoded, engine.parse_observations(decoded, []))
            decision = engine.decide(belief, policy)
            if decision.next_test is not None:
                test = decision.next_test
                answered = [(decoded.test_ids[test], decoded.outcome_labels[test][0])]
                engine.decide(engine.observe(decoded, engine.parse_observations(decoded, answered), belief), policy)
    except Exception:
        log.exception("the worker's rehearsal failed; its first requests run unrehearsed")


def _rehearsal_instances() -> list[dict]:
    rng = np.random.default_rng(0)
    n, n_tests = 2048, 64  # 2¹⁸ answers: past the engine's dense pass
    tests = [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)]
    deterministic = {"tests": tests, "classes": [f"c{i % 8}" for i in range(n)],
                     "matrix": encode(rng.integers(0, 2, size=(n, n_tests), dtype=np.uint8))}
    likelihoods = {"tests": tests[:16], "classes": [f"c{i % 4}" for i in range(32)],
                   "likelihood_matrix": encode(rng.dirichlet(np.ones(2), size=(32, 16)))}
    return [deterministic, likelihoods]
