"""``POST /v1/select``: the next step for observations the client keeps itself; nothing stored."""

from __future__ import annotations

from flask import Blueprint, Response

from schemas.api import SelectRequest

from .context import sessions, tenant
from .encoding import flag, json_response, parse_body

bp = Blueprint("select", __name__, url_prefix="/v1")


@bp.post("/select")
def select() -> Response:
    return json_response(sessions().select(parse_body(SelectRequest), tenant(), explain=flag("explain")))
