"""The session-store contract. Every store (in-memory, Redis) implements :class:`SessionStore`
and passes the same contract suite (tests/test_store_contract.py).

What is stored:

* compiled instances, once per (tenant, content hash), as raw array bytes plus a JSON header
  (dtype, shape, labels) — never pickle (service/store/codec.py);
* sessions: small records (ids, config, the observations so far, a version number).

Updates are compare-and-set on the version: two workers can never both apply a step.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace

from service.engine import CompiledInstance

DEFAULT_TENANT = "public"


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    instance_id: str
    policy: str
    max_tests: int | None = None
    max_cost: float | None = None
    confidence: float | None = None
    seed: int = 0
    # Observations by label, in the order they were applied: [(test_id, outcome_label), ...].
    observations: tuple[tuple[str, str], ...] = ()
    version: int = 1
    created_at: float = 0.0  # unix seconds
    expires_at: float = 0.0  # unix seconds; slides forward on every read and write
    tenant: str = DEFAULT_TENANT
    max_expected_loss: float | None = None  # decision instances with losses

    def with_observations(self, observations: tuple[tuple[str, str], ...]) -> SessionRecord:
        return replace(self, observations=observations, version=self.version + 1)


class StoreUnavailable(RuntimeError):
    """The backing store cannot be reached (answered 503 with Retry-After)."""


@dataclass(frozen=True)
class Quotas:
    """What one tenant may keep stored at once (``TENANT_MAX_*``); None: no limit. Counted by
    the store itself, atomically with the write, so that no number of workers can overshoot."""

    instances: int | None = None
    stored_bytes: int | None = None  # encoded instances (service/store/codec.py encoded_size)
    sessions: int | None = None  # live (not expired, not deleted)


class QuotaExceeded(RuntimeError):
    """A write would take a tenant past a quota; nothing was written."""

    def __init__(self, setting: str, limit: int, usage: int, what: str):
        super().__init__(f"this tenant {what}; the quota ({setting}) is {limit}")
        self.setting = setting
        self.limit = limit
        self.usage = usage


class CorruptRecord(ValueError):
    """A stored session record that does not decode to a valid :class:`SessionRecord`."""


class StoreFull(StoreUnavailable):
    """The store is out of memory (Redis ``OOM`` under ``maxmemory``): answered 507 with
    Retry-After. Nothing was written; reads still work."""


class VersionConflict(RuntimeError):
    """A compare-and-set lost: the session changed since it was read."""


class SessionStore(abc.ABC):
    """One tenant-scoped store of instances and sessions. All methods are thread-safe."""

    @abc.abstractmethod
    def put_instance(self, instance: CompiledInstance, tenant: str = DEFAULT_TENANT) -> bool:
        """Store under ``instance.content_hash``; True if new, False if it was already there
        (its TTL is refreshed either way). A new one past the tenant's quotas raises
        :class:`QuotaExceeded`."""

    @abc.abstractmethod
    def get_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> CompiledInstance | None:
        """The compiled instance, or None when unknown or expired (served from a per-process
        byte-bounded LRU when possible)."""

    @abc.abstractmethod
    def create_session(self, record: SessionRecord) -> None:
        """Store a new session (its ``session_id`` is fresh and unguessable); past the tenant's
        session quota, :class:`QuotaExceeded`."""

    @abc.abstractmethod
    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        """The session, or None when unknown, expired or another tenant's. Slides the TTL."""

    @abc.abstractmethod
    def update_session(self, record: SessionRecord, expected_version: int) -> None:
        """Replace the session if its stored version is still ``expected_version``, else raise
        :class:`VersionConflict`. ``record.version`` must be ``expected_version + 1``."""

    @abc.abstractmethod
    def delete_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        """True if it existed."""

    @abc.abstractmethod
    def claim_idempotency_key(self, key: str, session_id: str, tenant: str = DEFAULT_TENANT) -> str | None:
        """Atomically bind ``key`` to ``session_id`` unless already bound; returns the session id
        it was already bound to (None when this call bound it). Keys expire with sessions."""

    @abc.abstractmethod
    def idempotency_binding(self, key: str, tenant: str = DEFAULT_TENANT) -> str | None:
        """The session id ``key`` is bound to, or None; binds nothing (a request is checked
        whole before anything is written)."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Return if the store answers; raise :class:`StoreUnavailable` otherwise."""
