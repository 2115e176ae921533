"""A step's and a session's wire state, as JSON: what every response showing them carries.

The wire models of schemas/api.py (``SessionState``, ``StepState``) define the JSON; building
and dumping a pydantic model per response cost ~15% of an observation's CPU, so a step is dumped
once, when it is computed (:class:`Step`), and every response showing it splices those bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import orjson

from schemas.api import InstanceListItem, InstanceSummary
from service import engine
from service.store.base import StoredInstance

EXPLAIN_CANDIDATES = 5
# Estimates from above of CPython's objects (64-bit): a Step with its bytes' and tuples' headers
# and a slot per test id (the ids are the instance's own strings).
STEP_OBJECT_BYTES = 512
TEST_SLOT_BYTES = 8

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
    """One computed step, kept as the JSON every response that shows it carries: StepState's
    fields but ``candidates`` (``fields``: the object's members without its braces, so a session's
    own members go around them without parsing or dumping the step again), the tests' scores the
    candidates are written from when asked for (?explain=true: rarely, so not every step), and
    what the domain itself reads of it."""

    fields: bytes
    scores: np.ndarray
    done: bool
    stop_reason: str | None
    next_tests: tuple[str, ...]  # ids of the tests proposed
    history: tuple[int, int] = (0, 0)  # where the history's JSON array is in ``fields``

    @property
    def nbytes(self) -> int:
        """What it holds, from above: its JSON, its test ids, the objects around them."""
        return len(self.fields) + self.scores.nbytes + STEP_OBJECT_BYTES + TEST_SLOT_BYTES * len(self.next_tests)


# A step and the belief it was computed from (None when the step cache did not keep it).
Computed = tuple[Step, "engine.Belief | None"]


def instance_summary(inst: engine.CompiledInstance) -> InstanceSummary:
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
    return b"{" + step_members(step, compiled, explain) + b"}"


def step_members(step: Step, compiled: engine.CompiledInstance, explain: bool) -> bytes:
    """StepState's members as JSON, with the candidates only when asked for."""
    return step.fields + b',"candidates":' + candidates_json(compiled, step.scores) if explain else step.fields


def candidates_json(compiled: engine.CompiledInstance, scores: np.ndarray) -> bytes:
    """The best EXPLAIN_CANDIDATES tests by score (NaN: not eligible, left out), ties in instance
    order, as JSON."""
    ranked = np.where(np.isnan(scores), np.inf, -scores)
    best = [t for t in np.argsort(ranked, kind="stable")[:EXPLAIN_CANDIDATES].tolist() if ranked[t] != np.inf]
    tests, costs = compiled.test_ids, compiled.costs
    return orjson.dumps([{"test": tests[t], "score": float(scores[t]), "cost": float(costs[t])} for t in best])


def step_of(compiled: engine.CompiledInstance, policy: str, decision: engine.Decision,
            previous: Computed | None = None) -> Step:
    """The step's JSON. ``previous``: the step before (and its belief), whose history's JSON is
    reused when this belief carries its observations forward: a step late in a session then
    writes one history entry, not all of them."""
    belief = decision.belief
    posterior = belief.class_posterior
    # Most probable first, ties in instance order; the classes of probability 0 sort last and are left out.
    order = np.argsort(-posterior, kind="stable")[:np.count_nonzero(posterior)]
    labels, tests, costs = compiled.class_labels, compiled.test_ids, compiled.costs
    next_tests = [{"id": tests[t], "cost": float(costs[t]), "outcomes": list(compiled.outcome_labels[t])}
                  for t in decision.batch]
    head = {
        "policy": policy,
        "step": len(belief.answers),
        "next_test": next_tests[0] if next_tests else None,
        "next_tests": next_tests,
        "done": decision.done,
        "stop_reason": None if decision.stop_reason is None else str(decision.stop_reason),
        "cost_spent": float(belief.cost_spent),
    }
    tail = {
        "class_posterior": dict(zip(map(labels.__getitem__, order.tolist()), posterior[order].tolist())),
        "map_class": labels[int(order[0])],
        "version_space_size": int(belief.alive.size) if compiled.kind == "deterministic" else None,
        **decision_fields(compiled, belief),
    }
    history = history_json(compiled, belief.observations, previous)
    opening = orjson.dumps(head)[1:-1] + b',"history":'
    fields = opening + history + b"," + orjson.dumps(tail)[1:-1]
    return Step(fields, decision.scores, decision.done, head["stop_reason"],
                tuple(test["id"] for test in next_tests), (len(opening), len(opening) + len(history)))


def history_json(compiled: engine.CompiledInstance, observations: tuple[engine.Observation, ...],
                 previous: Computed | None) -> bytes:
    """The history's JSON array: the previous step's, extended by the observations since, when
    its belief's observations begin these; else written whole."""
    carried, written = b"[]", 0
    if previous is not None and previous[1] is not None:
        before = previous[1].observations
        if observations[:len(before)] == before:
            start, end = previous[0].history
            carried, written = previous[0].fields[start:end], len(before)
    tests, costs = compiled.test_ids, compiled.costs
    added = orjson.dumps([{"test": tests[t], "skipped": True, "cost": float(costs[t]) if compiled.skip_charged else 0.0}
                          if k == engine.SKIPPED else
                          {"test": tests[t], "outcome": compiled.outcome_labels[t][k], "cost": float(costs[t])}
                          for t, k in observations[written:]])
    if carried == b"[]":
        return added
    return carried if added == b"[]" else carried[:-1] + b"," + added[1:]


def decision_fields(compiled: engine.CompiledInstance, belief: engine.Belief) -> WireBody:
    """Decision instances: the decision to act on (``expected_loss`` only with losses) and
    P(acceptable) per decision, most probable first; nothing for a class instance."""
    if not compiled.is_decision:
        return {}
    probability, losses = engine.decision_posterior(belief), engine.expected_loss(belief)
    chosen = engine.choose_decision(probability, losses)
    decision = {"id": compiled.decision_labels[chosen], "probability": float(probability[chosen])}
    if losses is not None:
        decision["expected_loss"] = float(losses[chosen])
    order = np.argsort(-probability, kind="stable")
    return {"decision": decision,
            "decision_posterior": {compiled.decision_labels[d]: float(probability[d]) for d in order}}
