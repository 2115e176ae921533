"""A real FHIR client library (SMART's ``fhirclient``) runs a whole triage questionnaire through
``$next-question`` against ``edgecut serve``: it reads the CapabilityStatement and the
Questionnaire into its own R4 models, and posts and parses every QuestionnaireResponse with them."""

from __future__ import annotations

import requests
from fhir_support import truth_answers, worded_triage
from fhirclient import client as smart
from fhirclient.models.questionnaire import Questionnaire
from fhirclient.models.questionnaireresponse import QuestionnaireResponse, QuestionnaireResponseItem


def test_fhirclient_runs_a_whole_triage_questionnaire(served):
    instance = worded_triage()
    instance_id = requests.post(f"{served.url}/v1/instances", json=instance, timeout=10).json()["instance_id"]
    fhir = smart.FHIRClient(settings={"app_id": "edgecut-test", "api_base": f"{served.url}/fhir/"})
    fhir.prepare()  # reads /fhir/metadata into its CapabilityStatement model
    assert fhir.server.capabilityStatement.rest[0].resource[0].operation[0].name == "next-question"

    questionnaire = Questionnaire.read(instance_id, fhir.server)
    questionnaire.id = "q"
    response = QuestionnaireResponse({"status": "in-progress", "questionnaire": "#q"})
    response.contained = [questionnaire]
    truths, asked = truth_answers(instance, 5), []
    for _ in range(len(instance["tests"]) + 1):
        posted = fhir.server.post_json("Questionnaire/$next-question", response.as_json())
        response = QuestionnaireResponse(posted.json())
        if response.status == "completed":
            break
        item = response.contained[0].item[-1]
        option = next(o for o in item.answerOption if o.valueCoding.code == truths[item.linkId])
        answered = QuestionnaireResponseItem({"linkId": item.linkId, "answer": [{"valueCoding": option.valueCoding.as_json()}]})
        response.item = (response.item or []) + [answered]
        asked.append({"test": item.linkId, "outcome": truths[item.linkId]})
    assert response.status == "completed"
    reference = requests.post(f"{served.url}/v1/select", json={"instance_id": instance_id, "observations": asked},
                              timeout=10).json()
    results = {i.linkId: i.answer[0] for i in response.item if i.linkId.startswith("$result.")}
    assert results["$result.decision"].valueString == reference["decision"]["id"]
    assert results["$result.stop-reason"].valueString == reference["stop_reason"]
    losses = instance["hypotheses"][5]["loss"]
    assert losses[reference["decision"]["id"]] <= min(losses.values()) + instance["loss_tolerance"]
