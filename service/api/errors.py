"""Errors the API layer raises (a request's body, parameters and headers; a missing renderer):
each a :class:`~service.errors.ServiceError` with a stable ``code`` that service/api/problems.py
maps to its status and problem+json body."""

from __future__ import annotations

from service.errors import ServiceError


class UnsupportedMediaType(ServiceError):
    code = "unsupported-media-type"


class MalformedJson(ServiceError):
    code = "malformed-json"


class UnreadableBody(ServiceError):
    """The server could not read the body as framed (a malformed chunk, a client gone quiet)."""

    code = "bad-request"


class BodyTooLarge(ServiceError):
    code = "body-too-large"


class RequestValidationFailed(ServiceError):
    code = "validation-error"


class InvalidParameter(ServiceError):
    code = "invalid-parameter"


class InvalidHeaderValue(ServiceError):
    code = "invalid-header"


class GraphvizUnavailable(ServiceError):
    code = "graphviz-missing"
