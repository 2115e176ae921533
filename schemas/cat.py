"""The wire of the 1EdTech Computer Adaptive Testing (CAT) 1.0 REST/JSON binding, as served under
``/ims/cat/v1p0`` (service/adapters/cat/): the request bodies we read and the response bodies we
write. Field names are the standard's (camelCase); what a section configuration holds is ours
(the standard leaves ``sectionConfiguration`` to the engine): a :class:`CatSectionConfig`.

Requests from delivery systems carry more of QTI's results reporting than an adaptive test reads
(datestamps, durations, outcome variables): unknown members of an assessment result are ignored,
the members we read are typed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictStr, model_validator
from pydantic_core import PydanticCustomError

from .api import MAX_OBSERVATIONS_PER_REQUEST, StepConfig

# A sessionState or sectionConfiguration string: generous, far below the body limit.
MAX_TOKEN_CHARS = 1 << 20


class _Lenient(BaseModel):
    """QTI results reporting: members we do not read are ignored (delivery systems send many)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CatSectionConfig(StepConfig):
    """What ``sectionConfiguration`` carries (as a JSON object, or that object's JSON in base64):
    the instance (inline, or its ``instance_id``), the policy and stop rules as for
    ``/v1/sessions``; ``batch_size`` items per stage (``stageLength``); ``stateless``: sessions are
    not stored, the ``sessionState`` string carries the answers instead."""

    stateless: StrictBool = False


class CatSectionIn(_Strict):
    """``POST /sections``: the standard's section data. ``qtiMetadata`` and ``qtiUsagedata``
    (base64 QTI metadata and usage data) are accepted and not read: the instance says all the
    engine uses."""

    sectionConfiguration: CatSectionConfig | StrictStr = Field(
        description="A CatSectionConfig, or its JSON in base64 (the standard's string form)")
    qtiMetadata: StrictStr | None = Field(default=None, max_length=MAX_TOKEN_CHARS)
    qtiUsagedata: StrictStr | None = Field(default=None, max_length=MAX_TOKEN_CHARS)


class CatSessionIn(_Strict):
    """``POST /sections/{id}/sessions``: the standard's session data, accepted and not read (an
    instance's prior already says what is known before the first item)."""

    personalNeedsAndPreferences: StrictStr | None = None
    demographics: StrictStr | None = None
    priorData: list[Any] | None = None


class CatValue(_Lenient):
    value: StrictStr | int | float | bool


class CatCandidateResponse(_Lenient):
    """QTI's candidate response: its values; ``[]`` is the explicit no-response (a skip)."""

    value: list[CatValue | StrictStr]


class CatVariable(_Lenient):
    """A response or outcome variable, its values in either spelling: QTI results reporting's
    ``candidateResponse: {"value": [...]}``, or the list directly under ``value`` (what OAT's
    CAT client, oat-sa/lib-test-cat, writes). Exactly one of the two."""

    identifier: StrictStr
    candidateResponse: CatCandidateResponse | None = None
    value: list[CatValue | StrictStr] | None = None


# QTI's conventional names of an item's response variable and of its score (an outcome variable).
RESPONSE = "RESPONSE"
SCORE = "SCORE"


class CatItemResult(_Lenient):
    """One item's result: ``identifier`` is the item (a test of the instance). The answer is its
    response: the response variables come as ``responseVariable`` (QTI results reporting) or
    ``responseVariables`` (OAT's client), and the one read is the variable named ``RESPONSE``,
    else the only one. An item result with no response variable is read by its score: the
    outcome variable named ``SCORE`` (in ``outcomeVariable`` or ``outcomeVariables``; OAT's client
    sends only that variable), whose value names the outcome (a score of 1.0 is the label "1":
    an item bank's outcomes are its scores). The variable's single value is the outcome label; a
    skip is that variable with an empty value list. Anything else (neither a response nor a
    score, both spellings of a member, several variables and none named as above, a variable
    with no values member, more than one value) cannot be read and is refused."""

    identifier: StrictStr = Field(min_length=1)
    responseVariable: list[CatVariable] | None = None
    responseVariables: list[CatVariable] | None = None
    outcomeVariable: list[CatVariable] | None = None
    outcomeVariables: list[CatVariable] | None = None
    # The answer read by the validator: the outcome label, or None for a skip.
    _outcome: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_response(self) -> CatItemResult:
        self._outcome = _outcome_of(self)
        return self

    @property
    def outcome(self) -> str | None:
        return self._outcome


def _unreadable(message: str) -> PydanticCustomError:
    return PydanticCustomError("unreadable_response", message)


def _one_of(item: CatItemResult, singular: str, plural: str) -> list[CatVariable] | None:
    given = [getattr(item, name) for name in (singular, plural) if getattr(item, name) is not None]
    if len(given) > 1:
        raise _unreadable(f"an item result gives {singular} or {plural}, not both")
    return given[0] if given else None


def _outcome_of(item: CatItemResult) -> str | None:
    """The one parser of an item's answer (see CatItemResult): the label, None for a skip."""
    responses = _one_of(item, "responseVariable", "responseVariables")
    scores = _one_of(item, "outcomeVariable", "outcomeVariables")
    if responses:
        named = [variable for variable in responses if variable.identifier == RESPONSE]
        if len(named) > 1 or (not named and len(responses) != 1):
            raise _unreadable(f"{len(responses)} response variables, {len(named)} of them named {RESPONSE}: "
                              f"the answer is the one named {RESPONSE}, or the only one")
        chosen = named[0] if named else responses[0]
    else:
        # As OAT's client matches it: the name in any case.
        named = [variable for variable in scores or () if variable.identifier.upper() == SCORE]
        if len(named) != 1:
            raise _unreadable(f"an item result without a response variable is read by its {SCORE} outcome "
                              f"variable; it has {len(named)}. A skip is the {RESPONSE} variable with no values "
                              "(candidateResponse: {\"value\": []})")
        chosen = named[0]
    if (chosen.candidateResponse is None) == (chosen.value is None):
        raise _unreadable(f"variable '{chosen.identifier}' gives its values in candidateResponse or in value "
                          "(exactly one)")
    values = chosen.candidateResponse.value if chosen.candidateResponse is not None else chosen.value
    if not values:
        return None
    if len(values) > 1:
        raise _unreadable(f"variable '{chosen.identifier}' has {len(values)} values: an item's answer is one "
                          "outcome label")
    return _label(values[0] if isinstance(values[0], str) else values[0].value)


def _label(value: str | int | float | bool) -> str:
    """An outcome label from a QTI value: text as it is, a boolean as JSON writes it, a whole
    number as an integer (a FLOAT score of 1.0 is "1"), another number as Python writes it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class CatAssessmentResultIn(_Lenient):
    itemResult: list[CatItemResult] = Field(min_length=1, max_length=MAX_OBSERVATIONS_PER_REQUEST)


class CatResultsIn(_Strict):
    """``POST .../results``: the items' results, and the ``sessionState`` the last answer gave
    (required by stateless sections, checked against the path by stored ones)."""

    assessmentResult: CatAssessmentResultIn
    sessionState: StrictStr | None = Field(default=None, max_length=MAX_TOKEN_CHARS)


# --- responses (plain data; the façade writes them as dicts, these document them) ----------


class CatSectionCreated(_Strict):
    sectionIdentifier: str


class CatSectionOut(_Strict):
    """``GET /sections/{id}``: the section's configuration (a CatSectionConfig naming its
    instance by id) as JSON in base64, the standard's string form."""

    sectionConfiguration: str


class CatNextItems(_Strict):
    """The items of the next stage, all to be presented (``stageLength`` of them); none once the
    session has stopped."""

    itemIdentifiers: list[str]
    stageLength: int


class CatSessionCreated(_Strict):
    sessionIdentifier: str
    nextItems: CatNextItems
    sessionState: str


class CatResultsOut(_Strict):
    """The next stage, the state to send with the next results, and the session so far as a QTI
    assessment result (test-level outcome variables: CLASS, CLASS_PROBABILITY, DECISION,
    DECISION_PROBABILITY, COMPLETION_STATUS, ITEMS_ANSWERED, COST_SPENT, STOP_REASON)."""

    nextItems: CatNextItems
    sessionState: str
    assessmentResult: dict[str, Any]


class ImsxCodeMinorField(_Strict):
    imsx_codeMinorFieldName: str
    imsx_codeMinorFieldValue: str


class ImsxCodeMinor(_Strict):
    imsx_codeMinorField: list[ImsxCodeMinorField]


class ImsxStatusInfo(_Strict):
    """1EdTech's status report, the body of every refusal on the CAT paths."""

    imsx_codeMajor: str
    imsx_severity: str
    imsx_description: str
    imsx_CodeMinor: ImsxCodeMinor
