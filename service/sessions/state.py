"""A step's and a session's wire state, as JSON: what every response showing them carries.

The wire models of schemas/responses.py (``StepState``, ``SessionState``) define the JSON: a step
is built as a ``StepState`` once, when it is computed, and its JSON is pydantic's serialisation
of that model (:class:`Step`). A response showing it wraps those bytes in the session's own two
members (``SessionState`` is ``session_id``, the step's members, ``expires_at``, in that order)
or appends the candidates (``StepState``'s last member) when asked for; tests prove every kind of
body byte-equal to the model's own ``model_dump_json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

import numpy as np
import orjson
from pydantic import TypeAdapter

from schemas.responses import (
    Candidate,
    DecisionOut,
    HistoryEntry,
    InstanceListItem,
    InstanceSummary,
    NextTest,
    SessionState,
    StepState,
    ThetaOut,
)
from service import engine
from service.store.base import StoredInstance
from service.store.encoded import EncodedInstance

EXPLAIN_CANDIDATES = 5
# Estimates from above of CPython's objects (64-bit): a Step with its bytes' and tuples' headers
# and a slot per test id (the ids are the instance's own strings).
STEP_OBJECT_BYTES = 512
TEST_SLOT_BYTES = 8
# History entries and proposed tests are the same few objects in every step of an instance's
# sessions: built once each (the most recently used this many of each kind).
WIRE_PARTS_CACHED = 1 << 13

# The splices below rely on this order of members; a model that changes it fails here, at import.
if (tuple(SessionState.model_fields) != ("session_id", *StepState.model_fields, "expires_at")
        or tuple(StepState.model_fields)[-1] != "candidates"):
    raise ImportError("SessionState must be session_id, StepState's members, expires_at; StepState must end "
                      "with candidates (service/sessions/state.py splices them in that order)")

_STEP_JSON = TypeAdapter(StepState)
_CANDIDATES_JSON = TypeAdapter(list[Candidate])

# A response body as plain data.
WireBody = dict[str, Any]


@dataclass(frozen=True)
class SessionResult:
    body: bytes  # SessionState's wire form, as JSON
    version: int  # the ETag of the session's representation
    created: bool = False
    replayed: bool = False

    @property
    def state(self) -> WireBody:
        return orjson.loads(self.body)


@dataclass(frozen=True, eq=False)
class Step:
    """One computed step: its ``StepState`` as JSON without ``candidates`` (the model's own
    serialisation), the tests' scores the candidates are written from when asked for
    (?explain=true: rarely, so not every step), and what the domain itself reads of it."""

    json: bytes
    scores: np.ndarray
    done: bool
    stop_reason: str | None
    next_tests: tuple[str, ...]  # ids of the tests proposed

    @property
    def nbytes(self) -> int:
        """What it holds, from above: its JSON, its scores, its test ids, the objects around them."""
        return len(self.json) + self.scores.nbytes + STEP_OBJECT_BYTES + TEST_SLOT_BYTES * len(self.next_tests)


def instance_summary(inst: engine.CompiledInstance | EncodedInstance) -> InstanceSummary:
    return InstanceSummary(instance_id=inst.content_hash, kind=inst.kind, n_hypotheses=inst.n_hypotheses,
                           n_tests=inst.n_tests, n_classes=inst.n_classes, warnings=list(inst.warnings),
                           decisions=list(inst.decision_labels) if inst.is_decision else None)


def listing_item(item: StoredInstance) -> InstanceListItem:
    return InstanceListItem(instance_id=item.instance_id, kind=item.kind, n_hypotheses=item.n_hypotheses,
                            n_tests=item.n_tests, n_classes=item.n_classes, created_at=rfc3339(item.created_at))


def rfc3339(unix_seconds: float) -> str:
    global _last_rfc3339
    second = int(unix_seconds)  # whole seconds are shown: the same text for every call within one
    if _last_rfc3339[0] != second:
        _last_rfc3339 = (second, datetime.fromtimestamp(second, tz=timezone.utc).isoformat().replace("+00:00", "Z"))
    return _last_rfc3339[1]


_last_rfc3339: tuple[int, str] = (-1, "")


def session_json(session_id: str, expires_at: float, step: Step, compiled: engine.CompiledInstance,
                 explain: bool) -> bytes:
    """SessionState's wire form, as JSON: the session's id, its step's members, when it expires."""
    return (b'{"session_id":' + orjson.dumps(session_id) + b"," + step_members(step, compiled, explain)
            + b',"expires_at":' + orjson.dumps(rfc3339(expires_at)) + b"}")


def step_json(step: Step, compiled: engine.CompiledInstance, explain: bool) -> bytes:
    """StepState's wire form, as JSON."""
    return b"{" + step_members(step, compiled, explain) + b"}" if explain else step.json


def step_members(step: Step, compiled: engine.CompiledInstance, explain: bool) -> bytes:
    """StepState's members as JSON, with the candidates (its last member) only when asked for."""
    members = step.json[1:-1]
    return members + b',"candidates":' + candidates_json(compiled, step.scores) if explain else members


def candidates_json(compiled: engine.CompiledInstance, scores: np.ndarray) -> bytes:
    """The best EXPLAIN_CANDIDATES tests by score (NaN: not eligible, left out), ties in instance
    order, as JSON."""
    ranked = np.where(np.isnan(scores), np.inf, -scores)
    best = [t for t in np.argsort(ranked, kind="stable")[:EXPLAIN_CANDIDATES].tolist() if ranked[t] != np.inf]
    tests, costs = compiled.test_ids, compiled.costs
    return _CANDIDATES_JSON.dump_json([Candidate(test=tests[t], score=float(scores[t]), cost=float(costs[t]))
                                       for t in best])


def step_of(compiled: engine.CompiledInstance, policy: str, decision: engine.Decision) -> Step:
    """The step a decision makes, its JSON serialised from its model."""
    state = step_state(compiled, policy, decision)
    return Step(_STEP_JSON.dump_json(state), decision.scores, decision.done, state.stop_reason,
                tuple(test.id for test in state.next_tests))


def step_state(compiled: engine.CompiledInstance, policy: str, decision: engine.Decision) -> StepState:
    """The wire model of the step a decision makes (without candidates)."""
    belief = decision.belief
    posterior = belief.class_posterior
    # Most probable first, ties in instance order; the classes of probability 0 sort last and are left out.
    order = np.argsort(-posterior, kind="stable")[:np.count_nonzero(posterior)]
    labels = compiled.class_labels
    next_tests = [next_test(compiled, t) for t in decision.batch]
    decision_out, decision_posterior = decision_fields(compiled, belief)
    return StepState(
        policy=policy,
        step=len(belief.answers),
        next_test=next_tests[0] if next_tests else None,
        next_tests=next_tests,
        done=decision.done,
        stop_reason=None if decision.stop_reason is None else str(decision.stop_reason),
        cost_spent=float(belief.cost_spent),
        history=history(compiled, belief.observations),
        class_posterior=dict(zip(map(labels.__getitem__, order.tolist()), posterior[order].tolist())),
        map_class=labels[int(order[0])],
        version_space_size=int(belief.alive.size) if compiled.kind == "deterministic" else None,
        decision=decision_out,
        decision_posterior=decision_posterior,
        theta=None if compiled.theta is None else ThetaOut(**dict(zip(("eap", "sd"), engine.theta_estimate(belief)))),
    )


def history(compiled: engine.CompiledInstance, observations: tuple[engine.Observation, ...]) -> list[HistoryEntry]:
    """The observations as the history shows them: answers with their cost, skips with theirs
    (the test's cost when skips are charged, else 0)."""
    tests, costs, outcomes = compiled.test_ids, compiled.costs, compiled.outcome_labels
    skip_charged = compiled.skip_charged
    return [_skipped(tests[t], float(costs[t]) if skip_charged else 0.0) if k == engine.SKIPPED
            else _answered(tests[t], outcomes[t][k], float(costs[t])) for t, k in observations]


@lru_cache(maxsize=WIRE_PARTS_CACHED)
def _answered(test: str, outcome: str, cost: float) -> HistoryEntry:
    return HistoryEntry(test=test, outcome=outcome, cost=cost)


@lru_cache(maxsize=WIRE_PARTS_CACHED)
def _skipped(test: str, cost: float) -> HistoryEntry:
    return HistoryEntry(test=test, skipped=True, cost=cost)


def next_test(compiled: engine.CompiledInstance, t: int) -> NextTest:
    """Test ``t`` as a step proposes it, with its display text when the instance has any."""
    text = None if compiled.test_text is None else (compiled.test_text[t], compiled.outcome_text[t])
    return _next_test(compiled.test_ids[t], float(compiled.costs[t]), compiled.outcome_labels[t], text)


@lru_cache(maxsize=WIRE_PARTS_CACHED)
def _next_test(test: str, cost: float, outcomes: tuple[str, ...],
               text: tuple[str | None, tuple[str | None, ...]] | None) -> NextTest:
    if text is None:
        return NextTest(id=test, cost=cost, outcomes=list(outcomes))
    worded = {label: wording for label, wording in zip(outcomes, text[1]) if wording is not None}
    return NextTest(id=test, cost=cost, outcomes=list(outcomes), text=text[0], outcome_text=worded or None)


def decision_fields(compiled: engine.CompiledInstance,
                    belief: engine.Belief) -> tuple[DecisionOut | None, dict[str, float] | None]:
    """Decision instances: the decision to act on (``expected_loss`` only with losses) and
    P(acceptable) per decision, most probable first; nothing for a class instance."""
    if not compiled.is_decision:
        return None, None
    probability, losses = engine.decision_posterior(belief), engine.expected_loss(belief)
    chosen = engine.choose_decision(probability, losses)
    decision = DecisionOut(id=compiled.decision_labels[chosen], probability=float(probability[chosen]),
                           expected_loss=None if losses is None else float(losses[chosen]))
    order = np.argsort(-probability, kind="stable")
    return decision, {compiled.decision_labels[d]: float(probability[d]) for d in order}
