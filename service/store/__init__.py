"""Persistence: one :class:`~service.store.base.SessionStore` contract, two implementations."""

from __future__ import annotations

from .base import DEFAULT_TENANT, SessionRecord, SessionStore, StoreUnavailable, VersionConflict


def create_store(
    redis_url: str | None,
    *,
    session_ttl: int,
    key_prefix: str = "edgecut",
    instance_cache_bytes: int = 256 * 1024 * 1024,
) -> SessionStore:
    """The Redis store when ``redis_url`` is set, else the embedded in-memory store."""
    if redis_url:
        from .redis_store import RedisStore

        return RedisStore(redis_url, session_ttl=session_ttl, key_prefix=key_prefix,
                          instance_cache_bytes=instance_cache_bytes)
    from .memory import MemoryStore

    return MemoryStore(session_ttl=session_ttl)


__all__ = ["DEFAULT_TENANT", "SessionRecord", "SessionStore", "StoreUnavailable", "VersionConflict",
           "create_store"]
