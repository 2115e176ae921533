"""Big instances: the compact array form of ``matrix`` / ``likelihood_matrix``, the binary body
(multipart/form-data with a ``.npy`` part), gzip request bodies (a bomb is refused before it is
inflated), and defaults under which an instance at MAX_CELLS can be posted. Every form is compared with the per-hypothesis form, compiled by the
path that never sees a columnar array (tests/reference.py builds the instances)."""

from __future__ import annotations

import gzip
import io
import math
import random
import socket
import tracemalloc

import numpy as np
import orjson
import pytest

from api_support import assert_problem
from schemas.arrays import encode
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


# --- a body is what a plain JSON parse and the wire models say ------------------------------------


def big_compact(n: int = 400, n_tests: int = 300) -> tuple[dict, np.ndarray]:
    matrix = np.random.default_rng(n).integers(0, 3, size=(n, n_tests), dtype=np.uint8)
    return ({"tests": [{"id": f"t{j}", "outcomes": ["a", "b", "c"]} for j in range(n_tests)],
             "classes": [f"c{i % 9}" for i in range(n)], "matrix": encode(matrix)}, matrix)


def test_a_string_that_spells_a_placeholder_is_only_that_string():
    """A ≥ 64 KiB valid base64 string as a class label and, as ``matrix.data``, an escaped
    spelling of ``"\x00lifted-0"``: as JSON, a label over 200 characters and data that is not
    base64 — refused, nothing stored."""
    payload, _ = big_compact()
    data = payload["matrix"]["data"]
    assert len(data) >= 1 << 16
    raw = orjson.dumps({**payload, "classes": [data, *payload["classes"][1:]],
                        "matrix": {**payload["matrix"], "data": "X"}})
    raw = raw.replace(b'"data":"X"', rb'"data":"\u0000\u006cifted-0"')
    assert orjson.loads(raw)["matrix"]["data"] == "\x00lifted-0"
    app = create_app({"redis_url": None})
    response = app.test_client().post("/v1/instances", data=raw, content_type="application/json")
    problem = assert_problem(response, 422, "validation-error")
    assert "classes[0]" in [e["path"] for e in problem["errors"]]
    assert not app.extensions["edgecut"].store._instances


@pytest.mark.parametrize("case", ["long label", "long key", "repeated key", "control character",
                                  "wrong length", "placeholder-like label"])
def test_a_big_compact_body_is_judged_as_json(case):
    payload, _ = big_compact()
    data = payload["matrix"]["data"]
    raw = orjson.dumps(payload)
    long = "x" * (1 << 16)
    expected = {"long label": (422, "classes[0]"), "long key": (422, long),
                "repeated key": (422, "matrix.dtype"), "control character": (400, None),
                "wrong length": (422, "matrix.data"), "placeholder-like label": (201, None)}[case]
    if case == "long label":
        raw = orjson.dumps({**payload, "classes": [long, *payload["classes"][1:]]})
    elif case == "long key":
        raw = orjson.dumps({**payload, long: 1})
    elif case == "repeated key":
        raw = raw.replace(b'"dtype":"uint8"', b'"dtype":"uint8","dtype":"uint16"')
    elif case == "control character":
        raw = raw.replace(data[:10].encode(), data[:5].encode() + b"\x01" + data[6:10].encode(), 1)
    elif case == "wrong length":
        raw = raw.replace(data.encode(), data[:-4].encode())
    else:
        raw = orjson.dumps({**payload, "classes": ["\x00lifted-0", *payload["classes"][1:]]})
    app = create_app({"redis_url": None})
    response = app.test_client().post("/v1/instances", data=raw, content_type="application/json")
    status, path = expected
    if status == 201:
        assert response.status_code == 201
        stored = app.extensions["edgecut"].store.get_instance(response.get_json()["instance_id"])
        assert "\x00lifted-0" in stored.class_labels
        return
    problem = assert_problem(response, status, "validation-error" if status == 422 else "malformed-json")
    if path is not None:
        assert any(e["path"].startswith(path) or path.startswith(e["path"]) for e in problem["errors"]), problem
    assert not app.extensions["edgecut"].store._instances


# --- the binary body: multipart/form-data, the instance as JSON and its array as .npy -------------


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=array.dtype.hasobject)
    return out.getvalue()


def multipart(parts: dict[str, bytes], boundary: str = "edgecut-test-boundary") -> tuple[bytes, str]:
    body = b"".join(b"--%s\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s\"\r\n"
                    b"Content-Type: application/octet-stream\r\n\r\n%s\r\n"
                    % (boundary.encode(), name.encode(), name.encode(), data) for name, data in parts.items())
    return body + b"--%s--\r\n" % boundary.encode(), f"multipart/form-data; boundary={boundary}"


def post_binary(client, document: dict, arrays: dict[str, np.ndarray | bytes], **headers):
    parts = {"instance": orjson.dumps(document),
             **{name: npy(a) if isinstance(a, np.ndarray) else a for name, a in arrays.items()}}
    body, content_type = multipart(parts)
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.compress(body)
    return client.post("/v1/instances", data=body, headers={"Content-Type": content_type, **headers})


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
def test_every_array_sent_as_npy_is_the_instance_its_lists_are(kind):
    rng = random.Random(12)
    for _ in range(10):
        model = ref.random_model(rng, kind)
        lists = columnar(model, None)
        field = "matrix" if kind == "deterministic" else "likelihood_matrix"
        array = np.array(lists.pop(field))
        app = create_app({"redis_url": None})
        client = app.test_client()
        want = client.post("/v1/instances", json={**lists, field: array.tolist()})
        assert want.status_code == 201
        for dtype in DTYPES[kind]:
            if kind == "likelihood" and dtype == "float32":
                continue  # other numbers than the lists'
            for variant in (array.astype(dtype), np.asfortranarray(array.astype(dtype)),
                            array.astype(np.dtype(dtype).newbyteorder(">"))):
                got = post_binary(client, lists, {field: variant})
                assert got.status_code == 200, got.get_json()  # the same content: already stored
                assert got.get_json() == want.get_json()
        gzipped = post_binary(client, lists, {field: array.astype(DTYPES[kind][0])}, **{"Content-Encoding": "gzip"})
        assert gzipped.get_json() == want.get_json()


def test_a_binary_body_stores_what_the_compact_form_stores():
    payload, matrix = big_compact()
    app = create_app({"redis_url": None})
    client = app.test_client()
    compact = client.post("/v1/instances", json=payload)
    binary = post_binary(client, {k: v for k, v in payload.items() if k != "matrix"}, {"matrix": matrix})
    assert compact.status_code == 201 and binary.status_code == 200
    assert binary.get_json() == compact.get_json()


TINY = {"tests": TESTS, "classes": ["x", "y", "y"]}


BINARY_REFUSED = {
    "not a .npy file": ({"matrix": b"PK\x03\x04 a zip, say"}, TINY, 422, "matrix"),
    "data shorter than its shape": ({"matrix": npy(GOOD)[:-1]}, TINY, 422, "matrix"),
    "data longer than its shape": ({"matrix": npy(GOOD) + b"\x00"}, TINY, 422, "matrix"),
    "a pickled object array": ({"matrix": npy(np.array([[0, 1], [1, 0], [1, 1]], dtype=object))}, TINY, 422,
                               "matrix"),
    "a structured dtype": ({"matrix": npy(np.zeros((3, 2), dtype=[("a", "u1")]))}, TINY, 422, "matrix"),
    "an int64 matrix": ({"matrix": npy(GOOD.astype(np.int64))}, TINY, 422, "matrix.dtype"),
    "float outcome indices": ({"matrix": npy(GOOD.astype(np.float32))}, TINY, 422, "matrix.dtype"),
    "a column per test": ({"matrix": npy(GOOD[:, :1])}, TINY, 422, "matrix.shape"),
    "an index past the test's outcomes": ({"matrix": npy(np.array([[0, 1], [2, 0], [1, 1]], dtype=np.uint8))},
                                          TINY, 422, "matrix[1][0]"),
    "the matrix given twice": ({"matrix": npy(GOOD)}, {**TINY, "matrix": GOOD.tolist()}, 422, "matrix"),
    "a part of no field": ({"matrix": npy(GOOD), "classes": npy(GOOD)}, TINY, 422, "classes"),
    "no instance part": ({"matrix": npy(GOOD)}, None, 422, "instance"),
    "an instance that is not an object": ({"matrix": npy(GOOD)}, [1, 2], 422, "instance"),
    "an instance that is not JSON": ({"matrix": npy(GOOD)}, b"{nope", 400, None),
}


@pytest.mark.parametrize("case", BINARY_REFUSED)
def test_a_malformed_binary_body_is_refused_at_its_part_and_stores_nothing(case):
    arrays, document, status, path = BINARY_REFUSED[case]
    parts = {} if document is None else {
        "instance": document if isinstance(document, bytes) else orjson.dumps(document)}
    body, content_type = multipart({**parts, **arrays})
    app = create_app({"redis_url": None})
    response = app.test_client().post("/v1/instances", data=body, headers={"Content-Type": content_type})
    problem = assert_problem(response, status, "validation-error" if status == 422 else "malformed-json")
    if path is not None:
        assert path in [e["path"] for e in problem["errors"]], problem["errors"]
    assert not app.extensions["edgecut"].store._instances


def test_a_npy_header_promising_a_huge_array_is_refused_before_allocating_it():
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": "<f8", "fortran_order": False,
                                               "shape": (10**6, 10**6)})
    body, content_type = multipart({"instance": orjson.dumps(TINY), "matrix": out.getvalue() + b"\x00" * 64})
    client = create_app({"redis_url": None}).test_client()
    tracemalloc.start()
    try:
        response = client.post("/v1/instances", data=body, headers={"Content-Type": content_type})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_problem(response, 422, "validation-error")
    assert peak < 10 * 1024 * 1024


@pytest.mark.parametrize("body", [b"--edgecut-test-boundary\r\nContent-Disposition: form-data; name=\"instance\""
                                  b"\r\n\r\n{}",  # never closed
                                  b"no boundary anywhere"])
def test_broken_multipart_framing_is_400(body):
    client = create_app({"redis_url": None}).test_client()
    response = client.post("/v1/instances", data=body,
                           headers={"Content-Type": "multipart/form-data; boundary=edgecut-test-boundary"})
    assert_problem(response, 400, "bad-request")


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/select"])
def test_only_an_instance_may_come_as_a_binary_body(path):
    body, content_type = multipart({"instance": orjson.dumps(TINY), "matrix": npy(GOOD)})
    client = create_app({"redis_url": None}).test_client()
    response = client.post(path, data=body, headers={"Content-Type": content_type})
    assert_problem(response, 415, "unsupported-media-type")


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
