"""Bad input: a catalogue of malformed and hostile requests, each answered with the right
4xx problem+json while the store stays byte-identical (Redis: DUMP of every key under the test's
prefix; memory: the store's tables), over both stores. Then property-based fuzzing (hypothesis)
of the instance parser and the observation endpoint: nothing but validation errors."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from api_support import QUAD, TRIAGE, assert_problem
from schemas.instance import Instance
from service.app import create_app
from service.engine import EngineError, compile_instance
from snapshots import snapshot

LIMITS = {"max_body_bytes": 64 * 1024, "max_observations_per_request": 50, "max_classes": 8,
          "max_cells": 10_000, "max_json_depth": 32, "max_compiled_bytes": 50_000,
          "evaluation_time_limit": 0.0}
# Every refusal comes within this many seconds: no request, however small, holds a worker.
ANSWER_SECONDS = 2.0
JSON = "application/json"


@dataclass(frozen=True)
class Bad:
    name: str
    path: str  # may name {sid} (TRIAGE, troponin=low observed, version 2), {quad} (a=0 observed),
    #           {done} (determined), {iid} (TRIAGE's instance id)
    body: Any = None  # JSON-able, or bytes sent as they are
    status: int = 422
    code: str = "validation-error"
    method: str = "post"
    headers: dict = field(default_factory=dict)
    content_type: str | None = JSON


def _instance(**changes) -> dict:
    inst = copy.deepcopy(TRIAGE)
    inst.update(changes)
    return inst


def _hyp(i: int, **changes) -> dict:
    inst = copy.deepcopy(TRIAGE)
    inst["hypotheses"][i].update(changes)
    return inst


OBS = "/v1/sessions/{sid}/observations"
LIKELY = {"tests": [{"id": "swab", "outcomes": ["neg", "pos"]}],
          "hypotheses": [{"id": "well", "likelihoods": {"swab": {"neg": 0.9, "pos": 0.2}}},
                         {"id": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}}}]}
COLUMNAR = {"tests": [{"id": "a", "outcomes": ["0", "1"]}, {"id": "b", "outcomes": ["0", "1"]}],
            "classes": ["x", "y"], "matrix": [[0, 1], [1, 0]]}

CATALOGUE = [
    # --- the bytes: not JSON, not the media type, too big, too deep -----------------------
    Bad("truncated JSON", OBS, b'{"test": "ecg"', 400, "malformed-json"),
    Bad("empty body", OBS, b"", 400, "malformed-json"),
    Bad("single quotes", OBS, b"{'test': 'ecg', 'outcome': 'normal'}", 400, "malformed-json"),
    Bad("trailing garbage", OBS, b'{"test": "ecg", "outcome": "normal"} x', 400, "malformed-json"),
    Bad("NaN literal", OBS, b'{"test": NaN, "outcome": "normal"}', 400, "malformed-json"),
    Bad("Infinity prior", "/v1/instances", orjson.dumps(TRIAGE).replace(b'"prior":0.1', b'"prior":Infinity'),
        400, "malformed-json"),
    Bad("number beyond float64", "/v1/instances", orjson.dumps(TRIAGE).replace(b'"prior":0.1', b'"prior":1e400'),
        400, "malformed-json"),
    Bad("invalid UTF-8", OBS, b'{"test": "\xff\xfe", "outcome": "normal"}', 400, "malformed-json"),
    Bad("lone surrogate escape", OBS, b'{"test": "\\ud800", "outcome": "normal"}', 400, "malformed-json"),
    Bad("text/plain", OBS, b'{"test": "ecg", "outcome": "normal"}', 415, "unsupported-media-type",
        content_type="text/plain"),
    Bad("no content type", OBS, b'{"test": "ecg", "outcome": "normal"}', 415, "unsupported-media-type",
        content_type=None),
    Bad("form encoded", OBS, b"test=ecg&outcome=normal", 415, "unsupported-media-type",
        content_type="application/x-www-form-urlencoded"),
    Bad("nested past orjson's limit", OBS, b"[" * 5000 + b"]" * 5000, 400, "malformed-json"),
    Bad("nested past MAX_JSON_DEPTH", OBS, b'{"test": ' + b"[" * 100 + b"]" * 100 + b"}", 413, "limit-exceeded"),
    Bad("body over MAX_BODY_BYTES", "/v1/instances", _instance(tests=[{"id": "x" * 150}] * 500),
        413, "body-too-large"),
    # --- the wrong shape -------------------------------------------------------------------
    Bad("array body", OBS, [{"test": "ecg", "outcome": "normal"}]),
    Bad("string body", OBS, "ecg=normal"),
    Bad("null body", OBS, None),
    Bad("outcome missing", OBS, {"test": "ecg"}),
    Bad("both observation forms", OBS, {"test": "ecg", "outcome": "normal",
                                        "observations": [{"test": "ecg", "outcome": "normal"}]}),
    Bad("empty observations list", OBS, {"observations": []}),
    Bad("unknown field", OBS, {"test": "ecg", "outcome": "normal", "confidence": 0.9}),
    Bad("boolean outcome", OBS, {"test": "ecg", "outcome": True}),
    Bad("empty string label", OBS, {"test": "", "outcome": "normal"}),
    Bad("enormous label", OBS, {"test": "e" * 10_000, "outcome": "normal"}),
    Bad("too many observations", OBS, {"observations": [{"test": "ecg", "outcome": "normal"}] * 51},
        413, "limit-exceeded"),
    # --- unknown names, conflicts, order, preconditions -------------------------------------
    Bad("unknown test", OBS, {"test": "mri", "outcome": "normal"}, 422, "unknown-test"),
    Bad("unknown outcome label", OBS, {"test": "ecg", "outcome": "borderline"}, 422, "unknown-outcome"),
    Bad("NUL inside a label", OBS, {"test": "ec\u0000g", "outcome": "normal"}, 422, "unknown-test"),
    Bad("RTL override label", OBS, {"test": "\u202eecg", "outcome": "normal"}, 422, "unknown-test"),
    Bad("homoglyph label (Cyrillic е)", OBS, {"test": "\u0435cg", "outcome": "normal"}, 422, "unknown-test"),
    Bad("conflicting with the recorded outcome", OBS, {"test": "troponin", "outcome": "high"}, 409,
        "conflicting-observation"),
    Bad("one test twice in a batch, two outcomes", OBS, {"observations": [
        {"test": "ecg", "outcome": "normal"}, {"test": "ecg", "outcome": "abnormal"}]}, 409, "conflicting-observation"),
    Bad("batch with an unknown test after a good one", OBS, {"observations": [
        {"test": "ecg", "outcome": "normal"}, {"test": "mri", "outcome": "x"}]}, 422, "unknown-test"),
    Bad("stale If-Match", OBS, {"test": "ecg", "outcome": "normal"}, 412, "precondition-failed",
        headers={"If-Match": '"1"'}),
    Bad("garbage If-Match", OBS, {"test": "ecg", "outcome": "normal"}, 412, "precondition-failed",
        headers={"If-Match": "not-a-tag"}),
    Bad("contradicts every hypothesis", "/v1/sessions/{quad}/observations", {"test": "c", "outcome": "1"}, 409,
        "inconsistent"),
    Bad("observation after done", "/v1/sessions/{done}/observations", {"test": "troponin", "outcome": "low"}, 409,
        "session-done"),
    Bad("observation for an unknown session", "/v1/sessions/no-such-session/observations",
        {"test": "ecg", "outcome": "normal"}, 404, "session-not-found"),
    Bad("explain=maybe", OBS + "?explain=maybe", {"test": "ecg", "outcome": "normal"}, 400, "invalid-parameter"),
    Bad("stale If-Match on delete", "/v1/sessions/{sid}", None, 412, "precondition-failed", method="delete",
        headers={"If-Match": '"1"'}),
    # --- instances -------------------------------------------------------------------------
    Bad("no tests", "/v1/instances", _instance(tests=[])),
    Bad("negative cost", "/v1/instances", _instance(tests=[{"id": "ecg", "cost": -2}, {"id": "troponin"}])),
    Bad("zero cost", "/v1/instances", _instance(tests=[{"id": "ecg", "cost": 0}, {"id": "troponin"}])),
    Bad("cost as a string", "/v1/instances", _instance(tests=[{"id": "ecg", "cost": "2"}, {"id": "troponin"}])),
    Bad("negative prior", "/v1/instances", _hyp(0, prior=-0.1)),
    Bad("all priors zero", "/v1/instances", {**TRIAGE, "hypotheses": [
        {**h, "prior": 0} for h in TRIAGE["hypotheses"]]}),
    Bad("prior on some hypotheses only", "/v1/instances", {**TRIAGE, "hypotheses": [
        {k: v for k, v in h.items() if k != "prior" or h["id"] == "mi"} for h in TRIAGE["hypotheses"]]}),
    Bad("duplicate test ids", "/v1/instances", _instance(tests=[{"id": "ecg"}, {"id": "ecg"}, {"id": "troponin"}])),
    Bad("duplicate hypothesis ids", "/v1/instances", _hyp(1, id="mi")),
    Bad("duplicate outcome labels", "/v1/instances", _instance(tests=[
        {"id": "ecg", "outcomes": ["normal", "normal", "abnormal"]}, {"id": "troponin"}])),
    Bad("outcome outside the test's labels", "/v1/instances", _hyp(0, outcomes={"ecg": "weird", "troponin": "high"})),
    Bad("outcome for an unknown test", "/v1/instances", _hyp(0, outcomes={"ecg": "abnormal", "troponin": "high",
                                                                          "mri": "x"})),
    Bad("no outcome for a test", "/v1/instances", _hyp(0, outcomes={"ecg": "abnormal"})),
    Bad("ragged matrix", "/v1/instances", {**COLUMNAR, "matrix": [[0, 1], [1]]}),
    Bad("matrix index out of range", "/v1/instances", {**COLUMNAR, "matrix": [[0, 2], [1, 0]]}),
    Bad("classes length mismatch", "/v1/instances", {**COLUMNAR, "classes": ["x"]}),
    Bad("both forms at once", "/v1/instances", {**TRIAGE, "matrix": [[0, 1]]}),
    Bad("likelihoods not summing to 1", "/v1/instances", LIKELY),
    Bad("negative likelihood", "/v1/instances", {**LIKELY, "hypotheses": [
        {"id": "well", "likelihoods": {"swab": {"neg": 1.5, "pos": -0.5}}}, LIKELY["hypotheses"][1]]}),
    Bad("noise of 1", "/v1/instances", {**TRIAGE, "noise": 1}),
    Bad("more classes than MAX_CLASSES", "/v1/instances", {
        "tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(4)],
        "hypotheses": [{"id": f"h{i}", "outcomes": {f"t{j}": str((i >> j) & 1) for j in range(4)}}
                       for i in range(16)]}, 413, "limit-exceeded"),
    Bad("more cells than MAX_CELLS", "/v1/instances", {
        "tests": [{"id": f"t{j}"} for j in range(101)], "classes": ["x"] * 100,
        "matrix": [[0] * 101 for _ in range(100)]}, 413, "instance-too-large"),
    # --- sessions and select -----------------------------------------------------------------
    Bad("unknown policy (inline instance)", "/v1/sessions", {"instance": COLUMNAR, "policy": "oracle"}, 422,
        "unknown-policy"),
    Bad("unknown policy (stored instance)", "/v1/sessions", {"instance_id": "{iid}", "policy": "oracle"}, 422,
        "unknown-policy"),
    Bad("both instance and instance_id", "/v1/sessions", {"instance": TRIAGE, "instance_id": "{iid}"}),
    Bad("instance_id not a hash", "/v1/sessions", {"instance_id": "../../etc/passwd"}),
    Bad("unknown instance_id", "/v1/sessions", {"instance_id": "0" * 64}, 404, "instance-not-found"),
    Bad("negative max_tests", "/v1/sessions", {"instance_id": "{iid}", "max_tests": -1}),
    Bad("confidence above 1", "/v1/sessions", {"instance_id": "{iid}", "confidence": 1.5}),
    Bad("seed beyond 2^63", "/v1/sessions", b'{"instance_id": "0000000000000000000000000000000000000000000000000000000000000000", "seed": 18446744073709551616}'),
    Bad("Idempotency-Key not ASCII", "/v1/sessions", {"instance_id": "{iid}"}, 400, "invalid-header",
        headers={"Idempotency-Key": "clé"}),
    Bad("Idempotency-Key too long", "/v1/sessions", {"instance_id": "{iid}"}, 400, "invalid-header",
        headers={"Idempotency-Key": "k" * 300}),
    Bad("Idempotency-Key replayed with another request", "/v1/sessions",
        {"instance_id": "{iid}", "policy": "gbs"}, 409, "idempotency-key-reused",
        headers={"Idempotency-Key": "used-once"}),
    Bad("select: unknown test", "/v1/select", {"instance_id": "{iid}", "observations": [
        {"test": "mri", "outcome": "x"}]}, 422, "unknown-test"),
    Bad("select: contradictory observations", "/v1/select", {"instance": QUAD, "observations": [
        {"test": "a", "outcome": "0"}, {"test": "c", "outcome": "1"}]}, 409, "inconsistent"),
    # --- sizes counted before anything is built; values every later use would fail on -------
    Bad("max_flips 2^63-1", "/v1/instances", {**COLUMNAR, "max_flips": 2**63 - 1}),
    Bad("max_flips beyond the number of tests", "/v1/instances", {**COLUMNAR, "max_flips": 1_000_000}),
    Bad("max_flips copies over MAX_CELLS", "/v1/instances", {
        "tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(30)], "classes": ["x", "y"],
        "matrix": [[0] * 30, [1] * 30], "max_flips": 30}, 413, "instance-too-large"),
    Bad("noise over many labels: n·N·ℓ over MAX_CELLS", "/v1/instances", {
        "tests": [{"id": f"t{j}", "outcomes": [f"o{k}" for k in range(200)]} for j in range(10)],
        "classes": ["x", "y"] * 5, "matrix": [[(i + j) % 200 for j in range(10)] for i in range(10)],
        "noise": 0.1}, 413, "instance-too-large"),
    Bad("compiled bytes over MAX_COMPILED_BYTES", "/v1/instances", {
        "tests": [{"id": f"t{j}", "outcomes": [f"o{k}" for k in range(20)]} for j in range(20)],
        "classes": ["x", "y"] * 10, "matrix": [[(i + j) % 20 for j in range(20)] for i in range(20)],
        "noise": 0.1}, 413, "instance-too-large"),
    Bad("12 000 duplicated outcome labels", "/v1/instances", {
        "tests": [{"id": "t", "outcomes": ["a", "b"] * 6_000}], "classes": ["x"], "matrix": [[0]]}),
    Bad("priors whose sum overflows", "/v1/instances", {**TRIAGE, "hypotheses": [
        {**h, "prior": 1e308} for h in TRIAGE["hypotheses"]]}),
    Bad("a prior too small to tell from round-off", "/v1/instances", {**COLUMNAR, "priors": [1, 1e-13]}),
    Bad("subnormal cost", "/v1/instances", _instance(tests=[{"id": "ecg", "cost": 1e-320}, {"id": "troponin"}])),
    Bad("costs whose sum overflows", "/v1/instances", _instance(tests=[{"id": "ecg", "cost": 1e308},
                                                                       {"id": "troponin", "cost": 1e308}])),
    Bad("repeated key in an outcome map", "/v1/instances",
        orjson.dumps(TRIAGE).replace(b'"ecg":"abnormal"', b'"ecg":"normal","ecg":"abnormal"', 1)),
    Bad("repeated key in an observation", OBS, b'{"test": "ecg", "test": "troponin", "outcome": "low"}'),
    Bad("evaluate: max_cost as a string", "/v1/instances/{iid}/evaluate", {"max_cost": "5"}),
    Bad("evaluate: confidence true", "/v1/instances/{iid}/evaluate", {"confidence": True}),
    Bad("evaluate: max_se 0", "/v1/instances/{iid}/evaluate", {"max_se": 0}),
    Bad("evaluate: randomesque without k", "/v1/instances/{iid}/evaluate", {"exposure": {"method": "randomesque"}}),
    Bad("evaluate: progressive with k", "/v1/instances/{iid}/evaluate", {"exposure": {"method": "progressive", "k": 5}}),
    Bad("evaluate past EVALUATION_TIME_LIMIT", "/v1/instances/{iid}/evaluate", {"policies": ["ec2"]}, 422,
        "evaluation-limit"),
    Bad("tree past EVALUATION_TIME_LIMIT", "/v1/instances/{iid}/tree?policy=ec2", None, 422, "evaluation-limit",
        method="get"),
    # --- routes ----------------------------------------------------------------------------
    Bad("unknown route", "/v1/sessions/{sid}/undo", {}, 404, "not-found"),
    Bad("wrong method", "/v1/instances", None, 405, "method-not-allowed", method="put"),
    Bad("delete an unknown session", "/v1/sessions/nope", None, 404, "session-not-found", method="delete"),
    # --- respondents: skips, exclusions, pages, corrections, instances ---------------------
    Bad("skip with an outcome", OBS, {"test": "ecg", "outcome": "normal", "skip": True}),
    Bad("skip: false", OBS, {"test": "ecg", "skip": False}),
    Bad("skip of an answered test", OBS, {"test": "troponin", "skip": True}, 409, "conflicting-observation"),
    Bad("skip after done", "/v1/sessions/{done}/observations", {"test": "troponin", "skip": True}, 409,
        "session-done"),
    Bad("unknown excluded test", "/v1/sessions", {"instance_id": "{iid}", "exclude_tests": ["mri"]}, 422,
        "unknown-test"),
    Bad("select: unknown excluded test", "/v1/select", {"instance_id": "{iid}", "exclude_tests": ["mri"]}, 422,
        "unknown-test"),
    Bad("batch_size 0", "/v1/sessions", {"instance_id": "{iid}", "batch_size": 0}),
    Bad("batch beyond the work limit", "/v1/sessions", {"instance": {
        "tests": [{"id": f"t{j}", "outcomes": [str(k) for k in range(10)]} for j in range(6)],
        "likelihood_matrix": [[[0.1] * 10] * 6, [[0.2, 0.8] + [0.0] * 8] * 6], "classes": ["a", "b"]},
        "batch_size": 6}, 422, "infeasible"),
    Bad("correct to an unknown outcome", OBS + "/troponin", {"outcome": "medium"}, 422, "unknown-outcome",
        method="put"),
    Bad("correct with outcome and skip", OBS + "/troponin", {"outcome": "low", "skip": True}, method="put"),
    Bad("correct an unobserved test", OBS + "/ecg", {"outcome": "normal"}, 404, "observation-not-found",
        method="put"),
    Bad("correct an unknown test", OBS + "/mri", {"outcome": "x"}, 422, "unknown-test", method="put"),
    Bad("correct on a stale If-Match", OBS + "/troponin", {"outcome": "high"}, 412, "precondition-failed",
        method="put", headers={"If-Match": '"1"'}),
    Bad("correct with a bad occurrence", OBS + "/troponin?occurrence=-1", {"outcome": "high"}, 400,
        "invalid-parameter", method="put"),
    Bad("withdraw an unobserved test", OBS + "/ecg", None, 404, "observation-not-found", method="delete"),
    Bad("withdraw on a stale If-Match", OBS + "/troponin", None, 412, "precondition-failed", method="delete",
        headers={"If-Match": '"1"'}),
    Bad("list with limit 0", "/v1/instances?limit=0", None, 400, "invalid-parameter", method="get"),
    Bad("list with a forged cursor", "/v1/instances?cursor=../x", None, 400, "invalid-parameter", method="get"),
    Bad("delete an unknown instance", "/v1/instances/" + "0" * 64, None, 404, "instance-not-found",
        method="delete"),
    Bad("read an unknown instance", "/v1/instances/" + "0" * 64, None, 404, "instance-not-found", method="get"),
    Bad("read an unknown session", "/v1/sessions/nope", None, 404, "session-not-found", method="get"),
]


def test_the_catalogue_is_large_enough():
    assert len(CATALOGUE) >= 40
    assert len({bad.name for bad in CATALOGUE}) == len(CATALOGUE)


def test_every_api_operation_has_a_bad_request_in_the_catalogue():
    """A /v1 route added without a refused request of its own in the catalogue fails here
    (docs/architecture.md: adding an endpoint)."""
    app = create_app({"redis_url": None})
    urls = app.url_map.bind("localhost")
    ids = {"iid": "0" * 64, "sid": "s", "quad": "q", "done": "d"}
    reached = set()
    for bad in CATALOGUE:
        try:
            endpoint, _ = urls.match(bad.path.format(**ids).split("?")[0], method=bad.method.upper())
        except HTTPException:
            continue  # the catalogue's unknown route and wrong method
        reached.add((endpoint, bad.method.upper()))
    operations = {(rule.endpoint, method) for rule in app.url_map.iter_rules() if rule.rule.startswith("/v1/")
                  for method in rule.methods - {"HEAD", "OPTIONS"}}
    assert len(operations) >= 10
    assert not operations - reached, f"no bad request in the catalogue for {sorted(operations - reached)}"


@pytest.fixture
def guarded(app_config):
    """An app with small limits, and the resources the catalogue's paths name."""
    app = create_app({**app_config, **LIMITS})
    client = app.test_client()
    ids = {"iid": client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]}
    ids["sid"] = client.post("/v1/sessions", json={"instance_id": ids["iid"]}).get_json()["session_id"]
    assert client.post(f"/v1/sessions/{ids['sid']}/observations",
                       json={"test": "troponin", "outcome": "low"}).status_code == 200
    ids["quad"] = client.post("/v1/sessions", json={"instance": QUAD}).get_json()["session_id"]
    assert client.post(f"/v1/sessions/{ids['quad']}/observations", json={"test": "a", "outcome": "0"}).status_code == 200
    ids["done"] = client.post("/v1/sessions", json={"instance_id": ids["iid"]}).get_json()["session_id"]
    assert client.post(f"/v1/sessions/{ids['done']}/observations",
                       json={"test": "ecg", "outcome": "normal"}).get_json()["done"] is True
    assert client.post("/v1/sessions", json={"instance_id": ids["iid"]},
                       headers={"Idempotency-Key": "used-once"}).status_code == 201
    return app, ids


def _fill(value: Any, ids: dict) -> Any:
    if isinstance(value, str):
        return value.format(**ids) if value.startswith("{") and value.endswith("}") and value[1:-1] in ids else value
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


@pytest.mark.parametrize("bad", CATALOGUE, ids=[bad.name for bad in CATALOGUE])
def test_each_bad_request_is_refused_and_changes_nothing(guarded, bad):
    app, ids = guarded
    client = app.test_client()
    path = bad.path.format(**ids)
    data = bad.body if isinstance(bad.body, bytes) else orjson.dumps(_fill(bad.body, ids))
    before = snapshot(app)
    started = time.monotonic()
    bodiless = bad.method in ("get", "delete") or (bad.method == "put" and bad.body is None)
    response = getattr(client, bad.method)(path, data=None if bodiless else data,
                                           content_type=bad.content_type, headers=bad.headers)
    elapsed = time.monotonic() - started
    assert_problem(response, bad.status, bad.code)
    assert elapsed < ANSWER_SECONDS, f"{bad.name} took {elapsed:.2f} s"
    assert snapshot(app) == before, f"{bad.name} changed what is stored"


# --- property-based fuzzing ------------------------------------------------------------------

labels = st.one_of(st.text(max_size=6), st.sampled_from(["a", "b", "0", "1", "x"]), st.integers(-2, 3))
numbers = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.sampled_from([0, 0.5, 1, 1e308, -1e-308]))
anything = st.recursive(st.one_of(st.none(), st.booleans(), numbers, labels),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                        max_leaves=12)
tests = st.lists(st.fixed_dictionaries({"id": labels}, optional={
    "cost": numbers, "outcomes": st.lists(labels, max_size=3), "error_rate": numbers}), max_size=3)
hypotheses = st.lists(st.fixed_dictionaries({"id": labels}, optional={
    "class": labels, "prior": numbers,
    "outcomes": st.dictionaries(labels.map(str), labels, max_size=3),
    "likelihoods": st.dictionaries(labels.map(str), st.dictionaries(labels.map(str), numbers, max_size=2), max_size=2),
}), max_size=4)
instances = st.one_of(
    st.fixed_dictionaries({"tests": tests, "hypotheses": hypotheses}, optional={"noise": numbers, "max_flips": numbers}),
    st.fixed_dictionaries({"tests": tests}, optional={
        "matrix": st.lists(st.lists(st.integers(-1, 3), max_size=3), max_size=4),
        "likelihood_matrix": st.lists(st.lists(st.lists(numbers, max_size=2), max_size=3), max_size=3),
        "classes": st.lists(labels, max_size=4), "priors": st.lists(numbers, max_size=4),
        "hypothesis_ids": st.lists(labels, max_size=4)}),
    anything,
)

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@FUZZ
@given(instances)
def test_the_instance_parser_only_ever_refuses_with_validation_errors(data):
    try:
        instance = Instance.model_validate(data)
    except ValidationError:
        return
    try:
        compiled = compile_instance(instance, max_cells=10_000)
    except EngineError:
        return
    assert compiled.n_hypotheses >= 1 and compiled.n_tests >= 1


@pytest.fixture(scope="module")
def fuzz_target():
    app = create_app({"redis_url": None, **LIMITS})
    client = app.test_client()
    sid = client.post("/v1/sessions", json={"instance": QUAD}).get_json()["session_id"]
    return app, sid


observation_bodies = st.one_of(
    st.fixed_dictionaries({"test": labels, "outcome": labels}),
    st.fixed_dictionaries({"observations": st.lists(st.fixed_dictionaries({"test": labels, "outcome": labels}),
                                                    max_size=4)}),
    anything,
)


# Header values a client can send: HTTP forbids CR, LF and NUL in them (the test client refuses them).
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=5)


@FUZZ
@given(body=observation_bodies, if_match=st.one_of(st.none(), header_values))
def test_the_observation_endpoint_never_fails_on_the_server(fuzz_target, body, if_match):
    app, _ = fuzz_target
    client = app.test_client()
    # A fresh session per example, so earlier examples cannot make every later one a 409.
    sid = client.post("/v1/sessions", json={"instance": QUAD}).get_json()["session_id"]
    headers = {} if if_match is None else {"If-Match": if_match}
    response = client.post(f"/v1/sessions/{sid}/observations", data=orjson.dumps(body), content_type=JSON,
                           headers=headers)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert response.mimetype == "application/problem+json"


@FUZZ
@given(raw=st.binary(max_size=200))
def test_raw_bytes_never_fail_on_the_server(fuzz_target, raw):
    app, sid = fuzz_target
    response = app.test_client().post(f"/v1/sessions/{sid}/observations", data=raw, content_type=JSON)
    assert response.status_code in (400, 413, 422), response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
