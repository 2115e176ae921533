"""Reading a session's record, and the instance it runs on, back from the store."""

from __future__ import annotations

import logging

from service import engine
from service.errors import InstanceExpired, InstanceGone, SessionNotFound, SessionUnreadable
from service.store import CorruptRecord, SessionRecord, SessionStore

log = logging.getLogger("service.sessions")


def stored_session(store: SessionStore, session_id: str, tenant: str) -> SessionRecord | None:
    try:
        return store.get_session(session_id, tenant)
    except CorruptRecord as error:
        log.error("session %r of tenant %r is unreadable: %s", session_id, tenant, error)
        raise SessionUnreadable(f"session '{session_id}' cannot be read back from the store; "
                                "start a new session (the incident is logged)") from None


def session_record(store: SessionStore, session_id: str, tenant: str) -> SessionRecord:
    record = stored_session(store, session_id, tenant)
    if record is None:
        raise SessionNotFound(f"no session '{session_id}' (unknown, expired or deleted)")
    return record


def instance_of_session(store: SessionStore, record: SessionRecord) -> engine.CompiledInstance:
    compiled = store.get_instance(record.instance_id, record.tenant)
    if compiled is None and store.instance_deleted(record.instance_id, record.tenant):
        raise InstanceGone(
            f"session '{record.session_id}' refers to instance '{record.instance_id}', which was deleted")
    if compiled is None:
        raise InstanceExpired(
            f"session '{record.session_id}' refers to instance '{record.instance_id}', which has "
            "expired; post the instance again and start a new session"
        )
    return compiled
