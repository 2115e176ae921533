"""``Idempotency-Key`` on session creation: a retried create answers the session the key made."""

from __future__ import annotations

from service.errors import IdempotencyKeyReused
from service.store import SessionRecord, SessionStore

from .commit import Writer
from .records import instance_of_session, stored_session
from .state import SessionResult


def config_of(record: SessionRecord) -> tuple:
    """What a create request asked for: a retry with the key must ask for the same."""
    return (record.instance_id, record.policy, record.max_tests, record.max_cost, record.confidence, record.seed,
            record.max_expected_loss, record.exclude_tests, record.batch_size, record.max_se,
            record.randomesque, record.sympson_hetter, record.progressive, record.max_rate)


def replay(writer: Writer, bound: str, record: SessionRecord, explain: bool) -> SessionResult:
    """The answer to a create whose key is bound to session ``bound`` already (``record``: what
    this request would have created)."""
    store: SessionStore = writer.store
    earlier = stored_session(store, bound, record.tenant)
    if earlier is None:
        raise IdempotencyKeyReused("the session this Idempotency-Key created was deleted or has expired; use a new key")
    if config_of(earlier) != config_of(record):
        raise IdempotencyKeyReused(f"this Idempotency-Key already created session '{bound}' with a different request")
    return SessionResult(writer.state(earlier, instance_of_session(store, earlier), explain),
                         earlier.version, created=True, replayed=True)
