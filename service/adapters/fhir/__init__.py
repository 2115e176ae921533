"""HL7 FHIR R4 Structured Data Capture's adaptive questionnaires over the session domain
(docs/integrations.md): ``POST /fhir/Questionnaire/$next-question``, ``GET
/fhir/Questionnaire/{id}``, ``GET /fhir/metadata``. Stateless: each call replays the answers the
QuestionnaireResponse carries through ``/v1/select``'s path. Every refusal on ``/fhir`` is an
OperationOutcome (outcomes.py), including those the service makes before a view runs (API keys,
rate limits, body limits, routing).
"""

from __future__ import annotations

from flask import Flask
from werkzeug.routing import BaseConverter

from service.api.problems import answer_problems_as

from .outcomes import as_operation_outcome
from .views import bp

PREFIX = "/fhir/"


class FhirId(BaseConverter):
    """FHIR's id syntax: so ``/Questionnaire/$next-question`` is the operation's path alone, not a
    Questionnaire's too (its Allow header then names POST only)."""

    regex = r"[A-Za-z0-9\-\.]{1,64}"


def install(app: Flask) -> None:
    app.url_map.converters["fhir_id"] = FhirId  # before the blueprint's rules are bound
    app.register_blueprint(bp)
    answer_problems_as(app, PREFIX, as_operation_outcome)
