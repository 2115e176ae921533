"""``/v1/instances``: post an instance (stored once under its content hash), list the tenant's,
read one's summary, delete one."""

from __future__ import annotations

from flask import Blueprint, Response, request, url_for

from schemas.instance import Instance
from service.store.base import LISTING_CURSOR

from .context import sessions, tenant
from .encoding import InvalidParameter, json_response, parse_body

bp = Blueprint("instances", __name__, url_prefix="/v1/instances")


@bp.post("")
def create() -> Response:
    summary, created = sessions().register_instance(parse_body(Instance), tenant())
    location = url_for(".show", instance_id=summary.instance_id)
    return json_response(summary, 201 if created else 200, headers={"Location": location})


DEFAULT_PAGE = 50
MAX_PAGE = 500


@bp.get("")
def index() -> Response:
    raw_limit = request.args.get("limit", str(DEFAULT_PAGE))
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
        raise InvalidParameter(f"limit must be a whole number from 1 to {MAX_PAGE}, got {raw_limit!r}")
    cursor = request.args.get("cursor")
    if cursor is not None and not LISTING_CURSOR.match(cursor):
        raise InvalidParameter("cursor is not one this service gave out (pass next_cursor back unchanged)")
    listing = sessions().list_instances(tenant(), int(raw_limit), cursor)
    return json_response(listing, headers={"Cache-Control": "no-store"})


@bp.delete("/<instance_id>")
def delete(instance_id: str) -> Response:
    sessions().delete_instance(instance_id, tenant())
    return Response(status=204)


@bp.get("/<instance_id>")
def show(instance_id: str) -> Response:
    from service.sessions import instance_summary

    return json_response(instance_summary(sessions().instance(instance_id, tenant())))
