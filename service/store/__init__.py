"""Persistence: one :class:`~service.store.base.SessionStore` contract (instances, sessions,
idempotency keys, health, rate limits), two implementations (in memory; Redis, one node or a
cluster), and :func:`create_store`, the one place that picks between them."""

from __future__ import annotations

from .base import (
    DEFAULT_TENANT,
    CorruptRecord,
    QuotaExceeded,
    Quotas,
    SessionRecord,
    SessionStore,
    StoreFull,
    StoreUnavailable,
    VersionConflict,
)


def create_store(
    redis_url: str | None,
    *,
    session_ttl: int,
    key_prefix: str = "edgecut",
    instance_cache_bytes: int = 256 * 1024 * 1024,
    quotas: Quotas | None = None,
    redis_cluster: bool = False,
    redis_wait_replicas: int = 0,
    redis_wait_timeout_ms: int = 250,
) -> SessionStore:
    """The Redis store when ``redis_url`` is set (a Redis Cluster when ``redis_cluster``), else
    the embedded in-memory store."""
    if redis_url:
        from .redis_store import RedisStore

        return RedisStore(redis_url, session_ttl=session_ttl, key_prefix=key_prefix,
                          instance_cache_bytes=instance_cache_bytes, quotas=quotas, cluster=redis_cluster,
                          wait_replicas=redis_wait_replicas, wait_timeout_ms=redis_wait_timeout_ms)
    from .memory import MemoryStore

    return MemoryStore(session_ttl=session_ttl, quotas=quotas)


__all__ = ["DEFAULT_TENANT", "CorruptRecord", "QuotaExceeded", "Quotas", "SessionRecord", "SessionStore", "StoreFull",
           "StoreUnavailable", "VersionConflict", "create_store"]
