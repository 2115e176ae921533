"""The Redis store (redis-py + hiredis): what several gunicorn workers and hosts share. Its rooms:
the keys it writes (redis_keys.py), its Lua scripts (redis_scripts.py), its pools and write path
(redis_connection.py), the tenants' quotas (redis_quotas.py), restricted exposure control's counts
(redis_exposure.py); instances, listings and sessions here.

Consistency and lifetimes

* Instances are written with MULTI/EXEC (HSETNX header, HSETNX body, PEXPIRE): all or nothing,
  and two workers posting the same content cannot both see it as new.
* Every session write goes through ONE Lua script (``CAS_SCRIPT``, one key): compare the stored version,
  write version + record, and slide the TTL, atomically. ``create_session`` is the same script
  with expected version 0 ("must not exist"). Two workers can never both apply a step.
* One round trip per observation: each process remembers the records it last read or wrote
  (:class:`~.cache.RecordCache`), so a write can start from one with no read first
  (``recall_session``). The script then also compares the stored record's bytes with those the
  write started from, and when they differ answers with the stored record, which the next
  attempt starts from: a worker that guessed wrong pays the read it skipped, nothing more.
* Sessions slide: reads (``get_session``: one script, HGET + PEXPIRE, one round trip) and writes
  reset the TTL to ``session_ttl``. ``expires_at`` in returned records is now + ``session_ttl``.
  A session's quota entry (another slot's key) is given ``session_ttl`` + a slack of
  min(60 s, ``session_ttl`` / 10) and slid by every read, and by a write when the writing
  process has not slid it for half the slack: it never lapses before its session, and counts it
  at most the slack after the session expired.
* Instances are stored once per (tenant, content hash) with a TTL of 2 × ``session_ttl``, reset
  by ``put_instance`` and whenever ``get_instance`` serves them. The API reads a session's
  instance on every step, and each worker re-confirms (PEXPIRE) a cached instance at least every
  ``min(60 s, session_ttl / 4)``, so an instance outlives every session that still uses it.
* Idempotency keys: ``SET NX GET EX session_ttl`` (Redis ≥ 7.0) binds and reads in one command.
* The listing index is a hint kept beside the instances (another slot, so never in their
  transaction): a new instance is added after it is stored, and a position whose instance has
  expired is dropped when a listing meets it. The instance hash's ``summary`` field (counts and
  ``created_at``) is what a listing shows, so a page never reads headers or arrays.

Worker cache: a byte-bounded LRU (:mod:`.cache`) of decoded instances, so a step does not
re-download and re-hash the matrix; a hit costs no Redis round trip, except the periodic
existence re-check above. Decoding checks dtype, shape, byte ranges and the content hash
(:mod:`.codec`): corrupt bytes raise :class:`~.codec.CorruptInstance`, never a wrong answer.
Nothing read back is unpickled or evaluated.

Redis Cluster (``cluster=True``, REDIS_CLUSTER): the same keys and commands through redis-py's
cluster client (service/store/redis_client.py). Every script and transaction names one key, and
every key one hash tag, so each operation touches one slot; redirects are the client's business.

Failing fast: small commands use a pool with 0.5 s connect and read timeouts, a 5 s health-check
interval and at most one immediate retry, on connection errors only (redis-py's default is ten
retries with backoff, far beyond a 1 s budget; a timed-out command is not resent). A dead Redis
therefore answers :class:`StoreUnavailable` well within 1 s. Recovery needs no restart: the pool
checks a pooled connection before lending it and reconnects one the server closed, so the first
call after Redis returns succeeds. A connection error retried after the server had already run a CAS makes
the retry report VersionConflict: callers re-read and find their step applied (observations are
idempotent in the API), so nothing is doubled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import orjson
import redis

from service.engine import CompiledInstance

from . import codec
from .base import (
    DEFAULT_TENANT,
    INSTANCE_TTL_FACTOR,
    CorruptRecord,
    Quotas,
    SessionRecord,
    SessionStore,
    StoredInstance,
    StoreUnavailable,
    VersionConflict,
    check_next_version,
)
from .cache import InstanceCache, RecordCache
from .encoded import EncodedInstance
from .ratelimit import Rate, RedisLimiter
from .records import decode_record, encode_record
from .redis_client import redis_errors
from .redis_connection import DEFAULT_BULK_TIMEOUT, DEFAULT_WAIT_TIMEOUT_MS, RedisConnection, essential
from .redis_exposure import RedisExposure
from .redis_keys import RedisKeys
from .redis_quotas import RedisQuotas
from .redis_scripts import CAS_SCRIPT, READ_SCRIPT

log = logging.getLogger(__name__)

# Session records this process remembers as it last read or wrote them (a few KB each).
RECORD_CACHE_BYTES = 16 * 1024 * 1024


class RedisStore(RedisKeys, RedisExposure, SessionStore):
    def __init__(self, url: str, *, session_ttl: int = 24 * 3600, key_prefix: str = "edgecut",
                 instance_cache_bytes: int = 256 * 1024 * 1024, bulk_timeout: float = DEFAULT_BULK_TIMEOUT,
                 quotas: Quotas | None = None, cluster: bool = False, wait_replicas: int = 0,
                 wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS):
        if session_ttl <= 0:
            raise ValueError(f"session_ttl must be positive, got {session_ttl}")
        super().__init__(key_prefix)
        self.connection = RedisConnection(url, cluster=cluster, bulk_timeout=bulk_timeout, wait_replicas=wait_replicas,
                                          wait_timeout_ms=wait_timeout_ms)
        self._redis, self._bulk = self.connection.redis, self.connection.bulk
        self.session_ttl = session_ttl
        self.instance_ttl = INSTANCE_TTL_FACTOR * session_ttl
        self.cluster = cluster
        self._session_ttl_ms = int(session_ttl * 1000)
        # A session's quota entry counts it until it expires and up to this long after: then a
        # write (each observation) needs to slide the entry, another slot's key, only when this
        # process has not for half the slack, not in every round trip (bench/redis_store.py, row
        # "quota slid every write": 1.6 × a session write's CPU). Reads slide it every time.
        self._quota_slack = min(60.0, session_ttl / 10)
        self._session_quota_ms = self._session_ttl_ms + int(self._quota_slack * 1000)
        self._instance_ttl_ms = int(self.instance_ttl * 1000)
        # How long a cached instance is trusted to still exist in Redis; must stay ≤
        # instance_ttl − session_ttl for instances to outlive their sessions.
        self.recheck_interval = min(60.0, session_ttl / 4)
        self.quotas = quotas or Quotas()
        self.tenant_quotas = RedisQuotas(self.connection, self, self.quotas, self._instance_ttl_ms,
                                         self._session_quota_ms)
        self.cache = InstanceCache(instance_cache_bytes)
        self.records = RecordCache(RECORD_CACHE_BYTES)

    @property
    def round_trips(self) -> int:
        """Network round trips this store made (tests and /metrics read it)."""
        return self.connection.round_trips

    # --- instances ---------------------------------------------------------------------------

    def make_room(self, nbytes: int) -> None:
        self.cache.make_room(nbytes)

    def put_instance(self, instance: CompiledInstance | EncodedInstance, tenant: str = DEFAULT_TENANT) -> bool:
        key = self.instance_key(instance.content_hash, tenant)
        with redis_errors():
            # Refresh first: re-posting known content then costs no upload.
            self.connection.round_trips += 1
            if self.tenant_quotas.refresh_instance(key, instance.content_hash, tenant):
                created = False
            else:
                self.tenant_quotas.admit_instance(instance, tenant)
                header, body = ((instance.header, instance.body) if isinstance(instance, EncodedInstance)
                                else codec.encode(instance))
                listed = StoredInstance.of(instance, time.time())
                # MULTI/EXEC, not Lua: a script would copy a body of hundreds of MB into Lua
                # strings. Existing keys always hold both fields, so the first HSETNX alone says
                # whether this is new, and a reader never sees a header without its body.
                try:
                    created = bool(self.connection.write(key, [("HSETNX", key, "header", header),
                                                     ("HSETNX", key, "body", body),
                                                     ("HSETNX", key, "summary", orjson.dumps(dataclasses.asdict(listed))),
                                                     ("PEXPIRE", key, self._instance_ttl_ms),
                                                     ("DEL", self.deleted_key(instance.content_hash, tenant))],
                                               bulk=True, atomic=True)[0])
                except (redis.exceptions.RedisError, StoreUnavailable):
                    self.tenant_quotas.forget_instance(instance.content_hash, tenant)  # admitted, never stored
                    raise
                if created:
                    self.connection.round_trips += 1
                    self._redis.get().zadd(self.listing_key(tenant), {listed.cursor: 0})
        if isinstance(instance, CompiledInstance):  # an encoded one is decoded where it is read
            self.cache.put((tenant, instance.content_hash), instance, time.monotonic())
        return created

    def get_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> CompiledInstance | None:
        cache_key = (tenant, instance_id)
        key = self.instance_key(instance_id, tenant)
        now = time.monotonic()
        cached = self.cache.get(cache_key)
        if cached is not None:
            if now - cached.checked_at < self.recheck_interval:
                return cached.instance
            with redis_errors():
                self.connection.round_trips += 1
                alive = self.tenant_quotas.refresh_instance(key, instance_id, tenant)
            if alive:
                cached.checked_at = now
                return cached.instance
            self.cache.discard(cache_key)
            return None
        with redis_errors():
            pipe = self._bulk.get().pipeline(transaction=False)
            pipe.hmget(key, "header", "body")
            pipe.pexpire(key, self._instance_ttl_ms)
            self.tenant_quotas.slide(pipe, "instances", instance_id, tenant)
            self.connection.round_trips += 1
            header, body = essential(pipe, 2)[0]
        if header is None or body is None:
            return None
        try:
            instance = codec.decode(header, body, expected_hash=instance_id)
        except codec.CorruptInstance as error:
            # Bytes that fail their own hash must never become an answer. Drop them, so the
            # instance reads as expired (410 for its sessions) and posting it again repairs it.
            log.error("dropping corrupt instance %s: %s", key, error)
            with redis_errors():
                self._redis.get().delete(key)
            self.tenant_quotas.forget_instance(instance_id, tenant)
            return None
        self.cache.put(cache_key, instance, now)
        return instance

    def list_instances(self, tenant: str = DEFAULT_TENANT, limit: int = 50,
                       after: str | None = None) -> tuple[list[StoredInstance], str | None]:
        index = self.listing_key(tenant)
        page: list[StoredInstance] = []
        position = after
        # One more than a page tells whether another page follows; stale positions are skipped
        # (and dropped), so a page may take a few round trips.
        while len(page) <= limit:
            wanted = limit + 1 - len(page)
            with redis_errors():
                self.connection.round_trips += 1
                client = self._redis.get()
                positions = [p.decode() for p in client.zrangebylex(
                    index, "-" if position is None else f"({position}", "+", 0, wanted)]
                if not positions:
                    break
                pipe = client.pipeline(transaction=False)  # the instances' slots differ: no transaction
                for p in positions:
                    pipe.hget(self.instance_key(p.split(":", 1)[1], tenant), "summary")
                self.connection.round_trips += 1
                summaries = pipe.execute()
                stale = []
                for p, summary in zip(positions, summaries):
                    item = None if summary is None else StoredInstance(**orjson.loads(summary))
                    if item is None or item.cursor != p:
                        stale.append(p)  # expired, or deleted and stored again under a newer position
                    else:
                        page.append(item)
                if stale:
                    self.connection.round_trips += 1
                    client.zrem(index, *stale)
            if len(positions) < wanted:
                break
            position = positions[-1]
        return page[:limit], page[limit - 1].cursor if len(page) > limit else None

    def delete_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        key = self.instance_key(instance_id, tenant)
        with redis_errors():
            pipe = self._redis.get().pipeline(transaction=False)
            pipe.hget(key, "summary")
            pipe.exists(key)
            self.connection.round_trips += 1
            summary, exists = pipe.execute()
            if not exists:
                return False
            # The tombstone and the exposure counts share the instance's slot: all change in one transaction.
            existed = bool(self.connection.write(key, [("DEL", key), ("DEL", self.exposure_key(instance_id, tenant)),
                                                       ("SET", self.deleted_key(instance_id, tenant), b"1",
                                                        "PX", self._instance_ttl_ms)], atomic=True)[0])
            if summary is not None:
                self.connection.round_trips += 1
                self._redis.get().zrem(self.listing_key(tenant), StoredInstance(**orjson.loads(summary)).cursor)
        self.cache.discard((tenant, instance_id))
        if existed:
            self.tenant_quotas.forget_instance(instance_id, tenant)  # no longer counts against the quotas
        return existed

    def instance_deleted(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        with redis_errors():
            self.connection.round_trips += 1
            return bool(self._redis.get().exists(self.deleted_key(instance_id, tenant)))

    # --- sessions ----------------------------------------------------------------------------

    def create_session(self, record: SessionRecord) -> None:
        slid_at = time.monotonic()
        self.tenant_quotas.admit_session(record)
        raw = encode_record(record)
        if self._compare_and_set(record, raw, expected_version=0) != 1:
            with redis_errors():
                self.tenant_quotas.forget_session(record.session_id, record.tenant)
            raise VersionConflict(f"session {record.session_id!r} already exists")
        self.records.put(self.session_key(record.session_id, record.tenant), record, raw, slid_at)

    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        key = self.session_key(session_id, tenant)
        slid_at = time.monotonic()
        with redis_errors():
            self.connection.round_trips += 1
            read = ("EVAL", READ_SCRIPT, 1, key, self._session_ttl_ms)
            if not self.tenant_quotas.counts("sessions"):
                # One command, not a pipeline of one: the cluster client would spend a second
                # round trip on the pipeline.
                raw = self._redis.own().execute_command(*read)
            else:
                pipe = self._redis.get().pipeline(transaction=False)
                pipe.execute_command(*read)
                self.tenant_quotas.slide(pipe, "sessions", session_id, tenant)
                raw = essential(pipe, 1)[0]
        if raw is None:
            self.records.discard(key)
            return None
        return self._remembered(key, raw, session_id, tenant, slid_at)

    def recall_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        seen = self.records.get(self.session_key(session_id, tenant))
        return None if seen is None else seen.record

    def update_session(self, record: SessionRecord, expected_version: int) -> None:
        check_next_version(record, expected_version)
        if expected_version < 1:
            raise ValueError(f"expected_version must be ≥ 1, got {expected_version}")
        key = self.session_key(record.session_id, record.tenant)
        seen = self.records.get(key)
        # Started from a record this process read or wrote: its bytes must still be the stored
        # ones (a damaged record is then refused by the next read, never written over).
        started_from = seen.raw if seen is not None and seen.record.version == expected_version else b""
        now = time.monotonic()
        slid_at = 0.0 if seen is None else seen.quota_slid_at
        # Half the slack left as a margin for the round trip and the clocks.
        slide = self.tenant_quotas.counts("sessions") and now - slid_at >= self._quota_slack / 2
        raw = encode_record(record)
        result = self._compare_and_set(record, raw, expected_version, started_from, slide_quota=slide)
        if result == 1:
            self.records.put(key, record, raw, now if slide else slid_at)
            return
        if result == -1:
            self.records.discard(key)
            raise VersionConflict(f"session {record.session_id!r} no longer exists")
        if isinstance(result, bytes):  # what is stored instead: the caller's next attempt starts there
            with contextlib.suppress(CorruptRecord):  # forgotten: the next attempt reads it, and refuses it
                self._remembered(key, result, record.session_id, record.tenant, now if slide else slid_at)
        raise VersionConflict(f"session {record.session_id!r} is no longer at version {expected_version}")

    def delete_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        key = self.session_key(session_id, tenant)
        self.records.discard(key)
        with redis_errors():
            deleted = bool(self.connection.write(key, [("DEL", key)])[0])
            self.tenant_quotas.forget_session(session_id, tenant)
        return deleted

    def claim_idempotency_key(self, key: str, session_id: str, tenant: str = DEFAULT_TENANT) -> str | None:
        redis_key = self.idempotency_key(key, tenant)
        with redis_errors():
            previous = self.connection.write(redis_key, [("SET", redis_key, session_id, "NX", "GET", "EX", self.session_ttl,
                                                {"get": True})])[0]
        return None if previous is None else previous.decode()

    def idempotency_binding(self, key: str, tenant: str = DEFAULT_TENANT) -> str | None:
        with redis_errors():
            self.connection.round_trips += 1
            bound = self._redis.get().get(self.idempotency_key(key, tenant))
        return None if bound is None else bound.decode()

    def get_value(self, name: str, tenant: str = DEFAULT_TENANT) -> bytes | None:
        with redis_errors():
            self.connection.round_trips += 1
            return self._redis.get().get(self.value_key(name, tenant))

    def put_value(self, name: str, value: bytes, tenant: str = DEFAULT_TENANT) -> bytes:
        key = self.value_key(name, tenant)
        with redis_errors():
            # SET NX GET: stored only if absent, and the value already there comes back in the
            # same round trip, so racing workers agree on the first.
            previous = self.connection.write(key, [("SET", key, value, "NX", "GET", "PX", self._instance_ttl_ms,
                                          {"get": True})])[0]
        return value if previous is None else previous

    def rate_limiter(self, rate: Rate, scope: str) -> RedisLimiter:
        return RedisLimiter(rate, self._redis, self.key_prefix, scope)

    def ping(self) -> None:
        self.connection.ping()

    def warm(self) -> None:
        self.connection.warm()

    def close(self) -> None:
        """Drop pooled connections (tests; a worker just exits)."""
        self.connection.close()

    # --- internals ---------------------------------------------------------------------------

    def _remembered(self, key: str, raw: bytes, session_id: str, tenant: str, quota_slid_at: float) -> SessionRecord:
        """``raw`` read from ``key``, decoded and checked, and remembered as what is stored."""
        try:
            record = decode_record(raw, expires_at=time.time() + self.session_ttl)
            if record.session_id != session_id or record.tenant != tenant:
                raise CorruptRecord(f"the record under {key} names session {record.session_id!r} of {record.tenant!r}")
        except CorruptRecord:
            self.records.discard(key)  # nothing remembered may stand in for it
            raise
        self.records.put(key, record, raw, quota_slid_at)
        return record

    def _compare_and_set(self, record: SessionRecord, raw: bytes, expected_version: int,
                         started_from: bytes = b"", slide_quota: bool = False) -> int | bytes:
        key = self.session_key(record.session_id, record.tenant)
        args = (str(expected_version), str(record.version), raw, self._session_ttl_ms, started_from)
        bookkeeping = []
        if slide_quota:
            bookkeeping.append(self.tenant_quotas.slide_command("sessions", record.session_id, record.tenant))
        with redis_errors():
            # EVAL with the text, not EVALSHA: Redis caches the compiled script by its hash anyway,
            # and a master just promoted or restarted then never answers NOSCRIPT mid-pipeline.
            return self.connection.write(key, [("EVAL", CAS_SCRIPT, 1, key, *args)], bookkeeping=bookkeeping)[0]
