"""The embedded store: everything in this process's memory (quick start, one process).

Semantics match the Redis store exactly (the contract suite runs against both):

* sessions live ``session_ttl`` seconds after their last read or write (sliding TTL);
* compiled instances live ``2 × session_ttl`` after they were last stored or read. The API reads
  a session's instance on every step, so an instance always outlives the sessions that use it;
  an unused one goes away like it would in Redis (no separate LRU bound here: the instance count
  is bounded by what clients post within a TTL, the same as with Redis);
* everything is keyed by tenant: another tenant's session, instance or idempotency key is simply
  not found (no existence oracle);
* idempotency keys expire ``session_ttl`` after they were claimed; shared values the instance
  TTL after they were first stored;
* a deleted instance is remembered (so its sessions can say so) for the instance TTL, or until
  the same content is stored again; listings are in creation order, then id;
* an instance's exposure counts live the instance TTL after they were last counted, and go with
  the instance when it is deleted.

Expired entries are dropped when touched, and swept in full at most once per ``sweep_interval``
seconds of the clock, so memory held by abandoned sessions is returned without a timer thread.
One lock serialises every operation: each is a few dictionary lookups, far cheaper than the
selection step the API runs outside the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from service.engine import CompiledInstance

from .base import (
    DEFAULT_TENANT,
    INSTANCE_TTL_FACTOR,
    QuotaExceeded,
    Quotas,
    SessionRecord,
    SessionStore,
    StoredInstance,
    StoreUnavailable,
    VersionConflict,
    check_next_version,
    same_content,
)
from .codec import encoded_size
from .encoded import EncodedInstance
from .ratelimit import MemoryLimiter, Rate

PING_TIMEOUT = 1.0  # seconds


class MemoryStore(SessionStore):
    def __init__(self, session_ttl: int, clock: Callable[[], float] = time.time,
                 sweep_interval: float = 60.0, quotas: Quotas | None = None):
        if session_ttl <= 0:
            raise ValueError(f"session_ttl must be positive, got {session_ttl}")
        self.session_ttl = float(session_ttl)
        self.instance_ttl = INSTANCE_TTL_FACTOR * self.session_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._sweep_interval = sweep_interval
        self._last_sweep = clock()
        # Values are (payload, expires_at).
        self._instances: dict[tuple[str, str], tuple[CompiledInstance, float]] = {}
        self._deleted: dict[tuple[str, str], tuple[bool, float]] = {}
        # When each stored instance was first stored (kept beside it, dropped with it).
        self._created_at: dict[tuple[str, str], float] = {}
        self._sessions: dict[tuple[str, str], tuple[SessionRecord, float]] = {}
        self._idempotency: dict[tuple[str, str], tuple[str, float]] = {}
        self._values: dict[tuple[str, str], tuple[bytes, float]] = {}
        # Per instance: (sessions counted, {test id: times given}), counted in place.
        self._exposure: dict[tuple[str, str], tuple[tuple[int, dict[str, int]], float]] = {}
        # Per-tenant usage, kept in step with the tables by _forget: [instances, bytes, sessions].
        self.quotas = quotas or Quotas()
        self._instance_bytes: dict[tuple[str, str], int] = {}
        self._usage: dict[str, list[int]] = {}

    # --- instances ---------------------------------------------------------------------------

    def put_instance(self, instance: CompiledInstance | EncodedInstance, tenant: str = DEFAULT_TENANT) -> bool:
        if isinstance(instance, EncodedInstance):  # kept as objects here
            instance = instance.decoded()
        key = (tenant, instance.content_hash)
        with self._lock:
            now = self._tick()
            current = self._live(self._instances, key, now)
            if current is None:
                size = encoded_size(instance)
                self._admit_instance(tenant, size)
                self._instance_bytes[key] = size
                usage = self._usage.setdefault(tenant, [0, 0, 0])
                usage[0] += 1
                usage[1] += size
            stored = current[0] if current is not None else instance
            self._instances[key] = (stored, now + self.instance_ttl)
            if current is None:
                self._created_at[key] = now
                self._deleted.pop(key, None)
            return current is None

    def get_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> CompiledInstance | None:
        key = (tenant, instance_id)
        with self._lock:
            now = self._tick()
            current = self._live(self._instances, key, now)
            if current is None:
                return None
            self._instances[key] = (current[0], now + self.instance_ttl)
            return current[0]

    def list_instances(self, tenant: str = DEFAULT_TENANT, limit: int = 50,
                       after: str | None = None) -> tuple[list[StoredInstance], str | None]:
        with self._lock:
            now = self._tick()
            listed = [StoredInstance.of(instance, self._created_at[key])
                      for key, (instance, expires_at) in self._instances.items()
                      if key[0] == tenant and expires_at > now]
        listed.sort(key=lambda item: item.cursor)
        if after is not None:
            listed = [item for item in listed if item.cursor > after]
        page = listed[:limit]
        return page, page[-1].cursor if len(listed) > limit else None

    def delete_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        key = (tenant, instance_id)
        with self._lock:
            now = self._tick()
            existed = self._live(self._instances, key, now) is not None
            if existed:
                self._forget(self._instances, key)
                self._exposure.pop(key, None)
                self._deleted[key] = (True, now + self.instance_ttl)
            return existed

    def instance_deleted(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        with self._lock:
            return self._live(self._deleted, (tenant, instance_id), self._tick()) is not None

    # --- sessions ----------------------------------------------------------------------------

    def create_session(self, record: SessionRecord) -> None:
        key = (record.tenant, record.session_id)
        with self._lock:
            now = self._tick()
            current = self._live(self._sessions, key, now)
            # A retried create of the very same record is a no-op (as in Redis, where a dropped
            # connection can make the client resend a create that already ran).
            if current is not None and same_content(current[0], record):
                self._sessions[key] = (current[0], now + self.session_ttl)
                return
            if current is not None:
                raise VersionConflict(f"session {record.session_id!r} already exists")
            usage = self._usage.setdefault(record.tenant, [0, 0, 0])
            limit = self.quotas.sessions
            if limit is not None and usage[2] >= limit:
                self._sweep(now)  # expired sessions not yet dropped must not count
            if limit is not None and usage[2] >= limit:
                raise QuotaExceeded("TENANT_MAX_SESSIONS", limit, usage[2], f"has {usage[2]} live sessions")
            usage[2] += 1
            self._sessions[key] = (record, now + self.session_ttl)

    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        key = (tenant, session_id)
        with self._lock:
            now = self._tick()
            current = self._live(self._sessions, key, now)
            if current is None:
                return None
            expires_at = now + self.session_ttl
            self._sessions[key] = (current[0], expires_at)
            return replace(current[0], expires_at=expires_at)

    def update_session(self, record: SessionRecord, expected_version: int) -> None:
        check_next_version(record, expected_version)
        key = (record.tenant, record.session_id)
        with self._lock:
            now = self._tick()
            current = self._live(self._sessions, key, now)
            if current is None:
                raise VersionConflict(f"session {record.session_id!r} no longer exists")
            if current[0].version != expected_version:
                raise VersionConflict(
                    f"session {record.session_id!r} is at version {current[0].version}, "
                    f"not {expected_version}"
                )
            self._sessions[key] = (record, now + self.session_ttl)

    def delete_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        key = (tenant, session_id)
        with self._lock:
            now = self._tick()
            existed = self._live(self._sessions, key, now) is not None
            if existed:
                self._forget(self._sessions, key)
            return existed

    def claim_idempotency_key(self, key: str, session_id: str, tenant: str = DEFAULT_TENANT) -> str | None:
        slot = (tenant, key)
        with self._lock:
            now = self._tick()
            current = self._live(self._idempotency, slot, now)
            if current is not None:
                return current[0]
            self._idempotency[slot] = (session_id, now + self.session_ttl)
            return None

    def idempotency_binding(self, key: str, tenant: str = DEFAULT_TENANT) -> str | None:
        with self._lock:
            current = self._live(self._idempotency, (tenant, key), self._tick())
            return None if current is None else current[0]

    def get_value(self, name: str, tenant: str = DEFAULT_TENANT) -> bytes | None:
        with self._lock:
            current = self._live(self._values, (tenant, name), self._tick())
            return None if current is None else current[0]

    def put_value(self, name: str, value: bytes, tenant: str = DEFAULT_TENANT) -> bytes:
        slot = (tenant, name)
        with self._lock:
            now = self._tick()
            current = self._live(self._values, slot, now)
            if current is not None:
                return current[0]
            self._values[slot] = (value, now + self.instance_ttl)
            return value

    def exposure_counts(self, instance_id: str, tenant: str = DEFAULT_TENANT,
                        at_least: float = 0.0) -> tuple[int, dict[str, int]]:
        with self._lock:
            current = self._live(self._exposure, (tenant, instance_id), self._tick())
            if current is None:
                return 0, {}
            sessions, given = current[0]
            # A copy: the counts go on changing under the lock.
            return sessions, {test: count for test, count in given.items() if count >= at_least * sessions}

    def count_exposure(self, instance_id: str, tenant: str = DEFAULT_TENANT, *, sessions: int = 0,
                       tests: Sequence[str] = ()) -> None:
        key = (tenant, instance_id)
        with self._lock:
            now = self._tick()
            current = self._live(self._exposure, key, now)
            counted, given = (0, {}) if current is None else current[0]
            for test in tests:  # a test named twice is counted twice, as two calls would count it
                given[test] = given.get(test, 0) + 1
            self._exposure[key] = ((counted + sessions, given), now + self.instance_ttl)

    def ping(self) -> None:
        # The store answers when its lock can be taken: an operation stuck holding it would
        # stall every request, and /readyz should say so rather than hang too.
        if not self._lock.acquire(timeout=PING_TIMEOUT):
            raise StoreUnavailable(f"the in-memory store did not answer within {PING_TIMEOUT:g} s")
        self._lock.release()

    def rate_limiter(self, rate: Rate, scope: str) -> MemoryLimiter:
        # Timed by the store's clock (wall time, as Redis's TIME is for the shared limiter).
        return MemoryLimiter(rate, clock=self._clock)

    # --- expiry ------------------------------------------------------------------------------

    def _tick(self) -> float:
        """The current time; sweeps every table when the last sweep is old enough."""
        now = self._clock()
        if now - self._last_sweep >= self._sweep_interval:
            self._sweep(now)
        return now

    def _sweep(self, now: float) -> None:
        for table in (self._instances, self._deleted, self._sessions, self._idempotency, self._values, self._exposure):
            for key in [k for k, (_, expires_at) in table.items() if expires_at <= now]:
                self._forget(table, key)
        self._last_sweep = now

    def _live(self, table: dict, key, now: float):
        entry = table.get(key)
        if entry is not None and entry[1] <= now:
            self._forget(table, key)
            return None
        return entry

    def _forget(self, table: dict, key) -> None:
        del table[key]
        tenant = key[0]
        if table is self._instances:
            self._usage[tenant][0] -= 1
            self._usage[tenant][1] -= self._instance_bytes.pop(key)
            self._created_at.pop(key, None)
        elif table is self._sessions:
            self._usage[tenant][2] -= 1

    def _admit_instance(self, tenant: str, size: int) -> None:
        count, stored, _ = self._usage.get(tenant, (0, 0, 0))
        if self._over_instance_quota(count, stored, size):
            self._sweep(self._clock())  # expired instances not yet dropped must not count
            count, stored, _ = self._usage.get(tenant, (0, 0, 0))
        if self.quotas.instances is not None and count >= self.quotas.instances:
            raise QuotaExceeded("TENANT_MAX_INSTANCES", self.quotas.instances, count,
                                f"has {count} stored instances")
        if self.quotas.stored_bytes is not None and stored + size > self.quotas.stored_bytes:
            raise QuotaExceeded("TENANT_MAX_STORED_BYTES", self.quotas.stored_bytes, stored,
                                f"stores {stored} bytes of instances and this one takes {size}")

    def _over_instance_quota(self, count: int, stored: int, size: int) -> bool:
        return ((self.quotas.instances is not None and count >= self.quotas.instances)
                or (self.quotas.stored_bytes is not None and stored + size > self.quotas.stored_bytes))

