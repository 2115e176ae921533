"""The one JSON encoder (orjson): every body the API writes goes through :func:`json_response`
(Flask's own ``jsonify`` through the same encoder by :class:`OrjsonProvider`)."""

from __future__ import annotations

from typing import Any

import orjson
from flask import Response
from flask.json.provider import JSONProvider
from pydantic import BaseModel

JSON_MEDIA_TYPE = "application/json"


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
