"""The one way to read a request body: :func:`parse_body` checks the media type, reads the body
(never past ``MAX_BODY_BYTES``), inflates ``Content-Encoding: gzip`` (service/api/content_encoding.py),
decodes strictly (orjson refuses NaN, Infinity and invalid UTF-8), refuses repeated keys
(service/api/duplicate_keys.py) and validates against the wire model, raising the errors
service/api/problems.py maps to 413, 415, 400 and 422. An instance may also come as a binary
body (service/api/multipart.py): its JSON part is read as a JSON body is, its array part becomes
the numpy array of its field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from flask import Request, request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.wsgi import get_content_length

from schemas.instance import json_path
from service.settings import Settings

from .content_encoding import inflated
from .context import services
from .duplicate_keys import refuse_duplicate_keys
from .errors import MalformedJson, RequestValidationFailed, UnreadableBody, UnsupportedMediaType
from .limits import check_depth, check_parse_cost, check_request, hold_big_request, holding_big_request
from .isolation import parsed_in_isolation
from .multipart import instance_parts
from .responses import JSON_MEDIA_TYPE

try:  # what gunicorn's body reader raises on bad chunked framing
    from gunicorn.http.errors import ParseException as _GunicornParseError

    _SERVER_PARSE_ERRORS: tuple[type[Exception], ...] = (_GunicornParseError,)
except ImportError:  # another WSGI server
    _SERVER_PARSE_ERRORS = ()

Model = TypeVar("Model", bound=BaseModel)
MULTIPART_MEDIA_TYPE = "multipart/form-data"


def _is_json(mimetype: str) -> bool:
    return mimetype == JSON_MEDIA_TYPE or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def validation_errors(error: ValidationError) -> list[dict[str, str]]:
    return [{"path": json_path(tuple(e["loc"])), "message": e["msg"]} for e in error.errors(include_url=False)]


def _read_body(served: Request, settings: Settings) -> bytes:
    """The whole body; 413 past MAX_BODY_BYTES whether or not it came with a length; inflated
    when it was sent with ``Content-Encoding: gzip``."""
    limit = settings.max_body_bytes
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
            return inflated(served, raw, settings)
        raw = served.get_data(cache=False)  # a Content-Length over the limit: 413 here, unread
        # A chunked body is cut at the limit silently (werkzeug's LimitedStream): one byte more
        # left in the stream means it was longer.
        if len(raw) >= limit and served.environ["wsgi.input"].read(1):
            raise RequestEntityTooLarge()
    except HTTPException:
        raise
    except (OSError, *_SERVER_PARSE_ERRORS) as error:
        raise UnreadableBody(f"the request body could not be read: {error}") from None
    return inflated(served, raw, settings)


def parse_body(model: type[Model], array_parts: tuple[str, ...] = ()) -> Model:
    """The request body as ``model``. ``array_parts``: the top-level array fields a
    ``multipart/form-data`` body may carry as ``.npy`` parts (none: JSON only). A big request
    (service/api/limits.py) carrying an instance is parsed, validated and compiled by the
    worker's isolated process (service/api/isolation.py), with the same refusals."""
    served = request
    settings = services().settings
    if _is_json(served.mimetype):
        raw = _read_body(served, settings)
        hold_big_request(len(raw), settings)  # one at a time (service/api/limits.py)
        # Before orjson builds a single object. A body big by its bytes is not made bigger by
        # it, and one parsed by the isolated process is checked there: its passes over 80 MB
        # take ~0.2 s holding the GIL.
        cost_checked = not holding_big_request()
        if cost_checked:
            check_parse_cost(raw, settings)  # may make it big
        isolated = parsed_in_isolation(model, raw)
        if isolated is not None:
            return isolated
        if not cost_checked:
            check_parse_cost(raw, settings)
        return validated(loaded(raw, settings), model, settings)
    boundary = served.mimetype_params.get("boundary") if served.mimetype == MULTIPART_MEDIA_TYPE else None
    if not array_parts or not boundary:
        shown = served.mimetype or "none"
        accepted = JSON_MEDIA_TYPE + (f" or {MULTIPART_MEDIA_TYPE} (with a boundary)" if array_parts else "")
        raise UnsupportedMediaType(f"send the body as {accepted} (Content-Type was {shown})")
    raw = _read_body(served, settings)
    hold_big_request(len(raw), settings)
    isolated = parsed_in_isolation(model, raw, boundary, array_parts)
    if isolated is not None:
        return isolated
    data, arrays = from_parts(raw, boundary, array_parts, settings, check_parse_cost)
    return validated(data, model, settings, arrays)


def from_parts(raw: bytes, boundary: str, array_parts: tuple[str, ...], settings: Settings,
               check_cost: Callable[[bytes, Settings], object]) -> tuple[dict, dict]:
    """A binary body's instance part parsed (``check_cost`` on its bytes first) and its arrays."""
    document, arrays = instance_parts(raw, boundary, array_parts)
    check_cost(document, settings)
    data = loaded(document, settings)
    if not isinstance(data, dict):
        raise RequestValidationFailed("the request body has 1 problem(s)", [
            {"path": "instance", "message": "the instance part must be a JSON object"}])
    given_twice = [name for name in arrays if name in data]
    if given_twice:
        raise RequestValidationFailed(f"the request body has {len(given_twice)} problem(s)", [
            {"path": name, "message": "given both in the instance part and as a part of its own"}
            for name in given_twice])
    return data, arrays


def loaded(raw: bytes, settings: Settings) -> Any:
    """``raw`` parsed as JSON, within the depth limit, with no object repeating a key (its
    parse cost checked by the caller, before)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise MalformedJson(f"the body is not valid JSON: {error}") from None
    check_depth(raw, settings.max_json_depth)  # before the wire model walks it (service/api/limits.py)
    refuse_duplicate_keys(raw, data)
    return data


def validated(data: Any, model: type[Model], settings: Settings, arrays: dict | None = None) -> Model:
    """``data`` (with a binary body's ``arrays``) as ``model``, within the request limits."""
    try:
        parsed = model.model_validate({**data, **arrays} if arrays else data)
    except ValidationError as error:
        errors = validation_errors(error)
        raise RequestValidationFailed(f"the request body has {len(errors)} problem(s)", errors) from None
    check_request(parsed, settings)  # the worker-protecting limits, before any array is built
    return parsed
