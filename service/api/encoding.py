"""The one JSON encoder (orjson) and the one way to read a JSON request body.

Responses: :func:`json_response` for every body the API writes (Flask's own ``jsonify`` is
routed through the same encoder by :class:`OrjsonProvider`). Requests: :func:`parse_body`
checks the media type, inflates a ``Content-Encoding: gzip`` body (never past
``MAX_BODY_BYTES``), decodes strictly (orjson refuses NaN, Infinity and invalid UTF-8) and
validates against the wire model, raising the errors service/api/problems.py maps to 413, 415,
400 and 422. An instance may also come as a binary body (service/api/multipart.py): its JSON
part is read as a JSON body is, its array part becomes the numpy array of its field.
"""

from __future__ import annotations

import zlib
from typing import Any, TypeVar

import orjson
from flask import Request, Response, request
from flask.json.provider import JSONProvider
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.wsgi import get_content_length

from schemas.instance import json_path
from service.errors import ServiceError
from service.settings import Settings

from .context import services
from .duplicate_keys import refuse_duplicate_keys
from .errors import BodyTooLarge, MalformedJson, RequestValidationFailed, UnreadableBody, UnsupportedMediaType
from .limits import check_depth, check_request
from .multipart import instance_parts

try:  # what gunicorn's body reader raises on bad chunked framing
    from gunicorn.http.errors import ParseException as _GunicornParseError

    _SERVER_PARSE_ERRORS: tuple[type[Exception], ...] = (_GunicornParseError,)
except ImportError:  # another WSGI server
    _SERVER_PARSE_ERRORS = ()

Model = TypeVar("Model", bound=BaseModel)
JSON_MEDIA_TYPE = "application/json"
MULTIPART_MEDIA_TYPE = "multipart/form-data"


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_none=False)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(value: Any) -> bytes:
    # OPT_SERIALIZE_NUMPY: a stray numpy scalar is written as a number, not a 500.
    return orjson.dumps(value, default=_default, option=orjson.OPT_SERIALIZE_NUMPY)


def body_of(model: BaseModel) -> dict[str, Any]:
    """The wire form of a response model; optional extras that are absent (``candidates``,
    ``errors``, the decision fields of a class instance, a decision's ``expected_loss`` without
    losses) are left out rather than written as null (history entries leave out their own:
    schemas/api.py ``HistoryEntry``)."""
    data = model.model_dump()
    for optional in ("candidates", "errors", "decision", "decision_posterior", "decisions"):
        if optional in data and data[optional] is None:
            del data[optional]
    if isinstance(data.get("decision"), dict) and data["decision"].get("expected_loss") is None:
        del data["decision"]["expected_loss"]
    return data


def json_response(body: BaseModel | dict[str, Any] | bytes, status: int = 200, headers: dict[str, str] | None = None,
                  media_type: str = JSON_MEDIA_TYPE) -> Response:
    """``body``: a wire model, plain data, or JSON this encoder already wrote (a session's step)."""
    if not isinstance(body, bytes):
        body = dumps(body_of(body) if isinstance(body, BaseModel) else body)
    return Response(body, status=status, headers=headers, content_type=media_type)


class OrjsonProvider(JSONProvider):
    def dumps(self, obj: Any, **kwargs: Any) -> str:
        return dumps(obj).decode()

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return orjson.loads(s)


def _is_json(mimetype: str) -> bool:
    return mimetype == JSON_MEDIA_TYPE or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def validation_errors(error: ValidationError) -> list[dict[str, str]]:
    return [{"path": json_path(tuple(e["loc"])), "message": e["msg"]} for e in error.errors(include_url=False)]


def _read_body(served: Request, limit: int) -> bytes:
    """The whole body; 413 past ``limit`` (MAX_BODY_BYTES) whether or not it came with a length;
    inflated when it was sent with ``Content-Encoding: gzip``."""
    try:
        # werkzeug's rules (none with Transfer-Encoding: chunked), from the environ: the
        # request's own property builds a headers view first.
        length = get_content_length(served.environ)
        if length is not None and length <= limit:
            # One read of the announced length: werkzeug's get_data reads 64 KiB at a time, and
            # gunicorn's body reader copies what it has buffered on every read (quadratic in
            # the body: +0.25 s on a 13 MB instance).
            raw = served.environ["wsgi.input"].read(length)
            if len(raw) < length:
                raise UnreadableBody(f"the request body ended after {len(raw)} of {length} bytes")
            return _inflated(served, raw, limit)
        raw = served.get_data(cache=False)  # a Content-Length over the limit: 413 here, unread
        # A chunked body is cut at the limit silently (werkzeug's LimitedStream): one byte more
        # left in the stream means it was longer.
        if len(raw) >= limit and served.environ["wsgi.input"].read(1):
            raise RequestEntityTooLarge()
    except HTTPException:
        raise
    except (OSError, *_SERVER_PARSE_ERRORS) as error:
        raise UnreadableBody(f"the request body could not be read: {error}") from None
    return _inflated(served, raw, limit)


def parse_body(model: type[Model], array_parts: tuple[str, ...] = ()) -> Model:
    """The request body as ``model``. ``array_parts``: the top-level array fields a
    ``multipart/form-data`` body may carry as ``.npy`` parts (none: JSON only)."""
    served = request._get_current_object()  # through the proxies once each
    settings = services().settings
    # The exact common value spares werkzeug's parse of the header (parameters, case).
    if served.environ.get("CONTENT_TYPE") == JSON_MEDIA_TYPE or _is_json(served.mimetype):
        return _validated(_loaded(_read_body(served, settings.max_body_bytes), settings), model, settings)
    boundary = served.mimetype_params.get("boundary") if served.mimetype == MULTIPART_MEDIA_TYPE else None
    if not array_parts or not boundary:
        shown = served.mimetype or "none"
        accepted = JSON_MEDIA_TYPE + (f" or {MULTIPART_MEDIA_TYPE} (with a boundary)" if array_parts else "")
        raise UnsupportedMediaType(f"send the body as {accepted} (Content-Type was {shown})")
    document, arrays = instance_parts(_read_body(served, settings.max_body_bytes), boundary, array_parts)
    data = _loaded(document, settings)
    if not isinstance(data, dict):
        raise RequestValidationFailed("the request body has 1 problem(s)", [
            {"path": "instance", "message": "the instance part must be a JSON object"}])
    given_twice = [name for name in arrays if name in data]
    if given_twice:
        raise RequestValidationFailed(f"the request body has {len(given_twice)} problem(s)", [
            {"path": name, "message": "given both in the instance part and as a part of its own"}
            for name in given_twice])
    return _validated({**data, **arrays}, model, settings)


def _loaded(raw: bytes, settings: Settings) -> Any:
    """``raw`` parsed as JSON, within the depth limit, with no object repeating a key."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise MalformedJson(f"the body is not valid JSON: {error}") from None
    check_depth(raw, settings.max_json_depth)  # before the wire model walks it (service/api/limits.py)
    refuse_duplicate_keys(raw, data)
    return data


def _validated(data: Any, model: type[Model], settings: Settings) -> Model:
    try:
        parsed = model.model_validate(data)
    except ValidationError as error:
        errors = validation_errors(error)
        raise RequestValidationFailed(f"the request body has {len(errors)} problem(s)", errors) from None
    check_request(parsed, settings)  # the worker-protecting limits, before any array is built
    return parsed


GZIP_CODINGS = ("gzip", "x-gzip")


def _inflated(served: Request, raw: bytes, limit: int) -> bytes:
    """``raw`` inflated per its ``Content-Encoding`` (gzip or none). The inflated size is held to
    ``limit`` (MAX_BODY_BYTES) *while* inflating, so a gzip bomb is refused after at most that many
    bytes of output, never expanded in full."""
    coding = served.environ.get("HTTP_CONTENT_ENCODING")
    if coding is None:
        return raw
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding not in GZIP_CODINGS:
        raise UnsupportedMediaType(f"Content-Encoding {coding!r} is not supported; send gzip or nothing")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
    try:
        body = inflater.decompress(raw, limit + 1)  # stops after limit + 1 bytes of output
    except zlib.error as error:
        raise UnreadableBody(f"the body is not valid gzip: {error}") from None
    if len(body) > limit:
        raise BodyTooLarge(f"the body inflates to more than the limit of {limit} bytes (MAX_BODY_BYTES)")
    if not inflater.eof or inflater.unused_data:
        raise UnreadableBody("the body is not one complete gzip stream")
    return body


class InvalidParameter(ServiceError):
    code = "invalid-parameter"


class InvalidHeaderValue(ServiceError):
    code = "invalid-header"


def flag(name: str) -> bool:
    """A boolean query parameter (``?explain=true``; also 1/yes and false/0/no); else 400."""
    served = request._get_current_object()  # through the proxy once
    if not served.query_string:
        return False  # without parsing the (absent) query string into request.args
    raw = served.args.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidParameter(f"{name} must be true or false, got {raw!r}")
