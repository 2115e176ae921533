"""Errors of the service layer (sessions, instances in the store). Like the engine's errors
(service/engine/errors.py) each carries a stable ``code``; service/api/problems.py is the one
place that maps every code to an HTTP status and a problem+json body."""


class ServiceError(Exception):
    code = "service-error"

    def __init__(self, message: str = "", errors: list[dict[str, str]] | None = None):
        super().__init__(message)
        # One problem per JSON path ({path, message}), when the refusal names several places.
        self.errors = errors


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


class InstanceGone(ServiceError):
    """A session refers to an instance its owner deleted."""

    code = "instance-gone"


class ObservationNotFound(ServiceError):
    """A correction names a test the session has no observation of."""

    code = "observation-not-found"


class AmbiguousObservation(ServiceError):
    """A correction of a repeated test that does not say which answer it means."""

    code = "ambiguous-observation"


class PreconditionRequired(ServiceError):
    """A write that is not safe to repeat came without ``If-Match`` (RFC 6585 §3)."""

    code = "precondition-required"


class UnknownTests(ServiceError):
    """Test ids in a request field that the instance does not have; ``errors`` gives each path."""

    code = "unknown-test"


class LimitExceeded(ServiceError):
    """Over a service limit; the message names the setting that raises it."""

    code = "limit-exceeded"

    def __init__(self, setting: str, limit: int, what: str, errors: list[dict[str, str]] | None = None):
        super().__init__(f"{what}; the limit ({setting}) is {limit}", errors)
        self.setting = setting
        self.limit = limit
