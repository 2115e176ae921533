"""What handlers reach through the app: the settings, the store and the session domain,
attached once by :func:`service.app.create_app` (never at import time); and the empty answer
they give to a delete."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Response, current_app, g

from service.sessions import Sessions
from service.settings import Settings
from service.store import DEFAULT_TENANT, SessionStore

EXTENSION = "edgecut"


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: SessionStore
    sessions: Sessions


def services() -> Services:
    return current_app.extensions[EXTENSION]


def sessions() -> Sessions:
    return services().sessions


def tenant() -> str:
    """The caller's tenant: its API key's (service/api/security.py), else the one public tenant."""
    return g.get("tenant", DEFAULT_TENANT)


def no_content() -> Response:
    """204: no body, so no Content-Type (Flask would label the empty body text/html)."""
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response
