"""Reading a posted ``$next-question`` body: the QuestionnaireResponse (bare, or the
``questionnaire-response`` / ``in`` parameter of a Parameters resource), its contained
Questionnaire, which instance it runs on, and its answers as the observations ``/v1/select``
replays. Every refusal names its place as a FHIRPath expression.

The contained Questionnaire's items are the questions asked, in order; the response's items
answer some of them. A question answered with a ``valueCoding`` is an answer; one not answered,
answered with no value, or whose answer carries the ``data-absent-reason`` extension is a skip.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from service import engine

from .outcomes import FhirError
from .resources import RESULT_LINK_IDS, STEP_CONFIG, test_of_link, test_system

DATA_ABSENT_REASON = "http://hl7.org/fhir/StructureDefinition/data-absent-reason"
CONFIG_VALUES = ("valueString", "valueCode", "valueInteger", "valuePositiveInt", "valueUnsignedInt", "valueDecimal",
                 "valueBoolean")
LISTED = ("exclude_tests",)
PARAMETER_NAMES = ("questionnaire-response", "in")  # SDC's name, and the older one
INSTANCE_URL = re.compile(r"/v1/instances/([0-9a-f]{64})\Z")

# (test, outcome label or None for a skip), in the order asked.
Labelled = list[tuple[str, str | None]]


@dataclass
class Posted:
    response: dict[str, Any]  # the QuestionnaireResponse, changed in place into the answer
    questionnaire: dict[str, Any]  # its contained Questionnaire
    where: str  # the FHIRPath of the response in the body
    contained_at: int  # the Questionnaire's index in ``contained``
    instance_id: str


def _list(owner: dict[str, Any], key: str, where: str) -> list[Any]:
    value = owner.get(key, [])
    if not isinstance(value, list):
        raise FhirError(400, "structure", f"{key} must be an array", f"{where}.{key}")
    return value


def read(body: Any) -> Posted:
    """The posted resource, checked as far as the replay reads it."""
    if not isinstance(body, dict) or body.get("resourceType") not in ("QuestionnaireResponse", "Parameters"):
        raise FhirError(400, "structure", "post a QuestionnaireResponse, or a Parameters resource carrying one as "
                                          "its 'questionnaire-response' parameter")
    response, where = body, "QuestionnaireResponse"
    if body["resourceType"] == "Parameters":
        carried = [(i, p) for i, p in enumerate(_list(body, "parameter", "Parameters"))
                   if isinstance(p, dict) and p.get("name") in PARAMETER_NAMES]
        if len(carried) != 1:
            raise FhirError(400, "required", "give exactly one parameter 'questionnaire-response' (or 'in')",
                            "Parameters.parameter")
        i, parameter = carried[0]
        where = f"Parameters.parameter[{i}].resource"
        response = parameter.get("resource")
        if not isinstance(response, dict) or response.get("resourceType") != "QuestionnaireResponse":
            raise FhirError(400, "structure", "the parameter's resource must be a QuestionnaireResponse", where)
    status = response.get("status")
    if status == "completed":
        raise FhirError(422, "business-rule", "this QuestionnaireResponse is completed: its result is final; start "
                        "a new one to ask again", f"{where}.status")
    if status != "in-progress":
        raise FhirError(400 if status is None else 422, "required" if status is None else "business-rule",
                        "the QuestionnaireResponse's status must be 'in-progress'", f"{where}.status")
    if not isinstance(response.get("meta", {}), dict):
        raise FhirError(400, "structure", "meta must be an object", f"{where}.meta")
    at, questionnaire = _contained(response, where)
    url = questionnaire.get("url")
    found = INSTANCE_URL.search(url) if isinstance(url, str) else None
    if found is None:
        raise FhirError(400, "required", "the contained Questionnaire's url must name an instance: "
                        "{base}/v1/instances/{id} (as GET /fhir/Questionnaire/{id} gives it)",
                        f"{where}.contained[{at}].url")
    return Posted(response, questionnaire, where, at, found.group(1))


def _contained(response: dict[str, Any], where: str) -> tuple[int, dict[str, Any]]:
    """The contained Questionnaire the response's ``questionnaire`` points to ("#id"), or its only one."""
    contained = _list(response, "contained", where)
    questionnaires = [(i, r) for i, r in enumerate(contained)
                      if isinstance(r, dict) and r.get("resourceType") == "Questionnaire"]
    reference = response.get("questionnaire")
    if isinstance(reference, str) and reference.startswith("#"):
        questionnaires = [(i, r) for i, r in questionnaires if r.get("id") == reference[1:]]
    elif reference is not None or len(questionnaires) > 1:
        raise FhirError(400, "structure", "questionnaire must reference the contained Questionnaire as '#<its id>'",
                        f"{where}.questionnaire")
    if len(questionnaires) != 1:
        raise FhirError(400, "required", "the QuestionnaireResponse must contain the adaptive Questionnaire it "
                        "answers (questionnaire: '#<its id>')", f"{where}.contained")
    return questionnaires[0]


def observations(posted: Posted, compiled: engine.CompiledInstance) -> tuple[Labelled, Counter]:
    """The answers and skips in the order asked, and how often each test was asked."""
    q_where = f"{posted.where}.contained[{posted.contained_at}]"
    asked: list[tuple[str, str]] = []  # (linkId, test)
    for i, item in enumerate(_list(posted.questionnaire, "item", q_where)):
        link = item.get("linkId") if isinstance(item, dict) else None
        if isinstance(link, str) and link in RESULT_LINK_IDS:
            raise FhirError(422, "business-rule", "this questionnaire already stopped (it holds its result items); "
                            "start a new QuestionnaireResponse to ask again", f"{q_where}.item[{i}]")
        test = test_of_link(compiled, link) if isinstance(link, str) else None
        if test is None:
            raise FhirError(422, "invalid", f"item {link!r} is no question of this instance", f"{q_where}.item[{i}]")
        asked.append((link, test))
    answers = _answers(posted, compiled, dict(asked))
    labelled = [(test, answers.get(link)) for link, test in asked]
    return labelled, Counter(test for _, test in asked)


def step_config(posted: Posted) -> tuple[dict[str, Any], str | None]:
    """The select request's fields the contained Questionnaire's step-config extension gives, and
    the FHIRPath of that extension (None: it has none; the instance's defaults apply)."""
    q_where = f"{posted.where}.contained[{posted.contained_at}]"
    extensions = _list(posted.questionnaire, "extension", q_where)
    found = [i for i, e in enumerate(extensions) if isinstance(e, dict) and e.get("url") == STEP_CONFIG]
    if not found:
        return {}, None
    here = f"{q_where}.extension[{found[0]}]"
    if len(found) > 1:
        raise FhirError(400, "structure", f"give one {STEP_CONFIG} extension", here)
    config = _parts(extensions[found[0]], here)
    for name in ("instance", "instance_id", "observations"):
        if name in config:
            raise FhirError(400, "structure", f"'{name}' is the questionnaire's own", here)
    return config, here


def _parts(extension: dict[str, Any], here: str, depth: int = 0) -> dict[str, Any]:
    """A complex extension's parts as fields: each names one in 'url' and has one value[x], or
    parts of its own (an object such as ``exposure``: {method, k})."""
    fields: dict[str, Any] = {}
    for i, part in enumerate(_list(extension, "extension", here)):
        at = f"{here}.extension[{i}]"
        name = part.get("url") if isinstance(part, dict) else None
        values = [part[key] for key in CONFIG_VALUES if key in part] if isinstance(part, dict) else []
        if isinstance(name, str) and not values and "extension" in part and depth == 0:
            values = [_parts(part, at, depth + 1)]
        if not isinstance(name, str) or len(values) != 1:
            raise FhirError(400, "structure", "each part names a /v1/select field in 'url' with one value[x] "
                            "(string, code, integer, decimal or boolean) or parts of its own", at)
        if name in LISTED:
            fields.setdefault(name, []).append(values[0])
        elif name in fields:
            raise FhirError(400, "structure", f"'{name}' is given twice", at)
        else:
            fields[name] = values[0]
    return fields


def _answers(posted: Posted, compiled: engine.CompiledInstance, asked: dict[str, str]) -> dict[str, str]:
    """linkId → the outcome label answered (skips are left out)."""
    answers: dict[str, str] = {}
    seen: set[str] = set()
    for i, item in enumerate(_list(posted.response, "item", posted.where)):
        here = f"{posted.where}.item[{i}]"
        link = item.get("linkId") if isinstance(item, dict) else None
        if not isinstance(link, str):
            raise FhirError(400, "required", "every item needs a linkId", here)
        if link in seen:
            raise FhirError(400, "structure", f"item {link!r} is answered twice", here)
        seen.add(link)
        if link not in asked:
            raise FhirError(422, "invalid", f"item {link!r} answers no question the contained Questionnaire asked",
                            f"{here}.linkId")
        given = _list(item, "answer", here)
        if len(given) > 1:
            raise FhirError(422, "invalid", "one answer per question", f"{here}.answer")
        if not given or _absent(item) or _absent(given[0]):
            continue  # a skip
        answer = given[0]
        coding = answer.get("valueCoding") if isinstance(answer, dict) else None
        if not isinstance(coding, dict):
            raise FhirError(422, "invalid", "answer with a valueCoding from the item's answerOption",
                            f"{here}.answer[0]")
        if _absent(coding):
            continue
        answers[link] = _outcome(compiled, asked[link], coding, f"{here}.answer[0].valueCoding")
    return answers


def _outcome(compiled: engine.CompiledInstance, test: str, coding: dict[str, Any], here: str) -> str:
    code, system = coding.get("code"), coding.get("system")
    labels = compiled.outcome_labels[compiled.test_index[test]]
    own = test_system("", compiled.content_hash, test)  # any base: a proxy may show another host
    if system is not None and not (isinstance(system, str) and system.endswith(own)):
        raise FhirError(422, "code-invalid", f"system {system!r} is not the code system of test '{test}'",
                        f"{here}.system")
    if code not in labels:
        raise FhirError(422, "code-invalid", f"{code!r} is not an outcome of test '{test}' ({', '.join(labels)})",
                        f"{here}.code")
    return code


def _absent(element: Any) -> bool:
    """Whether ``element`` carries the data-absent-reason extension (an unknown answer)."""
    if not isinstance(element, dict):
        return False
    extensions = element.get("extension")
    return isinstance(extensions, list) and any(
        isinstance(e, dict) and e.get("url") == DATA_ABSENT_REASON for e in extensions)
