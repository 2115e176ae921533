"""The Redis store (redis-py + hiredis): what several gunicorn workers and hosts share.

Key layout (``P`` is the configurable ``key_prefix``; tenant, session id and idempotency key are
percent-encoded, so none of them can contain ``{``, ``}`` or ``:``)::

    P:{i:<tenant>:<content hash>}:instance  hash  header → JSON (codec.encode), body → raw arrays
    P:{s:<tenant>:<session id>}:state       hash  version → "<n>", record → JSON SessionRecord
    P:{k:<tenant>:<idempotency key>}:idem   string  the session id the key is bound to

The ``{…}`` part is the Redis Cluster hash tag: every key belonging to one session (the state
today; anything later added for it must reuse ``{s:<tenant>:<sid>}``) lands in one slot, so the
compare-and-set script only ever touches one slot. Tenants are part of every key, so another
tenant's data is simply not found.

Consistency and lifetimes

* Instances are written with MULTI/EXEC (HSETNX header, HSETNX body, PEXPIRE): all or nothing,
  and two workers posting the same content cannot both see it as new.
* Every session write goes through ONE Lua script (``_CAS_SCRIPT``): compare the stored version,
  write version + record, and slide the TTL, atomically. ``create_session`` is the same script
  with expected version 0 ("must not exist"). Two workers can never both apply a step.
* Sessions slide: reads (``get_session``: HGET + PEXPIRE pipelined, one round trip) and writes
  reset the TTL to ``session_ttl``. ``expires_at`` in returned records is now + ``session_ttl``.
* Instances are stored once per (tenant, content hash) with a TTL of 2 × ``session_ttl``, reset
  by ``put_instance`` and whenever ``get_instance`` serves them. The API reads a session's
  instance on every step, and each worker re-confirms (PEXPIRE) a cached instance at least every
  ``min(60 s, session_ttl / 4)``, so an instance outlives every session that still uses it.
* Idempotency keys: ``SET NX GET EX session_ttl`` (Redis ≥ 7.0) binds and reads in one command.

Worker cache: a byte-bounded LRU (:mod:`.cache`) of decoded instances, so a step does not
re-download and re-hash the matrix; a hit costs no Redis round trip, except the periodic
existence re-check above. Decoding checks dtype, shape, byte ranges and the content hash
(:mod:`.codec`): corrupt bytes raise :class:`~.codec.CorruptInstance`, never a wrong answer.
Nothing read back is unpickled or evaluated.

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
import logging
import time
from urllib.parse import quote

import orjson
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.engine import CompiledInstance

from . import codec
from .base import DEFAULT_TENANT, SessionRecord, SessionStore, StoreUnavailable, VersionConflict
from .cache import InstanceCache
from .memory import INSTANCE_TTL_FACTOR, _check_next_version

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 0.5
COMMAND_TIMEOUT = 0.5
HEALTH_CHECK_INTERVAL = 5
DEFAULT_BULK_TIMEOUT = 10.0

# KEYS[1]: the session's state hash. ARGV: expected version ("0": the session must not exist),
# new version, record JSON, TTL in ms. Returns 1 applied, 0 version mismatch, -1 no session.
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
elseif current ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'record', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# Server replies meaning "not available right now" rather than "your command is wrong".
_UNAVAILABLE_REPLIES = ("LOADING", "MASTERDOWN", "READONLY", "MISCONF", "OOM", "CLUSTERDOWN", "TRYAGAIN",
                        "BUSY")

_RECORD_FIELDS = ("session_id", "instance_id", "policy", "max_tests", "max_cost", "confidence", "seed",
                  "observations", "version", "created_at", "tenant", "max_expected_loss")


class RedisStore(SessionStore):
    def __init__(self, url: str, *, session_ttl: int = 24 * 3600, key_prefix: str = "edgecut",
                 instance_cache_bytes: int = 256 * 1024 * 1024, bulk_timeout: float = DEFAULT_BULK_TIMEOUT):
        if session_ttl <= 0:
            raise ValueError(f"session_ttl must be positive, got {session_ttl}")
        if not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ValueError(f"key_prefix must be non-empty and free of braces, got {key_prefix!r}")
        self.session_ttl = session_ttl
        self.instance_ttl = INSTANCE_TTL_FACTOR * session_ttl
        self.key_prefix = key_prefix
        self._session_ttl_ms = int(session_ttl * 1000)
        self._instance_ttl_ms = int(self.instance_ttl * 1000)
        # How long a cached instance is trusted to still exist in Redis; must stay ≤
        # instance_ttl − session_ttl for instances to outlive their sessions.
        self.recheck_interval = min(60.0, session_ttl / 4)
        common = dict(socket_connect_timeout=CONNECT_TIMEOUT, health_check_interval=HEALTH_CHECK_INTERVAL,
                      socket_keepalive=True,
                      retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)))
        self._redis = redis.Redis.from_url(url, socket_timeout=COMMAND_TIMEOUT, **common)
        self._bulk = redis.Redis.from_url(url, socket_timeout=bulk_timeout, **common)
        self._cas = self._redis.register_script(_CAS_SCRIPT)
        self.cache = InstanceCache(instance_cache_bytes)
        self.round_trips = 0  # network round trips this store made (tests and /metrics read it)

    # --- keys --------------------------------------------------------------------------------

    def instance_key(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{i:{_part(tenant)}:{_part(instance_id)}}}:instance"

    def session_key(self, session_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{s:{_part(tenant)}:{_part(session_id)}}}:state"

    def idempotency_key(self, key: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{k:{_part(tenant)}:{_part(key)}}}:idem"

    # --- instances ---------------------------------------------------------------------------

    def put_instance(self, instance: CompiledInstance, tenant: str = DEFAULT_TENANT) -> bool:
        key = self.instance_key(instance.content_hash, tenant)
        with self._guard():
            # Refresh first: re-posting known content then costs no upload.
            self.round_trips += 1
            if self._redis.pexpire(key, self._instance_ttl_ms):
                created = False
            else:
                header, body = codec.encode(instance)
                # MULTI/EXEC, not Lua: a script would copy a body of hundreds of MB into Lua
                # strings (and EVALSHA's NOSCRIPT fallback would upload it twice). Existing keys
                # always hold both fields, so the first HSETNX alone says whether this is new,
                # and a reader never sees a header without its body.
                pipe = self._bulk.pipeline(transaction=True)
                pipe.hsetnx(key, "header", header)
                pipe.hsetnx(key, "body", body)
                pipe.pexpire(key, self._instance_ttl_ms)
                self.round_trips += 1
                created = bool(pipe.execute()[0])
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
                alive = self._redis.pexpire(key, self._instance_ttl_ms)
            if alive:
                cached.checked_at = now
                return cached.instance
            self.cache.discard(cache_key)
            return None
        with self._guard():
            pipe = self._bulk.pipeline(transaction=False)
            pipe.hmget(key, "header", "body")
            pipe.pexpire(key, self._instance_ttl_ms)
            self.round_trips += 1
            (header, body), _ = pipe.execute()
        if header is None or body is None:
            return None
        try:
            instance = codec.decode(header, body, expected_hash=instance_id)
        except codec.CorruptInstance as error:
            # Bytes that fail their own hash must never become an answer. Drop them, so the
            # instance reads as expired (410 for its sessions) and posting it again repairs it.
            log.error("dropping corrupt instance %s: %s", key, error)
            with self._guard():
                self._redis.delete(key)
            return None
        self.cache.put(cache_key, instance, now)
        return instance

    # --- sessions ----------------------------------------------------------------------------

    def create_session(self, record: SessionRecord) -> None:
        if self._compare_and_set(record, expected_version=0) != 1:
            raise VersionConflict(f"session {record.session_id!r} already exists")

    def get_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionRecord | None:
        key = self.session_key(session_id, tenant)
        with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            pipe.hget(key, "record")
            pipe.pexpire(key, self._session_ttl_ms)
            self.round_trips += 1
            raw, _ = pipe.execute()
        if raw is None:
            return None
        return _decode_record(raw, expires_at=time.time() + self.session_ttl)

    def update_session(self, record: SessionRecord, expected_version: int) -> None:
        _check_next_version(record, expected_version)
        if expected_version < 1:
            raise ValueError(f"expected_version must be ≥ 1, got {expected_version}")
        result = self._compare_and_set(record, expected_version)
        if result == -1:
            raise VersionConflict(f"session {record.session_id!r} no longer exists")
        if result != 1:
            raise VersionConflict(f"session {record.session_id!r} is no longer at version {expected_version}")

    def delete_session(self, session_id: str, tenant: str = DEFAULT_TENANT) -> bool:
        with self._guard():
            self.round_trips += 1
            return bool(self._redis.delete(self.session_key(session_id, tenant)))

    def claim_idempotency_key(self, key: str, session_id: str, tenant: str = DEFAULT_TENANT) -> str | None:
        with self._guard():
            self.round_trips += 1
            previous = self._redis.set(self.idempotency_key(key, tenant), session_id, nx=True,
                                       ex=self.session_ttl, get=True)
        return None if previous is None else previous.decode()

    def ping(self) -> None:
        with self._guard():
            self.round_trips += 1
            self._redis.ping()

    def close(self) -> None:
        """Drop pooled connections (tests; a worker just exits)."""
        self._redis.close()
        self._bulk.close()

    # --- internals ---------------------------------------------------------------------------

    def _compare_and_set(self, record: SessionRecord, expected_version: int) -> int:
        key = self.session_key(record.session_id, record.tenant)
        with self._guard():
            self.round_trips += 1
            return int(self._cas(keys=[key], args=[str(expected_version), str(record.version),
                                                   _encode_record(record), self._session_ttl_ms]))

    @contextlib.contextmanager
    def _guard(self):
        """redis-py's connection failures → StoreUnavailable (503 + Retry-After upstream)."""
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise StoreUnavailable(f"Redis is unreachable: {exc}") from exc
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith(_UNAVAILABLE_REPLIES):
                raise StoreUnavailable(f"Redis cannot serve the request: {exc}") from exc
            raise


def _part(text: str) -> str:
    # Percent-encode so a tenant or id can never open/close a hash tag or fake a separator.
    return quote(text, safe="-_.~@")


def _encode_record(record: SessionRecord) -> bytes:
    # expires_at is not stored: the key's TTL is the truth, and leaving it out keeps a retried
    # create byte-identical to the first.
    fields = {name: getattr(record, name) for name in _RECORD_FIELDS}
    return orjson.dumps(fields)


def _decode_record(raw: bytes, expires_at: float) -> SessionRecord:
    fields = orjson.loads(raw)
    fields = {name: fields[name] for name in _RECORD_FIELDS if name in fields}
    fields["observations"] = tuple((str(t), str(o)) for t, o in fields.get("observations", ()))
    return SessionRecord(**fields, expires_at=expires_at)
