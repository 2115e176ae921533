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

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

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
    value: list[CatValue | StrictStr] = Field(default_factory=list)


class CatResponseVariable(_Lenient):
    identifier: StrictStr
    candidateResponse: CatCandidateResponse | None = None


class CatItemResult(_Lenient):
    """One item's result: ``identifier`` is the item (a test of the instance); its response
    variable (``RESPONSE``, or the only one) gives the outcome; no value at all is a skip."""

    identifier: StrictStr = Field(min_length=1)
    responseVariable: list[CatResponseVariable] | None = None


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
