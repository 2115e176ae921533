"""Errors of the service layer (sessions, instances in the store). Like the engine's errors
(service/engine/errors.py) each carries a stable ``code``; service/api/problems.py is the one
place that maps every code to an HTTP status and a problem+json body."""


class ServiceError(Exception):
    code = "service-error"


class InstanceNotFound(ServiceError):
    code = "instance-not-found"


class InstanceExpired(ServiceError):
    """A session refers to an instance the store no longer holds (its TTL ran out)."""

    code = "instance-expired"


class SessionNotFound(ServiceError):
    code = "session-not-found"


class SessionDone(ServiceError):
    """An observation posted after the session stopped."""

    code = "session-done"


class PreconditionFailed(ServiceError):
    """``If-Match`` named a version the session no longer has."""

    code = "precondition-failed"


class ConcurrentUpdate(ServiceError):
    """Compare-and-set kept losing to other writers; the client may retry."""

    code = "concurrent-update"


class IdempotencyKeyReused(ServiceError):
    """An ``Idempotency-Key`` already used for a different session request."""

    code = "idempotency-key-reused"




class SessionUnreadable(ServiceError):
    """The stored session record is damaged: the session cannot go on (its id is logged)."""

    code = "session-unreadable"
