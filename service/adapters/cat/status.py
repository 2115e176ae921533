"""Refusals on the CAT paths in the standard's shape: 1EdTech's ``imsx_StatusInfo``.

Every error of the app becomes RFC 9457 problem+json in one place (service/api/problems.py);
on ``/ims/cat/`` that body is rewritten, after the fact, into a status report with the same HTTP
status and headers. The problem's code stays readable as a second minor code (``problem``), and
its detail is the description. Refusals made below the application (service/worker/: a request
that is not valid HTTP, a server too busy to read it) never reach Flask and stay problem+json.
"""

from __future__ import annotations

import orjson
from flask import Flask, Response

from service.api.responses import dumps
from service.api.problems import TYPE_PREFIX, answer_problems_as

PREFIX = "/ims/cat/"

# HTTP status → the minor code 1EdTech's REST bindings use for it.
MINOR_CODES = {400: "invalid_data", 401: "unauthorisedrequest", 403: "forbidden", 404: "unknownobject",
               405: "invalid_data", 409: "invalid_data", 410: "unknownobject", 412: "invalid_data",
               413: "invalid_data", 415: "invalid_data", 422: "invalid_data", 428: "invalid_data",
               429: "server_busy", 503: "server_busy", 507: "server_busy"}


def status_info(status: int, code: str, description: str) -> dict:
    minor = MINOR_CODES.get(status, "internal_server_error" if status >= 500 else "invalid_data")
    return {"imsx_codeMajor": "failure", "imsx_severity": "error", "imsx_description": description,
            "imsx_CodeMinor": {"imsx_codeMinorField": [
                {"imsx_codeMinorFieldName": "TargetEndSystem", "imsx_codeMinorFieldValue": minor},
                {"imsx_codeMinorFieldName": "problem", "imsx_codeMinorFieldValue": code}]}}


def as_status_info(response: Response) -> Response:
    problem = orjson.loads(response.get_data())
    description = problem.get("detail") or problem.get("title") or ""
    if problem.get("errors"):
        description += "; " + "; ".join(f"{e['path']}: {e['message']}" for e in problem["errors"])
    code = str(problem.get("type", "")).removeprefix(TYPE_PREFIX)
    response.set_data(dumps(status_info(response.status_code, code, description)))
    response.mimetype = "application/json"
    return response


def install(app: Flask) -> None:
    answer_problems_as(app, PREFIX, as_status_info)
