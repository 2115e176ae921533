"""HL7 FHIR R4 Structured Data Capture's adaptive questionnaires over the session domain
(docs/integrations.md): ``POST /fhir/Questionnaire/$next-question``, ``GET
/fhir/Questionnaire/{id}``, ``GET /fhir/metadata``. Stateless: each call replays the answers the
QuestionnaireResponse carries through ``/v1/select``'s path. Every refusal on ``/fhir`` is an
OperationOutcome (outcomes.py), including those the service makes before a view runs (API keys,
rate limits, body limits, routing).
"""

from __future__ import annotations

from flask import Flask, Response, request
from werkzeug.routing import BaseConverter

from .outcomes import as_operation_outcome
from .views import bp

PREFIX = "/fhir/"
PROBLEM_MEDIA_TYPE = "application/problem+json"


class FhirId(BaseConverter):
    """FHIR's id syntax: so ``/Questionnaire/$next-question`` is the operation's path alone, not a
    Questionnaire's too (its Allow header then names POST only)."""

    regex = r"[A-Za-z0-9\-\.]{1,64}"


def install(app: Flask) -> None:
    app.url_map.converters["fhir_id"] = FhirId  # before the blueprint's rules are bound
    app.register_blueprint(bp)

    @app.after_request
    def _operation_outcomes(response: Response) -> Response:
        if response.mimetype == PROBLEM_MEDIA_TYPE and (request.path.startswith(PREFIX) or request.path == "/fhir"):
            return as_operation_outcome(response)
        return response
