"""Requests that could take a worker down or reach it unchecked, the engine's half: each test
here fails without the limit it covers. Sizes are counted before anything is allocated, inputs that
would make every later use fail are refused at the door with their JSON path, evaluations and
trees keep to their time limit, and the stop rules hold at their exact boundaries."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import tracemalloc
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api_support import TRIAGE, assert_problem
from schemas.instance import Instance, json_path
from service import engine
from service.app import create_app
from service.engine import StopReason, StopRules
from service.evaluation import EvaluationLimits, evaluate
from tests.builders import compile_wire


def paths(error: ValidationError) -> list[str]:
    return [json_path(tuple(e["loc"])) for e in error.errors()]


def refused_paths(payload: dict) -> list[str]:
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate(payload)
    return paths(refused.value)


def binary_tests(count: int) -> list[dict]:
    return [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(count)]


# --- max_flips: bounded before any loop -------------------------------------------------------


@pytest.mark.parametrize("max_flips", [2**63 - 1, 1_000_000, 4, -1])
def test_max_flips_outside_0_to_n_is_refused_with_its_path(max_flips):
    payload = {"tests": binary_tests(3), "classes": ["a", "b"], "matrix": [[0, 0, 0], [1, 1, 1]],
               "max_flips": max_flips}
    assert refused_paths(payload) == ["max_flips"]


def test_max_flips_equal_to_n_is_the_largest_accepted():
    payload = {"tests": binary_tests(3), "classes": ["a", "b"], "matrix": [[0, 0, 0], [1, 1, 1]], "max_flips": 3}
    assert compile_wire(payload).n_hypotheses == 2 * 2**3


def test_counting_noisy_copies_stops_at_the_cap_whatever_max_flips_says():
    # Without the cap this is a DP over 10⁶ levels and 5000 tests: minutes, and huge integers.
    started = time.process_time()
    count = engine.count_noisy_copies(np.full(5000, 2), 10**6, cap=10_000)
    assert count > 10_000
    assert time.process_time() - started < 1.0
    # Below the cap the count is exact: Σ_{j ≤ 2} C(6, j)·2^j for ternary tests.
    assert engine.count_noisy_copies(np.full(6, 3), 2, cap=10_000) == 1 + 6 * 2 + 15 * 4


def test_noisy_copies_count_their_labels_in_the_compiled_bytes():
    # 2 hypotheses × (1 + 8 + 28) copies × 8 tests is 592 cells, far under MAX_CELLS, but each
    # copy's id names its flips with 190-character test ids: the labels are what is large.
    tests = [{"id": f"{j}" + "x" * 190, "outcomes": ["0", "1"]} for j in range(8)]
    payload = {"tests": tests, "classes": ["a", "b"], "matrix": [[0] * 8, [1] * 8], "max_flips": 2}
    with pytest.raises(engine.InstanceTooLarge, match="MAX_COMPILED_BYTES"):
        engine.compile_instance(Instance.model_validate(payload), max_bytes=20_000)
    assert engine.compile_instance(Instance.model_validate(payload), max_bytes=100_000).n_hypotheses == 74


# --- every size limit counts what will be allocated, before allocating -------------------------


def many_labels_with_noise(n: int, n_tests: int, labels: int) -> dict:
    outcomes = [f"o{k}" for k in range(labels)]
    return {"tests": [{"id": f"t{j}", "outcomes": outcomes} for j in range(n_tests)],
            "classes": [f"c{i % 5}" for i in range(n)],
            "matrix": [[(i + j) % labels for j in range(n_tests)] for i in range(n)], "noise": 0.1}


def test_noise_over_many_labels_counts_n_N_l_cells_before_building_the_tensor():
    # n·N = 10⁴ cells is well under the limit; the noisy tensor n·N·ℓ = 2.56·10⁶ floats (20 MB)
    # is not, and must be refused before any of it is allocated.
    instance = Instance.model_validate(many_labels_with_noise(200, 50, 256))
    tracemalloc.start()
    try:
        with pytest.raises(engine.InstanceTooLarge, match=r"200×50×256 = 2560000 cells.*MAX_CELLS"):
            engine.compile_instance(instance, max_cells=1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"{peak} bytes allocated before refusing"


def test_a_likelihood_tensor_counts_its_bytes_against_max_compiled_bytes():
    instance = Instance.model_validate(many_labels_with_noise(100, 20, 64))
    with pytest.raises(engine.InstanceTooLarge, match="MAX_COMPILED_BYTES"):
        engine.compile_instance(instance, max_bytes=1_000_000)  # 100·20·64·8 = 1.02 MB of floats
    assert engine.compile_instance(instance, max_bytes=2_000_000).likelihood.shape == (100, 20, 64)


def test_compiling_holds_at_most_about_twice_what_it_counts():
    # MAX_COMPILED_BYTES promises "about twice this for a moment": the noisy tensor is built in
    # place in its final layout, and the content hash reads it a block at a time.
    instance = Instance.model_validate(many_labels_with_noise(400, 50, 64))  # 10 MB of floats
    tracemalloc.start()
    try:
        compiled = engine.compile_instance(instance)
        assert compiled.content_hash
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * compiled.likelihood.nbytes, peak


def test_noisy_rows_are_compared_by_their_stated_outcomes_for_the_warnings():
    # h0 and h1 differ only on t0, whose noise 0.5 on two outcomes makes it say nothing.
    payload = {"tests": [{"id": "t0", "outcomes": ["0", "1"], "error_rate": 0.5},
                         {"id": "t1", "outcomes": ["0", "1"]}],
               "classes": ["a", "b", "b"], "matrix": [[0, 0], [1, 0], [0, 1]], "noise": 0.1}
    assert compile_wire(payload).warnings == ("indistinguishable: no test tells apart '0' (a), '1' (b)",)


def test_given_likelihoods_count_n_N_l_cells():
    rows = [[[0.5, 0.25, 0.25]] * 4 for _ in range(10)]  # 10 × 4 = 40 cells, 120 numbers
    payload = {"tests": [{"id": f"t{j}"} for j in range(4)], "classes": ["a", "b"] * 5, "likelihood_matrix": rows}
    with pytest.raises(engine.InstanceTooLarge, match="10×4×3 = 120 cells"):
        engine.compile_instance(Instance.model_validate(payload), max_cells=100)


def test_http_refuses_the_noisy_tensor_and_names_the_setting_that_raises_it():
    client = create_app({"redis_url": None, "max_cells": 100_000}).test_client()
    response = client.post("/v1/instances", json=many_labels_with_noise(100, 20, 64))  # 128 000 cells
    problem = assert_problem(response, 413, "instance-too-large")
    assert "MAX_CELLS" in problem["detail"]
    small = create_app({"redis_url": None, "max_compiled_bytes": 4096}).test_client()
    problem = assert_problem(small.post("/v1/instances", json=many_labels_with_noise(40, 10, 2)),
                             413, "instance-too-large")
    assert "MAX_COMPILED_BYTES" in problem["detail"]


# --- instances every later use would fail on: refused at the door ------------------------------


def test_priors_whose_sum_overflows_are_refused():
    payload = {**TRIAGE, "hypotheses": [{**h, "prior": 1e308} for h in TRIAGE["hypotheses"]]}
    assert refused_paths(payload) == ["hypotheses"]
    assert refused_paths({"tests": binary_tests(1), "classes": ["a", "b"], "matrix": [[0], [1]],
                          "priors": [1.5e308, 1.5e308]}) == ["priors"]


@pytest.mark.parametrize("cost", [1e-320, 5e-324, 2e-308])
def test_subnormal_costs_are_refused(cost):
    payload = {**TRIAGE, "tests": [{"id": "ecg", "cost": cost, "outcomes": ["normal", "abnormal"]},
                                   {"id": "troponin"}]}
    assert refused_paths(payload) == ["tests[0].cost"]


def test_costs_whose_sum_overflows_are_refused():
    payload = {**TRIAGE, "tests": [{"id": "ecg", "cost": 1e308, "outcomes": ["normal", "abnormal"]},
                                   {"id": "troponin", "cost": 1e308}]}
    assert refused_paths(payload) == ["tests"]
    # Past 1e300 in all, a sum of sampled run costs could overflow in an evaluation.
    payload["tests"] = [{**payload["tests"][0], "cost": 9e299}, {"id": "troponin", "cost": 2e299}]
    assert refused_paths(payload) == ["tests"]


EXTREMES = [1e308, 1.7e308, 5e299, 1e-300, 2.3e-308, 1e-9, 1.0, 3.0]


@pytest.mark.parametrize("cost", EXTREMES)
@pytest.mark.parametrize("prior", EXTREMES)
def test_an_accepted_instance_is_usable_by_every_endpoint(prior, cost):
    # Whatever POST accepts must serve sessions, select, evaluate and trees without a 500.
    client = create_app({"redis_url": None}).test_client()
    payload = {"tests": [{"id": "ecg", "cost": cost, "outcomes": ["normal", "abnormal"]},
                         {"id": "troponin", "cost": 1.0}],
               "hypotheses": [{**h, "prior": prior if i else 1.0} for i, h in enumerate(TRIAGE["hypotheses"])]}
    created = client.post("/v1/instances", json=payload)
    if created.status_code == 422:
        return
    assert created.status_code == 201, created.get_json()
    iid = created.get_json()["instance_id"]
    session = client.post("/v1/sessions", json={"instance_id": iid, "max_cost": 2.0})
    assert session.status_code == 201, session.get_json()
    responses = [
        client.post(f"/v1/sessions/{session.get_json()['session_id']}/observations",
                    json={"test": "troponin", "outcome": "low"}),
        client.post("/v1/select", json={"instance_id": iid, "observations": [{"test": "ecg", "outcome": "abnormal"}]}),
        client.post(f"/v1/instances/{iid}/evaluate", json={"policies": ["ec2", "gbs"]}),
        client.get(f"/v1/instances/{iid}/tree?policy=ec2"),
    ]
    for response in responses:
        # A refusal of the request itself (e.g. 409: the session already stopped) is fine.
        assert response.status_code < 500, (response.request.path, response.get_data(as_text=True)[:300])
        assert response.status_code == 200 or response.mimetype == "application/problem+json"


EXTREME = st.sampled_from([0.0, 1.0, 0.5, 3.0, 1e-320, 5e-324, 2.3e-308, 1e-300, 1e-12, 1e-9, 1 - 1e-16,
                           1e299, 1e300, 1.7e308])


@st.composite
def extreme_instances(draw):
    n, n_tests, width = draw(st.integers(2, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    body = {"tests": [{"id": f"t{j}", "outcomes": [f"o{k}" for k in range(width)], "cost": draw(EXTREME)}
                      for j in range(n_tests)],
            "classes": [f"c{draw(st.integers(0, 1))}" for _ in range(n)],
            "priors": [draw(EXTREME) for _ in range(n)]}
    kind = draw(st.sampled_from(["matrix", "likelihoods", "noise", "max_flips"]))
    if kind == "likelihoods":
        def row():
            raw = [draw(EXTREME) for _ in range(width)]
            total = math.fsum(raw) if all(x < 1e300 for x in raw) else 0.0
            return [x / total for x in raw] if total > 0 else [1.0] + [0.0] * (width - 1)
        body["likelihood_matrix"] = [[row() for _ in range(n_tests)] for _ in range(n)]
        return body
    body["matrix"] = [[draw(st.integers(0, width - 1)) for _ in range(n_tests)] for _ in range(n)]
    if kind != "matrix":
        body["noise"] = draw(st.sampled_from([0.0, 1e-320, 1e-12, 0.5, 0.999999999]))
    if kind == "max_flips":
        body["max_flips"] = draw(st.integers(0, n_tests))
    return body


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(extreme_instances(), st.sampled_from([None, 5e-324, 0.3, 1e300]), st.sampled_from([None, 1e-300, 1.0]))
def test_no_accepted_instance_fails_on_the_server_later(body, max_cost, confidence):
    client = create_app({"redis_url": None, "evaluation_time_limit": 5.0}).test_client()
    created = client.post("/v1/instances", json=body)
    assert created.status_code in (201, 413, 422), created.get_data(as_text=True)
    if created.status_code != 201:
        return
    iid = created.get_json()["instance_id"]
    config = {"instance_id": iid, **({"max_cost": max_cost} if max_cost else {}),
              **({"confidence": confidence} if confidence else {})}
    session = client.post("/v1/sessions", json=config)
    responses = [session, client.post("/v1/select", json={**config, "observations": [{"test": "t0", "outcome": "o0"}]}),
                 client.post(f"/v1/instances/{iid}/evaluate", json={"samples": 20}),
                 client.get(f"/v1/instances/{iid}/tree")]
    if session.status_code == 201:
        responses.append(client.post(f"/v1/sessions/{session.get_json()['session_id']}/observations",
                                     json={"test": "t0", "outcome": "o0"}))
    for response in responses:
        assert response.status_code < 500, (response.request.path, response.get_data(as_text=True)[:300])
        if response.status_code == 200 and response.mimetype == "application/json":
            assert b"Infinity" not in response.data and b"NaN" not in response.data


# --- linear checks, size limits first ----------------------------------------------------------


def test_the_duplicate_outcome_rule_is_linear_in_the_labels():
    # list.count per label made this quadratic: 20 000 labels took 5 s to reach their refusal.
    labels = [f"l{k}" for k in range(20_000)] + ["l7", "l7"]
    payload = {"tests": [{"id": "t", "outcomes": labels}], "classes": ["a"], "matrix": [[0]]}
    started = time.process_time()
    assert refused_paths(payload) == ["tests[0].outcomes"]
    assert time.process_time() - started < 1.0


def test_an_instance_reports_at_most_fifty_problems():
    # 3000 labels outside the test's outcomes: a refusal names the first fifty, not a megabyte.
    hyps = [{"id": f"h{i}", "outcomes": {"t": f"nope{i}"}} for i in range(3000)]
    payload = {"tests": [{"id": "t", "outcomes": [f"o{k}" for k in range(500)]}], "hypotheses": hyps}
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate(payload)
    problems = refused.value.errors()
    assert len(problems) <= 51
    assert len(str(refused.value)) < 50_000
    assert "..." in problems[0]["msg"]  # 500 labels are not all spelled out


# --- duplicate keys ----------------------------------------------------------------------------


def post_raw(client, path: str, raw: bytes):
    return client.post(path, data=raw, content_type="application/json")


def test_a_repeated_key_is_refused_naming_it_and_its_path():
    client = create_app({"redis_url": None}).test_client()
    raw = orjson.dumps(TRIAGE).replace(b'"ecg":"abnormal"', b'"ecg":"normal","ecg":"abnormal"', 1)
    problem = assert_problem(post_raw(client, "/v1/instances", raw), 422, "validation-error")
    assert problem["errors"][0]["path"] == "hypotheses[0].outcomes.ecg"
    assert "'ecg'" in problem["errors"][0]["message"]
    top = assert_problem(post_raw(client, "/v1/select", b'{"instance": {}, "instance": {}}'), 422, "validation-error")
    assert top["errors"][0]["path"] == "instance"


def test_escaped_colons_neither_hide_a_repeated_key_nor_invent_one():
    client = create_app({"redis_url": None}).test_client()
    # "e\u003acg" is the key "e:cg": written with an escape, then repeated literally.
    instance = b'{"tests": [{"id": "e:cg"}], "hypotheses": [{"id": "a", "outcomes": {"e\\u003acg": "x"}}]}'
    assert post_raw(client, "/v1/instances", instance).status_code == 201
    repeated = instance.replace(b'"x"}', b'"x", "e:cg": "y"}')
    problem = assert_problem(post_raw(client, "/v1/instances", repeated), 422, "validation-error")
    assert problem["errors"][0]["path"] == "hypotheses[0].outcomes.e:cg"


# --- one strict model for the stop rules ------------------------------------------------------


@pytest.mark.parametrize("field, value", [("max_cost", "5"), ("confidence", True), ("max_tests", 1.5),
                                          ("seed", 2**63), ("max_cost", 0), ("policies", [""])])
def test_evaluate_is_as_strict_as_the_session_endpoints(field, value):
    client = create_app({"redis_url": None}).test_client()
    iid = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    problem = assert_problem(client.post(f"/v1/instances/{iid}/evaluate", json={field: value}), 422, "validation-error")
    assert problem["errors"][0]["path"].startswith(field)
    if field != "policies":
        assert_problem(client.post("/v1/sessions", json={"instance_id": iid, field: value}), 422, "validation-error")


# --- evaluations and trees: no recursion on the depth, the time limit everywhere --------------


def chain(n: int) -> dict:
    """n hypotheses in n classes on a line; test t_j asks "beyond j?". The optimum's first
    descent (t0, then t1 on what is left, ...) is n − 1 version spaces deep."""
    return {"tests": binary_tests(n - 1), "classes": [f"c{i}" for i in range(n)],
            "matrix": [[int(i > j) for j in range(n - 1)] for i in range(n)]}


def test_the_optimum_descends_a_long_chain_without_recursion():
    inst = compile_wire(chain(300))
    visited = 0

    def enough() -> None:
        nonlocal visited
        visited += 1
        if visited > 320:
            raise engine.InfeasibleComputation("deep enough")

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)  # below the chain's depth: a recursive DP fails here
    try:
        with pytest.raises(engine.InfeasibleComputation, match="deep enough"):
            engine.optimal_expected_cost(inst, max_states=10**6, check=enough)
    finally:
        sys.setrecursionlimit(limit)
    assert engine.optimal_expected_cost(compile_wire(chain(6))) == pytest.approx(
        min_expected_cost_by_brute_force(6))


def min_expected_cost_by_brute_force(n: int) -> float:
    """OPT on chain(n) with unit costs, uniform prior, from the definition: the best first
    question splits {0..n−1} into a prefix and a suffix, each solved the same way."""
    best = {1: 0.0}
    for size in range(2, n + 1):
        best[size] = 1 + min((k * best[k] + (size - k) * best[size - k]) / size for k in range(1, size))
    return best[n]


def test_every_evaluation_and_tree_request_keeps_to_the_time_limit():
    client = create_app({"redis_url": None, "evaluation_time_limit": 0.0}).test_client()
    iid = client.post("/v1/instances", json=chain(60)).get_json()["instance_id"]
    for response in (client.get(f"/v1/instances/{iid}/tree?policy=ec2"),
                     client.post(f"/v1/instances/{iid}/evaluate", json={"policies": ["ec2"]})):
        problem = assert_problem(response, 422, "evaluation-limit")
        assert "EVALUATION_TIME_LIMIT" in problem["detail"]


def test_drawing_a_tree_counts_against_the_time_limit(monkeypatch):
    import subprocess

    from service.evaluation import trees

    def graphviz_too_slow(*args, timeout, **kwargs):
        assert timeout <= 1.0  # what is left of the request's limit, not a fresh 30 s
        raise subprocess.TimeoutExpired("dot", timeout)

    monkeypatch.setattr(trees.shutil, "which", lambda name: "/usr/bin/dot")
    monkeypatch.setattr(trees.subprocess, "run", graphviz_too_slow)
    client = create_app({"redis_url": None, "evaluation_time_limit": 1.0}).test_client()
    iid = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    problem = assert_problem(client.get(f"/v1/instances/{iid}/tree?policy=ec2&format=svg"), 422, "evaluation-limit")
    assert "EVALUATION_TIME_LIMIT" in problem["detail"]


def test_the_optimum_past_the_deadline_is_a_note_and_the_policies_are_still_reported(monkeypatch):
    from service.evaluation import limits as limits_module
    from service.evaluation import report as report_module

    # A clock that stands still until the optimum starts, then jumps past any deadline.
    in_optimum = False
    real_optimum = report_module.optimal_expected_cost

    def optimum(*args, **kwargs):
        nonlocal in_optimum
        in_optimum = True
        return real_optimum(*args, **kwargs)

    monkeypatch.setattr(report_module, "optimal_expected_cost", optimum)
    clock = SimpleNamespace(monotonic=lambda: 1e9 if in_optimum else 0.0)
    monkeypatch.setattr(report_module, "time", clock)
    monkeypatch.setattr(limits_module, "time", clock)
    report = evaluate(compile_wire(chain(12)), ["ec2", "gbs"], limits=EvaluationLimits(time_limit=5.0))
    assert in_optimum
    assert report.optimum is None and "EVALUATION_TIME_LIMIT" in report.optimum_note
    assert [p.policy for p in report.policies] == ["ec2", "gbs"]
    assert report.policies[0].expected_cost > 0


def test_a_monte_carlo_run_checks_the_clock_at_every_step():
    # One run of many steps must not overrun the deadline between two checks.
    steps = 0

    def count() -> None:
        nonlocal steps
        steps += 1

    inst = compile_wire(chain(30))
    run = engine.run_policy(inst, 29, engine.POLICIES["gbs"], check=count)
    assert steps == len(run.observations) + 1


# --- the stop rules at their exact boundaries -------------------------------------------------


def two_class(priors: list[float], costs: list[float] | None = None) -> engine.CompiledInstance:
    n_tests = len(costs or [1.0])
    return compile_wire({"tests": [{"id": f"t{j}", "cost": c, "outcomes": ["0", "1"]}
                                   for j, c in enumerate(costs or [1.0])],
                         "classes": ["a", "b"], "priors": priors,
                         "matrix": [[0] * n_tests, [1] * n_tests]})


def test_confidence_is_reached_at_exactly_the_threshold():
    # P(b) = 0.75 / (0.25 + 0.75) = 0.75 exactly in binary floating point.
    inst = two_class([0.25, 0.75])
    assert float(engine.observe(inst, ()).class_posterior.max()) == 0.75
    assert engine.next_step(inst, rules=StopRules(confidence=0.75)).stop_reason == StopReason.CONFIDENCE_REACHED
    assert engine.next_step(inst, rules=StopRules(confidence=0.7500000000000001)).next_test == 0


def test_the_budget_admits_round_off_but_not_an_overrun():
    # 0.1 + 0.2 = 0.30000000000000004 > 0.3: without a tolerance the second test would not fit.
    inst = compile_wire({"tests": [{"id": "t0", "cost": 0.1, "outcomes": ["0", "1"]},
                                   {"id": "t1", "cost": 0.2, "outcomes": ["0", "1"]}],
                         "classes": ["a", "b", "c"], "matrix": [[0, 0], [1, 0], [1, 1]]})
    assert 0.1 + 0.2 > 0.3
    assert engine.next_step(inst, [(0, 1)], rules=StopRules(max_cost=0.3)).next_test == 1
    # The tolerance is relative: tests of cost 1e-13 against a budget of 1e-13 fit once, not ten
    # times (an absolute 1e-12 let them overrun it tenfold).
    tiny = compile_wire({"tests": [{"id": "t0", "cost": 1e-13, "outcomes": ["0", "1"]},
                                   {"id": "t1", "cost": 1e-13, "outcomes": ["0", "1"]}],
                         "classes": ["a", "b", "c"], "matrix": [[0, 0], [1, 0], [1, 1]]})
    assert engine.next_step(tiny, rules=StopRules(max_cost=1e-13)).next_test == 0
    assert engine.next_step(tiny, [(0, 1)], rules=StopRules(max_cost=1e-13)).stop_reason == \
        StopReason.BUDGET_EXHAUSTED


def test_a_prior_too_small_to_represent_is_refused_and_a_small_one_is_seen():
    assert refused_paths({"tests": binary_tests(1), "classes": ["a", "b"], "matrix": [[0], [1]],
                          "priors": [1, 1e-13]}) == ["priors[1]"]
    # 2e-9 of the total is above the refusal, and EC² runs the one test that separates it.
    inst = two_class([1.0, 2e-9])
    first = engine.next_step(inst)
    assert first.next_test == 0
    assert engine.next_step(inst, [(0, 1)]).stop_reason == StopReason.DETERMINED


def test_indistinguishable_is_never_claimed_for_hypotheses_a_test_separates():
    # A class lighter than the zero tolerance (built past the wire check): its gains are round-off,
    # but the test does separate it, so "indistinguishable" would be false.
    inst = two_class([0.5, 0.5])
    light = dataclasses.replace(inst, prior=np.array([1 - 1e-13, 1e-13]))
    decision = engine.next_step(light)
    assert decision.stop_reason != StopReason.INDISTINGUISHABLE
    # ... while hypotheses that answer alike are.
    same = compile_wire({"tests": binary_tests(1), "classes": ["a", "b"], "matrix": [[0], [0]]})
    assert engine.next_step(same).stop_reason == StopReason.INDISTINGUISHABLE


def test_the_posterior_survives_evidence_far_below_the_smallest_float():
    # 200 answers of likelihood 0.01 vs 0.02: P(x | h) is 1e-400 vs 1e-340, both 0 in float64.
    # The ratio, (1/2)^200, is what the posterior is made of; computed exactly with fractions.
    n_tests = 200
    payload = {"tests": binary_tests(n_tests + 1), "classes": ["a", "b"],
               "likelihood_matrix": [[[0.01, 0.99]] * n_tests + [[0.5, 0.5]],
                                     [[0.02, 0.98]] * n_tests + [[0.4, 0.6]]]}
    inst = compile_wire(payload)
    observations = [(t, 0) for t in range(n_tests)]
    a, b = Fraction(0.01) ** n_tests, Fraction(0.02) ** n_tests
    assert float(a) == 0.0 and float(b) == 0.0
    decision = engine.next_step(inst, observations, rules=StopRules(max_tests=1000))
    posterior = decision.belief.class_posterior
    expected_a = float(a / (a + b))  # (1/2)^200 / (1 + (1/2)^200)
    assert np.isfinite(posterior).all()
    assert posterior[inst.class_labels.index("a")] == pytest.approx(expected_a, rel=1e-9)
    assert decision.stop_reason in (None, StopReason.NO_INFORMATIVE_TEST)
    assert math.isfinite(decision.scores[n_tests])
