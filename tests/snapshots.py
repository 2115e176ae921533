"""What a store holds, captured so a test can say "this request changed nothing stored".

Redis: every key under the app's prefix with its DUMP (the server's own byte serialisation of the
value; TTLs are not part of it, and they legitimately slide on reads). Quota bookkeeping is
captured by its members and sizes, not its expiry scores, which slide on reads like TTLs.
Memory: the store's tables, each payload with its expiry left out, for the same reason, and the
per-tenant usage. Rate-limit counters are not stored state and are skipped.
"""

from __future__ import annotations

from dataclasses import replace

import redis

from service.store.memory import MemoryStore
from service.store.redis_store import RedisStore


def snapshot(app) -> dict:
    store = app.extensions["edgecut"].store
    if isinstance(store, RedisStore):
        client = redis.Redis.from_url(app.extensions["edgecut"].settings.redis_url)
        try:
            keys = sorted(k for k in client.scan_iter(match=f"{store.key_prefix}:*", count=1000)
                          if not k.endswith(b":rate"))
            return {key: _quota_entries(client, key) if key.endswith(b":quota") else client.dump(key)
                    for key in keys}
        finally:
            client.close()
    if isinstance(store, MemoryStore):
        with store._lock:
            return {
                "instances": {key: (value.content_hash, id(value)) for key, (value, _) in store._instances.items()},
                "sessions": {key: replace(record, expires_at=0.0) for key, (record, _) in store._sessions.items()},
                "idempotency": {key: value for key, (value, _) in store._idempotency.items()},
                "usage": {tenant: tuple(usage) for tenant, usage in store._usage.items() if any(usage)},
                "deleted": set(store._deleted),
                "created_at": dict(store._created_at),
            }
    raise TypeError(f"no snapshot for {type(store).__name__}")


def _quota_entries(client: redis.Redis, key: bytes):
    if client.type(key) == b"zset":
        return sorted(client.zrange(key, 0, -1))
    return client.hgetall(key)
