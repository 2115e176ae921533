"""Big instances: the compact array form of ``matrix`` / ``likelihood_matrix``, gzip request
bodies (a bomb is refused before it is inflated), and defaults under which an instance at
MAX_CELLS can be posted. Every form is compared with the per-hypothesis form, compiled by the
path that never sees a columnar array (tests/reference.py builds the instances)."""

from __future__ import annotations

import gzip
import math
import random
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
