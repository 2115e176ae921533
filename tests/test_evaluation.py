"""Evaluation and export of policies (service/evaluation): the exact figures agree with brute
force, the optimum bounds every policy, the paper's two bad instances come out as the paper says,
and the exported trees are well-formed JSON (against their schema) and DOT."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pydot
import pytest

from service import engine
from service.app import create_app
from service.cli import main as cli_main
from service.evaluation import EvaluationLimitExceeded, EvaluationLimits, evaluate, format_tables
from service.evaluation import trees
from tests.builders import appendix, compile_wire, section3

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DETERMINISTIC_POLICIES = ("ec2", "effecxtive", "gbs", "infogain", "voi", "uncertainty", "random")


def example(name: str) -> engine.CompiledInstance:
    return compile_wire(json.loads((EXAMPLES / name / "instance.json").read_text()))


def random_instance(seed: int, n: int = 9, n_tests: int = 6, n_classes: int = 3, arity: int = 3) -> dict:
    """A small deterministic instance with a skewed prior and uneven costs."""
    rng = np.random.default_rng(seed)
    return {
        "tests": [{"id": f"t{j}", "cost": float(rng.integers(1, 6))} for j in range(n_tests)],
        "matrix": rng.integers(0, arity, size=(n, n_tests)).tolist(),
        "classes": [f"c{c}" for c in rng.integers(0, n_classes, size=n)],
        "priors": rng.dirichlet(np.ones(n)).tolist(),
    }


# --- exact evaluation agrees with brute force -----------------------------------------------


@pytest.mark.parametrize("source", ["triage", "seed-1", "seed-2", "seed-3"])
def test_tree_walk_equals_prior_weighted_simulation_of_every_hypothesis(source):
    inst = example(source) if not source.startswith("seed") else compile_wire(random_instance(int(source[5:])))
    policies = [*DETERMINISTIC_POLICIES, *(("hec", "direct") if inst.is_decision else ())]
    report = evaluate(inst, policies, optimum=False)
    for result in report.policies:
        policy = engine.resolve_policy(inst, result.policy)
        runs = [engine.run_policy(inst, h, policy) for h in range(inst.n_hypotheses)]
        cost = np.array([r.cost for r in runs])
        tests = np.array([len(r.observations) for r in runs])
        if inst.is_decision:  # triage: is the decision at the stop acceptable to the truth?
            right = np.array([inst.acceptable[h, r.decision] for h, r in enumerate(runs)])
            loss = np.array([inst.loss[h, r.decision] for h, r in enumerate(runs)])
            assert result.expected_loss == pytest.approx(inst.prior @ loss, rel=1e-12)
        else:
            right = np.array([inst.class_index[h] == r.final_class for h, r in enumerate(runs)])
        assert result.method == "exact"
        assert result.expected_cost == pytest.approx(inst.prior @ cost, rel=1e-12)
        assert result.expected_tests == pytest.approx(inst.prior @ tests, rel=1e-12)
        assert result.worst_case_cost == pytest.approx(cost[inst.prior > 0].max())
        assert result.accuracy == pytest.approx(inst.prior @ right)
        for c in result.per_class:
            members = inst.class_index == inst.class_labels.index(c.label)
            assert c.mean_cost == pytest.approx(inst.prior[members] @ cost[members] / inst.prior[members].sum())
            assert c.max_cost == pytest.approx(cost[members].max())
        assert sum(result.stop_reasons.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(8))
def test_the_optimum_is_never_above_any_policy_and_ec2_keeps_its_guarantee(seed):
    inst = compile_wire(random_instance(seed + 10))
    report = evaluate(inst, DETERMINISTIC_POLICIES)
    assert report.optimum is not None
    for result in report.policies:
        if result.determined_share == pytest.approx(1.0):  # a policy that gives up pays less
            assert result.expected_cost >= report.optimum - 1e-9, result.policy
    ec2 = next(r for r in report.policies if r.policy == "ec2")
    assert ec2.expected_cost <= report.ec2_bound * report.optimum + 1e-9
    assert report.ec2_bound == pytest.approx(2 * math.log(1 / inst.prior.min()) + 1)


def test_stopping_early_is_reported_with_its_reason_and_accuracy():
    inst = example("triage")
    report = evaluate(inst, ["ec2", "hec"], engine.StopRules(max_tests=3), optimum=False)
    ec2, hec = report.policies
    for result, settled in ((ec2, "determined"), (hec, "decided")):
        assert result.worst_case_tests == 3
        assert 0 < result.stop_reasons["max_tests"] < 1
        assert result.stop_reasons[settled] + result.stop_reasons["max_tests"] == pytest.approx(1.0)
        assert result.accuracy < 1.0 and result.expected_loss > 0


# --- the paper's bad instances -----------------------------------------------------------------
#
# The engine breaks ties by taking the earliest test. On section 3's instance every test t whose
# h_t is still alive has the same GBS gain (it splits off one hypothesis), so GBS runs t_1, t_2, …
# in order: truth h_t (t < n) is found after t tests; once h_1..h_{n-2} are ruled out the version
# space {h_{n-1}, h_n} needs t_{n-1} (tie with t_n, earliest wins), so h_{n-1} and h_n both cost
# n-1.  E[GBS] = (1/n)(Σ_{t<n} t + (n-1)) = (n-1)(n+2)/(2n) ≈ n/2, while t_n alone settles the
# class: OPT = 1.  The appendix's instance gives the same sum over its 2^q classes: t0 and the
# bit tests leave the class posterior unchanged, so a posterior-based policy walks seq_1, seq_2, …
# and pays (K-1)(K+2)/(2K) ≈ 2^q/2 with K = 2^q, against q + 1 for t0 then binary search.


def sequential_search_cost(k: int) -> float:
    return (k - 1) * (k + 2) / (2 * k)


@pytest.mark.parametrize("n", [6, 12])
def test_gbs_pays_about_n_over_2_where_ec2_pays_the_optimum_1(n):
    report = evaluate(compile_wire(section3(n)), ["ec2", "gbs"])
    ec2, gbs = report.policies
    assert report.optimum == pytest.approx(1.0)
    assert ec2.expected_cost == pytest.approx(1.0) and ec2.ratio_to_optimum == pytest.approx(1.0)
    assert gbs.expected_cost == pytest.approx(sequential_search_cost(n))
    assert gbs.worst_case_cost == n - 1
    assert report.ec2_bound == pytest.approx(2 * math.log(n) + 1)
    if n == 12:  # by n = 12 GBS is beyond even the factor EC² is guaranteed
        assert gbs.ratio_to_optimum > report.ec2_bound


def test_information_gain_pays_about_2_to_the_q_over_2_where_ec2_pays_q_plus_1():
    q = 3
    report = evaluate(compile_wire(appendix(q, dummies=1)), ["ec2", "infogain", "voi"])
    ec2, infogain, voi = report.policies
    assert ec2.expected_cost == pytest.approx(q + 1)  # t0, then one bit test per level
    assert infogain.expected_cost == pytest.approx(sequential_search_cost(2**q))
    assert voi.expected_cost == pytest.approx(sequential_search_cost(2**q))
    # The paper's π' (t0 then binary search) costs q + 1, so OPT ≤ q + 1; EC² is within its bound.
    assert report.optimum <= q + 1 + 1e-9
    assert ec2.expected_cost <= report.ec2_bound * report.optimum


def test_information_gain_falls_further_behind_as_q_grows():
    q = 4  # the optimum takes a minute at this size: compare with the paper's π' instead
    report = evaluate(compile_wire(appendix(q, dummies=1)), ["ec2", "infogain"], optimum=False)
    ec2, infogain = report.policies
    assert ec2.expected_cost == pytest.approx(q + 1)
    assert infogain.expected_cost == pytest.approx(sequential_search_cost(2**q))  # 8.4375
    assert report.optimum is None and report.optimum_note == "not computed"


# --- Monte Carlo ------------------------------------------------------------------------------


def test_monte_carlo_is_reproducible_for_a_seed_and_matches_run_policy():
    inst = example("noisy")
    first = evaluate(inst, ["effecxtive", "gbs"], samples=150, seed=7)
    again = evaluate(inst, ["effecxtive", "gbs"], samples=150, seed=7)
    other = evaluate(inst, ["effecxtive", "gbs"], samples=150, seed=8)
    strip = lambda r: {**r.to_dict(), "elapsed_seconds": 0}  # noqa: E731
    assert strip(first) == strip(again)
    assert strip(first) != strip(other)
    # A policy's figures do not depend on which other policies are evaluated with it.
    alone = evaluate(inst, ["gbs"], samples=150, seed=7).policies[0]
    assert alone == first.policies[1]
    # Sample i: truth drawn from the prior with default_rng(seed), answers from default_rng([seed, i]).
    truths = np.random.default_rng(7).choice(inst.n_hypotheses, size=150, p=inst.prior)
    policy = engine.resolve_policy(inst, "gbs")
    costs = [engine.run_policy(inst, int(h), policy, rng=np.random.default_rng([7, i])).cost
             for i, h in enumerate(truths)]
    assert alone.expected_cost == pytest.approx(np.mean(costs))


def test_monte_carlo_reports_intervals_accuracy_and_the_accuracy_curve():
    inst = example("noisy")
    (result,) = evaluate(inst, ["effecxtive"], samples=300, seed=1).policies
    assert result.method == "monte_carlo" and result.samples == 300
    low, high = result.expected_cost_ci
    assert low < result.expected_cost < high
    assert result.accuracy_ci[0] <= result.accuracy <= result.accuracy_ci[1]
    curve = result.accuracy_by_tests
    assert curve[0] == pytest.approx(max(np.bincount(inst.class_index, inst.prior)), abs=0.1)
    assert curve[-1] == pytest.approx(result.accuracy)
    assert result.stop_reasons.get("confidence_reached", 0) > 0.5
    assert "± is a 95 % interval" in format_tables(evaluate(inst, ["gbs"], samples=20))


def test_limits_refuse_with_a_message_naming_the_limit():
    inst = example("noisy")
    with pytest.raises(EvaluationLimitExceeded, match="max_samples"):
        evaluate(inst, ["gbs"], samples=101, limits=EvaluationLimits(max_samples=100))
    with pytest.raises(EvaluationLimitExceeded, match="time_limit"):
        evaluate(inst, ["gbs"], samples=100, limits=EvaluationLimits(time_limit=0.0))
    with pytest.raises(engine.InfeasibleComputation, match="deterministic"):
        evaluate(inst, ["gbs"], method="exact")
    with pytest.raises(engine.PolicyNotApplicable):
        evaluate(inst, ["ec2"])


# --- tree export ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema_validator():
    schema = trees.tree_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("name,policy", [("triage", "ec2"), ("triage", "hec"), ("gbs_bad", "gbs"), ("noisy", None)])
def test_the_json_tree_validates_against_its_schema(schema_validator, name, policy):
    inst = example(name)
    document = json.loads(trees.export_tree(inst, policy, "json"))
    schema_validator.validate(document)
    leaves, stack = [], [document["root"]]
    while stack:
        node = stack.pop()
        if "branches" in node:
            assert sum(b["probability"] for b in node["branches"]) == pytest.approx(1.0)
            stack.extend(b["node"] for b in node["branches"])
        else:
            leaves.append(node)
    assert sum(leaf["probability"] for leaf in leaves) == pytest.approx(1.0)
    assert document["summary"]["leaves"] == len(leaves)
    if inst.kind == "likelihood":
        assert document["truncated_at_depth"] == trees.TreeLimits.max_depth
        assert any(leaf["truncated"] for leaf in leaves)


def test_decision_trees_label_their_leaves_with_an_acceptable_decision():
    inst = example("triage")
    document = json.loads(trees.export_tree(inst, "hec", "json"))
    assert document["instance"]["decisions"] == list(inst.decision_labels)
    stack, leaves = [document["root"]], []
    while stack:
        node = stack.pop()
        assert node["decision"] in inst.decision_labels
        if "branches" in node:
            stack.extend(b["node"] for b in node["branches"])
        else:
            leaves.append(node)
    for leaf in leaves:
        alive = [inst.hypothesis_ids.index(h) for h in leaf["hypotheses"]]
        d = inst.decision_labels.index(leaf["decision"])
        assert leaf["stop_reason"] == "decided" and inst.acceptable[alive, d].all()
        assert leaf["decision_posterior"][leaf["decision"]] == pytest.approx(1.0)
    dot = trees.export_tree(inst, "hec", "dot").decode()
    assert all(f'label="{leaf["decision"]}' in dot for leaf in leaves)


def test_the_schema_rejects_a_malformed_tree(schema_validator):
    document = json.loads(trees.export_tree(example("triage"), "ec2", "json"))
    del document["root"]["branches"]  # an internal node without branches is neither kind
    with pytest.raises(jsonschema.ValidationError):
        schema_validator.validate(document)


def test_the_triage_tree_leaves_carry_class_mass_and_path_cost():
    inst = example("triage")
    document = json.loads(trees.export_tree(inst, "ec2", "json"))
    summary = document["summary"]
    assert summary["expected_cost"] == pytest.approx(evaluate(inst, ["ec2"], optimum=False).policies[0].expected_cost)
    root = document["root"]
    assert root["cost"] == 0 and root["probability"] == 1
    first = root["branches"][0]["node"]
    assert first["cost"] == root["test_cost"]


AWKWARD = {  # labels that break naive DOT: quotes, backslashes, newlines, braces, unicode
    "tests": [{"id": 'say "hi"', "outcomes": ["a\\b", "c;d"]}, {"id": "x{1}", "cost": 2}],
    "hypotheses": [
        {"id": "h1", "class": "self-care", "outcomes": {'say "hi"': "a\\b", "x{1}": "0"}},
        {"id": "h2", "class": "émergence\n2", "outcomes": {'say "hi"': "c;d", "x{1}": "1"}},
        {"id": "h3", "class": "self-care", "outcomes": {'say "hi"': "c;d", "x{1}": "0"}},
    ],
}


@pytest.mark.parametrize("name", ["triage", "noisy", "awkward"])
def test_the_dot_output_parses(name):
    inst = compile_wire(AWKWARD) if name == "awkward" else example(name)
    text = trees.export_tree(inst, None, "dot").decode()
    graphs = pydot.graph_from_dot_data(text)
    assert graphs and len(graphs) == 1
    graph = graphs[0]
    document = json.loads(trees.export_tree(inst, None, "json"))
    assert len(graph.get_nodes()) - sum(1 for n in graph.get_nodes() if n.get_name() in ("node", "graph", "edge")) \
        == document["summary"]["nodes"]
    assert len(graph.get_edges()) == document["summary"]["nodes"] - 1
    if name == "awkward":
        labels = [n.get_label() for n in graph.get_nodes() if n.get_label()]
        assert any('say \\"hi\\"' in label for label in labels)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed (apt-get install graphviz)")
@pytest.mark.parametrize("fmt,magic", [("svg", b"<svg"), ("png", b"\x89PNG")])
def test_graphviz_renders_svg_and_png(fmt, magic):
    data = trees.export_tree(compile_wire(AWKWARD), "ec2", fmt)
    assert magic in data[:400]


def test_a_missing_graphviz_is_said_plainly(monkeypatch):
    monkeypatch.setattr(trees.shutil, "which", lambda name: None)
    with pytest.raises(trees.GraphvizMissing, match="apt-get install graphviz"):
        trees.export_tree(example("triage"), "ec2", "svg")
    assert trees.export_tree(example("triage"), "ec2", "dot").startswith(b"digraph")


def test_tree_size_limits_refuse_with_a_clear_error():
    with pytest.raises(trees.TreeTooLarge, match="max_nodes"):
        trees.export_tree(example("triage"), "ec2", "json", limits=trees.TreeLimits(max_nodes=5))
    shallow = json.loads(trees.export_tree(example("noisy"), None, "json", depth=2))
    assert shallow["summary"]["depth"] == 2 and shallow["truncated_at_depth"] == 2
    with pytest.raises(ValueError, match="unknown tree format"):
        trees.export_tree(example("triage"), "ec2", "pdf")


# --- command line -----------------------------------------------------------------------------


def test_cli_evaluate_prints_a_table_json_and_writes_a_plot(tmp_path, capsys):
    instance = str(EXAMPLES / "gbs_bad" / "instance.json")
    assert cli_main(["evaluate", instance, "--policies", "ec2,gbs", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "optimum OPT = 1" in table and "6.417" in table
    plot = tmp_path / "plot.png"
    assert cli_main(["evaluate", instance, "--policies", "ec2,gbs", "--format", "json",
                     "--plot", str(plot), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["policy"] for p in report["policies"]] == ["ec2", "gbs"]
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_cli_tree_writes_the_format_of_the_suffix_and_reports_errors(tmp_path, capsys):
    instance = str(EXAMPLES / "triage" / "instance.json")
    out = tmp_path / "tree.dot"
    assert cli_main(["tree", instance, "--policy", "ec2", "-o", str(out)]) == 0
    assert out.read_text().startswith("digraph")
    assert cli_main(["tree", instance, "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text('{"tests": [{"id": "a", "cost": -1}], "matrix": [[0]], "classes": ["x"]}')
    assert cli_main(["evaluate", str(broken)]) == 2
    assert "tests[0].cost" in capsys.readouterr().err


# --- HTTP ---------------------------------------------------------------------------------------


def post_instance(client, name: str) -> str:
    response = client.post("/v1/instances", json=json.loads((EXAMPLES / name / "instance.json").read_text()))
    assert response.status_code in (200, 201)
    return response.get_json()["instance_id"]


def test_http_evaluate_answers_the_report(client):
    instance_id = post_instance(client, "gbs_bad")
    response = client.post(f"/v1/instances/{instance_id}/evaluate", json={"policies": ["ec2", "gbs"]})
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["instance_id"] == instance_id and body["optimum"] == pytest.approx(1.0)
    ec2, gbs = body["policies"]
    assert gbs["expected_cost"] == pytest.approx(sequential_search_cost(12))
    assert ec2["determined_share"] == pytest.approx(1.0)


def test_http_evaluate_is_seeded_and_refuses_past_its_limits(client):
    instance_id = post_instance(client, "noisy")
    url = f"/v1/instances/{instance_id}/evaluate"
    first = client.post(url, json={"policies": ["gbs"], "samples": 50, "seed": 3}).get_json()
    again = client.post(url, json={"policies": ["gbs"], "samples": 50, "seed": 3}).get_json()
    assert first["policies"] == again["policies"]
    too_many = client.post(url, json={"policies": ["gbs"], "samples": 10**9})
    assert too_many.status_code == 422
    assert too_many.get_json()["type"].endswith("evaluation-limit")
    assert "max_samples" in too_many.get_json()["detail"]
    assert client.post(url, json={"policies": ["ec2"]}).status_code == 422  # needs deterministic
    assert client.post(url, json={"policies": []}).status_code == 422
    assert client.post("/v1/instances/" + "0" * 64 + "/evaluate", json={}).status_code == 404


def test_http_evaluate_stops_at_the_time_limit(app_config):
    client = create_app({**app_config, "evaluation_time_limit": 0.0}).test_client()
    instance_id = post_instance(client, "noisy")
    response = client.post(f"/v1/instances/{instance_id}/evaluate", json={"policies": ["gbs"], "samples": 100})
    assert response.status_code == 422 and "time_limit" in response.get_json()["detail"]


def test_http_tree_in_each_format_with_size_limits(client, app_config, monkeypatch, schema_validator):
    instance_id = post_instance(client, "triage")
    url = f"/v1/instances/{instance_id}/tree"
    document = client.get(url + "?policy=ec2&format=json")
    assert document.status_code == 200 and document.mimetype == "application/json"
    schema_validator.validate(document.get_json())
    dot = client.get(url + "?policy=ec2&format=dot")
    assert dot.mimetype == "text/vnd.graphviz" and pydot.graph_from_dot_data(dot.get_data(as_text=True))
    assert client.get(url + "?format=pdf").status_code == 400
    assert client.get(url + "?policy=nope").status_code == 422
    small_trees = create_app({**app_config, "tree_max_nodes": 5}).test_client()
    post_instance(small_trees, "triage")
    too_big = small_trees.get(url + "?policy=ec2")
    assert too_big.status_code == 422 and too_big.get_json()["type"].endswith("tree-too-large")
    monkeypatch.setattr(trees.shutil, "which", lambda name: None)
    missing = client.get(url + "?policy=ec2&format=svg&max_tests=1")
    assert missing.status_code == 501 and "apt-get install graphviz" in missing.get_json()["detail"]
