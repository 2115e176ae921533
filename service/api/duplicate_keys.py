"""No object of a JSON body may repeat a key: orjson, like most parsers, would silently keep the
last value, so a repeated key is refused as 422 naming its path.

Every body pays one count, linear in its bytes with no Python per value: each key is followed by
exactly one ':' and orjson never escapes ':', so when the parsed data written back holds as many
colons as the body (each escaped colon ``\\u003a`` counted as one) no key was dropped. Only a body
that did drop a key is parsed again (the stdlib's C scanner, one hook call per object) to name
the first repeated key; that walk steps over arrays of plain values without visiting them one
by one in Python.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from schemas.instance import json_path

from .errors import RequestValidationFailed


def refuse_duplicate_keys(raw: bytes, data: Any) -> None:
    """``data``: what orjson parsed from ``raw``. 422 naming the first repeated key (in document
    order, outer objects first)."""
    if _colons(raw) == orjson.dumps(data).count(b":"):
        return
    # Numbers are never keys: len (a C call answering a cached small int) spares making a float
    # of each (bench/duplicate_keys.py, rows "repeated key" against "repeated key, floats made").
    repeat = _first_repeat(json.loads(raw, object_pairs_hook=_keep_repeats, parse_float=len, parse_int=len))
    if repeat is not None:
        path, key = repeat
        raise RequestValidationFailed("the request body repeats a key", [
            {"path": json_path(path), "message": f"duplicate key '{key}': which value is meant is ambiguous"}])


def _colons(raw: bytes) -> int:
    """The colons of valid JSON ``raw`` once its escapes are read: literal ones plus ``\\u003a``."""
    colons = raw.count(b":")
    if b"\\u003" not in raw:  # one scan for both spellings, which almost no body has
        return colons
    # A string holding a backslash and the text "u003a" is written "\\u003a": not a colon. With
    # every escaped backslash dropped (left to right, as a parser reads them) each backslash left
    # starts an escape, so the count below is exact.
    escapes = raw.replace(b"\\\\", b"") if b"\\\\" in raw else raw
    return colons + escapes.count(b"\\u003a") + escapes.count(b"\\u003A")


class _Repeated(dict):
    """An object of the body that repeats ``key`` (made only while locating the repetition)."""

    key: str


def _keep_repeats(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    repeated = _Repeated(obj)
    repeated.key = next(key for key, _ in pairs if key in seen or seen.add(key))
    return repeated


_CONTAINERS = (dict, list, _Repeated)


def _first_repeat(document: Any) -> tuple[tuple[str | int, ...], str] | None:
    """The location and key of the first :class:`_Repeated` object in ``document`` (pre-order),
    visiting objects and arrays only: an array of numbers or strings is passed over in C."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), document)]
    while stack:
        loc, value = stack.pop()
        if type(value) is _Repeated:
            return (*loc, value.key), value.key
        if type(value) is dict:
            inner = [((*loc, key), item) for key, item in value.items() if type(item) in _CONTAINERS]
        elif not set(map(type, value)).isdisjoint(_CONTAINERS):
            inner = [((*loc, i), item) for i, item in enumerate(value) if type(item) in _CONTAINERS]
        else:
            continue
        inner.reverse()
        stack.extend(inner)
    return None
