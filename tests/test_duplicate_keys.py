"""A JSON body whose objects repeat a key is refused (422 naming the key's path); every other
body parses exactly as orjson parses it. The check is linear in the body whatever it holds: the
second parse that names the key runs only for a body that does repeat one, and its walk does not
visit the values of an array of numbers one by one."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api_support import assert_problem
from schemas.instance import json_path
from service.api.duplicate_keys import refuse_duplicate_keys
from service.api.errors import RequestValidationFailed
from service.app import create_app


def post(raw: bytes):
    client = create_app({"redis_url": None}).test_client()
    return client.post("/v1/select", data=raw, content_type="application/json")


def refused_path(raw: bytes) -> str:
    problem = assert_problem(post(raw), 422, "validation-error")
    assert problem["detail"] == "the request body repeats a key"
    return problem["errors"][0]["path"]


# --- the reference: from the definition, on the stdlib's pairs ----------------------------------


def first_repeat_by_definition(raw: bytes) -> str | None:
    """Every object kept as its list of (key, value) pairs; the first object in document order
    (outer before inner) whose keys are not all distinct names its first key seen twice."""

    class Pairs(list):
        pass

    def walk(value, loc):
        if isinstance(value, Pairs):
            keys = [key for key, _ in value]
            for i, key in enumerate(keys):
                if key in keys[:i]:
                    return json_path((*loc, key))
            for key, item in value:
                found = walk(item, (*loc, key))
                if found:
                    return found
        elif isinstance(value, list):
            for i, item in enumerate(value):
                found = walk(item, (*loc, i))
                if found:
                    return found
        return None

    return walk(json.loads(raw, object_pairs_hook=Pairs), ())


def checked(raw: bytes) -> str | None:
    try:
        refuse_duplicate_keys(raw, orjson.loads(raw))
    except RequestValidationFailed as refused:
        return refused.errors[0]["path"]
    return None


# --- where a repeated key is found ------------------------------------------------------------


@pytest.mark.parametrize("raw, path", [
    (b'{"a": 1, "a": 1}', "a"),
    (b'{"x": {"y": {"z": [0, {"k": 1, "j": 2, "k": 3}]}}}', "x.y.z[1].k"),
    (b'{"items": [{"a": 1}, {"a": 2}, {"b": 1, "b": 2}]}', "items[2].b"),
    (b'[[1, 2], [{"deep": [[{"q": 0, "q": 0}]]}]]', "[1][0].deep[0][0].q"),
    (b'{"\\u0061": 1, "a": 2}', "a"),  # an escaped key is the same key
    (b'{"e\\u003acg": 1, "e:cg": 2}', "e:cg"),
    (b'{"outer": {"a": 1, "a": 2}, "outer": 3}', "outer"),  # the outer object first
    (b'{"first": {"a": 1, "a": 2}, "then": {"b": 1, "b": 2}}', "first.a"),  # then document order
])
def test_a_repeated_key_is_refused_at_its_path(raw, path):
    assert first_repeat_by_definition(raw) == path  # the reference agrees with the table
    assert refused_path(raw) == path


@pytest.mark.parametrize("raw", [
    b'{"a": [{"k": 1}, {"k": 2}], "b": {"k": 3}}',  # the same key in different objects
    b'{"a": "\\\\u003a", "b": ":\\u003a"}',
    b'{"s": "\\\\\\u003a\\\\\\\\u003A", "t": ["\\\\u003a", "\\\\u003A"]}',
    b'{"\\\\u003a": 1, "\\u003a": 2, ":\\\\": 3}',  # backslash-u003a, then a colon: two keys
    b'{}',
    b'[1, 2.5, "x:y"]',
])
def test_bodies_without_a_repeated_key_pass_and_parse_as_orjson_parses_them(raw, monkeypatch):
    assert first_repeat_by_definition(raw) is None
    assert checked(raw) is None
    client = create_app({"redis_url": None}).test_client()
    response = client.post("/v1/select", data=raw, content_type="application/json")
    assert response.status_code == 422  # not a selection request, refused by the wire model
    assert all("duplicate key" not in e["message"] for e in response.get_json().get("errors", []))


# --- a linear check: the second parse only for a repeat, no walk over every value -------------


def second_parses(monkeypatch) -> list[bytes]:
    calls: list[bytes] = []
    real = json.loads

    def counting(raw, **kwargs):
        if "object_pairs_hook" in kwargs:
            calls.append(raw)
        return real(raw, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    return calls


def test_a_valid_body_holding_backslash_u003a_text_is_parsed_once(monkeypatch):
    calls = second_parses(monkeypatch)
    text = "C:\\u003a\\\\u003A path"  # backslashes and the text u003a, no escaped colon
    raw = orjson.dumps({"instance": {"labels": [text] * 1000, "a:b": 1}})
    assert b"\\\\u003a" in raw
    post(raw)
    assert calls == []
    assert refused_path(raw.replace(b'"a:b":1', b'"a:b":1,"a\\u003ab":2')) == "instance.a:b"
    assert len(calls) == 1  # a repeat is what the second parse is for


def python_calls_while_posting(raw: bytes) -> int:
    client = create_app({"redis_url": None}).test_client()
    client.post("/v1/select", data=b"{}", content_type="application/json")  # imports, caches
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        response = client.post("/v1/select", data=raw, content_type="application/json")
    finally:
        sys.setprofile(None)
    assert response.status_code == 422
    return calls


def test_naming_a_repeated_key_does_not_visit_each_number_of_a_big_array():
    def body(numbers: int) -> bytes:
        return orjson.dumps({"matrix": [[0.25] * numbers, [1, 2]]})[:-1] + b', "a": {"k": 1, "k": 2}}'

    small, big = body(1_000), body(200_000)
    assert refused_path(big) == "a.k"
    # Python calls in the whole request: independent of the array's length.
    assert python_calls_while_posting(big) - python_calls_while_posting(small) < 1_000


# --- against the reference, on bodies with escapes and repeats ------------------------------------

PIECES = [":", "\\", "u003a", "u003A", "a", '"', "\\u003a"]


def written(text: str, draw) -> str:
    """``text`` as a JSON string, each character literal or \\u-escaped (either case) at random."""
    out = []
    for char in text:
        how = draw(st.integers(0, 2))
        if char in '"\\':
            out.append("\\" + char if how < 2 else f"\\u{ord(char):04x}")
        elif how == 0:
            out.append(char)
        else:
            hex_digits = f"{ord(char):04x}"
            out.append("\\u" + (hex_digits if how == 1 else hex_digits.upper()))
    return '"' + "".join(out) + '"'


@st.composite
def documents(draw, depth=0):
    texts = st.lists(st.sampled_from(PIECES), max_size=4).map("".join)
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        return draw(st.one_of(texts.map(lambda t: written(t, draw)), st.integers(-5, 5).map(str)))
    if draw(st.booleans()):
        items = draw(st.lists(documents(depth + 1), max_size=4))
        return "[" + ", ".join(items) + "]"
    keys = draw(st.lists(st.sampled_from(["a", ":", "\\u003a", "a:"]), max_size=4))
    values = [draw(documents(depth + 1)) for _ in keys]
    return "{" + ", ".join(f"{written(k, draw)}: {v}" for k, v in zip(keys, values)) + "}"


@settings(max_examples=400, deadline=None)
@given(documents())
def test_the_check_names_what_the_definition_names(document):
    raw = document.encode()
    assert checked(raw) == first_repeat_by_definition(raw)
