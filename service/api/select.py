"""``POST /v1/select``: the next step for observations the client keeps itself; nothing stored."""

from __future__ import annotations

from flask import Blueprint, Response

from schemas.api import SelectRequest

from .context import sessions, tenant
from .contract import EXPLAIN, TRIAGE_EXAMPLE, json_body, operation, problems, ref, request_body
from .bodies import parse_body
from .query import flag
from .responses import json_response

bp = Blueprint("select", __name__, url_prefix="/v1")


@bp.post("/select")
@operation("select", "select", "Stateless: the step after the given observations; nothing is stored",
           parameters=[EXPLAIN],
           body=request_body("SelectRequest", "The instance (or its id), the observations so far, the policy",
                             {"instance": TRIAGE_EXAMPLE, "observations": [{"test": "ecg", "outcome": "abnormal"}]}),
           responses={"200": json_body(ref("StepState"), "The step"),
                      **problems(400, 404, 409, 413, 415, 422, 500, 503)})
def select() -> Response:
    return json_response(sessions().select(parse_body(SelectRequest), tenant(), explain=flag("explain")))
