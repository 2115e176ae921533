"""``/ims/cat/v1p0``: the CAT standard's operations, each one call into the session domain that
the ``/v1`` views make too (:class:`service.sessions.Sessions`): stored sessions are
``/v1/sessions`` sessions; stateless ones are ``/v1/select`` replays of the answers their
``sessionState`` carries. A section is its configuration, written into its identifier
(tokens.py): it stores nothing but the instance it brings inline.
"""

from __future__ import annotations

import base64
import binascii
import secrets

import orjson
from flask import Blueprint, Response, request, url_for
from pydantic import ValidationError

from schemas.api import ObservationIn, ObservationsRequest, SelectRequest, SessionCreate, StepConfig
from schemas.cat import CatResultsIn, CatSectionConfig, CatSectionIn, CatSessionIn
from service.api.context import no_content, services, sessions, tenant
from service.api.contract import json_body, operation, ref, request_body, TRIAGE_EXAMPLE
from service.api.bodies import parse_body, validation_errors
from service.api.duplicate_keys import refuse_duplicate_keys
from service.api.errors import MalformedJson, RequestValidationFailed
from service.api.limits import check_depth, check_request
from service.api.responses import json_response
from service.errors import LimitExceeded, SessionNotFound

from .results import Answer, answers_of, assessment_result, new_answers, next_items
from .status import PREFIX
from .tokens import MAX_SECTION_ID_CHARS, BadSessionState, Section, SessionState, section_of, session_state_of

bp = Blueprint("cat", __name__, url_prefix=PREFIX + "v1p0")

# Session identifiers of stateless sessions: as random as the store's (nothing is kept of them).
STATELESS_ID_BYTES = 18
# The instance id a section's identifier will carry: its length is checked before anything is stored.
PLACEHOLDER_ID = "0123456789abcdef" * 4

SECTION_ID = {"name": "sectionIdentifier", "in": "path", "required": True, "schema": {"type": "string"}}
SESSION_ID = {"name": "sessionIdentifier", "in": "path", "required": True, "schema": {"type": "string"}}
TAG = "1EdTech CAT"


def refusals(*statuses: int) -> dict:
    """The refusals a CAT operation answers, as imsx_StatusInfo (components/responses/CatStatus<status>)."""
    return {str(status): {"$ref": f"#/components/responses/CatStatus{status}"} for status in statuses}


def _config_of(given: CatSectionConfig | str) -> CatSectionConfig:
    """The section configuration, from the object or from its JSON in base64."""
    if isinstance(given, CatSectionConfig):
        config = given
    else:
        try:
            raw = base64.b64decode(given, validate=True)
            data = orjson.loads(raw)
        except (binascii.Error, ValueError) as error:
            raise MalformedJson(f"sectionConfiguration is not JSON in base64: {error}") from None
        settings = services().settings
        check_depth(raw, settings.max_json_depth)
        refuse_duplicate_keys(raw, data)
        try:
            config = CatSectionConfig.model_validate(data)
        except ValidationError as error:
            errors = [{"path": "sectionConfiguration." + e["path"], "message": e["message"]}
                      for e in validation_errors(error)]
            raise RequestValidationFailed(f"the section configuration has {len(errors)} problem(s)", errors) from None
    check_request(config, services().settings)
    return config


def _step_config(config: StepConfig, model: type[StepConfig], **extra) -> StepConfig:
    """``config``'s instance, policy and rules as another request of the session domain
    (validated already: constructed, not validated again)."""
    return model.model_construct(**{name: getattr(config, name) for name in StepConfig.model_fields}, **extra)


def _identifier(config: CatSectionConfig, instance_id: str, inline: bool) -> str:
    identifier = Section(config.model_copy(update={"instance": None, "instance_id": instance_id}), inline).identifier()
    if len(identifier) > MAX_SECTION_ID_CHARS:
        raise LimitExceeded("the CAT section identifier's length", MAX_SECTION_ID_CHARS,
                            f"the section configuration makes an identifier of {len(identifier)} characters "
                            "(shorten exclude_tests)")
    return identifier


def _select(config: StepConfig, answers: tuple[Answer, ...] | list[Answer]) -> dict:
    """The step after ``answers``: ``/v1/select``'s replay, nothing stored."""
    limit = services().settings.max_observations_per_request
    if len(answers) > limit:
        raise LimitExceeded("MAX_OBSERVATIONS_PER_REQUEST", limit, f"the session carries {len(answers)} answers")
    return orjson.loads(sessions().select(_step_config(config, SelectRequest, observations=_observations(answers)),
                                         tenant()))


def _observations(answers: tuple[Answer, ...] | list[Answer]) -> list[ObservationIn]:
    """Answers as the wire's observations (already checked: constructed, not validated)."""
    return [ObservationIn.model_construct(test=test, outcome=outcome, skip=None if outcome is not None else True)
            for test, outcome in answers]


@bp.post("/sections")
@operation("catCreateSection", TAG, "Create a section: an instance (inline or by id), a policy, stop rules",
           description=("`sectionConfiguration` is a CatSectionConfig object, or its JSON in base64. Everything "
                        "is checked (the same run as `/v1/select`) before the inline instance is stored; the "
                        "section itself stores nothing: its identifier carries its configuration."),
           body=request_body("CatSectionIn", "The section data",
                             {"sectionConfiguration": {"instance": TRIAGE_EXAMPLE, "policy": "ec2"}}),
           responses={"201": json_body(ref("CatSectionCreated"), "Created"),
                      **refusals(400, 404, 409, 413, 415, 422, 500, 503)})
def create_section() -> Response:
    config = _config_of(parse_body(CatSectionIn).sectionConfiguration)
    _identifier(config, PLACEHOLDER_ID, config.instance is not None)  # too long: refused before storing
    _select(config, [])  # every check the sessions will meet, nothing stored
    instance_id = config.instance_id
    if config.instance is not None:
        instance_id = sessions().register_instance(config.instance, tenant())[0].instance_id
    identifier = _identifier(config, instance_id, config.instance is not None)
    return json_response({"sectionIdentifier": identifier}, 201,
                         headers={"Location": url_for(".show_section", sectionIdentifier=identifier)})


def _section(identifier: str) -> Section:
    section = section_of(identifier)
    sessions().instance(section.config.instance_id, tenant())  # 404 once the instance is gone
    return section


@bp.get("/sections/<sectionIdentifier>")
@operation("catGetSection", TAG, "A section's configuration (its instance by id), as JSON in base64",
           parameters=[SECTION_ID],
           responses={"200": json_body(ref("CatSectionOut"), "The section"), **refusals(404, 500, 503)})
def show_section(sectionIdentifier: str) -> Response:
    config = _section(sectionIdentifier).config.model_dump(mode="json", exclude_defaults=True, exclude={"instance"})
    return json_response({"sectionConfiguration": base64.b64encode(orjson.dumps(config)).decode("ascii")})


@bp.delete("/sections/<sectionIdentifier>")
@operation("catEndSection", TAG, "End a section: the instance it brought inline is deleted",
           description=("A section that named a stored instance by `instance_id` leaves it alone (it is not "
                        "the section's), and nothing changes. Once the instance is deleted the section and its "
                        "sessions answer 404 instance-not-found."),
           parameters=[SECTION_ID], responses={"204": {"description": "Ended"}, **refusals(404, 500, 503)})
def end_section(sectionIdentifier: str) -> Response:
    section = _section(sectionIdentifier)
    if section.inline:
        sessions().delete_instance(section.config.instance_id, tenant())
    return no_content()


@bp.post("/sections/<sectionIdentifier>/sessions")
@operation("catCreateSession", TAG, "Start a session: its identifier, the first stage's items, its state",
           description=("The body (session data: personal needs, demographics, prior data) is optional and not "
                        "read. A section with `stateless: true` stores nothing: the state carries the answers."),
           parameters=[SECTION_ID], body={**request_body("CatSessionIn", "The session data", {}), "required": False},
           responses={"201": json_body(ref("CatSessionCreated"), "Started"),
                      **refusals(400, 404, 409, 410, 413, 415, 422, 500, 503)})
def create_session(sectionIdentifier: str) -> Response:
    section = _section(sectionIdentifier)
    if request.content_length or request.headers.get("Transfer-Encoding"):
        parse_body(CatSessionIn)
    if section.config.stateless:
        session_id = secrets.token_urlsafe(STATELESS_ID_BYTES)
        state = _select(section.config, [])
        token = SessionState(session_id, answers=(), section=section.digest()).token()
    else:
        created = sessions().create(_step_config(section.config, SessionCreate), None, tenant())
        state, session_id = created.state, created.state["session_id"]
        token = SessionState(session_id, version=created.version).token()
    return json_response({"sessionIdentifier": session_id, "nextItems": next_items(state), "sessionState": token},
                         201)


@bp.post("/sections/<sectionIdentifier>/sessions/<sessionIdentifier>/results")
@operation("catSubmitResults", TAG, "Submit the stage's results: the next stage (none once stopped), the state",
           description=("Each itemResult answers the item its identifier names with its RESPONSE variable's "
                        "single value (an outcome label), the variables given as `responseVariable` or "
                        "`responseVariables`, the values as `candidateResponse.value` or `value`; an empty value "
                        "list is a skip, a response that cannot be read is 422. Only items of the current stage "
                        "may be answered (422 item-not-asked); a post repeating recorded answers changes nothing; "
                        "new answers after the stop are 409. All or nothing: a refused post stores nothing."),
           parameters=[SECTION_ID, SESSION_ID],
           body=request_body("CatResultsIn", "The assessment result, and the last sessionState",
                             {"assessmentResult": {"itemResult": [{"identifier": "ecg", "responseVariable": [
                                 {"identifier": "RESPONSE", "candidateResponse": {"value": [{"value": "normal"}]}}]}]},
                              "sessionState": "<the last sessionState>"}),
           responses={"200": json_body(ref("CatResultsOut"), "The next stage and the session so far"),
                      **refusals(400, 404, 409, 410, 412, 413, 415, 422, 428, 500, 503)})
def submit_results(sectionIdentifier: str, sessionIdentifier: str) -> Response:
    section = _section(sectionIdentifier)
    _check_stored_session(section, sessionIdentifier)
    posted = parse_body(CatResultsIn)
    answers = answers_of(posted.assessmentResult.itemResult)
    # The limits /v1 holds observations to (their number, each label's length), before any is read.
    check_request(ObservationsRequest.model_construct(observations=_observations(answers)), services().settings)
    if section.config.stateless:
        if posted.sessionState is None:
            raise BadSessionState("a stateless section's results carry the sessionState the last answer gave")
        before = session_state_of(posted.sessionState, section, sessionIdentifier)
        state = _select(section.config, before.answers)
        new = new_answers(state, answers)
        if new:
            state = _select(section.config, before.answers + tuple(new))
        token = SessionState(sessionIdentifier, answers=before.answers + tuple(new), section=before.section).token()
    else:
        given = None if posted.sessionState is None else session_state_of(posted.sessionState, section,
                                                                          sessionIdentifier)
        result = sessions().get(sessionIdentifier, tenant())
        new = new_answers(result.state, answers)
        if new:
            if_match = None if given is None else given.version.__eq__
            result = sessions().observe(sessionIdentifier, new, tenant(), if_match=if_match)
        state = result.state
        token = SessionState(sessionIdentifier, version=result.version).token()
    return json_response({"nextItems": next_items(state), "sessionState": token,
                          "assessmentResult": assessment_result(sessionIdentifier, state)})


@bp.delete("/sections/<sectionIdentifier>/sessions/<sessionIdentifier>")
@operation("catEndSession", TAG, "End a session: a stored one is deleted (a stateless one holds nothing)",
           parameters=[SECTION_ID, SESSION_ID], responses={"204": {"description": "Ended"}, **refusals(404, 500, 503)})
def end_session(sectionIdentifier: str, sessionIdentifier: str) -> Response:
    section = _section(sectionIdentifier)
    if not section.config.stateless:
        _check_stored_session(section, sessionIdentifier)
        sessions().delete(sessionIdentifier, tenant())
    return no_content()


def _check_stored_session(section: Section, session_id: str) -> None:
    """A stored session answers only under the section that started it: one this section's
    configuration would create (its instance, policy and rules); another's is 404, untouched."""
    if not section.config.stateless and not sessions().created_by(
            session_id, _step_config(section.config, SessionCreate), tenant()):
        raise SessionNotFound(f"no session '{session_id}' in this section (it was started in another)")
