"""The Redis store (redis-py + hiredis): what several gunicorn workers and hosts share.

Key layout (``P`` is the configurable ``key_prefix``; tenant, session id and idempotency key are
percent-encoded, so none of them can contain ``{``, ``}`` or ``:``)::

    P:{i:<tenant>:<content hash>}:instance  hash  header → JSON (codec.encode), body → raw arrays
    P:{s:<tenant>:<session id>}:state       hash  version → "<n>", record → JSON SessionRecord (records.py)
    P:{k:<tenant>:<idempotency key>}:idem   string  the session id the key is bound to
    P:{q:<tenant>}:<counted>:quota          zset / hash  the tenant's quota counters (one slot per tenant)
    P:{i:<tenant>:<content hash>}:gone      string  the instance was deleted (TTL: the instance's)
    P:{l:<tenant>}:instances                zset    listing positions "<created ms>:<hash>", all
                                                    score 0 (ordered as text: creation order)
    P:{r:<tenant>}:rate                     string  the tenant's rate limit (GCRA TAT, ratelimit.py)
    P:{a:<client address>}:rate             string  failed authentications from one address

The ``{…}`` part is the Redis Cluster hash tag: every key belonging to one session (the state
today; anything later added for it must reuse ``{s:<tenant>:<sid>}``) lands in one slot, so the
compare-and-set script only ever touches one slot. Tenants are part of every key, so another
tenant's data is simply not found.

Consistency and lifetimes

* Instances are written with MULTI/EXEC (HSETNX header, HSETNX body, PEXPIRE): all or nothing,
  and two workers posting the same content cannot both see it as new.
* Every session write goes through ONE Lua script (``_CAS_SCRIPT``, one key): compare the stored version,
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

Durability: a write is acknowledged once the master has it; replication is asynchronous, so a
master killed before its replica received the last writes loses them in a failover. With
``wait_replicas`` (REDIS_WAIT_REPLICAS) each write is followed by WAIT on the same connection and
acknowledged only when that many replicas hold it (else 503; the client's retry is a no-op).
docs/scaling.md measures both.

Failing fast: small commands use a pool with 0.5 s connect and read timeouts, a 5 s health-check
interval and at most one immediate retry, on connection errors only (redis-py's default is ten
retries with backoff, far beyond a 1 s budget; a timed-out command is not resent). A dead Redis
therefore answers :class:`StoreUnavailable` well within 1 s. Recovery needs no restart: the pool
checks a pooled connection before lending it and reconnects one the server closed, so the first
call after Redis returns succeeds. Instance bodies (up to hundreds of
MB) go through a second pool whose read timeout is ``bulk_timeout`` (Python's ``sendall``
timeout bounds the whole upload); its connect timeout is the same 0.5 s, so an unreachable
server still fails fast. A connection error retried after the server had already run a CAS makes
the retry report VersionConflict: callers re-read and find their step applied (observations are
idempotent in the API), so nothing is doubled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from urllib.parse import quote

import orjson
import redis

from service.engine import CompiledInstance

from . import codec
from .base import (
    DEFAULT_TENANT,
    INSTANCE_TTL_FACTOR,
    CorruptRecord,
    QuotaExceeded,
    Quotas,
    SessionRecord,
    SessionStore,
    StoredInstance,
    StoreFull,
    StoreUnavailable,
    VersionConflict,
    check_next_version,
)
from .cache import InstanceCache, RecordCache
from .ratelimit import Rate, RedisLimiter
from .records import decode_record, encode_record
from .redis_client import COMMAND_TIMEOUT, LazyClient, connect, is_unavailable, redis_errors

log = logging.getLogger(__name__)

DEFAULT_BULK_TIMEOUT = 10.0
# Session records this process remembers as it last read or wrote them (a few KB each).
RECORD_CACHE_BYTES = 16 * 1024 * 1024
DEFAULT_WAIT_TIMEOUT_MS = 250

# KEYS[1]: the session's state hash. ARGV: expected version ("0": the session must not exist),
# new version, record JSON, TTL in ms, and the record JSON the write started from ("": compare
# the version alone). Returns 1 applied, -1 no session, 0 a create that found another record, and
# on an update's mismatch the stored record, so the caller's next attempt needs no read of its own.
_CAS_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'version')
if ARGV[1] == '0' then
  if current then
    -- A create retried after a dropped connection: the same record is already there.
    if redis.call('HGET', KEYS[1], 'record') == ARGV[3] then
      redis.call('PEXPIRE', KEYS[1], ARGV[4])
      return 1
    end
    return 0
  end
elseif not current then
  return -1
else
  local stored = redis.call('HGET', KEYS[1], 'record')
  if current ~= ARGV[1] or (ARGV[5] ~= '' and stored ~= ARGV[5]) then
    return stored or 0
  end
end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'record', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# Per-tenant quotas. KEYS[1]: zset member → expiry (ms) of what is counted; KEYS[2]: hash
# member → bytes (instances; sessions pass KEYS[1] again). ARGV: member, its expiry (ms), now (ms),
# max count, its bytes, max bytes (-1: no limit). Members past their expiry are dropped first;
# reads slide the scores as they slide the TTLs (ZADD XX), so the count is what is alive.
# Returns {1} admitted (or already counted), {0, 1, count} over the count, {0, 2, bytes} over
# the bytes.
_ADMIT_SCRIPT = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
  if KEYS[2] ~= KEYS[1] then redis.call('HDEL', KEYS[2], unpack(expired)) end
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  return {1}
end
local count = redis.call('ZCARD', KEYS[1])
local max_count = tonumber(ARGV[4])
if max_count >= 0 and count >= max_count then return {0, 1, count} end
local max_bytes = tonumber(ARGV[6])
if max_bytes >= 0 then
  local total = 0
  for _, size in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(size) end
  if total + tonumber(ARGV[5]) > max_bytes then return {0, 2, total} end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if KEYS[2] ~= KEYS[1] then redis.call('HSET', KEYS[2], ARGV[1], ARGV[5]) end
return {1}
"""

# KEYS[1]: the session's state hash. ARGV[1]: TTL in ms. The record, its TTL slid, or nil.
_READ_SCRIPT = """
local record = redis.call('HGET', KEYS[1], 'record')
if record then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return record
"""


class RedisStore(SessionStore):
    def __init__(self, url: str, *, session_ttl: int = 24 * 3600, key_prefix: str = "edgecut",
                 instance_cache_bytes: int = 256 * 1024 * 1024, bulk_timeout: float = DEFAULT_BULK_TIMEOUT,
                 quotas: Quotas | None = None, cluster: bool = False, wait_replicas: int = 0,
                 wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS):
        if session_ttl <= 0:
            raise ValueError(f"session_ttl must be positive, got {session_ttl}")
        if not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ValueError(f"key_prefix must be non-empty and free of braces, got {key_prefix!r}")
        if wait_replicas < 0 or not 0 < wait_timeout_ms < COMMAND_TIMEOUT * 1000:
            raise ValueError(f"wait_replicas must be ≥ 0 and wait_timeout_ms in (0, {COMMAND_TIMEOUT * 1000:.0f}) "
                             f"(below the command timeout), got {wait_replicas}, {wait_timeout_ms}")
        self.session_ttl = session_ttl
        self.instance_ttl = INSTANCE_TTL_FACTOR * session_ttl
        self.key_prefix = key_prefix
        self.cluster = cluster
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._session_ttl_ms = int(session_ttl * 1000)
        # A session's quota entry counts it until it expires and up to this long after: then a
        # write (each observation) needs to slide the entry, another slot's key, only when this
        # process has not for half the slack, not in every round trip (that pipeline cost ~6% of
        # an observation's CPU in process). Reads slide it every time, in their own pipeline.
        self._quota_slack = min(60.0, session_ttl / 10)
        self._session_quota_ms = self._session_ttl_ms + int(self._quota_slack * 1000)
        self._instance_ttl_ms = int(self.instance_ttl * 1000)
        # How long a cached instance is trusted to still exist in Redis; must stay ≤
        # instance_ttl − session_ttl for instances to outlive their sessions.
        self.recheck_interval = min(60.0, session_ttl / 4)
        self._redis = LazyClient(lambda: connect(url, cluster=cluster))
        # Bodies of up to hundreds of MB: 1 MiB socket reads, not 64 KiB (fewer syscalls and copies).
        self._bulk = LazyClient(lambda: connect(url, cluster=cluster, socket_timeout=bulk_timeout,
                                                read_size=1 << 20))
        self.quotas = quotas or Quotas()
        self.cache = InstanceCache(instance_cache_bytes)
        self.records = RecordCache(RECORD_CACHE_BYTES)
        self.round_trips = 0  # network round trips this store made (tests and /metrics read it)

    # --- keys --------------------------------------------------------------------------------

    def instance_key(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{i:{_part(tenant)}:{_part(instance_id)}}}:instance"

    def session_key(self, session_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{s:{_part(tenant)}:{_part(session_id)}}}:state"

    def idempotency_key(self, key: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{k:{_part(tenant)}:{_part(key)}}}:idem"

    def quota_key(self, counted: str, tenant: str = DEFAULT_TENANT) -> str:
        """``counted``: instances, instance-bytes or sessions (one slot per tenant)."""
        return f"{self.key_prefix}:{{q:{_part(tenant)}}}:{counted}:quota"

    def deleted_key(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{i:{_part(tenant)}:{_part(instance_id)}}}:gone"

    def value_key(self, name: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{v:{_part(tenant)}:{_part(name)}}}:value"

    def listing_key(self, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{l:{_part(tenant)}}}:instances"

    # --- instances ---------------------------------------------------------------------------

    def put_instance(self, instance: CompiledInstance, tenant: str = DEFAULT_TENANT) -> bool:
        key = self.instance_key(instance.content_hash, tenant)
        with self._guard():
            # Refresh first: re-posting known content then costs no upload.
            self.round_trips += 1
            if self._refresh_instance(key, instance.content_hash, tenant):
                created = False
            else:
                self._admit_instance(instance, tenant)
                header, body = codec.encode(instance)
                listed = StoredInstance.of(instance, time.time())
                # MULTI/EXEC, not Lua: a script would copy a body of hundreds of MB into Lua
                # strings. Existing keys always hold both fields, so the first HSETNX alone says
                # whether this is new, and a reader never sees a header without its body.
                try:
                    created = bool(self._write(key, [("HSETNX", key, "header", header),
                                                     ("HSETNX", key, "body", body),
                                                     ("HSETNX", key, "summary", orjson.dumps(dataclasses.asdict(listed))),
                                                     ("PEXPIRE", key, self._instance_ttl_ms),
                                                     ("DEL", self.deleted_key(instance.content_hash, tenant))],
                                               bulk=True, atomic=True)[0])
                except (redis.exceptions.RedisError, StoreUnavailable):
                    self._forget_instance(instance.content_hash, tenant)  # admitted, never stored
                    raise
                if created:
                    self.round_trips += 1
                    self._redis.get().zadd(self.listing_key(tenant), {listed.cursor: 0})
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
            with self._guard():
                self.round_trips += 1
                alive = self._refresh_instance(key, instance_id, tenant)
            if alive:
                cached.checked_at = now
                return cached.instance
            self.cache.discard(cache_key)
            return None
        with self._guard():
            pipe = self._bulk.get().pipeline(transaction=False)
            pipe.hmget(key, "header", "body")
            pipe.pexpire(key, self._instance_ttl_ms)
            self._slide_quota(pipe, "instances", instance_id, tenant, self._instance_ttl_ms)
            self.round_trips += 1
            header, body = _essential(pipe, 2)[0]
        if header is None or body is None:
            return None
        try:
            instance = codec.decode(header, body, expected_hash=instance_id)
        except codec.CorruptInstance as error:
            # Bytes that fail their own hash must never become an answer. Drop them, so the
            # instance reads as expired (410 for its sessions) and posting it again repairs it.
            log.error("dropping corrupt instance %s: %s", key, error)
            with self._guard():
                self._redis.get().delete(key)
            self._forget_instance(instance_id, tenant)
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
            with self._guard():
                self.round_trips += 1
                client = self._redis.get()
                positions = [p.decode() for p in client.zrangebylex(
                    index, "-" if position is None else f"({position}", "+", 0, wanted)]
                if not positions:
                    break
                pipe = client.pipeline(transaction=False)  # the instances' slots differ: no transaction
                for p in positions:
                    pipe.hget(self.instance_key(p.split(":", 1)[1], tenant), "summary")
                self.round_trips += 1
                summaries = pipe.execute()
                stale = []
                for p, summary in zip(positions, summaries):
                    item = None if summary is None else StoredInstance(**orjson.loads(summary))
                    if item is None or item.cursor != p:
                        stale.append(p)  # expired, or deleted and stored again under a newer position
                    else:
                        page.append(item)
                if stale:
                    self.round_trips += 1
                    client.zrem(index, *stale)
            if len(positions) < wanted:
                break
            position = positions[-1]
        return page[:limit], page[limit - 1].cursor if len(page) > limit else None

    def delete_instance(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        key = self.instance_key(instance_id, tenant)
        with self._guard():
            pipe = self._redis.get().pipeline(transaction=False)
            pipe.hget(key, "summary")
            pipe.exists(key)
            self.round_trips += 1
            summary, exists = pipe.execute()
            if not exists:
                return False
            # The tombstone shares the instance's slot, so both change in one transaction.
            existed = bool(self._write(key, [("DEL", key), ("SET", self.deleted_key(instance_id, tenant), b"1",
                                                            "PX", self._instance_ttl_ms)], atomic=True)[0])
            if summary is not None:
                self.round_trips += 1
                self._redis.get().zrem(self.listing_key(tenant), StoredInstance(**orjson.loads(summary)).cursor)
        self.cache.discard((tenant, instance_id))
        if existed:
            self._forget_instance(instance_id, tenant)  # no longer counts against the quotas
        return existed

    def instance_deleted(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        with self._guard():
            self.round_trips += 1
            return bool(self._redis.get().exists(self.deleted_key(instance_id, tenant)))

    # --- sessions ----------------------------------------------------------------------------

    def create_session(self, record: SessionRecord) -> None:
        limit = self.quotas.sessions
        slid_at = time.monotonic()
        if limit is not None:
            admitted = self._admit_member("sessions", "sessions", record.session_id, record.tenant,
                                          self._session_quota_ms, limit, 0, -1)
            if not admitted[0]:
                raise QuotaExceeded("TENANT_MAX_SESSIONS", limit, admitted[2], f"has {admitted[2]} live sessions")
        raw = encode_record(record)
        if self._compare_and_set(record, raw, expected_version=0) != 1:
            if limit is not None:
                with self._guard():
                    self._redis.get().zrem(self.quota_key("sessions", record.tenant), record.session_id)
            raise VersionConflict(f"session {record.session_id!r} already exists")
        self.records.put(self.session_key(record.session_id, record.tenant), record, raw, slid_at)

    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        key = self.session_key(session_id, tenant)
        slid_at = time.monotonic()
        with self._guard():
            self.round_trips += 1
            read = ("EVAL", _READ_SCRIPT, 1, key, self._session_ttl_ms)
            if not self._counted("sessions"):
                # One command, not a pipeline of one: the cluster client would spend a second
                # round trip on the pipeline.
                raw = self._redis.own().execute_command(*read)
            else:
                pipe = self._redis.get().pipeline(transaction=False)
                pipe.execute_command(*read)
                self._slide_quota(pipe, "sessions", session_id, tenant, self._session_quota_ms)
                raw = _essential(pipe, 1)[0]
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
        slide = self._counted("sessions") and now - slid_at >= self._quota_slack / 2
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
        with self._guard():
            deleted = bool(self._write(key, [("DEL", key)])[0])
            if self.quotas.sessions is not None:  # bookkeeping on the tenant's own slot
                self._redis.get().zrem(self.quota_key("sessions", tenant), session_id)
        return deleted

    def claim_idempotency_key(self, key: str, session_id: str, tenant: str = DEFAULT_TENANT) -> str | None:
        redis_key = self.idempotency_key(key, tenant)
        with self._guard():
            previous = self._write(redis_key, [("SET", redis_key, session_id, "NX", "GET", "EX", self.session_ttl,
                                                {"get": True})])[0]
        return None if previous is None else previous.decode()

    def idempotency_binding(self, key: str, tenant: str = DEFAULT_TENANT) -> str | None:
        with self._guard():
            self.round_trips += 1
            bound = self._redis.get().get(self.idempotency_key(key, tenant))
        return None if bound is None else bound.decode()

    def get_value(self, name: str, tenant: str = DEFAULT_TENANT) -> bytes | None:
        with self._guard():
            self.round_trips += 1
            return self._redis.get().get(self.value_key(name, tenant))

    def put_value(self, name: str, value: bytes, tenant: str = DEFAULT_TENANT) -> bytes:
        key = self.value_key(name, tenant)
        with self._guard():
            # SET NX GET: stored only if absent, and the value already there comes back in the
            # same round trip, so racing workers agree on the first.
            previous = self._write(key, [("SET", key, value, "NX", "GET", "PX", self._instance_ttl_ms,
                                          {"get": True})])[0]
        return value if previous is None else previous

    def rate_limiter(self, rate: Rate, scope: str) -> RedisLimiter:
        return RedisLimiter(rate, self._redis, self.key_prefix, scope)

    def ping(self) -> None:
        with self._guard():
            self.round_trips += 1
            client = self._redis.get()
            if not self.cluster:
                client.ping()
                return
            # Ready only when the cluster says it serves every slot and every master answers.
            state = client.cluster_info().get("cluster_state")
            if state != "ok":
                raise StoreUnavailable(f"Redis Cluster state is {state!r}, not 'ok'")
            client.ping(target_nodes=redis.RedisCluster.PRIMARIES)

    def warm(self) -> None:
        # Both pools: a session's first step downloads its instance on one and writes the
        # session on the other, and each first connection (with CLIENT SETINFO) was 2–10 ms of
        # a new worker's first request.
        with self._guard():
            for pool in (self._redis, self._bulk):
                self.round_trips += 1
                client = pool.get()
                if self.cluster:
                    client.ping(target_nodes=redis.RedisCluster.PRIMARIES)
                else:
                    client.ping()

    def close(self) -> None:
        """Drop pooled connections (tests; a worker just exits)."""
        self._redis.close()
        self._bulk.close()

    # --- internals ---------------------------------------------------------------------------

    def _refresh_instance(self, key: str, instance_id: str, tenant: str) -> bool:
        """Slide a stored instance's TTL (and its quota entry); False when it is not stored."""
        if not self._counted("instances"):
            return bool(self._redis.get().pexpire(key, self._instance_ttl_ms))
        pipe = self._redis.get().pipeline(transaction=False)
        pipe.pexpire(key, self._instance_ttl_ms)
        self._slide_quota(pipe, "instances", instance_id, tenant, self._instance_ttl_ms)
        return bool(_essential(pipe, 1)[0])

    def _counted(self, counted: str) -> bool:
        if counted == "sessions":
            return self.quotas.sessions is not None
        return self.quotas.instances is not None or self.quotas.stored_bytes is not None

    def _slide_quota(self, pipe, counted: str, member: str, tenant: str, ttl_ms: int) -> None:
        if self._counted(counted):
            pipe.execute_command(*self._quota_slide(counted, member, tenant, ttl_ms))

    def _quota_slide(self, counted: str, member: str, tenant: str, ttl_ms: int) -> tuple:
        """The command that slides ``member``'s quota entry to now + ``ttl_ms``: only an entry that
        exists, and never back (another worker may have slid it further)."""
        return ("ZADD", self.quota_key(counted, tenant), "XX", "GT", _now_ms() + ttl_ms, member)

    def _forget_instance(self, instance_id: str, tenant: str) -> None:
        if not self._counted("instances"):
            return
        with contextlib.suppress(redis.exceptions.RedisError):
            pipe = self._redis.get().pipeline(transaction=False)
            pipe.zrem(self.quota_key("instances", tenant), instance_id)
            pipe.hdel(self.quota_key("instance-bytes", tenant), instance_id)
            pipe.execute()

    def _admit_instance(self, instance: CompiledInstance, tenant: str) -> None:
        count_limit, bytes_limit = self.quotas.instances, self.quotas.stored_bytes
        if count_limit is None and bytes_limit is None:
            return
        size = codec.encoded_size(instance)
        admitted = self._admit_member("instances", "instance-bytes", instance.content_hash, tenant,
                                      self._instance_ttl_ms, -1 if count_limit is None else count_limit, size,
                                      -1 if bytes_limit is None else bytes_limit)
        if admitted[0]:
            return
        if admitted[1] == 1:
            raise QuotaExceeded("TENANT_MAX_INSTANCES", count_limit, admitted[2], f"has {admitted[2]} stored instances")
        raise QuotaExceeded("TENANT_MAX_STORED_BYTES", bytes_limit, admitted[2],
                            f"stores {admitted[2]} bytes of instances and this one takes {size}")

    def _admit_member(self, counted: str, sized: str, member: str, tenant: str, ttl_ms: int, max_count: int,
                      size: int, max_bytes: int) -> list[int]:
        now = _now_ms()
        keys = [self.quota_key(counted, tenant), self.quota_key(sized, tenant)]
        with self._guard():
            self.round_trips += 1
            # EVAL with the text (cached by Redis under its hash): no NOSCRIPT after a failover.
            reply = self._redis.get().execute_command("EVAL", _ADMIT_SCRIPT, 2, *keys, member, now + ttl_ms, now,
                                                      max_count, size, max_bytes)
            return [int(x) for x in reply]

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
            bookkeeping.append(self._quota_slide("sessions", record.session_id, record.tenant, self._session_quota_ms))
        with self._guard():
            # EVAL with the text, not EVALSHA: Redis caches the compiled script by its hash anyway,
            # and a master just promoted or restarted then never answers NOSCRIPT mid-pipeline.
            return self._write(key, [("EVAL", _CAS_SCRIPT, 1, key, *args)], bookkeeping=bookkeeping)[0]

    def _write(self, key: str, commands: list[tuple], *, bulk: bool = False, atomic: bool = False,
               bookkeeping: list[tuple] = ()) -> list:
        """Run ``commands`` (all on ``key``'s slot; a trailing dict in one is redis-py's parsing
        options for it) in one round trip, as one MULTI/EXEC when ``atomic``, and return their
        replies. ``bookkeeping`` (not with ``atomic``: any slot) rides along in the same round
        trip and may fail alone, as in :func:`_essential`.

        With ``wait_replicas`` (REDIS_WAIT_REPLICAS), ``WAIT`` follows them, and fewer replicas
        confirming within ``wait_timeout_ms`` is :class:`StoreUnavailable`: the write happened on
        the master but was not acknowledged, and the client's retry is a no-op (creates and
        observations are idempotent). WAIT counts the replicas holding *this connection's*
        writes, so it must follow them on the same connection to the key's master: a plain
        pipeline to that node (the cluster client names it), with MULTI/EXEC spelled out.
        """
        lazy = self._bulk if bulk else self._redis
        client = lazy.get()
        self.round_trips += 1
        if not self.wait_replicas:
            if len(commands) == 1 and not atomic and not bookkeeping:
                # A pipeline of one would cost the cluster client a second round trip.
                args, options = _options(commands[0])
                return [lazy.own().execute_command(*args, **options)]
            pipe = client.pipeline(transaction=atomic)
            for command in [*commands, *bookkeeping]:
                args, options = _options(command)
                pipe.execute_command(*args, **options)
            return _essential(pipe, len(commands)) if bookkeeping else pipe.execute()
        node = client.get_redis_connection(client.get_node_from_key(key)) if self.cluster else client
        pipe = node.pipeline(transaction=False)
        for command in [("MULTI",)] * atomic + commands + [("EXEC",)] * atomic:
            args, options = _options(command)
            pipe.execute_command(*args, **options)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        try:
            replies = pipe.execute()
        except redis.exceptions.RedisError as error:
            if self.cluster and is_unavailable(error):
                # This path bypasses the cluster client's redirect handling: have it re-read the
                # slot map so the client's retry goes to the node that now owns the slot.
                _refresh_slot_map(client)
            raise
        confirmed = int(replies[-1])
        if confirmed < self.wait_replicas:
            raise StoreUnavailable(f"{confirmed} of {self.wait_replicas} replicas confirmed the write within "
                                   f"{self.wait_timeout_ms} ms (REDIS_WAIT_REPLICAS)")
        if bookkeeping:  # its slot may be another node's: a round trip of its own
            self.round_trips += 1
            with contextlib.suppress(redis.exceptions.RedisError):
                bookkeeper = client.pipeline(transaction=False)
                for command in bookkeeping:
                    bookkeeper.execute_command(*command)
                bookkeeper.execute()
        if atomic:
            return list(replies[-2])
        return replies[:-1]

    def _guard(self):
        return redis_errors()


def _essential(pipe, count: int) -> list:
    """The replies of a pipeline whose first ``count`` commands are the point of it; the rest
    (sliding a quota entry) may fail alone — under OOM a ZADD is refused while reads still
    work, and a read must not fail for its bookkeeping."""
    replies = pipe.execute(raise_on_error=False)
    for reply in replies[:count]:
        if isinstance(reply, Exception):
            raise reply
    return replies[:count]


def _options(command: tuple) -> tuple[tuple, dict]:
    if command and isinstance(command[-1], dict):
        return command[:-1], command[-1]
    return command, {}


def _refresh_slot_map(client: redis.RedisCluster) -> None:
    try:
        client.nodes_manager.initialize()
    except Exception as error:  # the cluster may be unreachable as a whole; the 503 stands
        log.warning("could not refresh the Redis Cluster slot map: %s", error)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _part(text: str) -> str:
    # Percent-encode so a tenant or id can never open/close a hash tag or fake a separator.
    # Session ids and most tenants need none (the check is a tenth of quote's cost).
    return text if _NEEDS_NO_QUOTING.fullmatch(text) else quote(text, safe="-_.~@")


_NEEDS_NO_QUOTING = re.compile(r"[A-Za-z0-9_.~@-]*")
