"""``/v1/instances``: post an instance (stored once under its content hash), read its summary."""

from __future__ import annotations

from flask import Blueprint, Response, url_for

from schemas.instance import Instance

from .context import sessions, tenant
from .encoding import json_response, parse_body

bp = Blueprint("instances", __name__, url_prefix="/v1/instances")


@bp.post("")
def create() -> Response:
    summary, created = sessions().register_instance(parse_body(Instance), tenant())
    location = url_for(".show", instance_id=summary.instance_id)
    return json_response(summary, 201 if created else 200, headers={"Location": location})


@bp.get("/<instance_id>")
def show(instance_id: str) -> Response:
    from service.sessions import instance_summary

    return json_response(instance_summary(sessions().instance(instance_id, tenant())))
