"""The session domain: a stored :class:`SessionRecord` plus its :class:`CompiledInstance` in,
the wire state out. HTTP handlers parse, call one method here, and serialise.

A session stores only facts — the observations by label, in order (answers, and skips) — and
everything else (the version space, the class posterior, the next tests) is recomputed from them
by the engine, so any worker can serve any session, a replayed observation is naturally a no-op,
and a corrected or withdrawn observation simply changes the facts the state is computed from.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple

import numpy as np
import orjson

from schemas.api import (
    InstanceList,
    InstanceListItem,
    InstanceSummary,
    ObservationCorrection,
    SelectRequest,
    SessionCreate,
    StepConfig,
)
from schemas.instance import Instance
from service import engine
from service.errors import (
    AmbiguousObservation,
    ServiceError,
    ConcurrentUpdate,
    IdempotencyKeyReused,
    InstanceExpired,
    InstanceGone,
    InstanceNotFound,
    ObservationNotFound,
    PreconditionFailed,
    PreconditionRequired,
    SessionDone,
    SessionNotFound,
    SessionUnreadable,
    UnknownTests,
)
from service.metrics import OBSERVATIONS_APPLIED, SELECTION_SECONDS, SESSIONS_CREATED
from service.store import DEFAULT_TENANT, CorruptRecord, SessionRecord, SessionStore, VersionConflict
from service.store.base import StoredInstance
from service.store.cache import ByteBoundedLRU

log = logging.getLogger(__name__)

# Compare-and-set attempts before answering 409 concurrent-update. Re-applying is safe: the
# observations are facts keyed by test, so a retry after losing sees its own work as a no-op.
CAS_ATTEMPTS = 5
EXPLAIN_CANDIDATES = 5
# Session ids carry 144 random bits (issue 6 asks for at least 128).
SESSION_ID_BYTES = 18

# Observations by label; the outcome of a skipped test is None.
Labelled = tuple[tuple[str, str | None], ...]
# A response body as plain data: the wire models of schemas/api.py (SessionState, StepState)
# define it, and the API tests validate real bodies against them, but building and dumping a
# pydantic model per response cost ~15% of an observation's CPU. A step is dumped by orjson once,
# when it is computed (_Step), and every response showing it splices those bytes.
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


def instance_summary(inst: engine.CompiledInstance) -> InstanceSummary:
    return InstanceSummary(instance_id=inst.content_hash, kind=inst.kind, n_hypotheses=inst.n_hypotheses,
                           n_tests=inst.n_tests, n_classes=inst.n_classes, warnings=list(inst.warnings),
                           decisions=list(inst.decision_labels) if inst.is_decision else None)


@dataclass(frozen=True, eq=False)
class _Step:
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


@dataclass(frozen=True)
class _Computed:
    step: _Step
    belief: engine.Belief | None  # None when not kept (see _StepCache)
    nbytes: int


class _StepCache(ByteBoundedLRU):
    """A small per-process LRU of computed steps keyed by everything a step depends on
    (instance, policy, stop rules, the seed where the policy draws from it, observations). A POST
    of an observation needs the step before it (is the session done?) and after it; the one
    before is usually the step this worker answered last time, so it is not computed twice, and
    its belief is carried forward to compute the one after (a pass over the survivors, not over
    every row).

    Bounded by the bytes its entries hold, not their number: keys (:func:`_key_bytes`), steps
    (:attr:`_Step.nbytes`; a step of a long session carries its whole history) and the beliefs
    kept to carry forward (their arrays). A belief over an eighth of the budget is not kept (its
    step is): it would push out many steps to save one pass."""

    def get(self, key: _StepKey) -> _Step | None:
        entry = self._lookup(key)
        return None if entry is None else entry.step

    def computed(self, key: _StepKey) -> tuple[_Step, engine.Belief | None] | None:
        """The step and the belief it was computed from (None when not kept), without touching
        the order of eviction."""
        entry = self._peek(key)
        return None if entry is None else (entry.step, entry.belief)

    def put(self, key: _StepKey, step: _Step, belief: engine.Belief) -> None:
        size = _key_bytes(key, belief.instance) + step.nbytes
        held = _belief_bytes(belief)
        if held > self.max_bytes // 8:
            belief, held = None, 0
        if size + held <= self.max_bytes:  # else nothing changes, not even an entry of this key
            self._keep(key, _Computed(step, belief, size + held))


# Estimates from above of CPython's objects (64-bit): a 2-tuple of one observation and its slot
# in the tuple of all of them, a _Step with its bytes' and tuples' headers and a slot per test id
# (the ids are the instance's own strings), and a key's members but its labels (the rules, the
# tuples, the hash string).
OBSERVATION_BYTES = 72
STEP_OBJECT_BYTES = 512
TEST_SLOT_BYTES = 8
KEY_BYTES = 1024


class _StepKey(NamedTuple):
    """Everything a step depends on."""

    instance: str  # content hash
    policy: str
    rules: engine.StopRules
    seed: int | None  # None when the policy does not draw from it
    excluded: tuple[str, ...]
    batch_size: int
    observations: Labelled


# A belief and the step before it (with its belief), as _StepCache.computed gives it.
_Observed = tuple["engine.Belief", "tuple[_Step, engine.Belief | None] | None"]


def _step_key(compiled: engine.CompiledInstance, policy: str, rules: engine.StopRules, seed: int,
              observations: Labelled, excluded: tuple[str, ...], batch_size: int) -> _StepKey:
    # Sessions that differ in their seed alone share their steps, unless the policy draws from it.
    seeded = engine.resolve_policy(compiled, policy).seeded
    return _StepKey(compiled.content_hash, policy, rules, seed if seeded else None, excluded, batch_size, observations)


def _session_key(record: SessionRecord, compiled: engine.CompiledInstance, observations: Labelled) -> _StepKey:
    """The key of the step after ``observations`` in ``record``'s session."""
    rules = engine.StopRules(record.max_tests, record.max_cost, record.confidence, record.max_expected_loss)
    return _step_key(compiled, record.policy, rules, record.seed, observations, record.exclude_tests,
                     record.batch_size)


def _key_bytes(key: _StepKey, compiled: engine.CompiledInstance) -> int:
    """A step cache key's bytes, from above: every label as large as the instance's largest of
    its kind (a key's labels are the instance's test ids and outcome labels, or equal strings),
    counted in full though the keys of one session's steps share those of their common
    observations."""
    test_bytes, outcome_bytes = compiled.largest_label_bytes
    return (KEY_BYTES + (OBSERVATION_BYTES + test_bytes + outcome_bytes) * len(key.observations)
            + test_bytes * len(key.excluded))


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

    def list_instances(self, tenant: str = DEFAULT_TENANT, limit: int = 50, cursor: str | None = None) -> InstanceList:
        items, next_cursor = self.store.list_instances(tenant, limit, cursor)
        return InstanceList(items=[_listing_item(item) for item in items], next_cursor=next_cursor)

    def delete_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> None:
        """Delete the instance; its sessions then answer 410 instance-gone. A retried delete of
        an instance already deleted succeeds again (its deletion is remembered for its TTL)."""
        if not self.store.delete_instance(instance_id, tenant) and not self.store.instance_deleted(instance_id, tenant):
            raise InstanceNotFound(f"no instance '{instance_id}' (unknown, or expired)")

    def _instance_of(self, config: StepConfig, tenant: str, store_inline: bool) -> engine.CompiledInstance:
        if config.instance is None:
            return self.instance(config.instance_id, tenant)  # type: ignore[arg-type]
        compiled = self.compile(config.instance)
        if store_inline:
            self.store.put_instance(compiled, tenant)
        return compiled

    def _instance_of_session(self, record: SessionRecord) -> engine.CompiledInstance:
        compiled = self.store.get_instance(record.instance_id, record.tenant)
        if compiled is None and self.store.instance_deleted(record.instance_id, record.tenant):
            raise InstanceGone(
                f"session '{record.session_id}' refers to instance '{record.instance_id}', which was deleted")
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
        excluded = _checked_exclusions(compiled, request)
        engine.check_batch(compiled, request.batch_size)
        now = self.clock()
        record = SessionRecord(
            session_id=secrets.token_urlsafe(SESSION_ID_BYTES), instance_id=compiled.content_hash,
            policy=policy, max_tests=request.max_tests,
            max_cost=None if request.max_cost is None else float(request.max_cost),
            confidence=None if request.confidence is None else float(request.confidence),
            max_expected_loss=None if request.max_expected_loss is None else float(request.max_expected_loss),
            seed=request.seed, created_at=now, expires_at=now + self.session_ttl, tenant=tenant,
            exclude_tests=excluded, batch_size=request.batch_size,
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

    def observe(self, session_id: str, labelled: Sequence[tuple[str, str | None]], tenant: str = DEFAULT_TENANT,
                if_match: Callable[[int], bool] | None = None, explain: bool = False) -> SessionResult:
        """Record observations (answers and skips) in order, all or nothing, by compare-and-set
        on the version.

        Re-posting what is already recorded is a no-op, except an answer to a repeatable test,
        which is a new observation each time and therefore needs ``If-Match`` (428 without it),
        so a retry cannot count it twice. The same test with another outcome, or answered and
        skipped, is a conflict; anything new after the session stopped is refused, except the
        rest of the page it proposed last (batch sessions); an observation that contradicts every
        surviving hypothesis is refused and nothing is stored."""

        def attempt(record: SessionRecord) -> SessionResult | None:
            compiled = self._instance_of_session(record)
            fresh = self._new_observations(compiled, record, labelled)
            repeated = [test for test, outcome in fresh
                        if outcome is not None and compiled.repeatable_tests[compiled.test_index[test]]]
            if repeated and if_match is None:
                raise PreconditionRequired(
                    f"test '{repeated[0]}' is repeatable, so posting its answer again would record it again: "
                    "send If-Match with the session's ETag, so a retry of this request cannot be applied twice")
            if if_match is not None and not if_match(record.version) and fresh:
                # RFC 9110 §13.1.1: a change that has already been applied may answer 2xx.
                raise PreconditionFailed(
                    f"If-Match does not name the session's current version (\"{record.version}\")")
            if not fresh:
                return SessionResult(self._state(record, compiled, explain), record.version)
            observations = record.observations
            for observation in fresh:
                # The step before each new observation (the one before the first was computed when
                # the record was written) raises InconsistentObservation for an earlier one.
                state = self._step(record, compiled, observations)
                if state.done and observation[0] not in self._last_page(record, compiled, observations):
                    raise SessionDone(
                        f"the session stopped ({state.stop_reason}) before '{observation[0]}' was observed; "
                        "start a new session to go on")
                observations = (*observations, observation)
            result = self._commit(record, observations, compiled, explain)
            if result is not None:
                OBSERVATIONS_APPLIED.inc(len(fresh))
            return result

        return self._update(session_id, tenant, attempt)

    def correct(self, session_id: str, test: str, correction: ObservationCorrection, occurrence: int | None = None,
                tenant: str = DEFAULT_TENANT, if_match: Callable[[int], bool] | None = None,
                explain: bool = False) -> SessionResult:
        """Replace a recorded observation of ``test`` by another outcome, or by a skip (PUT).

        Idempotent: replacing it by what it already is changes nothing (and answers 200 even on
        a stale If-Match, the change having been applied). A repeated test needs ``occurrence``
        (1 = its first answer)."""

        def edit(compiled: engine.CompiledInstance, observations: Labelled) -> Labelled:
            position = _position_of(compiled, observations, test, occurrence)
            outcome = correction.outcome
            if outcome is not None:
                t = compiled.test_index[test]
                if str(outcome) not in compiled.outcome_index[t]:
                    raise engine.UnknownOutcome(f"'{outcome}' is not an outcome of test '{test}' "
                                                f"(expected one of {list(compiled.outcome_labels[t])})")
            return (*observations[:position], (test, outcome), *observations[position + 1:])

        return self._rewrite(session_id, tenant, if_match, explain, edit, repeat_safe=True)

    def withdraw(self, session_id: str, test: str, occurrence: int | None = None, tenant: str = DEFAULT_TENANT,
                 if_match: Callable[[int], bool] | None = None, explain: bool = False) -> SessionResult:
        """Remove a recorded observation of ``test`` (DELETE): the state is recomputed as if it
        was never made, so the test may be proposed again. Withdrawing one answer of a
        repeatable test needs If-Match (a retry would withdraw the next one)."""

        def edit(compiled: engine.CompiledInstance, observations: Labelled) -> Labelled:
            position = _position_of(compiled, observations, test, occurrence)
            if compiled.repeatable_tests[compiled.test_index[test]] and if_match is None:
                raise PreconditionRequired(
                    f"test '{test}' is repeatable, so a repeated withdrawal would remove another of its "
                    "answers: send If-Match with the session's ETag")
            return (*observations[:position], *observations[position + 1:])

        return self._rewrite(session_id, tenant, if_match, explain, edit, repeat_safe=False)

    def _rewrite(self, session_id: str, tenant: str, if_match: Callable[[int], bool] | None, explain: bool,
                 edit: Callable[[engine.CompiledInstance, Labelled], Labelled], repeat_safe: bool) -> SessionResult:
        """Apply ``edit`` to the recorded facts by compare-and-set and recompute the state from
        them (a corrected session may stop, or go on again). A result that leaves no consistent
        hypothesis is refused (409 inconsistent) and nothing is stored."""

        def attempt(record: SessionRecord) -> SessionResult | None:
            compiled = self._instance_of_session(record)
            observations = edit(compiled, record.observations)
            unchanged = observations == record.observations
            if if_match is not None and not if_match(record.version) and not (repeat_safe and unchanged):
                raise PreconditionFailed(
                    f"If-Match does not name the session's current version (\"{record.version}\")")
            if unchanged:
                return SessionResult(self._state(record, compiled, explain), record.version)
            return self._commit(record, observations, compiled, explain)

        return self._update(session_id, tenant, attempt)

    def _update(self, session_id: str, tenant: str,
                attempt: Callable[[SessionRecord], SessionResult | None]) -> SessionResult:
        """Run ``attempt`` on the session's record until it answers. ``attempt`` returns the
        result (a change committed by compare-and-set, or nothing to change), or None when its
        compare-and-set lost to another writer.

        The first attempt starts from the record as this worker last read or wrote it, with no
        read (the store's ``recall_session``): most requests of a session come to the worker
        that served the last one, and then the compare-and-set is the one round trip. A record
        recalled may be stale, so only a committed change is answered from it; a refusal or "no
        change" is decided again on a fresh read. A lost compare-and-set starts again from the
        record it lost to, when the store learnt it, else from a fresh read."""
        record = self.store.recall_session(session_id, tenant)
        for _ in range(CAS_ATTEMPTS):
            recalled = record is not None
            if not recalled:
                record = self._record(session_id, tenant)
            try:
                result = attempt(record)
            except (ServiceError, engine.EngineError):
                if not recalled:
                    raise
                record = None
                continue
            if result is None:
                record = self.store.recall_session(session_id, tenant)
            elif recalled and result.version == record.version:
                record = None
            else:
                return result
        raise ConcurrentUpdate("the session kept changing while this update was applied; retry")

    def select(self, request: SelectRequest, tenant: str = DEFAULT_TENANT, explain: bool = False) -> bytes:
        """The step for observations the client keeps itself, as JSON; nothing is stored."""
        compiled = self._instance_of(request, tenant, store_inline=False)
        policy = engine.resolve_policy(compiled, request.policy).name
        excluded = _checked_exclusions(compiled, request)
        engine.check_batch(compiled, request.batch_size)
        parsed = engine.parse_observations(compiled, request.labelled())
        observations = tuple(_labels_of(compiled, t, k) for t, k in parsed)
        rules = engine.StopRules(request.max_tests, None if request.max_cost is None else float(request.max_cost),
                                 None if request.confidence is None else float(request.confidence),
                                 None if request.max_expected_loss is None else float(request.max_expected_loss))
        return _wire(self._compute(compiled, _step_key(compiled, policy, rules, request.seed, observations, excluded,
                                                       request.batch_size)),
                     compiled, explain)

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
                          labelled: Sequence[tuple[str, str | None]]) -> Labelled:
        """The posted observations not yet recorded, with canonical labels (every answer to a
        repeatable test is new). Raises the engine's UnknownTest / UnknownOutcome /
        ConflictingObservation (positions as posted)."""
        parsed = engine.parse_observations(compiled, labelled)
        recorded = dict(record.observations)  # a repeatable test: its last answer, enough here
        fresh = []
        for t, k in parsed:
            test, outcome = _labels_of(compiled, t, k)
            if test in recorded and (recorded[test] is None) != (outcome is None):
                raise engine.ConflictingObservation(
                    f"test '{test}' was {'skipped' if recorded[test] is None else 'answered'} in this session; "
                    f"to change that, PUT /v1/sessions/{record.session_id}/observations/{test}")
            if test in recorded and not (outcome is not None and compiled.repeatable_tests[t]):
                if recorded[test] != outcome:
                    raise engine.ConflictingObservation(
                        f"test '{test}' was already observed as '{recorded[test]}' in this session; to correct "
                        f"it, PUT /v1/sessions/{record.session_id}/observations/{test}")
                continue
            fresh.append((test, outcome))
        return tuple(fresh)

    def _last_page(self, record: SessionRecord, compiled: engine.CompiledInstance, observations: Labelled) -> set[str]:
        """The tests of the page a batch session proposed last before it stopped (empty for a
        one-test session): the latest of the last ``batch_size`` states that was not done. Its
        remaining answers are still accepted once the session is done: the respondent saw them
        together and answered them in any order."""
        if record.batch_size <= 1:
            return set()
        for end in range(len(observations) - 1, max(-1, len(observations) - record.batch_size - 1), -1):
            state = self._step(record, compiled, observations[:end])
            if not state.done:
                return set(state.next_tests)
        return set()

    def _step(self, record: SessionRecord, compiled: engine.CompiledInstance, observations: Labelled) -> _Step:
        """The step after ``observations`` in ``record``'s session."""
        return self._compute(compiled, _session_key(record, compiled, observations))

    def _compute(self, compiled: engine.CompiledInstance, key: _StepKey, observed: _Observed | None = None) -> _Step:
        """The step ``key`` names (``observed``: its belief, from :meth:`_observe`, given by a caller
        that found no step under ``key``)."""
        step = self._steps.get(key) if observed is None else None
        if step is None:
            with SELECTION_SECONDS.time():
                belief, previous = self._observe(compiled, key) if observed is None else observed
                excluded_mask = None
                if key.excluded:
                    excluded_mask = np.zeros(compiled.n_tests, dtype=bool)
                    excluded_mask[[compiled.test_index[t] for t in key.excluded]] = True
                # The key holds the seed whenever the policy draws from it.
                decision = engine.decide(belief, engine.resolve_policy(compiled, key.policy), key.rules,
                                         key.seed or 0, excluded_mask, key.batch_size)
            step = _step_of(compiled, key.policy, decision, previous)
            self._steps.put(key, step, belief)
        return step

    def _observe(self, compiled: engine.CompiledInstance, key: _StepKey) -> _Observed:
        """The belief after the key's observations, carried forward from the step before when this
        worker computed it, and that step; raises InconsistentObservation when they leave no
        hypothesis alive."""
        observations = key.observations
        previous = self._steps.computed(_StepKey(*key[:-1], observations[:-1])) if observations else None
        before = None if previous is None else previous[1]
        if before is None:
            parsed = engine.parse_observations(compiled, observations)
        else:  # its belief's observations are the parse of all but the last
            parsed = engine.parse_observations(compiled, observations[-1:], before.observations, len(observations) - 1)
        return engine.observe(compiled, parsed, before), previous

    def _commit(self, record: SessionRecord, observations: Labelled, compiled: engine.CompiledInstance,
                explain: bool) -> SessionResult | None:
        """Store ``record`` with these observations (a new version, its TTL slid) unless another
        writer changed it since it was read: then None, and the caller reads it again. Observations
        that leave no hypothesis alive are refused first (InconsistentObservation); the step after
        them is computed once they are stored, so an attempt that loses (a record this worker
        remembered that another has moved on from) costs no step."""
        key = _session_key(record, compiled, observations)
        step = self._steps.get(key)  # computed already: they are consistent
        observed = None if step is not None else self._observe(compiled, key)
        updated = record.with_observations(observations, expires_at=self.clock() + self.session_ttl)
        try:
            self.store.update_session(updated, expected_version=record.version)
        except VersionConflict:
            return None
        if step is None:
            step = self._compute(compiled, key, observed)
        return SessionResult(self._state(updated, compiled, explain, step), updated.version)

    def _state(self, record: SessionRecord, compiled: engine.CompiledInstance, explain: bool,
               step: _Step | None = None) -> bytes:
        """SessionState's wire form, as JSON: the session's id, its step's members (``step``, when
        the caller has it), when it expires."""
        if step is None:
            step = self._step(record, compiled, record.observations)
        return (b'{"session_id":' + orjson.dumps(record.session_id) + b"," + _members(step, compiled, explain)
                + b',"expires_at":' + orjson.dumps(_rfc3339(record.expires_at)) + b"}")


def _config_of(record: SessionRecord) -> tuple:
    return (record.instance_id, record.policy, record.max_tests, record.max_cost, record.confidence, record.seed,
            record.max_expected_loss, record.exclude_tests, record.batch_size)


def _checked_exclusions(compiled: engine.CompiledInstance, config: StepConfig) -> tuple[str, ...]:
    """``exclude_tests`` as canonical ids, first mention first; unknown ids are refused with
    their paths."""
    unknown = [{"path": f"exclude_tests[{i}]", "message": f"unknown test '{test}'"}
               for i, test in enumerate(config.exclude_tests) if test not in compiled.test_index]
    if unknown:
        raise UnknownTests(f"exclude_tests names {len(unknown)} test(s) the instance does not have", unknown)
    return tuple(dict.fromkeys(config.exclude_tests))


def _labels_of(compiled: engine.CompiledInstance, t: int, k: int) -> tuple[str, str | None]:
    return compiled.test_ids[t], None if k == engine.SKIPPED else compiled.outcome_labels[t][k]


def _position_of(compiled: engine.CompiledInstance, observations: Labelled, test: str,
                 occurrence: int | None) -> int:
    """Where the observation a correction names is in the facts: the test's only one, or its
    ``occurrence``-th (1-based) when it was answered several times."""
    if test not in compiled.test_index:
        raise engine.UnknownTest(f"unknown test '{test}'")
    positions = [i for i, (recorded, _) in enumerate(observations) if recorded == test]
    if not positions:
        raise ObservationNotFound(f"test '{test}' has no observation in this session")
    if occurrence is None:
        if len(positions) > 1:
            raise AmbiguousObservation(f"test '{test}' was answered {len(positions)} times in this session; "
                                       "say which answer with ?occurrence=1 (first) to "
                                       f"?occurrence={len(positions)} (last)")
        return positions[0]
    if occurrence > len(positions):
        raise ObservationNotFound(f"test '{test}' has {len(positions)} observation(s) in this session, "
                                  f"not {occurrence}")
    return positions[occurrence - 1]


def _listing_item(item: StoredInstance) -> InstanceListItem:
    return InstanceListItem(instance_id=item.instance_id, kind=item.kind, n_hypotheses=item.n_hypotheses,
                            n_tests=item.n_tests, n_classes=item.n_classes, created_at=_rfc3339(item.created_at))


def _rfc3339(unix_seconds: float) -> str:
    global _last_rfc3339
    second = int(unix_seconds)  # whole seconds are shown: the same text for every call within one
    if _last_rfc3339[0] != second:
        _last_rfc3339 = (second, datetime.fromtimestamp(second, tz=timezone.utc).isoformat().replace("+00:00", "Z"))
    return _last_rfc3339[1]


_last_rfc3339: tuple[int, str] = (-1, "")


def _members(step: _Step, compiled: engine.CompiledInstance, explain: bool) -> bytes:
    """StepState's members as JSON, with the candidates only when asked for."""
    return step.fields + b',"candidates":' + _candidates(compiled, step.scores) if explain else step.fields


def _wire(step: _Step, compiled: engine.CompiledInstance, explain: bool) -> bytes:
    """StepState's wire form, as JSON."""
    return b"{" + _members(step, compiled, explain) + b"}"


def _candidates(compiled: engine.CompiledInstance, scores: np.ndarray) -> bytes:
    """The best EXPLAIN_CANDIDATES tests by score (NaN: not eligible, left out), ties in instance
    order, as JSON."""
    ranked = np.where(np.isnan(scores), np.inf, -scores)
    best = [t for t in np.argsort(ranked, kind="stable")[:EXPLAIN_CANDIDATES].tolist() if ranked[t] != np.inf]
    tests, costs = compiled.test_ids, compiled.costs
    return orjson.dumps([{"test": tests[t], "score": float(scores[t]), "cost": float(costs[t])} for t in best])


def _step_of(compiled: engine.CompiledInstance, policy: str, decision: engine.Decision,
             previous: tuple[_Step, engine.Belief | None] | None = None) -> _Step:
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
        **_decision_fields(compiled, belief),
    }
    history = _history(compiled, belief.observations, previous)
    opening = orjson.dumps(head)[1:-1] + b',"history":'
    fields = opening + history + b"," + orjson.dumps(tail)[1:-1]
    return _Step(fields, decision.scores, decision.done, head["stop_reason"],
                 tuple(test["id"] for test in next_tests), (len(opening), len(opening) + len(history)))


def _history(compiled: engine.CompiledInstance, observations: tuple[engine.Observation, ...],
             previous: tuple[_Step, engine.Belief | None] | None) -> bytes:
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
