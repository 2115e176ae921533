"""``/v1/instances``: post an instance (stored once under its content hash), list the tenant's,
read one's summary, delete one."""

from __future__ import annotations

from flask import Blueprint, Response, request, url_for

from schemas.instance import Instance
from service.store.base import LISTING_CURSOR

from .context import no_content, sessions, tenant
from .contract import HEADER, INSTANCE_ID, TRIAGE_EXAMPLE, json_body, operation, problems, ref, request_body
from .bodies import parse_body
from .errors import InvalidParameter
from .responses import json_response

bp = Blueprint("instances", __name__, url_prefix="/v1/instances")


@bp.post("")
@operation("postInstance", "instances", "Validate, compile and store an instance under its content hash",
           body=request_body("Instance", "An instance, per-hypothesis or columnar (docs/instances.md); a big "
                             "columnar one may instead come as multipart/form-data, the instance as JSON in the "
                             "part `instance` and its `matrix` or `likelihood_matrix` as a .npy part "
                             "(docs/instances.md, *The binary body*)", TRIAGE_EXAMPLE),
           responses={"200": json_body(ref("InstanceSummary"), "Already stored: the same content has the same id",
                                       {"Location": HEADER["Location"]}),
                      "201": json_body(ref("InstanceSummary"), "Stored", {"Location": HEADER["Location"]}),
                      **problems(400, 413, 415, 422, 500, 503)})
def create() -> Response:
    # A big instance may come as a binary body: the JSON, and its array as a .npy part.
    instance = parse_body(Instance, array_parts=("matrix", "likelihood_matrix"))
    summary, created = sessions().register_instance(instance, tenant())
    location = url_for(".show", instance_id=summary.instance_id)
    return json_response(summary, 201 if created else 200, headers={"Location": location})


DEFAULT_PAGE = 50
MAX_PAGE = 500
LIMIT = {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}}
CURSOR = {"name": "cursor", "in": "query", "required": False, "schema": {"type": "string"},
          "description": "A previous page's next_cursor, unchanged"}


@bp.get("")
@operation("listInstances", "instances", "The tenant's stored instances, oldest first, a page at a time",
           parameters=[LIMIT, CURSOR],
           responses={"200": json_body(ref("InstanceList"), "A page; next_cursor is null on the last"),
                      **problems(400, 500, 503)})
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
@operation("deleteInstance", "instances", "Delete an instance; its sessions then answer 410 instance-gone",
           description=("A retried delete answers 204 again while the deletion is remembered (the "
                        "instance's TTL). Posting the same content again stores it anew."),
           parameters=[INSTANCE_ID], responses={"204": {"description": "Deleted"}, **problems(404, 500, 503)})
def delete(instance_id: str) -> Response:
    sessions().delete_instance(instance_id, tenant())
    return no_content()


@bp.get("/<instance_id>")
@operation("getInstance", "instances", "An instance's summary, and what `auto` resolves to with the evidence",
           description=("`auto` is simulated once per instance and stop rules (here the default ones), within "
                        "AUTO_RESPONDENTS and AUTO_CPU_SECONDS, then shared by every worker: the first read may "
                        "take that long."),
           parameters=[INSTANCE_ID],
           responses={"200": json_body(ref("InstanceDetail"), "The instance's summary and auto's choice"),
                      **problems(404, 422, 500, 503)})
def show(instance_id: str) -> Response:
    return json_response(sessions().instance_detail(instance_id, tenant()))
