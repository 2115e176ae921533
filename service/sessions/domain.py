"""The session domain: a stored :class:`SessionRecord` plus its :class:`CompiledInstance` in,
the wire state out. HTTP handlers parse, call one method here, and serialise.

A session stores only facts — the observations by label, in order (answers, and skips) — and
everything else (the version space, the class posterior, the next tests) is recomputed from them
by the engine, so any worker can serve any session, a replayed observation is naturally a no-op,
and a corrected or withdrawn observation simply changes the facts the state is computed from.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence

from schemas.api import EvaluateRequest, ObservationCorrection, SelectRequest, SessionCreate, StepConfig
from schemas.responses import AutoChoice, InstanceDetail, InstanceList, InstanceSummary
from schemas.instance import Instance
from service import engine
from service.auto import AutoChoices
from service.errors import InstanceNotFound, PreconditionFailed, SessionNotFound, UnknownTests
from service.metrics import SESSIONS_CREATED
from service.store import DEFAULT_TENANT, SessionRecord, SessionStore
from service.store.encoded import EncodedInstance

from . import exposure
from .commit import Writer
from .corrections import Correct, Withdraw
from .idempotency import config_of, replay
from .observations import Observe, labels_of
from .pages import Deadline
from .precompiled import PrecompiledInstance
from .records import instance_of_session, session_record
from .state import SessionResult, instance_summary, listing_item, step_json
from .steps import Steps, step_key

# Session ids carry 144 random bits (at least 128 are asked for).
SESSION_ID_BYTES = 18


class Sessions:
    """Instances and sessions over one :class:`SessionStore`."""

    def __init__(self, store: SessionStore, *, session_ttl: int, max_cells: int,
                 max_compiled_bytes: int, step_cache_bytes: int = 64 * 1024 * 1024,
                 grid_points: int = engine.item_bank.DEFAULT_GRID_POINTS,
                 max_observations: int = 10_000, time_limit: float = 5.0,
                 auto_budget: engine.Budget = engine.Budget(),
                 clock: Callable[[], float] = time.time, timer: Callable[[], float] = time.thread_time):
        """``max_observations``, ``time_limit``: SESSION_MAX_OBSERVATIONS and SESSION_TIME_LIMIT;
        ``auto_budget``: AUTO_RESPONDENTS and AUTO_CPU_SECONDS; ``grid_points``: ITEM_BANK_GRID_POINTS;
        ``clock`` dates expiries, ``timer`` measures work against the time limit."""
        self.store = store
        self.max_observations = max_observations
        self.time_limit = time_limit
        self.timer = timer
        self.session_ttl = session_ttl
        self.max_cells = max_cells
        self.max_compiled_bytes = max_compiled_bytes
        self.grid_points = grid_points
        # engine.compile_instance's limits, here and in a worker's isolated process (service/api/isolation.py).
        self.compile_limits = {"max_cells": max_cells, "max_bytes": max_compiled_bytes, "grid_points": grid_points}
        self.clock = clock
        self.steps = Steps(step_cache_bytes)
        self.writer = Writer(store, self.steps, session_ttl, clock)
        self.auto = AutoChoices(store, auto_budget)

    # --- instances ----------------------------------------------------------------------

    def compile(self, instance: Instance) -> engine.CompiledInstance:
        if isinstance(instance, PrecompiledInstance):  # a big request's, compiled by its worker's isolated process
            return instance.compiled()
        return engine.compile_instance(instance, **self.compile_limits)

    def register_instance(self, instance: Instance, tenant: str = DEFAULT_TENANT) -> tuple[InstanceSummary, bool]:
        """Compile and store under the content hash; True when it was not stored before."""
        stored = self._storable(instance)
        created = self.store.put_instance(stored, tenant)
        return instance_summary(stored), created

    def _storable(self, instance: Instance, compiled: engine.CompiledInstance | None = None
                  ) -> engine.CompiledInstance | EncodedInstance:
        """What the store is given for ``instance`` (``compiled``: it compiled already): one
        compiled by a worker's isolated process as it was encoded there, not encoded again."""
        if isinstance(instance, PrecompiledInstance):
            return instance.encoded
        return self.compile(instance) if compiled is None else compiled

    def instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> engine.CompiledInstance:
        compiled = self.store.get_instance(instance_id, tenant)
        if compiled is None:
            raise InstanceNotFound(f"no instance '{instance_id}' (unknown, or expired)")
        return compiled

    def instance_detail(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> InstanceDetail:
        """The instance's summary and what ``auto`` resolves to under the default stop rules."""
        compiled = self.instance(instance_id, tenant)
        try:
            choice = AutoChoice.model_validate(self.auto.choose(compiled, engine.StopRules(), tenant).to_dict())
        except engine.PolicyNotApplicable:  # no registered policy applies: nothing to choose from
            choice = None
        return InstanceDetail(**dict(instance_summary(compiled)), auto=choice)

    def list_instances(self, tenant: str = DEFAULT_TENANT, limit: int = 50, cursor: str | None = None) -> InstanceList:
        items, next_cursor = self.store.list_instances(tenant, limit, cursor)
        return InstanceList(items=[listing_item(item) for item in items], next_cursor=next_cursor)

    def delete_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> None:
        """Delete the instance; its sessions then answer 410 instance-gone. A retried delete of
        an instance already deleted succeeds again (its deletion is remembered for its TTL)."""
        if not self.store.delete_instance(instance_id, tenant) and not self.store.instance_deleted(instance_id, tenant):
            raise InstanceNotFound(f"no instance '{instance_id}' (unknown, or expired)")

    def _instance_of(self, config: StepConfig, tenant: str) -> engine.CompiledInstance:
        """The instance a request names, or compiles the one it carries (not stored here)."""
        if config.instance is None:
            return self.instance(config.instance_id, tenant)  # type: ignore[arg-type]
        return self.compile(config.instance)

    # --- sessions -----------------------------------------------------------------------

    def create(self, request: SessionCreate, idempotency_key: str | None = None,
               tenant: str = DEFAULT_TENANT, explain: bool = False) -> SessionResult:
        # The inline instance is stored only once the request has passed every check (an unknown
        # policy must leave nothing behind).
        compiled = self._instance_of(request, tenant)
        record = self._record(request, compiled, secrets.token_urlsafe(SESSION_ID_BYTES), self.clock(), tenant)
        if record.max_rate is not None:
            held_back, reserved = exposure.restriction(self.store, compiled, record, starting=True)
            record = dataclasses.replace(record, held_back=held_back, reserved=reserved)
        state = self.writer.state(record, compiled, explain)  # before storing: nothing is kept on failure
        if idempotency_key is not None:
            bound = self.store.idempotency_binding(idempotency_key, tenant)
            if bound is not None:  # a retry, or a reuse: answered without writing anything
                return replay(self.writer, bound, record, explain)
        if request.instance is not None:
            self.store.put_instance(self._storable(request.instance, compiled), tenant)
        self.store.create_session(record)
        if idempotency_key is not None:
            bound = self.store.claim_idempotency_key(idempotency_key, record.session_id, tenant)
            if bound is not None:
                # A concurrent first use of the key won the claim. Drop ours and answer with that one.
                self.store.delete_session(record.session_id, tenant)
                return replay(self.writer, bound, record, explain)
        if record.max_rate is not None:
            exposure.count(self.store, record, sessions=1)
        SESSIONS_CREATED.inc()
        return SessionResult(state, record.version, created=True)

    def _record(self, request: SessionCreate, compiled: engine.CompiledInstance, session_id: str, now: float,
                tenant: str) -> SessionRecord:
        """The session ``request`` creates, checked, not stored."""
        excluded = checked_exclusions(compiled, request)
        engine.check_batch(compiled, request.batch_size)
        # Last of the checks: auto's choice is stored once made. The record keeps it: a session
        # never changes policy.
        policy = self.auto.policy(compiled, request.policy, stop_rules(request), tenant)
        return SessionRecord(
            session_id=session_id, instance_id=compiled.content_hash,
            policy=policy, max_tests=request.max_tests,
            max_cost=None if request.max_cost is None else float(request.max_cost),
            confidence=None if request.confidence is None else float(request.confidence),
            max_expected_loss=None if request.max_expected_loss is None else float(request.max_expected_loss),
            max_se=None if request.max_se is None else float(request.max_se),
            randomesque=None if request.exposure is None else request.exposure.k,
            sympson_hetter=True if request.exposure and request.exposure.sympson_hetter else None,
            progressive=True if request.exposure and request.exposure.progressive else None,
            max_rate=None if request.exposure is None else request.exposure.max_rate,
            seed=request.seed, created_at=now, expires_at=now + self.session_ttl, tenant=tenant,
            exclude_tests=excluded, batch_size=request.batch_size,
        )

    def created_by(self, session_id: str, request: SessionCreate, tenant: str = DEFAULT_TENANT) -> bool:
        """Whether the stored session is one ``request`` creates (the same instance, policy and
        rules): a façade that names sessions under a parent (a CAT section) checks the parent
        with it. 404 when there is no such session."""
        record = session_record(self.store, session_id, tenant)
        expected = self._record(request, self._instance_of(request, tenant), session_id, record.created_at, tenant)
        return config_of(record) == config_of(expected)

    def get(self, session_id: str, tenant: str = DEFAULT_TENANT, explain: bool = False) -> SessionResult:
        record = session_record(self.store, session_id, tenant)
        return SessionResult(self.writer.state(record, instance_of_session(self.store, record), explain),
                             record.version)

    def delete(self, session_id: str, tenant: str = DEFAULT_TENANT,
               if_match: Callable[[int], bool] | None = None) -> None:
        if if_match is not None:
            # Not atomic with the delete (the contract has no conditional delete); a delete racing
            # a write still removes the session, which is what the client asked for.
            if not if_match(session_record(self.store, session_id, tenant).version):
                raise PreconditionFailed("If-Match does not name the session's current version")
        if not self.store.delete_session(session_id, tenant):
            raise SessionNotFound(f"no session '{session_id}' (unknown, expired or deleted)")

    def observe(self, session_id: str, labelled: Sequence[tuple[str, str | None]], tenant: str = DEFAULT_TENANT,
                if_match: Callable[[int], bool] | None = None, explain: bool = False,
                listed: bool = True) -> SessionResult:
        """Record observations (answers and skips) in order, all or nothing (:class:`Observe`;
        ``listed``: posted as a list, not as one observation)."""
        operation = Observe(self.steps, labelled, if_match, self.max_observations,
                            Deadline.after(self.time_limit, self.timer), listed)
        return self.writer.update(session_id, tenant, operation, explain)

    def correct(self, session_id: str, test: str, correction: ObservationCorrection, occurrence: int | None = None,
                tenant: str = DEFAULT_TENANT, if_match: Callable[[int], bool] | None = None,
                explain: bool = False) -> SessionResult:
        """Replace a recorded observation of ``test`` by another outcome, or by a skip (:class:`Correct`)."""
        return self.writer.update(session_id, tenant, Correct(test, correction, occurrence, if_match), explain)

    def withdraw(self, session_id: str, test: str, occurrence: int | None = None, tenant: str = DEFAULT_TENANT,
                 if_match: Callable[[int], bool] | None = None, explain: bool = False) -> SessionResult:
        """Remove a recorded observation of ``test`` (:class:`Withdraw`)."""
        return self.writer.update(session_id, tenant, Withdraw(test, occurrence, if_match), explain)

    def select(self, request: SelectRequest, tenant: str = DEFAULT_TENANT, explain: bool = False) -> bytes:
        """The step for observations the client keeps itself, as JSON; nothing is stored."""
        compiled = self._instance_of(request, tenant)
        excluded = checked_exclusions(compiled, request)
        engine.check_batch(compiled, request.batch_size)
        parsed = engine.parse_observations(compiled, request.labelled())
        observations = tuple(labels_of(compiled, t, k) for t, k in parsed)
        rules = stop_rules(request)
        if rules.max_rate is not None:
            raise engine.StopRuleNotApplicable("restricted counts how often an instance's sessions gave each test; "
                                               "a stateless select belongs to none (create a session)",
                                               "exposure.method")
        policy = self.auto.policy(compiled, request.policy, rules, tenant)  # last: auto's choice is stored
        key = step_key(tenant, compiled, policy, rules, request.seed, observations, excluded, request.batch_size)
        return step_json(self.steps.compute(compiled, key), compiled, explain)


def stop_rules(config: StepConfig | EvaluateRequest) -> engine.StopRules:
    """The stop rules and exposure control a session, a select or an evaluation asks for."""
    return engine.StopRules(config.max_tests, None if config.max_cost is None else float(config.max_cost),
                            None if config.confidence is None else float(config.confidence),
                            None if config.max_expected_loss is None else float(config.max_expected_loss),
                            None if config.max_se is None else float(config.max_se),
                            None if config.exposure is None else config.exposure.k,
                            config.exposure is not None and config.exposure.sympson_hetter,
                            config.exposure is not None and config.exposure.progressive,
                            None if config.exposure is None else config.exposure.max_rate)


def checked_exclusions(compiled: engine.CompiledInstance, config: StepConfig) -> tuple[str, ...]:
    """``exclude_tests`` as canonical ids, first mention first; unknown ids are refused with
    their paths."""
    unknown = [{"path": f"exclude_tests[{i}]", "message": f"unknown test '{test}'"}
               for i, test in enumerate(config.exclude_tests) if test not in compiled.test_index]
    if unknown:
        raise UnknownTests(f"exclude_tests names {len(unknown)} test(s) the instance does not have", unknown)
    return tuple(dict.fromkeys(config.exclude_tests))
