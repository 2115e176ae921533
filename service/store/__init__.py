"""Persistence: one :class:`~service.store.base.SessionStore` contract, two implementations."""

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
) -> SessionStore:
    """The Redis store when ``redis_url`` is set, else the embedded in-memory store."""
    if redis_url:
        from .redis_store import RedisStore

        return RedisStore(redis_url, session_ttl=session_ttl, key_prefix=key_prefix,
                          instance_cache_bytes=instance_cache_bytes, quotas=quotas)
    from .memory import MemoryStore

    return MemoryStore(session_ttl=session_ttl, quotas=quotas)


__all__ = ["DEFAULT_TENANT", "CorruptRecord", "QuotaExceeded", "Quotas", "SessionRecord", "SessionStore", "StoreFull",
           "StoreUnavailable", "VersionConflict", "create_store"]
