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


class VersionConflict(RuntimeError):
    """A compare-and-set lost: the session changed since it was read."""


class SessionStore(abc.ABC):
    """One tenant-scoped store of instances and sessions. All methods are thread-safe."""

    @abc.abstractmethod
    def put_instance(self, instance: CompiledInstance, tenant: str = DEFAULT_TENANT) -> bool:
        """Store under ``instance.content_hash``; True if new, False if it was already there
        (its TTL is refreshed either way)."""

    @abc.abstractmethod
    def get_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> CompiledInstance | None:
        """The compiled instance, or None when unknown or expired (served from a per-process
        byte-bounded LRU when possible)."""

    @abc.abstractmethod
    def create_session(self, record: SessionRecord) -> None:
        """Store a new session (its ``session_id`` is fresh and unguessable)."""

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
    def ping(self) -> None:
        """Return if the store answers; raise :class:`StoreUnavailable` otherwise."""
