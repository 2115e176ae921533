"""The application factory: ``create_app(config)`` builds one Flask app with its own settings,
store and blueprints. Nothing is connected at import time; gunicorn calls
``service.app:create_app()`` in each worker."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask

from service.sessions import Sessions
from service.settings import Settings, load_settings
from service.store import Quotas, SessionStore, StoreUnavailable, create_store

from .api import evaluation, health, instances, observability, security, select, sessions
from .api.context import EXTENSION, Services
from .api.encoding import OrjsonProvider
from .api.problems import register_problems
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
    app.json = OrjsonProvider(app)
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes, JSON_SORT_KEYS=False)
    if store is None:
        store = create_store(settings.redis_url, session_ttl=settings.session_ttl, key_prefix=settings.key_prefix,
                             instance_cache_bytes=settings.instance_cache_bytes, quotas=quotas_of(settings),
                             redis_cluster=settings.redis_cluster, redis_wait_replicas=settings.redis_wait_replicas,
                             redis_wait_timeout_ms=settings.redis_wait_timeout_ms)
    domain = Sessions(store, session_ttl=settings.session_ttl, max_cells=settings.max_cells,
                      max_compiled_bytes=settings.max_compiled_bytes, step_cache_bytes=settings.step_cache_bytes)
    app.extensions[EXTENSION] = Services(settings=settings, store=store, sessions=domain)

    register_problems(app, retry_after_seconds=settings.retry_after_seconds)
    observability.install(app, settings)  # first: every later hook's refusal carries the request id
    security.install(app, settings)  # API keys, rate limits, CORS
    for blueprint in (instances.bp, sessions.bp, select.bp, health.bp, evaluation.bp):
        app.register_blueprint(blueprint)
    ui.install(app)  # /ui and /docs, from package files
    return app


def warm_up(app: Any) -> None:
    """Set up before any request what a new worker's first request would otherwise pay for: the
    store's connections. Never raises (it runs beside the worker, which must boot whether or
    not Redis answers): an unreachable store is logged and connected to on demand, as before,
    and /readyz says 503 meanwhile. Anything but an edgecut app is left alone."""
    services = getattr(app, "extensions", {}).get(EXTENSION)
    if not isinstance(services, Services):
        return
    try:
        services.store.warm()
    except StoreUnavailable as error:
        log.warning("the store did not answer before the first request: %s", error)
    except Exception:  # a bug here must not cost the worker: its requests connect on their own
        log.exception("warming up the store failed")
