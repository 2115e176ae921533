"""What one request may cost a worker: MAX_PARSE_BYTES refuses a JSON body before orjson builds
a single object from it, by an estimate counted on its bytes, and accepts the largest body of
each JSON form within it; the decision instance's compile helpers (rows as integers, warnings
by group) agree with their definitions. The peak memory and CPU of each form's largest body are
measured by ``python3 bench/hostile.py --heavy`` (docs/reliability.md), not here."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math
import re

import numpy as np
import orjson
import pytest

from api_support import assert_problem
from service.api import bodies
from service.api.limits import ARRAY_BYTES, MEMBER_BYTES, OBJECT_BYTES, VALUE_BYTES, parse_cost
from service.app import create_app
from service.engine.compilation import _row_keys, compile_instance
from schemas.arrays import encode
from schemas.instance import Instance

LIMIT = 2 * 1024 * 1024
JSON = "application/json"


# --- the estimate, from its definition -------------------------------------------------------


def counted(value) -> dict[str, int]:
    """Punctuation of ``value`` written as JSON, from the parsed structure: a comma between two
    items of a container, a colon per member, a bracket pair per array or object."""
    counts = {"commas": 0, "members": 0, "arrays": 0, "objects": 0}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            counts["objects"] += 1
            counts["members"] += len(item)
            counts["commas"] += max(len(item) - 1, 0)
            stack.extend(item.values())
        elif isinstance(item, list):
            counts["arrays"] += 1
            counts["commas"] += max(len(item) - 1, 0)
            stack.extend(item)
    return counts


def reference_cost(body: bytes) -> int:
    c = counted(json.loads(body))
    return (VALUE_BYTES * (c["commas"] + 1) + MEMBER_BYTES * c["members"] + ARRAY_BYTES * c["arrays"]
            + OBJECT_BYTES * c["objects"])


@pytest.mark.parametrize("body", [
    b"1", b"[]", b"{}", b'{"a": [1, 2, {"b": null}], "c": {}}', b'[[0, 1], [1, 0], [], [[]]]',
    b' {\n  "tests" : [ {"id": "t0"} ] ,\n "matrix": [[0]] }\n',
])
def test_the_estimate_is_the_weighted_punctuation_of_the_parsed_body(body):
    assert parse_cost(body)[0] == reference_cost(body)


def test_punctuation_inside_strings_only_raises_the_estimate():
    body = json.dumps({"tests": [{"id": "a, b: [c] {d}"}], "classes": ["x,y", "{"]}).encode()
    assert parse_cost(body)[0] > reference_cost(body)


# --- each JSON form at its largest within the limit, and one row more ---------------------------


def per_hypothesis(n: int) -> dict:
    return {"tests": [{"id": "t0", "outcomes": ["0", "1"]}],
            "hypotheses": [{"id": f"h{i}", "class": f"c{i % 7}", "outcomes": {"t0": str(i % 2)}} for i in range(n)]}


def per_hypothesis_likelihoods(n: int) -> dict:
    return {"tests": [{"id": "t0", "outcomes": ["0", "1"]}],
            "hypotheses": [{"id": f"h{i}", "class": f"c{i % 7}", "likelihoods": {"t0": {"0": 0.25, "1": 0.75}}}
                           for i in range(n)]}


def matrix_lists(n: int) -> dict:
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(10)],
            "matrix": [[(i >> j) & 1 for j in range(10)] for i in range(n)], "classes": [f"c{i % 7}" for i in range(n)]}


def likelihood_lists(n: int) -> dict:
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(10)],
            "likelihood_matrix": [[[0.25, 0.75] if (i >> j) & 1 else [0.75, 0.25] for j in range(10)]
                                  for i in range(n)],
            "classes": [f"c{i % 7}" for i in range(n)]}


def decisions(n: int) -> dict:
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(10)],
            "matrix": [[(i >> j) & 1 for j in range(10)] for i in range(n)], "decisions": ["a", "b", "c"],
            "acceptable_matrix": [[int(d == i % 3) for d in range(3)] for i in range(n)]}


FORMS = {"per-hypothesis": per_hypothesis, "per-hypothesis likelihoods": per_hypothesis_likelihoods,
         "nested matrix": matrix_lists, "nested likelihood_matrix": likelihood_lists,
         "nested acceptable_matrix": decisions}


def encoded(document: dict) -> bytes:
    return json.dumps(document).encode()


def largest(build, limit: int) -> int:
    """The most rows whose body the reference estimate keeps within ``limit`` (the estimate is
    affine in the rows of these bodies: found from two, then checked at the answer)."""
    a, b = (reference_cost(encoded(build(n))) for n in (10, 20))
    n = 10 + (limit - a) * 10 // (b - a)
    assert reference_cost(encoded(build(n))) <= limit < reference_cost(encoded(build(n + 1)))
    return n


class CountingOrjson:
    """orjson with the size of every text its ``loads`` was given: a refused body must never
    reach it (the test client reads each answer through it too, hence sizes, not a count)."""

    def __init__(self):
        self.parsed: list[int] = []

    def __getattr__(self, name):
        return getattr(orjson, name)

    def loads(self, raw):
        self.parsed.append(len(raw))
        return orjson.loads(raw)

    def parsed_any_of(self, size: int) -> bool:
        return size in self.parsed


@pytest.fixture
def parser(monkeypatch):
    counting = CountingOrjson()
    monkeypatch.setattr(bodies, "orjson", counting)
    return counting


@pytest.fixture
def limited(app_config):
    return create_app({**app_config, "max_parse_bytes": LIMIT}).test_client()


@pytest.mark.parametrize("form", FORMS)
def test_the_largest_body_of_each_json_form_is_accepted_and_one_row_more_refused_unparsed(form, limited, parser):
    build = FORMS[form]
    n = largest(build, LIMIT)
    accepted = limited.post("/v1/instances", data=encoded(build(n)), content_type=JSON)
    assert accepted.status_code == 201, accepted.get_json()
    body = encoded(build(n + 1))
    refused = limited.post("/v1/instances", data=body, content_type=JSON)
    problem = assert_problem(refused, 413, "limit-exceeded")
    assert "MAX_PARSE_BYTES" in problem["detail"]
    assert "compact base64" in problem["detail"] and ".npy" in problem["detail"]  # the forms for big arrays
    assert not parser.parsed_any_of(len(body))  # refused before orjson parsed it


def test_a_gzip_body_is_estimated_once_inflated(limited, parser):
    body = encoded(per_hypothesis(largest(per_hypothesis, LIMIT) + 1))
    refused = limited.post("/v1/instances", data=gzip.compress(body), content_type=JSON,
                           headers={"Content-Encoding": "gzip"})
    assert "MAX_PARSE_BYTES" in assert_problem(refused, 413, "limit-exceeded")["detail"]
    assert not parser.parsed_any_of(len(body))


def test_the_instance_part_of_a_binary_body_is_estimated_before_it_is_parsed(limited, parser):
    # The array travels as .npy; a classes list long enough to pass the limit stays JSON.
    n = 120_000
    matrix = io.BytesIO()
    np.save(matrix, np.zeros((n, 1), dtype=np.uint8))
    part = encoded({"tests": [{"id": "t0", "outcomes": ["0", "1"]}], "classes": [f"c{i % 7}" for i in range(n)]})
    assert reference_cost(part) > LIMIT
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"instance\"\r\n\r\n").encode() + part + (
        f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"matrix\"; filename=\"m.npy\"\r\n\r\n"
    ).encode() + matrix.getvalue() + f"\r\n--{boundary}--\r\n".encode()
    refused = limited.post("/v1/instances", data=body, content_type=f"multipart/form-data; boundary={boundary}")
    assert "MAX_PARSE_BYTES" in assert_problem(refused, 413, "limit-exceeded")["detail"]
    assert not parser.parsed_any_of(len(part))


def test_under_the_default_the_per_hypothesis_form_is_refused_before_it_is_parsed(parser):
    """The default's own figure: the largest per-hypothesis body (one test) it accepts, and one
    hypothesis more, refused unparsed (it was accepted after 27 s of CPU at 80 MiB)."""
    from service.settings import Settings

    client = create_app({"redis_url": None}).test_client()
    limit = Settings().max_parse_bytes
    n = largest(per_hypothesis, limit)
    body = encoded(per_hypothesis(n + 1))
    refused = client.post("/v1/instances", data=body, content_type=JSON)
    assert "MAX_PARSE_BYTES" in assert_problem(refused, 413, "limit-exceeded")["detail"]
    assert not parser.parsed_any_of(len(body))
    accepted = client.post("/v1/instances", data=encoded(per_hypothesis(n)), content_type=JSON)
    assert accepted.status_code == 201, accepted.get_json()


# --- decision instances: the compile helpers against their definitions -------------------------


def test_rows_as_integers_order_and_group_rows_as_numpy_unique_does():
    rng = np.random.default_rng(7)
    for width in (1, 3, 12, 32):
        rows = rng.random((3000, width)) < 0.3
        rows[::5] = rows[1]
        expected_rows, expected_inverse = np.unique(rows, axis=0, return_inverse=True)
        keys = _row_keys(rows)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        assert (rows[first] == expected_rows).all()
        assert (inverse == expected_inverse.reshape(-1)).all()


def indistinguishable_groups(payload: dict) -> set[frozenset[str]]:
    """From the definition: hypotheses with equal outcome rows that share no acceptable decision."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(payload["matrix"]):
        groups.setdefault(tuple(row), []).append(i)
    acceptable = np.array(payload["acceptable_matrix"], dtype=bool)
    return {frozenset(f"h{i}" for i in members) for members in groups.values()
            if len(members) > 1 and not acceptable[members].all(axis=0).any()}


@pytest.mark.parametrize("seed", range(6))
def test_decision_warnings_name_every_indistinguishable_group(seed):
    rng = np.random.default_rng(seed)
    n, n_tests = 40, 3  # 8 distinct rows of 5 hypotheses each: every member is named
    payload = {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)],
               "matrix": [[((i % 8) >> j) & 1 for j in range(n_tests)] for i in range(n)],
               "decisions": ["a", "b", "c"], "hypothesis_ids": [f"h{i}" for i in range(n)],
               "acceptable_matrix": [[int(d == k) for d in range(3)] for k in rng.integers(0, 3, size=n)]}
    for i in range(0, n, 8):  # the first row's group all accept "a": no warning for it
        payload["acceptable_matrix"][i] = [1, 0, 0]
    compiled = compile_instance(Instance.model_validate(payload))
    named = {frozenset(re.findall(r"'([^']*)' \(", message)) for message in compiled.warnings}
    assert named == indistinguishable_groups(payload) and len(named) == len(compiled.warnings)


# --- MAX_HYPOTHESES: the compiled rows, noisy copies counted, before compilation ---------------


def noisy_copies(widths: list[int], max_flips: int) -> int:
    """From the definition: every way of changing at most ``max_flips`` tests to another outcome."""
    return sum(math.prod(widths[t] - 1 for t in chosen)
               for k in range(max_flips + 1) for chosen in itertools.combinations(range(len(widths)), k))


def compact_rows(n: int, widths=(2, 2, 3), **extra) -> dict:
    matrix = np.array([[(i >> j) % w for j, w in enumerate(widths)] for i in range(n)], dtype=np.uint8)
    return {"tests": [{"id": f"t{j}", "outcomes": [str(k) for k in range(w)]} for j, w in enumerate(widths)],
            "classes": [f"c{i % 5}" for i in range(n)], "matrix": encode(matrix), **extra}


def per_hypothesis_unlisted(n: int, **extra) -> dict:
    # Outcomes not listed: the ones the hypotheses give (three for t0, two for t1).
    return {"tests": [{"id": "t0"}, {"id": "t1"}],
            "hypotheses": [{"id": f"h{i}", "class": f"c{i % 5}", "outcomes": {"t0": str(i % 3), "t1": str(i % 2)}}
                           for i in range(n)], **extra}


ROWS = 600


@pytest.fixture
def compiled_calls(monkeypatch):
    from service import engine

    calls = []
    real = engine.compile_instance
    monkeypatch.setattr(engine, "compile_instance", lambda instance, **kw: calls.append(instance) or real(instance, **kw))
    return calls


@pytest.mark.parametrize("build, copies", [
    (compact_rows, 1),
    (lambda n: compact_rows(n, noise=0.1, max_flips=1), noisy_copies([2, 2, 3], 1)),
    (lambda n: compact_rows(n, noise=0.1, max_flips=2), noisy_copies([2, 2, 3], 2)),
    (lambda n: per_hypothesis_unlisted(n, noise=0.1, max_flips=2), noisy_copies([3, 2], 2)),
], ids=["rows", "noisy copies, max_flips 1", "max_flips 2", "per-hypothesis, outcomes seen"])
def test_max_hypotheses_counts_the_compiled_rows_before_compiling(build, copies, app_config, compiled_calls):
    client = create_app({**app_config, "max_hypotheses": ROWS}).test_client()
    n = ROWS // copies
    accepted = client.post("/v1/instances", json=build(n))
    assert accepted.status_code == 201, accepted.get_json()
    compiled = len(compiled_calls)
    assert compiled, "the accepted instance was compiled through engine.compile_instance"
    refused = client.post("/v1/instances", json=build(n + 1))
    assert "MAX_HYPOTHESES" in assert_problem(refused, 413, "instance-too-large")["detail"]
    assert len(compiled_calls) == compiled


def test_an_inline_instance_of_a_select_request_is_held_to_max_hypotheses(app_config):
    client = create_app({**app_config, "max_hypotheses": ROWS}).test_client()
    refused = client.post("/v1/select", json={"instance": compact_rows(ROWS + 1), "observations": []})
    assert "MAX_HYPOTHESES" in assert_problem(refused, 413, "instance-too-large")["detail"]


# --- compiling a big tensor: one copy of it, rows grouped by content -----------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_given_likelihood_tensor_compiles_to_its_rows_divided_by_their_sums(dtype):
    rng = np.random.default_rng(3)
    n, n_tests, width = 60, 7, 3
    cells = rng.random((n, n_tests, width))
    cells /= cells.sum(axis=2, keepdims=True)
    cells *= 1 + rng.uniform(-4e-7, 4e-7, size=(n, n_tests, 1))  # within the 1e-6 the rules allow
    given = cells.astype(dtype)
    payload = {"tests": [{"id": f"t{j}", "outcomes": ["a", "b", "c"]} for j in range(n_tests)],
               "classes": [f"c{i % 4}" for i in range(n)], "hypothesis_ids": [f"h{i}" for i in range(n)],
               "likelihood_matrix": encode(given)}
    compiled = compile_instance(Instance.model_validate(payload))
    expected = given.astype(np.float64)
    expected = expected / expected.sum(axis=2, keepdims=True)
    rows = [int(h[1:]) for h in compiled.hypothesis_ids]
    assert rows != sorted(rows)  # grouped by class: the rows were reordered
    assert np.array_equal(compiled.likelihood, expected[rows])


def equal_row_partition(rows: np.ndarray) -> set[frozenset[int]]:
    groups: dict[bytes, set[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.tobytes(), set()).add(i)
    return {frozenset(members) for members in groups.values()}


@pytest.mark.parametrize("values", [(0.25, 0.75), (0.0, 1.0), (0.1, 0.2, 0.7)])
def test_rows_are_grouped_exactly_when_their_bytes_are_equal(values):
    from service.engine.indistinguishable import _equal_row_groups

    rng = np.random.default_rng(11)
    distinct = rng.choice(values, size=(40, 13))
    rows = distinct[rng.integers(0, 40, size=500)]
    group = _equal_row_groups(rows)
    found: dict[int, set[int]] = {}
    for i, g in enumerate(group.tolist()):
        found.setdefault(g, set()).add(i)
    assert {frozenset(m) for m in found.values()} == equal_row_partition(rows)
