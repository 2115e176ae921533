"""The wire contract of the HTTP API: request and response bodies (openapi.yaml mirrors these).

Requests are strict (unknown fields are refused, so a typo like ``max_test`` is a 422, not a
silently ignored limit). Responses are plain data; the service builds them, clients read them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, model_validator

from .instance import Instance, Label, Labels


InstanceId = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the compiled content")]
MAX_OBSERVATIONS_PER_REQUEST = 10_000
MAX_SEED = 2**63 - 1
MAX_BATCH_SIZE = 32
MAX_RANDOMESQUE_K = 100
MAX_EXCLUDED_TESTS = 100_000


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- requests -------------------------------------------------------------------------------


# An observation carries an outcome or says it was skipped, never both (for OpenAPI; the
# validators enforce it). A field given as null counts as absent.
ANSWER_OR_SKIP = [
    {"required": ["outcome"], "properties": {"outcome": {"not": {"type": "null"}}, "skip": {"type": "null"}}},
    {"required": ["skip"], "properties": {"skip": {"const": True}, "outcome": {"type": "null"}}},
]


def _answer_or_skip(outcome: str | None, skip: bool | None) -> None:
    if skip is False:
        raise ValueError("'skip' can only be true; to record an answer give 'outcome' instead")
    if (outcome is None) == (skip is None):
        raise ValueError("give exactly one of 'outcome' and 'skip': true")


class ObservationIn(_Request):
    """An answer ``{test, outcome}`` or a skip ``{test, skip: true}`` (no answer was given)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": ANSWER_OR_SKIP})

    test: Label
    outcome: Label | None = None
    skip: StrictBool | None = None

    @model_validator(mode="after")
    def _answer_or_skip(self) -> ObservationIn:
        _answer_or_skip(self.outcome, self.skip)
        return self


class ObservationsRequest(_Request):
    """One observation ``{test, outcome}`` / ``{test, skip: true}``, or several
    ``{observations: [...]}`` (all or nothing)."""

    # The two forms, for OpenAPI's generators (the validators enforce the same). A field given as
    # null counts as absent, as in the validators.
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["test"], "oneOf": ANSWER_OR_SKIP,
         "properties": {"test": {"not": {"type": "null"}}, "observations": {"type": "null"}}},
        {"required": ["observations"], "properties": {"observations": {"not": {"type": "null"}},
                                                      "test": {"type": "null"}, "outcome": {"type": "null"},
                                                      "skip": {"type": "null"}}},
    ]})

    test: Label | None = None
    outcome: Label | None = None
    skip: StrictBool | None = None
    observations: list[ObservationIn] | None = Field(
        default=None, min_length=1, max_length=MAX_OBSERVATIONS_PER_REQUEST
    )

    @model_validator(mode="after")
    def _one_form(self) -> ObservationsRequest:
        single = self.test is not None or self.outcome is not None or self.skip is not None
        if single and self.observations is not None:
            raise ValueError("give either {test, outcome} or {observations: [...]}, not both")
        if not single and self.observations is None:
            raise ValueError("give {test, outcome} or {observations: [...]}")
        if single and self.test is None:
            raise ValueError("an observation needs a 'test'")
        if single:
            _answer_or_skip(self.outcome, self.skip)
        return self

    def labelled(self) -> list[tuple[str, str | None]]:
        """(test, outcome) pairs in order; the outcome of a skip is None."""
        if self.observations is not None:
            return [(o.test, o.outcome) for o in self.observations]
        return [(self.test, self.outcome)]  # type: ignore[list-item]


# The stop rules and the seed, defined once: every request that takes them (sessions, select,
# evaluate) refuses the same values ("max_cost": "5" and "confidence": true are 422 everywhere).
MaxTests = Annotated[StrictInt, Field(ge=0)]
MaxCost = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]  # strict: numbers only, ints kept
Confidence = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]
PolicyName = Annotated[str, Field(min_length=1, max_length=64)]
MaxExpectedLoss = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]  # a loss may be 0
MaxSE = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
MaxRate = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]
MAX_EVALUATED_POLICIES = 10


class ObservationCorrection(_Request):
    """What a recorded observation becomes: another outcome, or a skip."""

    model_config = ConfigDict(json_schema_extra={"oneOf": ANSWER_OR_SKIP})

    outcome: Label | None = None
    skip: StrictBool | None = None

    @model_validator(mode="after")
    def _answer_or_skip(self) -> ObservationCorrection:
        _answer_or_skip(self.outcome, self.skip)
        return self


class Exposure(_Request):
    """Exposure control: ``randomesque`` draws the next test uniformly among the ``k`` best;
    ``sympson_hetter`` gives a chosen item with its ``exposure_parameter`` in the item bank;
    ``progressive`` scores each test by a random draw blended with its gain, the gain's weight
    growing with the step (needs max_tests); ``progressive_sympson_hetter`` applies both;
    ``restricted`` holds a test back while it has been given in ``max_rate`` of the instance's
    sessions or more, and one near that share from sessions already fairly sure of the class
    (counted across them: sessions and evaluations, not a stateless select)."""

    method: Literal["randomesque", "sympson_hetter", "progressive", "progressive_sympson_hetter", "restricted"]
    k: Annotated[StrictInt, Field(ge=1, le=MAX_RANDOMESQUE_K)] | None = None
    max_rate: MaxRate | None = None

    @model_validator(mode="after")
    def _parameter_of_method(self) -> Exposure:
        if (self.method == "randomesque") != (self.k is not None):
            raise ValueError("randomesque takes k (how many of the best to draw among); the other methods take none")
        if (self.method == "restricted") != (self.max_rate is not None):
            raise ValueError("restricted takes max_rate (the share of sessions a test may be given to); "
                             "the other methods take none")
        return self

    @property
    def progressive(self) -> bool:
        return self.method.startswith("progressive")

    @property
    def sympson_hetter(self) -> bool:
        return self.method.endswith("sympson_hetter")


class StepConfig(_Request):
    """What a session (or a stateless select) runs: the instance, the policy and the stop rules."""

    instance_id: InstanceId | None = None
    instance: Instance | None = None
    policy: PolicyName | None = None
    max_tests: MaxTests | None = None
    max_cost: MaxCost | None = None
    confidence: Confidence | None = None
    seed: Seed = 0
    # Decision instances with losses: decided once the least expected loss is at most this.
    max_expected_loss: MaxExpectedLoss | None = None
    # Item banks: done once the posterior SD of θ is at most this.
    max_se: MaxSE | None = None
    # Exposure control; a session draws from its seed and its id, a stateless select from its seed.
    exposure: Exposure | None = None
    # Tests that cannot be run here (a clinic without the machine): never proposed.
    exclude_tests: Labels = Field(default_factory=list, max_length=MAX_EXCLUDED_TESTS)
    # Tests proposed together (a page of questions): ``next_tests`` holds up to this many.
    batch_size: Annotated[StrictInt, Field(ge=1, le=MAX_BATCH_SIZE)] = 1

    @model_validator(mode="after")
    def _one_instance(self) -> StepConfig:
        if (self.instance_id is None) == (self.instance is None):
            raise ValueError("give exactly one of 'instance_id' and 'instance'")
        return self


class SessionCreate(StepConfig):
    pass


class SelectRequest(StepConfig):
    observations: list[ObservationIn] = Field(default_factory=list, max_length=MAX_OBSERVATIONS_PER_REQUEST)

    def labelled(self) -> list[tuple[str, str | None]]:
        """(test, outcome) pairs in order; the outcome of a skip is None."""
        return [(o.test, o.outcome) for o in self.observations]


class EvaluateRequest(_Request):
    """``POST /v1/instances/{id}/evaluate``: which policies, under which stop rules."""

    policies: Annotated[list[PolicyName], Field(min_length=1, max_length=MAX_EVALUATED_POLICIES)] | None = None
    max_tests: MaxTests | None = None
    max_cost: MaxCost | None = None
    confidence: Confidence | None = None
    max_expected_loss: MaxExpectedLoss | None = None
    # As a session's: a stop rule on item banks, and exposure control drawn per simulated examinee.
    max_se: MaxSE | None = None
    exposure: Exposure | None = None
    samples: Annotated[StrictInt, Field(ge=1)] = 2000
    seed: Seed = 0
    optimum: StrictBool = True
