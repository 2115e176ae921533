"""``/fhir``: the SDC adaptive-questionnaire operation, the instance as a Questionnaire, and the
CapabilityStatement. Each view parses, asks the session domain (for ``$next-question``: the
instance, then the step ``/v1/select`` computes), and renders."""

from __future__ import annotations

import re
from typing import Any

import orjson
from flask import Blueprint, Response, request
from pydantic import RootModel, ValidationError

from schemas.api import SelectRequest
from service.api.context import sessions, tenant
from service.api.contract import operation
from service.api.bodies import parse_body
from service.engine import policy_names

from . import replay
from .outcomes import FHIR_MEDIA_TYPE, FhirError, error_response
from .resources import (QUERY_FIELDS, RESPONSE_PROFILE, capability_statement, question_item, questionnaire,
                        result_items)

bp = Blueprint("fhir", __name__, url_prefix="/fhir")
bp.register_error_handler(FhirError, error_response)

FHIR_TAG = "fhir"
INSTANCE_ID = re.compile(r"\A[0-9a-f]{64}\Z")


class Resource(RootModel[dict[str, Any]]):
    """A FHIR resource as posted: any JSON object (the adapter reads what it needs itself)."""


def fhir_response(resource: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(resource), status=status, content_type=FHIR_MEDIA_TYPE)


def base_url() -> str:
    # Not request.host_url: its IRI decoding took a tenth of a $next-question call.
    served = request._get_current_object()
    return f"{served.scheme}://{served.host}{served.root_path}"


def _fhir_body(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {FHIR_MEDIA_TYPE: {"schema": {"type": "object", "required": ["resourceType"]}}}}


QUERY_SCHEMAS = {str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
                 list: {"type": "array", "items": {"type": "string"}}}
_OUTCOME = _fhir_body("An OperationOutcome saying what was refused and where (FHIRPath expressions); a "
                      "refusal the worker makes before the application sees the request is problem+json")


@bp.get("/metadata")
@operation("fhirMetadata", FHIR_TAG, "The FHIR CapabilityStatement: Questionnaire read and $next-question",
           responses={"200": _fhir_body("A CapabilityStatement (FHIR R4)")})
def metadata() -> Response:
    return fhir_response(capability_statement(base_url()))


@bp.get("/Questionnaire/<fhir_id:instance_id>")
@operation("fhirReadQuestionnaire", FHIR_TAG, "An instance as an SDC adaptive Questionnaire (no items: "
           "$next-question adds them)",
           description="Query parameters named after POST /v1/select's fields (policy, max_tests, confidence, "
                       "exclude_tests, batch_size, …) go into the Questionnaire's urn:edgecut:fhir:step-config "
                       "extension: what its $next-question replays run.",
           parameters=[{"name": "instance_id", "in": "path", "required": True, "schema": {"type": "string"}},
                       *({"name": name, "in": "query", "required": False, "schema": QUERY_SCHEMAS[kind]}
                         for name, kind in QUERY_FIELDS.items())],
           responses={"200": _fhir_body("A Questionnaire (sdc-questionnaire-adapt)"),
                      **{str(status): _OUTCOME for status in (400, 401, 404, 429)}})
def read_questionnaire(instance_id: str) -> Response:
    if not INSTANCE_ID.match(instance_id):
        raise FhirError(404, "not-found", f"no Questionnaire '{instance_id}': ids are instance ids (64 hex digits)")
    config = _query_config(instance_id)
    return fhir_response(questionnaire(base_url(), sessions().instance(instance_id, tenant()), config))


def _query_config(instance_id: str) -> dict[str, Any]:
    """The query's /v1/select fields (``?policy=hec&max_tests=8``), checked as /v1/select checks them."""
    config: dict[str, Any] = {}
    for name, values in request.args.lists():
        if name.startswith("_"):
            continue  # FHIR's own parameters (_format, _pretty, _summary): JSON is all there is to give
        kind = QUERY_FIELDS.get(name)
        if kind is None:
            raise FhirError(400, "value", f"unknown query parameter '{name}'; these set what the questionnaire "
                            f"runs: {', '.join(QUERY_FIELDS)}")
        try:
            config[name] = values if kind is list else kind(values[-1])
        except ValueError:
            raise FhirError(400, "value", f"{name} must be {kind.__name__}, got {values[-1]!r}") from None
    if "policy" in config and config["policy"] not in policy_names():
        raise FhirError(400, "value", f"no policy '{config['policy']}': {', '.join(policy_names())}")
    try:
        SelectRequest.model_validate({**config, "instance_id": instance_id})
    except ValidationError as error:
        shown = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in error.errors(include_url=False)[:5])
        raise FhirError(400, "value", f"not what /v1/select takes: {shown}") from None
    return config


@bp.post("/Questionnaire/$next-question")
@operation("fhirNextQuestion", FHIR_TAG, "SDC $next-question: the QuestionnaireResponse with the next question, "
           "or completed with the result; stateless, nothing is stored",
           description="The body is a QuestionnaireResponse (sdc-questionnaireresponse-adapt) with a contained "
                       "Questionnaire whose url is {base}/v1/instances/{id}, bare or as the 'questionnaire-response' "
                       "parameter of a Parameters resource. Its answers are replayed as POST /v1/select replays "
                       "observations, under what the contained Questionnaire's urn:edgecut:fhir:step-config "
                       "extension asks for (docs/integrations.md).",
           body={"required": True, "description": "A QuestionnaireResponse, or Parameters carrying one",
                 "content": {FHIR_MEDIA_TYPE: {"schema": {"type": "object", "required": ["resourceType"]}}}},
           responses={"200": _fhir_body("The QuestionnaireResponse: in-progress with one more item in its contained "
                                        "Questionnaire, or completed with the hidden result items"),
                      **{str(status): _OUTCOME for status in (400, 401, 404, 413, 415, 422, 429)}})
def next_question() -> Response:
    posted = replay.read(parse_body(Resource).root)
    domain, who, base = sessions(), tenant(), base_url()
    compiled = domain.instance(posted.instance_id, who)
    labelled, asked = replay.observations(posted, compiled)
    step = orjson.loads(domain.select(_select_request(posted, labelled), who))
    response, items = posted.response, posted.questionnaire.setdefault("item", [])
    response.setdefault("questionnaire", "#" + str(posted.questionnaire.get("id", "")))
    if step["done"] or not step["next_tests"]:
        asked_items, answers = result_items(step)
        items.extend(asked_items)
        response.setdefault("item", []).extend(answers)
        response["status"] = "completed"
    else:  # a page of batch_size questions, best first
        items.extend(question_item(base, compiled, test["id"], asked[test["id"]] + 1) for test in step["next_tests"])
    profiles = response.setdefault("meta", {}).setdefault("profile", [])
    if isinstance(profiles, list) and RESPONSE_PROFILE not in profiles:
        profiles.append(RESPONSE_PROFILE)
    return fhir_response(response)


def _select_request(posted: replay.Posted, labelled: replay.Labelled) -> SelectRequest:
    """The /v1/select request the response stands for: its answers, and what the contained
    Questionnaire's step-config extension asks for."""
    config, config_at = replay.step_config(posted)
    observations = [{"test": test, "outcome": outcome} if outcome is not None else {"test": test, "skip": True}
                    for test, outcome in labelled]
    try:
        return SelectRequest.model_validate({**config, "instance_id": posted.instance_id,
                                             "observations": observations})
    except ValidationError as error:
        problems = error.errors(include_url=False)
        if all(p["loc"][:1] == ("observations",) for p in problems):  # only past MAX_OBSERVATIONS_PER_REQUEST
            raise FhirError(413, "too-costly", f"the questionnaire asks too many questions: {problems[0]['msg']}",
                            f"{posted.where}.contained[{posted.contained_at}].item") from None
        shown = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems[:5])
        raise FhirError(422, "invalid", f"the step-config extension is not what /v1/select takes: {shown}",
                        config_at or f"{posted.where}.contained[{posted.contained_at}]") from None
