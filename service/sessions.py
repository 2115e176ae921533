"""The session domain: a stored :class:`SessionRecord` plus its :class:`CompiledInstance` in,
the wire state out. HTTP handlers parse, call one method here, and serialise.

A session stores only facts — the observations by label, in order — and everything else (the
version space, the class posterior, the next test) is recomputed from them by the engine, so any
worker can serve any session and a replayed observation is naturally a no-op.
"""

from __future__ import annotations

import logging
import secrets
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from schemas.api import InstanceSummary, SelectRequest, SessionCreate, StepConfig
from schemas.instance import Instance
from service import engine
from service.errors import (
    ConcurrentUpdate,
    IdempotencyKeyReused,
    InstanceExpired,
    InstanceNotFound,
    PreconditionFailed,
    SessionDone,
    SessionNotFound,
    SessionUnreadable,
)
from service.metrics import OBSERVATIONS_APPLIED, SELECTION_SECONDS, SESSIONS_CREATED
from service.store import DEFAULT_TENANT, CorruptRecord, SessionRecord, SessionStore, VersionConflict

log = logging.getLogger(__name__)

# Compare-and-set attempts before answering 409 concurrent-update. Re-applying is safe: the
# observations are facts keyed by test, so a retry after losing sees its own work as a no-op.
CAS_ATTEMPTS = 5
EXPLAIN_CANDIDATES = 5
# Session ids carry 144 random bits (issue 6 asks for at least 128).
SESSION_ID_BYTES = 18

Labelled = tuple[tuple[str, str], ...]
# A response body as plain data, serialised by orjson as it is: the wire models of schemas/api.py
# (SessionState, StepState) define it, and the API tests validate real bodies against them, but
# building and dumping a pydantic model per response cost ~15% of an observation's CPU.
WireBody = dict[str, Any]


@dataclass(frozen=True)
class SessionResult:
    state: WireBody  # SessionState's wire form
    version: int  # the ETag of the session's representation
    created: bool = False
    replayed: bool = False


def instance_summary(inst: engine.CompiledInstance) -> InstanceSummary:
    return InstanceSummary(instance_id=inst.content_hash, kind=inst.kind, n_hypotheses=inst.n_hypotheses,
                           n_tests=inst.n_tests, n_classes=inst.n_classes, warnings=list(inst.warnings),
                           decisions=list(inst.decision_labels) if inst.is_decision else None)


@dataclass(frozen=True, eq=False)
class _Step:
    """One computed step: StepState's wire form without ``candidates``, and the candidates (sent
    with ?explain=true)."""

    body: WireBody
    candidates: list[WireBody]

    @property
    def done(self) -> bool:
        return self.body["done"]

    @property
    def stop_reason(self) -> str | None:
        return self.body["stop_reason"]


class _StepCache:
    """A small per-process LRU of computed steps keyed by everything a step depends on
    (instance, policy, stop rules, the seed where the policy draws from it, observations). A POST
    of an observation needs the step before it (is the session done?) and after it; the one
    before is usually the step this worker answered last time, so it is not computed twice, and
    its belief is carried forward to compute the one after (a pass over the survivors, not over
    every row).

    Bounded by the bytes its entries hold, not their number: keys and steps (:func:`_deep_size`;
    a step of a long session carries its whole history) and the beliefs kept to carry forward
    (their arrays). A belief over an eighth of the budget is not kept (its step is): it would push
    out many steps to save one pass."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple, tuple[_Step, engine.Belief | None, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> _Step | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def belief(self, key: tuple) -> engine.Belief | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[1]

    def put(self, key: tuple, step: _Step, belief: engine.Belief) -> None:
        size = _deep_size(key) + _deep_size(step)
        held = _belief_bytes(belief)
        if held > self.max_bytes // 8:
            belief, held = None, 0
        size += held
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[2]
            self._entries[key] = (step, belief, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (_, _, evicted) = self._entries.popitem(last=False)
                self.nbytes -= evicted

    def __len__(self) -> int:
        return len(self._entries)


def _deep_size(value, seen: set[int] | None = None) -> int:
    """Bytes of ``value`` and everything it holds (containers, dataclasses, scalars), each object
    once. Strings shared with the compiled instance are counted again: an overestimate, which is
    the safe side for a bound."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        size += sum(_deep_size(item, seen) for item in value)
    elif hasattr(value, "__dataclass_fields__"):
        size += sum(_deep_size(getattr(value, name), seen) for name in value.__dataclass_fields__)
    return size


def _belief_bytes(belief: engine.Belief) -> int:
    arrays = {id(a): a for a in (belief.alive, belief.mass, belief.support, belief.log_posterior) if a is not None}
    return sum(a.nbytes for a in arrays.values())


class Sessions:
    """Instances and sessions over one :class:`SessionStore`."""

    def __init__(self, store: SessionStore, *, session_ttl: int, max_cells: int,
                 max_compiled_bytes: int, step_cache_bytes: int = 64 * 1024 * 1024,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.session_ttl = session_ttl
        self.max_cells = max_cells
        self.max_compiled_bytes = max_compiled_bytes
        self.clock = clock
        self._steps = _StepCache(step_cache_bytes)

    # --- instances ----------------------------------------------------------------------

    def compile(self, instance: Instance) -> engine.CompiledInstance:
        return engine.compile_instance(instance, max_cells=self.max_cells, max_bytes=self.max_compiled_bytes)

    def register_instance(self, instance: Instance, tenant: str = DEFAULT_TENANT) -> tuple[InstanceSummary, bool]:
        """Compile and store under the content hash; True when it was not stored before."""
        compiled = self.compile(instance)
        created = self.store.put_instance(compiled, tenant)
        return instance_summary(compiled), created

    def instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> engine.CompiledInstance:
        compiled = self.store.get_instance(instance_id, tenant)
        if compiled is None:
            raise InstanceNotFound(f"no instance '{instance_id}' (unknown, or expired)")
        return compiled

    def _instance_of(self, config: StepConfig, tenant: str, store_inline: bool) -> engine.CompiledInstance:
        if config.instance is None:
            return self.instance(config.instance_id, tenant)  # type: ignore[arg-type]
        compiled = self.compile(config.instance)
        if store_inline:
            self.store.put_instance(compiled, tenant)
        return compiled

    def _instance_of_session(self, record: SessionRecord) -> engine.CompiledInstance:
        compiled = self.store.get_instance(record.instance_id, record.tenant)
        if compiled is None:
            raise InstanceExpired(
                f"session '{record.session_id}' refers to instance '{record.instance_id}', which has "
                "expired; post the instance again and start a new session"
            )
        return compiled

    # --- sessions -----------------------------------------------------------------------

    def create(self, request: SessionCreate, idempotency_key: str | None = None,
               tenant: str = DEFAULT_TENANT, explain: bool = False) -> SessionResult:
        # The inline instance is stored only once the request has passed every check (an unknown
        # policy must leave nothing behind).
        compiled = self._instance_of(request, tenant, store_inline=False)
        policy = engine.resolve_policy(compiled, request.policy).name
        now = self.clock()
        record = SessionRecord(
            session_id=secrets.token_urlsafe(SESSION_ID_BYTES), instance_id=compiled.content_hash,
            policy=policy, max_tests=request.max_tests,
            max_cost=None if request.max_cost is None else float(request.max_cost),
            confidence=None if request.confidence is None else float(request.confidence),
            max_expected_loss=None if request.max_expected_loss is None else float(request.max_expected_loss),
            seed=request.seed, created_at=now, expires_at=now + self.session_ttl, tenant=tenant,
        )
        state = self._state(record, compiled, explain)  # before storing: nothing is kept on failure
        if idempotency_key is not None:
            bound = self.store.idempotency_binding(idempotency_key, tenant)
            if bound is not None:  # a retry, or a reuse: answered without writing anything
                return self._replay(bound, record, tenant, explain)
        if request.instance is not None:
            self.store.put_instance(compiled, tenant)
        self.store.create_session(record)
        if idempotency_key is None:
            SESSIONS_CREATED.inc()
            return SessionResult(state, record.version, created=True)
        bound = self.store.claim_idempotency_key(idempotency_key, record.session_id, tenant)
        if bound is None:
            SESSIONS_CREATED.inc()
            return SessionResult(state, record.version, created=True)
        # A concurrent first use of the key won the claim. Drop ours and answer with that one.
        self.store.delete_session(record.session_id, tenant)
        return self._replay(bound, record, tenant, explain)

    def _replay(self, bound: str, record: SessionRecord, tenant: str, explain: bool) -> SessionResult:
        earlier = self._stored_session(bound, tenant)
        if earlier is None:
            raise IdempotencyKeyReused(
                "the session this Idempotency-Key created was deleted or has expired; use a new key")
        if _config_of(earlier) != _config_of(record):
            raise IdempotencyKeyReused(
                f"this Idempotency-Key already created session '{bound}' with a different request")
        return SessionResult(self._state(earlier, self._instance_of_session(earlier), explain),
                             earlier.version, created=True, replayed=True)

    def get(self, session_id: str, tenant: str = DEFAULT_TENANT, explain: bool = False) -> SessionResult:
        record = self._record(session_id, tenant)
        return SessionResult(self._state(record, self._instance_of_session(record), explain), record.version)

    def delete(self, session_id: str, tenant: str = DEFAULT_TENANT,
               if_match: Callable[[int], bool] | None = None) -> None:
        if if_match is not None:
            # Not atomic with the delete (the contract has no conditional delete); a delete racing
            # a write still removes the session, which is what the client asked for.
            if not if_match(self._record(session_id, tenant).version):
                raise PreconditionFailed("If-Match does not name the session's current version")
        if not self.store.delete_session(session_id, tenant):
            raise SessionNotFound(f"no session '{session_id}' (unknown, expired or deleted)")

    def observe(self, session_id: str, labelled: Sequence[tuple[str, str]], tenant: str = DEFAULT_TENANT,
                if_match: Callable[[int], bool] | None = None, explain: bool = False) -> SessionResult:
        """Record observations in order, all or nothing, by compare-and-set on the version.

        Re-posting what is already recorded is a no-op; the same test with another outcome is a
        conflict; anything new after the session stopped is refused; an observation that
        contradicts every surviving hypothesis is refused and nothing is stored."""
        for _ in range(CAS_ATTEMPTS):
            record = self._record(session_id, tenant)
            compiled = self._instance_of_session(record)
            fresh = self._new_observations(compiled, record, labelled)
            if if_match is not None and not if_match(record.version) and fresh:
                # RFC 9110 §13.1.1: a change that has already been applied may answer 2xx.
                raise PreconditionFailed(
                    f"If-Match does not name the session's current version (\"{record.version}\")")
            if not fresh:
                return SessionResult(self._state(record, compiled, explain), record.version)
            observations = record.observations
            for observation in fresh:
                if self._step(record, compiled, observations).done:
                    raise SessionDone(
                        f"the session stopped ({self._step(record, compiled, observations).stop_reason}) "
                        f"before '{observation[0]}' was observed; start a new session to go on")
                observations = (*observations, observation)
                self._step(record, compiled, observations)  # raises InconsistentObservation
            updated = replace(record.with_observations(observations), expires_at=self.clock() + self.session_ttl)
            try:
                self.store.update_session(updated, expected_version=record.version)
            except VersionConflict:
                continue
            OBSERVATIONS_APPLIED.inc(len(fresh))
            return SessionResult(self._state(updated, compiled, explain), updated.version)
        raise ConcurrentUpdate("the session kept changing while this update was applied; retry")

    def select(self, request: SelectRequest, tenant: str = DEFAULT_TENANT, explain: bool = False) -> WireBody:
        """The step for observations the client keeps itself; nothing is stored."""
        compiled = self._instance_of(request, tenant, store_inline=False)
        policy = engine.resolve_policy(compiled, request.policy).name
        parsed = engine.parse_observations(compiled, [(o.test, o.outcome) for o in request.observations])
        observations = tuple((compiled.test_ids[t], compiled.outcome_labels[t][k]) for t, k in parsed)
        rules = engine.StopRules(request.max_tests, None if request.max_cost is None else float(request.max_cost),
                                 None if request.confidence is None else float(request.confidence),
                                 None if request.max_expected_loss is None else float(request.max_expected_loss))
        return _wire(self._compute(compiled, policy, rules, request.seed, observations), explain)

    # --- the steps ----------------------------------------------------------------------

    def _record(self, session_id: str, tenant: str) -> SessionRecord:
        record = self._stored_session(session_id, tenant)
        if record is None:
            raise SessionNotFound(f"no session '{session_id}' (unknown, expired or deleted)")
        return record

    def _stored_session(self, session_id: str, tenant: str) -> SessionRecord | None:
        try:
            return self.store.get_session(session_id, tenant)
        except CorruptRecord as error:
            log.error("session %r of tenant %r is unreadable: %s", session_id, tenant, error)
            raise SessionUnreadable(f"session '{session_id}' cannot be read back from the store; "
                                    "start a new session (the incident is logged)") from None

    @staticmethod
    def _new_observations(compiled: engine.CompiledInstance, record: SessionRecord,
                          labelled: Sequence[tuple[str, str]]) -> Labelled:
        """The posted observations not yet recorded, with canonical labels. Raises the engine's
        UnknownTest / UnknownOutcome / ConflictingObservation (positions as posted)."""
        parsed = engine.parse_observations(compiled, labelled)
        recorded = dict(record.observations)
        fresh = []
        for t, k in parsed:
            test, outcome = compiled.test_ids[t], compiled.outcome_labels[t][k]
            if test in recorded:
                if recorded[test] != outcome:
                    raise engine.ConflictingObservation(
                        f"test '{test}' was already observed as '{recorded[test]}' in this session")
                continue
            fresh.append((test, outcome))
        return tuple(fresh)

    def _step(self, record: SessionRecord, compiled: engine.CompiledInstance, observations: Labelled) -> _Step:
        rules = engine.StopRules(record.max_tests, record.max_cost, record.confidence, record.max_expected_loss)
        return self._compute(compiled, record.policy, rules, record.seed, observations)

    def _compute(self, compiled: engine.CompiledInstance, policy: str, rules: engine.StopRules, seed: int,
                 observations: Labelled) -> _Step:
        resolved = engine.resolve_policy(compiled, policy)
        # Sessions that differ in their seed alone share their steps, unless the policy draws
        # from the seed.
        key = (compiled.content_hash, policy, rules, seed if resolved.seeded else None)
        step = self._steps.get((*key, observations))
        if step is None:
            with SELECTION_SECONDS.time():
                parsed = engine.parse_observations(compiled, observations)
                previous = self._steps.belief((*key, observations[:-1])) if observations else None
                belief = engine.observe(compiled, parsed, previous)
                decision = engine.decide(belief, resolved, rules, seed)
            step = _step_of(compiled, policy, decision)
            self._steps.put((*key, observations), step, belief)
        return step

    def _state(self, record: SessionRecord, compiled: engine.CompiledInstance, explain: bool) -> WireBody:
        """SessionState's wire form: the session's id, its step's fields, when it expires."""
        step = self._step(record, compiled, record.observations)
        return {"session_id": record.session_id, **_wire(step, explain), "expires_at": _rfc3339(record.expires_at)}


def _config_of(record: SessionRecord) -> tuple:
    return (record.instance_id, record.policy, record.max_tests, record.max_cost, record.confidence, record.seed,
            record.max_expected_loss)


def _rfc3339(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _wire(step: _Step, explain: bool) -> WireBody:
    """StepState's wire form, with the candidates only when asked for."""
    return {**step.body, "candidates": step.candidates} if explain else step.body


def _step_of(compiled: engine.CompiledInstance, policy: str, decision: engine.Decision) -> _Step:
    belief = decision.belief
    posterior = belief.class_posterior
    order = np.argsort(-posterior, kind="stable")  # most probable first; ties in instance order
    order = order[posterior[order] > 0]
    labels, tests, costs = compiled.class_labels, compiled.test_ids, compiled.costs
    next_test = None
    if decision.next_test is not None:
        t = decision.next_test
        next_test = {"id": tests[t], "cost": float(costs[t]), "outcomes": list(compiled.outcome_labels[t])}
    scores = decision.scores
    scored = np.flatnonzero(~np.isnan(scores))
    best = scored[np.argsort(-scores[scored], kind="stable")][:EXPLAIN_CANDIDATES].tolist()
    body = {
        "policy": policy,
        "step": len(belief.observations),
        "next_test": next_test,
        "done": decision.done,
        "stop_reason": None if decision.stop_reason is None else str(decision.stop_reason),
        "cost_spent": float(belief.cost_spent),
        "history": [{"test": tests[t], "outcome": compiled.outcome_labels[t][k], "cost": float(costs[t])}
                    for t, k in belief.observations],
        "class_posterior": dict(zip((labels[i] for i in order.tolist()), posterior[order].tolist())),
        "map_class": labels[int(order[0])],
        "version_space_size": int(belief.alive.size) if compiled.kind == "deterministic" else None,
        **_decision_fields(compiled, belief),
    }
    candidates = [{"test": tests[t], "score": float(scores[t]), "cost": float(costs[t])} for t in best]
    return _Step(body, candidates)


def _decision_fields(compiled: engine.CompiledInstance, belief: engine.Belief) -> WireBody:
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
