"""Changing a stored session: an operation decides the new facts from a record, and
:meth:`Writer.update` stores them by compare-and-set on the record's version, retrying on a lost
race.

Re-applying an operation is safe: the observations are facts keyed by test, so a retry after
losing sees its own work as a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from service import engine
from service.errors import ConcurrentUpdate, ServiceError
from service.metrics import OBSERVATIONS_APPLIED
from service.store import SessionRecord, SessionStore, VersionConflict

from . import exposure
from .records import instance_of_session, session_record
from .state import SessionResult, Step, session_json
from .steps import Labelled, Steps, session_key

# Compare-and-set attempts before answering 409 concurrent-update.
CAS_ATTEMPTS = 5


class Change(NamedTuple):
    """What an operation makes of a session's facts."""

    observations: Labelled  # all of them, in order
    applied: int = 0  # how many are new (counted in OBSERVATIONS_APPLIED)
    belief: engine.Belief | None = None  # the belief after them, when the operation has it


class Operation(Protocol):
    """One change a client asked for (an observation, a correction, a withdrawal)."""

    def plan(self, record: SessionRecord, compiled: engine.CompiledInstance) -> Change | None:
        """The facts after the change, or None when it changes nothing (a replay). Raises the
        refusal (ServiceError, EngineError) when the record does not allow it."""


class Writer:
    """Stores operations on sessions, and renders the state a write answers with."""

    def __init__(self, store: SessionStore, steps: Steps, session_ttl: int, clock: Callable[[], float]):
        self.store = store
        self.steps = steps
        self.session_ttl = session_ttl
        self.clock = clock

    def state(self, record: SessionRecord, compiled: engine.CompiledInstance, explain: bool,
              step: Step | None = None) -> bytes:
        """SessionState's wire form, as JSON (``step``, when the caller has it)."""
        if step is None:
            step = self.steps.of_session(record, compiled, record.observations)
        return session_json(record.session_id, record.expires_at, step, compiled, explain)

    def update(self, session_id: str, tenant: str, operation: Operation, explain: bool) -> SessionResult:
        """Apply ``operation`` to the session until it is stored, or changes nothing.

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
                record = session_record(self.store, session_id, tenant)
            try:
                compiled = instance_of_session(self.store, record)
                change = operation.plan(record, compiled)
                if change is None:
                    if recalled:  # perhaps stale: decided again on a fresh read
                        record = None
                        continue
                    return SessionResult(self.state(record, compiled, explain), record.version)
                result = self.commit(record, change, compiled, explain)
            except (ServiceError, engine.EngineError):
                if not recalled:
                    raise
                record = None
                continue
            if result is not None:
                return result
            record = self.store.recall_session(session_id, tenant)
        raise ConcurrentUpdate("the session kept changing while this update was applied; retry")

    def commit(self, record: SessionRecord, change: Change, compiled: engine.CompiledInstance,
               explain: bool) -> SessionResult | None:
        """Store ``record`` with the change's observations (a new version, its TTL slid) unless
        another writer changed it since it was read: then None, and the caller reads it again.
        Observations that leave no hypothesis alive are refused first (InconsistentObservation);
        the step after them is computed once they are stored, so an attempt that loses (a record
        this worker remembered that another has moved on from) costs no step. Under restricted
        exposure control the record fixes the tests held back and reserved from the counts read
        first, and the tests it shows for the first time are counted once it is stored
        (exposure.py)."""
        restriction = exposure.restriction(self.store, compiled, record) if record.max_rate is not None else None
        updated = record.with_observations(change.observations, expires_at=self.clock() + self.session_ttl,
                                           restriction=restriction)
        key = session_key(updated, compiled, change.observations)
        step = self.steps.get(key)  # computed already: they are consistent
        belief = None if step is not None else change.belief or self.steps.observe(compiled, key)
        try:
            self.store.update_session(updated, expected_version=record.version)
        except VersionConflict:
            return None
        if change.applied:
            OBSERVATIONS_APPLIED.inc(change.applied)
        if record.max_rate is not None:
            given = exposure.first_given(record, change.observations)
            if given:
                exposure.count(self.store, record, tests=given)
        if step is None:
            step = self.steps.compute(compiled, key, belief)
        return SessionResult(self.state(updated, compiled, explain, step), updated.version)
