"""Per-tenant quotas in Redis: how many instances and sessions a tenant holds and how many bytes
its instances take (TENANT_MAX_*), counted in the tenant's own slot (redis_keys.py ``q:``).

Each counted member has an expiry, slid as its instance's or session's TTL slides, so the count is
what is alive; ADMIT_SCRIPT (redis_scripts.py) drops what expired and admits or refuses in one step.
"""

from __future__ import annotations

import contextlib
import time

import redis

from service.engine import CompiledInstance

from .base import QuotaExceeded, Quotas, SessionRecord
from .encoded import EncodedInstance, stored_size
from .redis_client import redis_errors
from .redis_connection import RedisConnection, essential
from .redis_keys import RedisKeys
from .redis_scripts import ADMIT_SCRIPT


class RedisQuotas:
    def __init__(self, connection: RedisConnection, keys: RedisKeys, quotas: Quotas, instance_ttl_ms: int,
                 session_quota_ms: int):
        self.connection = connection
        self.keys = keys
        self.quotas = quotas
        self.instance_ttl_ms = instance_ttl_ms
        self.session_quota_ms = session_quota_ms  # a session's TTL and a slack (redis_store.py)

    def counts(self, counted: str) -> bool:
        if counted == "sessions":
            return self.quotas.sessions is not None
        return self.quotas.instances is not None or self.quotas.stored_bytes is not None

    def slide(self, pipe, counted: str, member: str, tenant: str) -> None:
        if self.counts(counted):
            pipe.execute_command(*self.slide_command(counted, member, tenant))

    def slide_command(self, counted: str, member: str, tenant: str) -> tuple:
        """The command that slides ``member``'s quota entry to now + its TTL: only an entry that
        exists, and never back (another worker may have slid it further)."""
        ttl_ms = self.session_quota_ms if counted == "sessions" else self.instance_ttl_ms
        return ("ZADD", self.keys.quota_key(counted, tenant), "XX", "GT", _now_ms() + ttl_ms, member)

    def refresh_instance(self, key: str, instance_id: str, tenant: str) -> bool:
        """Slide a stored instance's TTL (and its quota entry); False when it is not stored."""
        if not self.counts("instances"):
            return bool(self.connection.redis.get().pexpire(key, self.instance_ttl_ms))
        pipe = self.connection.redis.get().pipeline(transaction=False)
        pipe.pexpire(key, self.instance_ttl_ms)
        self.slide(pipe, "instances", instance_id, tenant)
        return bool(essential(pipe, 1)[0])

    def admit_instance(self, instance: CompiledInstance | EncodedInstance, tenant: str) -> None:
        count_limit, bytes_limit = self.quotas.instances, self.quotas.stored_bytes
        if count_limit is None and bytes_limit is None:
            return
        size = stored_size(instance)
        admitted = self._admit("instances", "instance-bytes", instance.content_hash, tenant, self.instance_ttl_ms,
                               -1 if count_limit is None else count_limit, size,
                               -1 if bytes_limit is None else bytes_limit)
        if admitted[0]:
            return
        if admitted[1] == 1:
            raise QuotaExceeded("TENANT_MAX_INSTANCES", count_limit, admitted[2], f"has {admitted[2]} stored instances")
        raise QuotaExceeded("TENANT_MAX_STORED_BYTES", bytes_limit, admitted[2],
                            f"stores {admitted[2]} bytes of instances and this one takes {size}")

    def forget_instance(self, instance_id: str, tenant: str) -> None:
        if not self.counts("instances"):
            return
        with contextlib.suppress(redis.exceptions.RedisError):
            pipe = self.connection.redis.get().pipeline(transaction=False)
            pipe.zrem(self.keys.quota_key("instances", tenant), instance_id)
            pipe.hdel(self.keys.quota_key("instance-bytes", tenant), instance_id)
            pipe.execute()

    def admit_session(self, record: SessionRecord) -> None:
        limit = self.quotas.sessions
        if limit is None:
            return
        admitted = self._admit("sessions", "sessions", record.session_id, record.tenant, self.session_quota_ms,
                               limit, 0, -1)
        if not admitted[0]:
            raise QuotaExceeded("TENANT_MAX_SESSIONS", limit, admitted[2], f"has {admitted[2]} live sessions")

    def forget_session(self, session_id: str, tenant: str) -> None:
        """(Inside the caller's ``redis_errors``.)"""
        if self.quotas.sessions is not None:  # bookkeeping on the tenant's own slot
            self.connection.redis.get().zrem(self.keys.quota_key("sessions", tenant), session_id)

    def _admit(self, counted: str, sized: str, member: str, tenant: str, ttl_ms: int, max_count: int,
               size: int, max_bytes: int) -> list[int]:
        now = _now_ms()
        keys = [self.keys.quota_key(counted, tenant), self.keys.quota_key(sized, tenant)]
        with redis_errors():
            self.connection.round_trips += 1
            reply = self.connection.redis.get().execute_command("EVAL", ADMIT_SCRIPT, 2, *keys, member, now + ttl_ms,
                                                                now, max_count, size, max_bytes)
            return [int(x) for x in reply]


def _now_ms() -> int:
    return int(time.time() * 1000)
