"""The FHIR resources the adapter writes (R4): an instance as an adaptive Questionnaire, a test
as a question item, a step's result as hidden read-only items, the CapabilityStatement.

What becomes what (docs/integrations.md): a test is a ``choice`` item whose ``linkId`` is the
test id (``{id}#2``, ``#3``, … when a repeatable test is asked again); its outcomes are its
``answerOption`` codings (``code`` the outcome label, ``display`` its wording, ``system`` the
test's own URI); a stopped step adds hidden items for the class (or decision), its probability
and the stop reason.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from service import engine

from .outcomes import FhirError

FHIR_VERSION = "4.0.1"
SDC = "http://hl7.org/fhir/uv/sdc"
ADAPTIVE_EXTENSION = f"{SDC}/StructureDefinition/sdc-questionnaire-questionnaireAdaptive"
QUESTIONNAIRE_PROFILE = f"{SDC}/StructureDefinition/sdc-questionnaire-adapt"
RESPONSE_PROFILE = f"{SDC}/StructureDefinition/sdc-questionnaireresponse-adapt"
NEXT_QUESTION = f"{SDC}/OperationDefinition/Questionnaire-next-question"
HIDDEN = "http://hl7.org/fhir/StructureDefinition/questionnaire-hidden"
# The CapabilityStatement's date: when this statement's content last changed.
CAPABILITY_DATE = "2026-11-26"

# The contained Questionnaire's extension naming what the replay runs, as POST /v1/select takes it:
# sub-extensions named after its fields (policy, max_tests, confidence, …; exclude_tests repeated).
STEP_CONFIG = "urn:edgecut:fhir:step-config"
# /v1/select's fields a GET of a Questionnaire may set in that extension, by type.
QUERY_FIELDS = {"policy": str, "max_tests": int, "seed": int, "batch_size": int, "max_cost": float,
                "confidence": float, "max_expected_loss": float, "max_se": float, "exclude_tests": list}

# The result items' linkIds; a test of the same id could not be told apart from them.
RESULT_CLASS, RESULT_DECISION = "$result.class", "$result.decision"
RESULT_PROBABILITY, RESULT_STOP_REASON = "$result.probability", "$result.stop-reason"
RESULT_THETA, RESULT_THETA_SD = "$result.theta", "$result.theta-sd"
RESULT_LINK_IDS = frozenset({RESULT_CLASS, RESULT_DECISION, RESULT_PROBABILITY, RESULT_STOP_REASON, RESULT_THETA,
                             RESULT_THETA_SD})
# FHIR's code type: no leading, trailing or doubled whitespace.
FHIR_CODE = re.compile(r"\A[^\s]+( [^\s]+)*\Z")
REPEAT = re.compile(r"\A(.*)#([2-9]|[1-9][0-9]+)\Z", re.DOTALL)


def instance_url(base: str, instance_id: str) -> str:
    return f"{base}/v1/instances/{instance_id}"


def test_system(base: str, instance_id: str, test: str) -> str:
    """The code system of one test's outcomes."""
    return f"{instance_url(base, instance_id)}/tests/{quote(test, safe='')}"


def link_id(test: str, occurrence: int) -> str:
    """The ``linkId`` of the ``occurrence``-th asking of ``test`` (1 for the first)."""
    return test if occurrence == 1 else f"{test}#{occurrence}"


def test_of_link(compiled: engine.CompiledInstance, link: str) -> str | None:
    """The test an item's ``linkId`` names (None: none of the instance's)."""
    if link in compiled.test_index:
        return link
    repeated = REPEAT.match(link)
    return repeated.group(1) if repeated and repeated.group(1) in compiled.test_index else None


def step_config_extension(config: dict[str, Any], url: str = STEP_CONFIG) -> dict[str, Any]:
    """The step-config extension (STEP_CONFIG) holding ``config``'s fields (an object's as parts)."""
    kinds = {bool: "valueBoolean", int: "valueInteger", float: "valueDecimal", str: "valueString"}
    return {"url": url, "extension": [
        step_config_extension(value, name) if isinstance(value, dict) else {"url": name, kinds[type(value)]: value}
        for name, given in config.items() for value in (given if isinstance(given, list) else [given])]}


def questionnaire(base: str, compiled: engine.CompiledInstance, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The instance as an adaptive Questionnaire: no items (``$next-question`` adds them);
    ``config``: what its replays run (the step-config extension)."""
    instance_id = compiled.content_hash
    what = "decision" if compiled.is_decision else "class"
    extensions = [{"url": ADAPTIVE_EXTENSION, "valueUrl": f"{base}/fhir"}]
    if config:
        extensions.append(step_config_extension(config))
    return {
        "resourceType": "Questionnaire",
        "id": instance_id,
        "meta": {"profile": [QUESTIONNAIRE_PROFILE]},
        "extension": extensions,
        "url": instance_url(base, instance_id),
        "name": "Edgecut_" + instance_id[:16],
        "title": f"Adaptive questionnaire over edgecut instance {instance_id[:12]}",
        "status": "active",
        "description": (f"{compiled.n_tests} questions, {compiled.n_hypotheses} hypotheses; asks until the "
                        f"{what} is known. Items come from POST {base}/fhir/Questionnaire/$next-question."),
    }


def question_item(base: str, compiled: engine.CompiledInstance, test: str, occurrence: int) -> dict[str, Any]:
    t = compiled.test_index[test]
    instance_id = compiled.content_hash
    texts = compiled.test_text[t] if compiled.test_text is not None else None
    wordings = compiled.outcome_text[t] if compiled.outcome_text is not None else (None,) * len(
        compiled.outcome_labels[t])
    system = test_system(base, instance_id, test)
    options = []
    for label, wording in zip(compiled.outcome_labels[t], wordings):
        if not FHIR_CODE.match(label):
            raise FhirError(422, "not-supported", f"test '{test}' has the outcome label {label!r}, which is not a "
                            "FHIR code (no leading, trailing or doubled whitespace); use /v1 for this instance")
        options.append({"valueCoding": {"system": system, "code": label, "display": wording or label}})
    return {"linkId": link_id(test, occurrence), "text": texts or test, "type": "choice", "required": False,
            "answerOption": options}


def result_items(step: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the contained Questionnaire's hidden read-only items, the QuestionnaireResponse's answers
    to them) for a stopped step."""
    decision = step.get("decision")
    if decision is not None:
        answers = [(RESULT_DECISION, "Decision", "string", {"valueString": decision["id"]}),
                   (RESULT_PROBABILITY, "Probability the decision is acceptable", "decimal",
                    {"valueDecimal": decision["probability"]})]
    else:
        answers = [(RESULT_CLASS, "Most probable class", "string", {"valueString": step["map_class"]}),
                   (RESULT_PROBABILITY, "Probability of that class", "decimal",
                    {"valueDecimal": step["class_posterior"][step["map_class"]]})]
    theta = step.get("theta")
    if theta is not None:  # an item bank: the ability estimate and its standard error
        answers += [(RESULT_THETA, "Ability estimate (θ, posterior mean)", "decimal", {"valueDecimal": theta["eap"]}),
                    (RESULT_THETA_SD, "Its standard error (posterior SD)", "decimal", {"valueDecimal": theta["sd"]})]
    answers.append((RESULT_STOP_REASON, "Why the questionnaire stopped", "string",
                    {"valueString": step["stop_reason"] or "no test left to ask"}))
    items = [{"extension": [{"url": HIDDEN, "valueBoolean": True}], "linkId": link, "text": text, "type": kind,
              "readOnly": True} for link, text, kind, _ in answers]
    responses = [{"linkId": link, "text": text, "answer": [value]} for link, text, _, value in answers]
    return items, responses


def capability_statement(base: str) -> dict[str, Any]:
    return {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "date": CAPABILITY_DATE,
        "publisher": "edgecut",
        "kind": "instance",
        "software": {"name": "edgecut"},
        "implementation": {"description": "edgecut adaptive testing: SDC adaptive questionnaires",
                           "url": f"{base}/fhir"},
        "fhirVersion": FHIR_VERSION,
        "format": ["json"],
        "rest": [{
            "mode": "server",
            "resource": [{
                "type": "Questionnaire",
                "supportedProfile": [QUESTIONNAIRE_PROFILE],
                "interaction": [{"code": "read"}],
                "operation": [{"name": "next-question", "definition": NEXT_QUESTION}],
            }],
        }],
    }
