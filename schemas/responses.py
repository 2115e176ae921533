"""The response bodies of the HTTP API (part of the contract in :mod:`schemas.api`).

Plain data: the service builds them, clients read them. This module imports pydantic alone, so
``from edgecut import Client`` loads neither numpy nor the service.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")



class InstanceSummary(_Response):
    instance_id: str
    kind: Literal["deterministic", "likelihood"]
    n_hypotheses: int
    n_tests: int
    n_classes: int
    warnings: list[str]
    # Decision instances only: the decision ids, in order (n_classes counts the reduction's classes).
    decisions: list[str] | None = None


class AutoCandidate(_Response):
    """One candidate policy on the simulated respondents: accuracy (the share whose MAP class, or
    reported decision, at the stop was right) and cost at the stop, with 95 % intervals; null when
    no respondent finished."""

    policy: str
    accuracy: float | None
    accuracy_ci: tuple[float, float] | None
    mean_cost: float | None
    mean_cost_ci: tuple[float, float] | None
    mean_tests: float | None
    # Paired, respondent by respondent: this accuracy minus the pick's, with its interval (one
    # reaching 0: the simulation does not tell the two apart).
    accuracy_gap: float | None = None
    accuracy_gap_ci: tuple[float, float] | None = None


class AutoBudget(_Response):
    respondents: int
    cpu_seconds: float


class AutoChoice(_Response):
    """What ``policy: "auto"`` resolves to, and the evidence: the candidates best first (higher
    accuracy, then lower mean cost, then registry order), on the same simulated respondents."""

    policy: str
    candidates: list[AutoCandidate]
    respondents: int  # finished by every candidate
    seed: int
    budget: AutoBudget
    complete: bool  # false: the CPU budget ran out before budget.respondents (ranked on those finished)
    cpu_seconds: float  # spent simulating
    note: str


class InstanceDetail(InstanceSummary):
    """An instance's summary and what ``auto`` resolves to under the default stop rules."""

    auto: AutoChoice | None = None


class InstanceListItem(_Response):
    instance_id: str
    kind: Literal["deterministic", "likelihood"]
    n_hypotheses: int
    n_tests: int
    n_classes: int
    created_at: str  # RFC 3339, UTC


class InstanceList(_Response):
    items: list[InstanceListItem]
    # Pass as ?cursor= for the next page; null on the last page.
    next_cursor: str | None


class NextTest(_Response):
    id: str
    cost: float
    outcomes: list[str]
    # Only when the instance gives them (left out of the JSON otherwise): the question to show,
    # and the wording of those outcomes that have one.
    text: str | None = Field(default=None, exclude_if=lambda value: value is None)
    outcome_text: dict[str, str] | None = Field(default=None, exclude_if=lambda value: value is None)


class HistoryEntry(_Response):
    """An answer ``{test, outcome, cost}`` or a skip ``{test, skipped: true, cost}`` (the absent
    field is left out of the JSON)."""

    test: str
    outcome: str | None = Field(default=None, exclude_if=lambda value: value is None)
    skipped: bool | None = Field(default=None, exclude_if=lambda value: value is None)
    cost: float


class DecisionOut(_Response):
    """The decision to act on now: with losses the least expected loss, else the most probably
    acceptable; ``probability`` = P(acceptable | observations)."""

    id: str
    probability: float
    # Only when the instance gives losses (left out of the JSON otherwise).
    expected_loss: float | None = Field(default=None, exclude_if=lambda value: value is None)


class ThetaOut(_Response):
    """Item banks: the EAP estimate of θ (its posterior mean over the grid) and its posterior SD."""

    eap: float
    sd: float


class Candidate(_Response):
    """A test the policy scored: ``score`` is its gain per unit cost in the policy's own units."""

    test: str
    score: float
    cost: float


class StepState(_Response):
    policy: str
    step: int
    next_test: NextTest | None
    # The page to ask now: up to batch_size distinct tests, best first (next_test is the first).
    # Always sent; the default lets a client read a state from a service older than pages.
    next_tests: list[NextTest] = Field(default_factory=list)
    done: StrictBool
    stop_reason: str | None
    cost_spent: float
    history: list[HistoryEntry]
    # Classes with positive probability, most probable first.
    class_posterior: dict[str, float]
    map_class: str
    # |V(x_A)| for deterministic instances; null for likelihood instances.
    version_space_size: int | None
    # Decision instances only (left out of the JSON otherwise): the decision, and P(acceptable)
    # per decision, most probable first.
    decision: DecisionOut | None = Field(default=None, exclude_if=lambda value: value is None)
    decision_posterior: dict[str, float] | None = Field(default=None, exclude_if=lambda value: value is None)
    # Item-bank instances only (left out of the JSON otherwise).
    theta: ThetaOut | None = Field(default=None, exclude_if=lambda value: value is None)
    # Only with ?explain=true (left out of the JSON otherwise): the best-scoring eligible tests,
    # best first.
    candidates: list[Candidate] | None = Field(default=None, exclude_if=lambda value: value is None)


class _SessionIdentity(_Response):
    session_id: str


class SessionState(StepState, _SessionIdentity):
    """A session's state: the step fields plus its id (first) and when it expires."""

    expires_at: str  # RFC 3339, UTC; slides forward on every read and write


class ProblemError(_Response):
    path: str
    message: str


class Problem(_Response):
    type: str
    title: str
    status: int
    detail: str
    errors: list[ProblemError] | None = None
    # Quote it in a support ticket: the same id is in the X-Request-ID header and the logs.
    request_id: str | None = None
