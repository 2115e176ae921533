"""Big instances: the compact array form of ``matrix`` / ``likelihood_matrix``, gzip request
bodies (a bomb is refused before it is inflated), and defaults under which an instance at
MAX_CELLS can be posted. Every form is compared with the per-hypothesis form, compiled by the
path that never sees a columnar array (tests/reference.py builds the instances)."""

from __future__ import annotations

import gzip
import json
import math
import random
import socket
import tracemalloc

import numpy as np
import orjson
import pytest

from api_support import assert_problem
from schemas.arrays import Lifted, encode
from service.api.bulk import LIFT_MIN_BYTES, lift_bulk
from service.app import create_app
from service.settings import Settings
from tests import reference as ref
from tests.builders import compile_wire

DTYPES = {"deterministic": ["uint8", "uint16", "int32"], "likelihood": ["float64", "float32"]}


def columnar(model: ref.Model, dtype: str | None) -> dict:
    """``model`` in the columnar form: nested lists (dtype None) or compact with ``dtype``."""
    tests = [{"id": f"t{t}", "cost": model.costs[t], "outcomes": [f"o{k}" for k in range(model.arity[t])]}
             for t in range(model.n_tests)]
    payload = {"tests": tests, "classes": model.classes, "priors": model.prior,
               "hypothesis_ids": model.hypothesis_ids}
    if model.deterministic:
        cells = model.outcomes
        payload["matrix"] = cells if dtype is None else encode(np.array(cells, dtype=dtype))
    else:
        width = max(model.arity)
        cells = [[cell + [0.0] * (width - len(cell)) for cell in row] for row in model.likelihood]
        payload["likelihood_matrix"] = cells if dtype is None else encode(np.array(cells, dtype=dtype))
    return payload


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
def test_every_array_form_compiles_to_the_per_hypothesis_instance(kind):
    rng = random.Random(11)
    for _ in range(20):
        model = ref.random_model(rng, kind)
        if kind == "likelihood":  # float32 cells: the per-hypothesis reference gets the same numbers
            model.likelihood = [[np.asarray(c, dtype=np.float32).astype(float).tolist() for c in row]
                                for row in model.likelihood]
        want = compile_wire(ref.to_payload(model))
        for dtype in [None, *DTYPES[kind]]:
            got = compile_wire(columnar(model, dtype))
            if kind == "deterministic":
                assert got.content_hash == want.content_hash, dtype
                assert np.array_equal(got.outcomes, want.outcomes) and got.outcomes.dtype == want.outcomes.dtype
            else:  # rows are renormalised: equal within rounding, whatever the float width
                np.testing.assert_allclose(got.likelihood, want.likelihood, rtol=1e-12, atol=1e-15)
            assert got.hypothesis_ids == want.hypothesis_ids and np.array_equal(got.prior, want.prior)


def test_the_compact_form_keeps_a_small_dtype_small():
    matrix = np.random.default_rng(0).integers(0, 2, size=(300, 40), dtype=np.uint8)
    payload = {"tests": [{"id": f"t{j}"} for j in range(40)], "classes": [f"c{i % 7}" for i in range(300)],
               "matrix": encode(matrix)}
    compiled = compile_wire(payload)
    assert compiled.outcomes.dtype == np.uint8
    assert compiled.content_hash == compile_wire({**payload, "matrix": matrix.tolist()}).content_hash


# --- refusals: a clear 422 naming the place, nothing stored --------------------------------------

TESTS = [{"id": "a", "outcomes": ["no", "yes"]}, {"id": "b"}]
GOOD = np.array([[0, 1], [1, 0], [1, 1]], dtype=np.uint8)


def _matrix(**edits) -> dict:
    return {"tests": TESTS, "classes": ["x", "y", "y"], "matrix": {**encode(GOOD), **edits}}


def _likelihood(cells: np.ndarray, tests=TESTS) -> dict:
    return {"tests": tests, "classes": ["x", "y"], "likelihood_matrix": encode(cells)}


NOISY = np.array([[[0.2, 0.8], [0.5, 0.5]], [[0.9, 0.1], [1.0, 0.0]]])
REFUSED = {
    "shape of three lengths for a matrix": (_matrix(shape=[3, 2, 1]), "matrix.shape"),
    "a column per test": (_matrix(shape=[2, 3]), "matrix.shape"),
    "zero rows": (_matrix(shape=[0, 2], data=""), "matrix.shape"),
    "data too short for the shape": (_matrix(data=encode(GOOD[:2])["data"]), "matrix.data"),
    "not base64": (_matrix(data="!!!!" + encode(GOOD)["data"][4:]), "matrix.data"),
    "float outcome indices": (_matrix(dtype="float32", data=encode(GOOD.astype(np.float32))["data"]),
                              "matrix.dtype"),
    "an index past the test's outcomes": (
        {**_matrix(), "matrix": encode(np.array([[0, 1], [2, 0], [1, 1]], dtype=np.uint8))}, "matrix[1][0]"),
    "a negative index": ({**_matrix(), "matrix": encode(np.array([[0, 1], [1, 0], [1, -1]], dtype=np.int32))},
                         "matrix[2][1]"),
    "unknown dtype": (_matrix(dtype="int64"), "matrix.dtype"),
    "unknown encoding": (_matrix(encoding="hex"), "matrix.encoding"),
    "an extra field": (_matrix(order="F"), "matrix.order"),
    "a row not summing to 1": (_likelihood(np.where(NOISY == 0.8, 0.7, NOISY)), "likelihood_matrix[0][0]"),
    "NaN": (_likelihood(np.where(NOISY == 0.9, np.nan, NOISY)), "likelihood_matrix[1][0][0]"),
    "infinity": (_likelihood(np.where(NOISY == 0.1, np.inf, NOISY)), "likelihood_matrix[1][0][1]"),
    "a negative probability": (_likelihood(np.where(NOISY == 0.2, -0.2, NOISY)), "likelihood_matrix[0][0][0]"),
    "mass on an outcome the test lacks": (
        _likelihood(NOISY, tests=[{"id": "a", "outcomes": ["only"]}, {"id": "b"}]), "likelihood_matrix[0][0]"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_malformed_compact_arrays_are_422_at_their_path_and_store_nothing(case):
    payload, path = REFUSED[case]
    app = create_app({"redis_url": None})
    client = app.test_client()
    response = client.post("/v1/instances", json=payload)
    problem = assert_problem(response, 422, "validation-error")
    assert path in [e["path"] for e in problem["errors"]], problem["errors"]
    store = app.extensions["edgecut"].store
    assert not store._instances  # nothing stored


# --- gzip bodies ---------------------------------------------------------------------------------


def test_a_gzip_body_is_the_same_request():
    client = create_app({"redis_url": None}).test_client()
    payload = _matrix()
    plain = client.post("/v1/instances", json=payload)
    zipped = client.post("/v1/instances", data=gzip.compress(orjson.dumps(payload)),
                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert plain.status_code == 201 and zipped.status_code == 200  # the same content, already there
    assert zipped.get_json()["instance_id"] == plain.get_json()["instance_id"]


def test_a_gzip_bomb_is_413_before_it_is_inflated():
    limit = 64 * 1024
    client = create_app({"redis_url": None, "max_body_bytes": limit}).test_client()
    bomb = gzip.compress(b"[" + b" " * 50_000_000 + b"]", compresslevel=9)  # 50 MB in ~50 kB
    assert len(bomb) < limit
    tracemalloc.start()
    try:
        response = client.post("/v1/instances", data=bomb,
                               headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    problem = assert_problem(response, 413, "body-too-large")
    assert "MAX_BODY_BYTES" in problem["detail"]
    assert peak < 20 * limit, f"{peak} bytes allocated for a {limit}-byte limit"


@pytest.mark.parametrize("body, headers, status, code", [
    (b"\x1f\x8b not gzip at all", {"Content-Encoding": "gzip"}, 400, "bad-request"),
    (gzip.compress(b"{}")[:-6], {"Content-Encoding": "gzip"}, 400, "bad-request"),  # truncated
    (gzip.compress(b"{}") + b"junk", {"Content-Encoding": "gzip"}, 400, "bad-request"),
    (b"{}", {"Content-Encoding": "br"}, 415, "unsupported-media-type"),
])
def test_bad_gzip_bodies_are_refused_clearly(body, headers, status, code):
    client = create_app({"redis_url": None}).test_client()
    response = client.post("/v1/instances", data=body, headers={"Content-Type": "application/json", **headers})
    assert_problem(response, status, code)


# --- coherent defaults ---------------------------------------------------------------------------


def test_an_instance_at_max_cells_fits_the_default_body_limit_in_the_compact_form():
    defaults = Settings(_env_file=None)
    n_tests = 1_000
    n = defaults.max_cells // n_tests
    # Everything but the array, at full size: ids and class labels of realistic length.
    skeleton = {"tests": [{"id": f"question-{j:05d}"} for j in range(n_tests)],
                "classes": [f"segment-{i % 500:04d}" for i in range(n)],
                "hypothesis_ids": [f"respondent-type-{i:08d}" for i in range(n)],
                "matrix": {"encoding": "base64", "dtype": "uint8", "shape": [n, n_tests], "data": ""}}
    size = len(orjson.dumps(skeleton)) + 4 * math.ceil(n * n_tests / 3)
    assert size <= defaults.max_body_bytes, (size, defaults.max_body_bytes)


# --- long strings lifted out of the body before parsing (service/api/bulk.py) ---------------------

LONG = LIFT_MIN_BYTES + 5


def restored(lifted: tuple[bytes, Lifted]) -> object:
    """The lifted body parsed, each placeholder replaced by the value it stands for."""
    body, values = lifted

    def back(value):
        if isinstance(value, dict):
            return {back(key): back(item) for key, item in value.items()}
        if isinstance(value, list):
            if len(value) == 1 and isinstance(value[0], list) and len(value[0]) == 1 and isinstance(value[0][0], str):
                matrix = values.take(value[0][0], np.ndarray)
                if matrix is not None:
                    return matrix.tolist()
            return [back(item) for item in value]
        if isinstance(value, str):
            taken = values.take(value, memoryview)
            return value if taken is None else str(taken, "ascii")
        return value

    return back(orjson.loads(body))


def tricky_body(rng: random.Random) -> bytes:
    """JSON text with long strings among escapes that a quote count must not be fooled by."""
    def long_string() -> str:
        kind = rng.choice(["base64", "escaped quote", "backslash at the end", "unicode", "control"])
        text = "A" * rng.randint(LONG - 10, 3 * LONG)
        if kind == "escaped quote":
            return orjson.dumps(text[:100] + '"' + text[100:]).decode()
        if kind == "backslash at the end":
            return orjson.dumps(text + "\\").decode()
        if kind == "unicode":
            return orjson.dumps(text + "é").decode()
        if kind == "control":
            return orjson.dumps(text + "\n").decode()
        return f'"{text}"'

    def short_string() -> str:
        return rng.choice(['"a"', '"\\\\"', '"\\""', '"\\\\\\""', '"x\\u003ay"', '""', '"\\\\\\\\"'])

    def long_outside_strings() -> str:  # as quote-free as a long string, but not one
        return rng.choice(["[" + ",".join("7" * rng.randint(LONG // 2, LONG)) + "]",
                           "[" + " " * rng.randint(LONG, 2 * LONG) + "1]", digit_matrix()])

    def digit_matrix() -> str:
        """One-digit rows, or rows that only nearly are."""
        n, m = rng.randint(2, 300), rng.randint(1, 400)
        rows = [[rng.randrange(10) for _ in range(m)] for _ in range(n)]
        flaw = rng.choice([None, None, "ragged", "two digits", "negative", "float", "true", "deeper", "joined"])
        i, j = rng.randrange(n), rng.randrange(m)
        if flaw == "ragged":
            rows[i] = rows[i][:-1] if m > 1 else [1, 2]
        elif flaw in ("two digits", "negative", "float", "true"):
            rows[i][j] = {"two digits": 10, "negative": -1, "float": 0.5, "true": True}[flaw]
        elif flaw == "deeper":
            rows[i][j] = [1]
        text = json.dumps(rows, separators=(rng.choice([",", ", ", ",\n  "]), ": "))
        return text.replace("],", "]7", 1) if flaw == "joined" else text  # rows not joined by a comma

    def value(depth: int) -> str:
        pick = rng.random()
        if depth > 2 or pick < 0.3:
            return rng.choice([long_string(), long_outside_strings(), short_string(), "1", "true", "null"])
        if pick < 0.6:
            return "[" + ", ".join(value(depth + 1) for _ in range(rng.randint(0, 4))) + "]"
        if rng.random() < 0.3:
            return "{" + f'"matrix": {digit_matrix()}' + rng.choice(["}", ', "k": 1}', "  }"])
        keys = [rng.choice([short_string(), long_string(), '"k"', '"data"']) for _ in range(rng.randint(0, 4))]
        return "{" + ",".join(f"{k}: {value(depth + 1)}" for k in keys) + "}"

    return value(0).encode()


def test_lifting_long_strings_keeps_the_value_of_the_body():
    rng = random.Random(5)
    lifted_some = 0
    for _ in range(300):
        raw = tricky_body(rng)
        lifted = lift_bulk(raw)
        if lifted is None:
            continue
        try:
            expected = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a flawed matrix: the next test's business
        lifted_some += 1
        assert restored(lifted) == expected
    assert lifted_some > 50


def test_a_body_is_valid_json_after_lifting_exactly_when_it_was_before():
    rng = random.Random(6)
    lifted_some = 0
    for _ in range(300):
        raw = bytearray(tricky_body(rng))
        for _ in range(rng.randint(1, 3)):  # a stray quote, backslash, control byte or brace
            raw.insert(rng.randrange(len(raw) + 1), rng.choice(b'"\\\x01{,'))
        lifted = lift_bulk(bytes(raw))
        if lifted is None:
            continue
        lifted_some += 1

        def valid(text: bytes) -> bool:
            try:
                orjson.loads(text)
            except orjson.JSONDecodeError:
                return False
            return True

        assert valid(lifted[0]) == valid(bytes(raw)), bytes(raw)
    assert lifted_some > 25


def test_only_printable_ascii_strings_without_escapes_are_lifted():
    text = "A" * LONG
    for raw, lifted in [(f'{{"data": "{text}"}}', 1), (f'["{text}", "{text}"]', 2),
                        (orjson.dumps({"data": text + '"'}).decode(), 0), (orjson.dumps({"data": text + "é"}).decode(), 0),
                        (orjson.dumps({"data": text + "\t"}).decode(), 0), (f'{{"data": "{text[:1000]}"}}', 0),
                        # a placeholder the client wrote itself: nothing is lifted
                        (f'{{"data": "{text}", "note": "\\u0000lifted-0"}}', 0)]:
        result = lift_bulk(raw.encode())
        assert (0 if result is None else len(result[0].split(b"\\u0000lifted-")) - 1) == lifted, raw[-40:]


@pytest.mark.parametrize("separator", [",", ", ", ",\n    "])
@pytest.mark.parametrize("flaw", [None, "ragged", "two digits", "negative", "float", "true", "deeper",
                                  "not a digit", "rows joined by a digit", "cells joined by a digit",
                                  "a row not opened", "a third level", "short"])
def test_only_rectangular_one_digit_rows_are_lifted_as_a_matrix(flaw, separator):
    rows = np.random.default_rng(9).integers(0, 10, size=(300, 200)).tolist()
    if flaw == "ragged":
        rows[7] = rows[7][:-1]
    elif flaw in ("two digits", "negative", "float", "true", "deeper"):
        rows[7][3] = {"two digits": 10, "negative": -1, "float": 0.5, "true": True, "deeper": [1]}[flaw]
    elif flaw == "short":
        rows = rows[:10]
    text = json.dumps(rows, separators=(separator, ": "))
    if flaw == "not a digit":
        text = text[:30] + "x" + text[31:] if text[30].isdigit() else text[:31] + "x" + text[32:]
    elif flaw == "rows joined by a digit":
        text = text.replace("],", "]7", 1)
    elif flaw == "cells joined by a digit":
        text = text[:3] + text[3:].replace(",", "7", 1)
    elif flaw == "a row not opened":
        second = text.index("[", text.index("]"))
        text = text[:second] + "7" + text[second + 1:]
    elif flaw == "a third level":
        text = "[" + text + "]"
    raw = ('{"matrix": ' + text + ', "k": 1}').encode()
    last = ('{"k": 1, "matrix": ' + text + '}').encode()  # nothing after it: no quote ends the stretch
    assert (lift_bulk(last) is None) == (flaw is not None)
    lifted = lift_bulk(raw)
    if flaw is None:
        body, values = lifted
        assert body == b'{"matrix":[["\\u0000lifted-0"]],"k": 1}'
        matrix = values.take("\x00lifted-0", np.ndarray)
        assert matrix.dtype == np.uint8 and matrix.tolist() == rows
    else:
        assert lifted is None


def big_compact(n: int = 400, n_tests: int = 300) -> tuple[dict, np.ndarray]:
    matrix = np.random.default_rng(n).integers(0, 3, size=(n, n_tests), dtype=np.uint8)
    return ({"tests": [{"id": f"t{j}", "outcomes": ["a", "b", "c"]} for j in range(n_tests)],
             "classes": [f"c{i % 9}" for i in range(n)], "matrix": encode(matrix)}, matrix)


def test_a_lifted_compact_array_is_the_same_instance_as_its_lists():
    payload, matrix = big_compact()
    assert lift_bulk(orjson.dumps(payload)) is not None  # the path under test
    client = create_app({"redis_url": None}).test_client()
    compact = client.post("/v1/instances", data=orjson.dumps(payload), content_type="application/json")
    lists = client.post("/v1/instances", json={**payload, "matrix": matrix.tolist()})
    assert compact.status_code == 201 and lists.status_code == 200
    assert compact.get_json() == lists.get_json()


@pytest.mark.parametrize("case", ["long label", "long key", "repeated key", "control character",
                                  "wrong length", "inline placeholder"])
def test_a_body_the_lifted_strings_do_not_explain_is_judged_whole(case):
    payload, _ = big_compact()
    data = payload["matrix"]["data"]
    raw = orjson.dumps(payload)
    expected = {"long label": (422, "classes[0]"), "long key": (422, "x" * LONG),
                "repeated key": (422, "matrix.dtype"), "control character": (400, None),
                "wrong length": (422, "matrix.data"), "inline placeholder": (201, None)}[case]
    if case == "long label":
        raw = orjson.dumps({**payload, "classes": ["x" * LONG, *payload["classes"][1:]]})
    elif case == "long key":
        raw = orjson.dumps({**payload, "x" * LONG: 1})
    elif case == "repeated key":
        raw = raw.replace(b'"dtype":"uint8"', b'"dtype":"uint8","dtype":"uint16"')
    elif case == "control character":
        raw = raw.replace(data[:10].encode(), data[:5].encode() + b"\x01" + data[6:10].encode(), 1)
    elif case == "wrong length":
        raw = raw.replace(data.encode(), data[:-4].encode())
    else:  # the placeholder's text as a label: nothing is lifted, and it is only a label
        raw = orjson.dumps({**payload, "classes": ["\x00lifted-0", *payload["classes"][1:]]})
    app = create_app({"redis_url": None})
    response = app.test_client().post("/v1/instances", data=raw, content_type="application/json")
    status, path = expected
    if status == 201:
        assert response.status_code == 201
        return
    problem = assert_problem(response, status, "validation-error" if status == 422 else "malformed-json")
    if path is not None:
        assert any(e["path"].startswith(path) or path.startswith(e["path"]) for e in problem["errors"]), problem
    assert not app.extensions["edgecut"].store._instances


# --- the worker's unreader: a buffered body read in steps without copying the rest each time ------


def test_the_held_unreader_reads_what_a_byte_stream_would():
    """Random reads, push-backs and takes through HeldUnreader give the bytes, in order, of the
    stream they describe: what was held, then the socket."""
    from service.worker import HeldUnreader
    from gunicorn.http.unreader import SocketUnreader

    rng = random.Random(8)
    for _ in range(200):
        ours, theirs = socket.socketpair()
        sent = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3000)))
        theirs.sendall(sent)
        theirs.close()
        source = SocketUnreader(ours)
        early = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        source.unread(early)  # read ahead by gunicorn before the worker took the connection
        unreader = HeldUnreader(source)
        buffered = bytearray(rng.randbytes(rng.randrange(0, 5000)))
        unreader.unread(buffered)
        stream, got = bytes(buffered) + early + sent, b""
        for _ in range(30):
            action = rng.random()
            if action < 0.5:
                size = rng.choice([None, -1, 0, 1, rng.randrange(1, 2000)])
                data = unreader.read(size, read_ahead=rng.choice([None, 4096]))
                if size is not None and size > 0:
                    assert len(data) == min(size, len(stream) - len(got))
                got += data
            elif action < 0.8 and got:
                back = rng.randrange(1, len(got) + 1)
                unreader.unread(got[-back:])
                got = got[:-back]
            else:
                got += unreader.take_buffered()
            assert stream.startswith(got)
        while data := unreader.read(4096):
            got += data
        assert got == stream
        ours.close()


def test_a_body_fed_in_pieces_is_framed_whole_once_it_is_all_there():
    from service.worker import Framing

    rng = random.Random(10)
    for _ in range(50):
        body = rng.randbytes(rng.randrange(0, 5000))
        raw = b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        framing, fed = Framing(max_header_bytes=1000, max_body_bytes=10_000), 0
        while fed < len(raw):
            piece = raw[fed:fed + rng.randrange(1, 700)]
            framing.feed(piece)
            fed += len(piece)
            assert framing.verdict() == (Framing.COMPLETE if fed == len(raw) else Framing.INCOMPLETE)
            assert framing.size == fed and b"".join(framing.pieces()) == raw[:fed]
