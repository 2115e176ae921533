"""What the FHIR adapter's tests share: the worded triage instance, the resources a client
builds, and FHIR's own models (fhir.resources, R4B) to validate every resource against."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from fhir.resources.R4B import get_fhir_model_class

ROOT = Path(__file__).resolve().parent.parent
FHIR = "application/fhir+json"
NEXT = "/fhir/Questionnaire/$next-question"
DATA_ABSENT_REASON = "http://hl7.org/fhir/StructureDefinition/data-absent-reason"
RESULT_LINK_IDS = {"$result.class", "$result.decision", "$result.probability", "$result.stop-reason",
                   "$result.theta", "$result.theta-sd"}


def worded_triage() -> dict[str, Any]:
    """The triage example, with a question and answer wordings on its first two tests."""
    instance = json.loads((ROOT / "examples" / "triage" / "instance.json").read_text())
    instance = copy.deepcopy(instance)
    instance["tests"][0].update(text="Do you have a fever?", outcome_text={"yes": "Yes, since this morning"})
    instance["tests"][1].update(text="Are you coughing?", outcome_text={"no": "No", "yes": "Yes"})
    return instance


def valid(resource: dict[str, Any]) -> dict[str, Any]:
    """``resource`` after FHIR R4B's own model accepted it (raises when it does not)."""
    get_fhir_model_class(resource["resourceType"]).model_validate(resource)
    return resource


def start(questionnaire: dict[str, Any]) -> dict[str, Any]:
    """A client's first QuestionnaireResponse: no items, the Questionnaire contained as '#q'."""
    contained = dict(questionnaire, id="q")
    return {"resourceType": "QuestionnaireResponse", "status": "in-progress", "questionnaire": "#q",
            "contained": [contained]}


def last_question(response: dict[str, Any]) -> dict[str, Any]:
    return response["contained"][0]["item"][-1]


def answer(response: dict[str, Any], item: dict[str, Any], label: str | None) -> dict[str, Any]:
    """``response`` (a copy) answering ``item`` with the option coded ``label``; None: unknown
    (the data-absent-reason extension)."""
    response = copy.deepcopy(response)
    if label is None:
        given = {"valueCoding": {"extension": [{"url": DATA_ABSENT_REASON, "valueCode": "asked-unknown"}]}}
    else:
        given = {"valueCoding": next(o["valueCoding"] for o in item["answerOption"]
                                     if o["valueCoding"]["code"] == label)}
    response.setdefault("item", []).append({"linkId": item["linkId"], "text": item["text"], "answer": [given]})
    return response


def truth_answers(instance: dict[str, Any], index: int) -> dict[str, str]:
    """What the instance's ``index``-th hypothesis answers to each test (per-hypothesis form)."""
    return instance["hypotheses"][index]["outcomes"]
