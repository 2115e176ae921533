"""The session-store contract. Every store (in-memory, Redis, Redis Cluster) implements
:class:`SessionStore` and passes the same contract suite (tests/test_store_contract.py).

The contract is six small parts, each a class of its own, so a reader (or a domain module's
type hint) can hold one at a time: :class:`InstanceShelf` (instances, their listing and the
memory of deletions), :class:`SessionTable` (compare-and-set session records),
:class:`IdempotencyKeys`, :class:`SharedValues`, :class:`ExposureCounts` and
:class:`StoreHealth`; plus :meth:`SessionStore.rate_limiter`, so the rate limits live wherever
the store does. The rules every store shares (the instance TTL, the
next-version check, what makes two records the same) are public here, not in one store.

What is stored:

* compiled instances, once per (tenant, content hash), as raw array bytes plus a JSON header
  (dtype, shape, labels) — never pickle (service/store/codec.py);
* sessions: small records (ids, config, the observations so far, a version number);
* for listings, when each instance was first stored, and for a while which were deleted;
* small shared values computed once for all workers (what ``auto`` chose for an instance and
  stop rules), under a name, for the instance TTL;
* per instance, how many sessions counted its use and how many were given each test (for
  restricted exposure control), for the instance TTL.

Updates are compare-and-set on the version: two workers can never both apply a step.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from service.engine import CompiledInstance

if TYPE_CHECKING:
    from .encoded import EncodedInstance
    from .ratelimit import Rate, RateLimiter

DEFAULT_TENANT = "public"
# Instances live this many session TTLs after they were last stored or read: the API reads a
# session's instance on every step, so an instance outlives the sessions that use it.
INSTANCE_TTL_FACTOR = 2


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    instance_id: str
    policy: str
    max_tests: int | None = None
    max_cost: float | None = None
    confidence: float | None = None
    seed: int = 0
    # Observations by label, in the order they were applied: [(test_id, outcome_label), ...];
    # the outcome of a skipped test is None.
    observations: tuple[tuple[str, str | None], ...] = ()
    version: int = 1
    created_at: float = 0.0  # unix seconds
    expires_at: float = 0.0  # unix seconds; slides forward on every read and write
    tenant: str = DEFAULT_TENANT
    max_expected_loss: float | None = None  # decision instances with losses
    # Tests never to propose in this session, and how many to propose at once.
    exclude_tests: tuple[str, ...] = ()
    batch_size: int = 1
    max_se: float | None = None  # item banks: stop once θ's posterior SD is at most this
    randomesque: int | None = None  # exposure control: draw among the k best (seeded by seed and session id)
    sympson_hetter: bool | None = None  # exposure control with the item bank's parameters (the same seed)
    progressive: bool | None = None  # exposure control: gain blended with a random draw (the same seed)
    # Restricted exposure control: the share of the instance's sessions a test may be given to,
    # and the tests held back and reserved for the step after the observations (fixed when they
    # were stored, from the counts then, so every worker computes the same step).
    max_rate: float | None = None
    held_back: tuple[str, ...] = ()
    reserved: tuple[str, ...] = ()

    def with_observations(self, observations: tuple[tuple[str, str | None], ...],
                          expires_at: float | None = None,
                          restriction: tuple[tuple[str, ...], tuple[str, ...]] | None = None) -> SessionRecord:
        """The next version, with these observations (and this expiry, and the tests held back
        and reserved, when given)."""
        # A copy of the fields, not dataclasses.replace: that reads the class's fields and runs
        # __init__ (which checks nothing here) on every observation.
        record = object.__new__(SessionRecord)
        record.__dict__.update(self.__dict__, observations=observations, version=self.version + 1,
                               expires_at=self.expires_at if expires_at is None else expires_at)
        if restriction is not None:
            record.__dict__.update(held_back=restriction[0], reserved=restriction[1])
        return record


@dataclass(frozen=True)
class StoredInstance:
    """What a listing shows of one stored instance."""

    instance_id: str
    kind: str
    n_hypotheses: int
    n_tests: int
    n_classes: int
    created_at: float  # unix seconds, when this content was first stored (again after a delete)

    @property
    def cursor(self) -> str:
        """Its place in a listing (creation order, then id); opaque to clients."""
        return listing_position(self.created_at, self.instance_id)

    @staticmethod
    def of(instance: CompiledInstance, created_at: float) -> StoredInstance:
        return StoredInstance(instance.content_hash, instance.kind, instance.n_hypotheses, instance.n_tests,
                              instance.n_classes, created_at)


def listing_position(created_at: float, instance_id: str) -> str:
    """Sorts as text in creation order: milliseconds, zero-padded, then the id."""
    return f"{round(created_at * 1000):015d}:{instance_id}"


# \A…\Z: "$" would also match before a trailing newline.
LISTING_CURSOR = re.compile(r"\A[0-9]{15}:[0-9a-f]{64}\Z")


class StoreUnavailable(RuntimeError):
    """The backing store cannot be reached (answered 503 with Retry-After)."""


@dataclass(frozen=True)
class Quotas:
    """What one tenant may keep stored at once (``TENANT_MAX_*``); None: no limit. Counted by
    the store itself, atomically with the write, so that no number of workers can overshoot."""

    instances: int | None = None
    stored_bytes: int | None = None  # encoded instances (service/store/codec.py encoded_size)
    sessions: int | None = None  # live (not expired, not deleted; Redis: up to min(60 s, TTL / 10) past expiry)


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


def check_next_version(record: SessionRecord, expected_version: int) -> None:
    """An update must write exactly the version after the one it read."""
    if record.version != expected_version + 1:
        raise ValueError(
            f"record.version must be expected_version + 1 = {expected_version + 1}, got {record.version}"
        )


def same_content(a: SessionRecord, b: SessionRecord) -> bool:
    """The same session record but for ``expires_at``, which the store derives from its TTL."""
    return replace(a, expires_at=0.0) == replace(b, expires_at=0.0)


class InstanceShelf(abc.ABC):
    """Compiled instances per tenant: stored once under their content hash, listed in creation
    order, and remembered for a while after a deletion."""

    @abc.abstractmethod
    def put_instance(self, instance: CompiledInstance | EncodedInstance, tenant: str = DEFAULT_TENANT) -> bool:
        """Store under ``instance.content_hash``; True if new, False if it was already there
        (its TTL is refreshed either way). A new one past the tenant's quotas raises
        :class:`QuotaExceeded`. An :class:`EncodedInstance` is stored as it is, not decoded where
        the store does not keep objects."""

    @abc.abstractmethod
    def get_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> CompiledInstance | None:
        """The compiled instance, or None when unknown or expired (served from a per-process
        byte-bounded LRU when possible)."""

    @abc.abstractmethod
    def list_instances(self, tenant: str = DEFAULT_TENANT, limit: int = 50,
                       after: str | None = None) -> tuple[list[StoredInstance], str | None]:
        """The tenant's live instances in creation order, at most ``limit`` of them, starting
        after the listing position ``after`` (a previous page's cursor); and the cursor of the
        next page, None when this one is the last."""

    @abc.abstractmethod
    def delete_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        """Remove the instance and its exposure counts, and remember for its TTL that it was
        deleted (so its sessions can say so); True if it existed. Storing the same content again brings it back."""

    def make_room(self, nbytes: int) -> None:
        """Give up instances this process caches (never stored ones) until they and ``nbytes``
        more fit the cache's budget: a big request is about to hold that much (service/api/limits.py).
        A store that caches nothing (the embedded store holds its instances) does nothing."""

    @abc.abstractmethod
    def instance_deleted(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        """Whether the instance was deleted (and not stored again) within its TTL."""


class SessionTable(abc.ABC):
    """Session records per tenant, with a sliding TTL; every update a compare-and-set."""

    @abc.abstractmethod
    def create_session(self, record: SessionRecord) -> None:
        """Store a new session (its ``session_id`` is fresh and unguessable); past the tenant's
        session quota, :class:`QuotaExceeded`."""

    @abc.abstractmethod
    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        """The session, or None when unknown, expired or another tenant's. Slides the TTL."""

    def recall_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        """The session as this process last read or wrote it, without asking the store: a guess
        that may be stale, expired or deleted since, which only a successful
        :meth:`update_session` confirms. None when nothing is remembered (a store whose reads
        cost no round trip remembers nothing)."""
        return None

    @abc.abstractmethod
    def update_session(self, record: SessionRecord, expected_version: int) -> None:
        """Replace the session if its stored version is still ``expected_version``, else raise
        :class:`VersionConflict`. ``record.version`` must be ``expected_version + 1``. Slides
        the TTL like a read."""

    @abc.abstractmethod
    def delete_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        """True if it existed."""


class IdempotencyKeys(abc.ABC):
    """Client-chosen keys bound to the session a create made, for as long as sessions live."""

    @abc.abstractmethod
    def claim_idempotency_key(self, key: str, session_id: str, tenant: str = DEFAULT_TENANT) -> str | None:
        """Atomically bind ``key`` to ``session_id`` unless already bound; returns the session id
        it was already bound to (None when this call bound it). Keys expire with sessions."""

    @abc.abstractmethod
    def idempotency_binding(self, key: str, tenant: str = DEFAULT_TENANT) -> str | None:
        """The session id ``key`` is bound to, or None; binds nothing (a request is checked
        whole before anything is written)."""


class SharedValues(abc.ABC):
    """Small values computed once for every worker, under a name, for the instance TTL."""

    @abc.abstractmethod
    def get_value(self, name: str, tenant: str = DEFAULT_TENANT) -> bytes | None:
        """The value stored under ``name``, or None when none is (or it expired)."""

    @abc.abstractmethod
    def put_value(self, name: str, value: bytes, tenant: str = DEFAULT_TENANT) -> bytes:
        """Store ``value`` under ``name`` for the instance TTL unless a value is there already
        (atomically: the first writer wins), and return the value stored: every worker that
        computed one at the same time agrees on the first."""


class ExposureCounts(abc.ABC):
    """Running counts of one instance's use across its sessions, shared by every worker: how
    many sessions were counted and how many of them were given each test. Restricted exposure
    control (service/sessions/exposure.py) holds back a test once its count reaches a share of
    the sessions."""

    @abc.abstractmethod
    def exposure_counts(self, instance_id: str, tenant: str = DEFAULT_TENANT,
                        at_least: float = 0.0) -> tuple[int, dict[str, int]]:
        """(sessions counted, times given by test id, for the tests given ``at_least`` × sessions
        times or more; tests never given are absent); (0, {}) when nothing was counted, or the
        counts expired or were deleted with the instance. The filter is the store's, so a big
        instance's counts far from any cap are not sent."""

    @abc.abstractmethod
    def count_exposure(self, instance_id: str, tenant: str = DEFAULT_TENANT, *, sessions: int = 0,
                       tests: Sequence[str] = ()) -> None:
        """Add ``sessions`` to the session count and 1 to each of ``tests``' counts, at once, and
        keep the counts for the instance TTL from now. Any string is a test id (no id clashes
        with where the session count is kept)."""


class StoreHealth(abc.ABC):
    @abc.abstractmethod
    def ping(self) -> None:
        """Return if the store answers; raise :class:`StoreUnavailable` otherwise."""

    def warm(self) -> None:
        """Open now what a request would otherwise open first (connections), so that a new
        worker's first request does not pay for it; raise :class:`StoreUnavailable` when the
        store does not answer. Reads and writes nothing."""


class SessionStore(InstanceShelf, SessionTable, IdempotencyKeys, SharedValues, ExposureCounts, StoreHealth):
    """One tenant-scoped store of instances and sessions. All methods are thread-safe."""

    @abc.abstractmethod
    def rate_limiter(self, rate: Rate, scope: str) -> RateLimiter:
        """A GCRA limiter (service/store/ratelimit.py) whose state lives where this store's
        does: shared by every worker of a Redis store, in process for the in-memory one.
        ``scope`` keeps limiters of different things apart (``ratelimit.REQUESTS``, …)."""
