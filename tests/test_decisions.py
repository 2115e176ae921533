"""Decision instances: the region objectives against the naive reference, the decision toy
(examples/decision_toy), the stop rule ``decided`` and the decision the state reports."""

from __future__ import annotations

import random

import numpy as np
import pytest

from service import engine
from service.engine import StopReason, StopRules
from tests import reference_decisions as refd
from tests.builders import compile_wire

N_INSTANCES = 150


def toy(**extra) -> dict:
    """The decision toy: h1 accepts {A}, h2 {A, B}, h3 {B}; the cheap test separates h1 from
    {h2, h3}, only the dear one separates h2 from h3 (it puts h1 with h3)."""
    return {
        "tests": [{"id": "cheap", "cost": 1, "outcomes": ["a", "b"]},
                  {"id": "dear", "cost": 10, "outcomes": ["x", "y"]}],
        "decisions": ["A", "B"],
        "hypotheses": [
            {"id": "h1", "acceptable": ["A"], "outcomes": {"cheap": "a", "dear": "y"}},
            {"id": "h2", "acceptable": ["A", "B"], "outcomes": {"cheap": "b", "dear": "x"}},
            {"id": "h3", "acceptable": ["B"], "outcomes": {"cheap": "b", "dear": "y"}},
        ],
        **extra,
    }


def labelled(observations):
    return [(f"t{t}", f"o{k}") for t, k in observations]


def random_case(seed: int, kind: str):
    rng = random.Random(seed)
    model = refd.random_decision_model(rng, kind)
    truth = rng.randrange(model.base.n)
    tests = list(range(model.base.n_tests))
    rng.shuffle(tests)
    observations = [(t, refd.ref.sample_outcome(model.base, rng, truth, t)) for t in tests[: rng.randint(0, 2)]]
    return model, observations


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
@pytest.mark.parametrize("policy", ["hec", "direct"])
def test_region_objectives_agree_with_explicit_edge_lists(kind, policy):
    compared = 0
    for seed in range(N_INSTANCES):
        model, observations = random_case(seed, kind)
        inst = compile_wire(refd.to_payload(model))
        where = f"seed {seed}, {policy}, observations {observations}"
        try:
            parsed = engine.parse_observations(inst, labelled(observations))
            decision = engine.next_step(inst, parsed, policy)
        except engine.InconsistentObservation:
            continue
        reason, expected = refd.stop_or_scores(model, observations, policy)
        if reason is not None:
            assert decision.stop_reason == reason, where
            continue
        compared += 1
        for t, score in expected.items():
            # 1e-9 relative; the absolute floor only matters where the true gain is 0. On the
            # posterior a gain can be negative (as EffECXtive's): scores show it as 0.
            got, score = decision.scores[t], max(score, 0.0)
            assert abs(got - score) <= 1e-9 * score + 1e-12, f"{where}, test {t}: {got} vs {score}"
        if decision.next_test is not None:
            best = max(expected.values())
            assert expected[decision.next_test] >= best * (1 - 1e-8), where
    assert compared >= N_INSTANCES // 4, f"only {compared} instances were scored"


def test_hec_on_one_decision_per_hypothesis_ranks_tests_as_ec2_does():
    # Disjoint regions: hyperedges are pairs from different regions, which are EC²'s edges.
    rng = random.Random(5)
    for _ in range(20):
        model = refd.random_decision_model(rng, "deterministic")
        model.acceptable = [{min(a)} for a in model.acceptable]
        inst = compile_wire(refd.to_payload(model))
        hec = engine.next_step(inst, [], "hec")
        ec2 = engine.next_step(inst, [], "ec2")
        assert hec.next_test == ec2.next_test
        if not hec.done:
            informative = ec2.scores > 1e-12
            finite = hec.scores[informative] / ec2.scores[informative]
            assert np.allclose(finite, finite[0], rtol=1e-9)


def test_the_toy_hec_and_direct_ask_the_cheap_test_and_decide_b():
    inst = compile_wire(toy())
    for policy in ("hec", "direct"):
        first = engine.next_step(inst, [], policy)
        assert inst.test_ids[first.next_test] == "cheap"
        after = engine.next_step(inst, engine.parse_observations(inst, [("cheap", "b")]), policy)
        assert after.stop_reason == StopReason.DECIDED
        probability = engine.decision_posterior(after.belief)
        assert inst.decision_labels[engine.choose_decision(probability, None)] == "B"


def test_the_toy_ec2_on_the_reduction_must_separate_h2_from_h3():
    inst = compile_wire(toy())
    assert inst.class_labels == ("A", "B")  # h1, h2 → A (first acceptable); h3 → B
    after = engine.next_step(inst, engine.parse_observations(inst, [("cheap", "b")]), "ec2")
    assert inst.test_ids[after.next_test] == "dear"
    tree = engine.policy_tree(inst, engine.POLICIES["ec2"])
    assert engine.expected_cost(tree) >= 23 / 3 - 1e-12
    for policy in ("hec", "direct"):
        assert engine.expected_cost(engine.policy_tree(inst, engine.POLICIES[policy])) == pytest.approx(1.0)
    assert engine.optimal_decision_cost(inst) == pytest.approx(1.0)
    assert engine.optimal_expected_cost(inst) == pytest.approx(23 / 3)  # over the classes


def test_decision_policies_need_a_decision_instance():
    inst = compile_wire({"tests": [{"id": "t"}], "hypotheses": [
        {"id": "a", "outcomes": {"t": "0"}}, {"id": "b", "outcomes": {"t": "1"}}]})
    with pytest.raises(engine.PolicyNotApplicable):
        engine.next_step(inst, [], "hec")
    assert engine.resolve_policy(compile_wire(toy()), None).name == "hec"


def likelihood_toy(**extra) -> dict:
    """Two conditions on one noisy test; 'minor' accepts home, 'major' accepts hospital."""
    return {
        "tests": [{"id": "q", "outcomes": ["no", "yes"]}],
        "decisions": ["home", "hospital"],
        "hypotheses": [
            {"id": "minor", "prior": 0.7, "loss": {"home": 0, "hospital": 1},
             "likelihoods": {"q": {"no": 0.9, "yes": 0.1}}},
            {"id": "major", "prior": 0.3, "loss": {"home": 20, "hospital": 0},
             "likelihoods": {"q": {"no": 0.2, "yes": 0.8}}},
        ],
        **extra,
    }


def test_likelihood_decisions_stop_at_confidence_and_at_expected_loss():
    inst = compile_wire(likelihood_toy())
    belief = engine.observe(inst, [])
    np.testing.assert_allclose(engine.decision_posterior(belief), [0.7, 0.3])
    np.testing.assert_allclose(engine.expected_loss(belief), [0.3 * 20, 0.7 * 1])
    # The Bayes decision under these losses is hospital, though home is more probably acceptable.
    assert engine.choose_decision(engine.decision_posterior(belief), engine.expected_loss(belief)) == 1
    assert not engine.next_step(inst, [], "hec").done
    assert engine.next_step(inst, [], "hec", StopRules(confidence=0.7)).stop_reason == StopReason.DECIDED
    assert engine.next_step(inst, [], "hec", StopRules(max_expected_loss=0.7)).stop_reason == StopReason.DECIDED
    assert not engine.next_step(inst, [], "hec", StopRules(max_expected_loss=0.69)).done
    no = engine.parse_observations(inst, [("q", "no")])
    # P(minor | no) = 0.63 / 0.69 = 0.913 < 0.95: the only test is spent.
    assert engine.next_step(inst, no, "direct").stop_reason == StopReason.TESTS_EXHAUSTED


def test_losses_define_acceptable_decisions_within_the_tolerance():
    payload = likelihood_toy()
    payload["hypotheses"][0]["loss"] = {"home": 0, "hospital": 1}
    strict = compile_wire(payload)
    tolerant = compile_wire({**payload, "loss_tolerance": 1})
    minor = strict.hypothesis_ids.index("minor")
    assert strict.acceptable[minor].tolist() == [True, False]
    assert tolerant.acceptable[minor].tolist() == [True, True]
    assert strict.content_hash != tolerant.content_hash


def test_columnar_and_per_hypothesis_forms_compile_alike():
    payload = toy()
    columnar = {
        "tests": payload["tests"],
        "matrix": [[0, 1], [1, 0], [1, 1]],
        "hypothesis_ids": ["h1", "h2", "h3"],
        "decisions": ["A", "B"],
        "acceptable_matrix": [[1, 0], [1, 1], [0, 1]],
    }
    assert compile_wire(columnar).content_hash == compile_wire(payload).content_hash
    losses = {**columnar, "acceptable_matrix": None, "loss_matrix": [[0, 5], [1, 1], [3, 0]]}
    del losses["acceptable_matrix"]
    inst = compile_wire(losses)
    assert inst.acceptable.tolist() == [[True, False], [True, True], [False, True]]
    assert inst.loss is not None


def test_noisy_copies_keep_their_hypothesis_decisions():
    inst = compile_wire(toy(max_flips=1))
    for h, name in enumerate(inst.hypothesis_ids):
        origin = name.split("~")[0]
        expected = {"h1": [True, False], "h2": [True, True], "h3": [False, True]}[origin]
        assert inst.acceptable[h].tolist() == expected


@pytest.mark.parametrize("seed", range(40))
def test_the_optimum_over_decisions_matches_the_reference_and_no_policy_beats_it(seed):
    model = refd.random_decision_model(random.Random(1000 + seed), "deterministic")
    inst = compile_wire(refd.to_payload(model))
    optimum = engine.optimal_decision_cost(inst)
    assert optimum == pytest.approx(refd.optimal_cost(model), rel=1e-12, abs=1e-12)
    for name in ("hec", "direct", "ec2", "infogain", "gbs", "random"):
        cost = engine.expected_cost(engine.policy_tree(inst, engine.POLICIES[name]))
        assert optimum <= cost + 1e-9, name


# --- the wire contract --------------------------------------------------------------------------


def rejected_at(payload: dict) -> list[str]:
    from pydantic import ValidationError

    from schemas.instance import Instance, json_path
    with pytest.raises(ValidationError) as refused:
        Instance.model_validate(payload)
    return [json_path(error["loc"]) for error in refused.value.errors()]


def columnar_toy(**change) -> dict:
    payload = {"tests": toy()["tests"], "matrix": [[0, 1], [1, 0], [1, 1]], "decisions": ["A", "B"],
               "acceptable_matrix": [[1, 0], [1, 1], [0, 1]]}
    payload.update(change)
    return payload


def with_hypothesis(index: int, **change) -> dict:
    payload = toy()
    payload["hypotheses"][index] = {**payload["hypotheses"][index], **change}
    return payload


REJECTIONS = {
    "class beside decisions": (with_hypothesis(1, **{"class": "x"}), "hypotheses[1].class"),
    "unknown decision id": (with_hypothesis(2, acceptable=["B", "C"]), "hypotheses[2].acceptable[1]"),
    "no acceptable decision": (with_hypothesis(0, acceptable=[]), "hypotheses[0].acceptable"),
    "neither acceptable nor loss": (
        {**toy(), "hypotheses": [{k: v for k, v in h.items() if k != "acceptable"} if i == 1 else h
                                 for i, h in enumerate(toy()["hypotheses"])]}, "hypotheses[1].acceptable"),
    "both acceptable and loss": (with_hypothesis(0, loss={"A": 0, "B": 1}), "hypotheses[0].loss"),
    "unknown decision in loss": (
        {**toy(), "hypotheses": [{**{k: v for k, v in h.items() if k != "acceptable"},
                                  "loss": {"A": 0, "B": 1, **({"C": 2} if i == 2 else {})}}
                                 for i, h in enumerate(toy()["hypotheses"])]}, "hypotheses[2].loss.C"),
    "negative loss": (
        {**toy(), "hypotheses": [{**{k: v for k, v in h.items() if k != "acceptable"},
                                  "loss": {"A": -1 if i == 1 else 0, "B": 1}}
                                 for i, h in enumerate(toy()["hypotheses"])]}, "hypotheses[1].loss.A"),
    "missing loss": (
        {**toy(), "hypotheses": [{**{k: v for k, v in h.items() if k != "acceptable"},
                                  "loss": {"A": 0} if i == 0 else {"A": 0, "B": 1}}
                                 for i, h in enumerate(toy()["hypotheses"])]}, "hypotheses[0].loss.B"),
    "loss tolerance without losses": ({**toy(), "loss_tolerance": 1}, "loss_tolerance"),
    "duplicate decision": ({**toy(), "decisions": ["A", "B", "A"]}, "decisions[2]"),
    "acceptable without decisions": ({k: v for k, v in toy().items() if k != "decisions"}, "hypotheses[0].acceptable"),
    "classes beside decisions": (columnar_toy(classes=["a", "b", "c"]), "classes"),
    "both matrices": (columnar_toy(loss_matrix=[[0, 1], [0, 0], [1, 0]]), "loss_matrix"),
    "no matrix": ({k: v for k, v in columnar_toy().items() if k != "acceptable_matrix"}, "acceptable_matrix"),
    "not 0/1": (columnar_toy(acceptable_matrix=[[1, 0], [2, 1], [0, 1]]), "acceptable_matrix[1][0]"),
    "row accepting nothing": (columnar_toy(acceptable_matrix=[[1, 0], [0, 0], [0, 1]]), "acceptable_matrix[1]"),
    "ragged row": (columnar_toy(acceptable_matrix=[[1, 0], [1], [0, 1]]), "acceptable_matrix[1]"),
    "rows of the wrong number": (columnar_toy(acceptable_matrix=[[1, 0], [0, 1]]), "acceptable_matrix"),
    "matrices in the per-hypothesis form": ({**toy(), "acceptable_matrix": [[1, 0]]}, "acceptable_matrix"),
    "NaN in the loss matrix": (
        {**{k: v for k, v in columnar_toy().items() if k != "acceptable_matrix"},
         "loss_matrix": [[0, 1], [0, float("nan")], [1, 0]]}, "loss_matrix[1][1]"),
}


@pytest.mark.parametrize("payload,path", REJECTIONS.values(), ids=REJECTIONS.keys())
def test_every_decision_rejection_names_its_place(payload, path):
    assert path in rejected_at(payload)


def test_the_base_decision_payloads_are_valid():
    compile_wire(toy())
    compile_wire(columnar_toy())


# --- over HTTP ----------------------------------------------------------------------------------


def test_the_instance_summary_lists_the_decisions(client):
    summary = client.post("/v1/instances", json=toy()).get_json()
    assert summary["decisions"] == ["A", "B"] and summary["n_classes"] == 2
    plain = {"tests": [{"id": "t"}], "hypotheses": [{"id": "a", "outcomes": {"t": "0"}}]}
    assert "decisions" not in client.post("/v1/instances", json=plain).get_json()


def test_a_decision_session_reports_the_decision_and_stops_decided(client):
    created = client.post("/v1/sessions", json={"instance": toy()})
    assert created.status_code == 201
    state = created.get_json()
    assert state["policy"] == "hec" and state["next_test"]["id"] == "cheap"
    assert list(state["decision_posterior"]) == ["A", "B"]  # ties in decision order
    assert state["decision_posterior"] == pytest.approx({"A": 2 / 3, "B": 2 / 3})
    assert state["decision"] == {"id": "A", "probability": pytest.approx(2 / 3)}  # no losses: no expected_loss
    sid = state["session_id"]
    done = client.post(f"/v1/sessions/{sid}/observations", json={"test": "cheap", "outcome": "b"},
                       headers={"If-Match": '"1"'}).get_json()
    assert done["done"] and done["stop_reason"] == "decided"
    assert done["decision"] == {"id": "B", "probability": 1.0}
    assert done["decision_posterior"] == {"B": 1.0, "A": pytest.approx(0.5)}


def test_select_with_losses_reports_the_expected_loss_and_stops_at_max_expected_loss(client):
    body = {"instance": likelihood_toy(), "max_expected_loss": 0.7}
    state = client.post("/v1/select", json=body).get_json()
    assert state["done"] and state["stop_reason"] == "decided"
    assert state["decision"] == {"id": "hospital", "probability": pytest.approx(0.3),
                                 "expected_loss": pytest.approx(0.7)}
    going = client.post("/v1/select", json={"instance": likelihood_toy(), "policy": "direct"}).get_json()
    assert not going["done"] and going["next_test"]["id"] == "q"


def test_class_instances_keep_their_state_shape_and_refuse_decision_policies(client):
    payload = {"tests": [{"id": "t"}], "hypotheses": [{"id": "a", "outcomes": {"t": "0"}},
                                                       {"id": "b", "outcomes": {"t": "1"}}]}
    state = client.post("/v1/select", json={"instance": payload}).get_json()
    assert "decision" not in state and "decision_posterior" not in state
    refused = client.post("/v1/select", json={"instance": payload, "policy": "hec"})
    assert refused.status_code == 422 and refused.get_json()["type"].endswith("policy-not-applicable")


def test_max_expected_loss_without_losses_is_refused_and_stores_nothing(client):
    refused = client.post("/v1/sessions", json={"instance": toy(), "max_expected_loss": 1})
    assert refused.status_code == 422 and "losses" in refused.get_json()["detail"]
    assert client.post("/v1/instances", json=toy()).status_code == 201  # the inline instance was not kept


def test_a_session_keeps_max_expected_loss_in_both_stores(client):
    created = client.post("/v1/sessions", json={"instance": likelihood_toy(), "max_expected_loss": 0.5}).get_json()
    assert not created["done"]
    after = client.post(f"/v1/sessions/{created['session_id']}/observations",
                        json={"test": "q", "outcome": "no"}).get_json()
    # After 'no': E[loss(home)] = 20 · 0.06 / 0.69 = 1.74, E[loss(hospital)] = 0.63 / 0.69 = 0.91.
    assert after["stop_reason"] == "tests_exhausted"
    assert after["decision"]["id"] == "hospital"
    assert after["decision"]["expected_loss"] == pytest.approx(0.63 / 0.69)


def test_hec_work_past_the_cell_limit_is_refused_before_it_is_built():
    from schemas.instance import Instance
    # Patterns {A} (1 set), {A, B} (3), {B} (1): (1 + 5) × k = 3 powers × 2 tests × 2 outcomes = 72.
    instance = Instance.model_validate(toy())
    engine.compile_instance(instance, max_cells=72)
    with pytest.raises(engine.InstanceTooLarge, match="max_cells"):
        engine.compile_instance(instance, max_cells=71)


def test_indistinguishable_hypotheses_sharing_no_decision_are_warned_about():
    payload = toy()
    payload["hypotheses"][2]["outcomes"] = dict(payload["hypotheses"][0]["outcomes"])  # h3 answers as h1
    inst = compile_wire(payload)
    assert len(inst.warnings) == 1 and "'h1' (A), 'h3' (B)" in inst.warnings[0]
    payload["hypotheses"][2]["outcomes"] = dict(payload["hypotheses"][1]["outcomes"])  # h3 as h2: B suits both
    assert compile_wire(payload).warnings == ()


def test_the_codec_keeps_decisions_and_refuses_tampered_acceptance():
    from service.store import codec
    inst = compile_wire(likelihood_toy(loss_tolerance=1))
    header, body = codec.encode(inst)
    back = codec.decode(header, body, inst.content_hash)
    assert back.decision_labels == inst.decision_labels
    assert np.array_equal(back.acceptable, inst.acceptable) and np.array_equal(back.loss, inst.loss)
    assert back.content_hash == inst.content_hash
    tampered = bytearray(body)
    tampered[-1] ^= 1  # the last array is the acceptance matrix: a 1 becomes 0 or a 0 becomes 1
    with pytest.raises(codec.CorruptInstance):
        codec.decode(header, bytes(tampered), inst.content_hash)
    plain = compile_wire({"tests": [{"id": "t"}], "hypotheses": [{"id": "a", "outcomes": {"t": "0"}}]})
    assert b"decision_labels" not in codec.encode(plain)[0]  # class instances keep their header


def test_monte_carlo_accuracy_and_loss_are_those_of_the_reported_decisions():
    from service.evaluation import evaluate
    inst = compile_wire(likelihood_toy(tests=[{"id": "q", "outcomes": ["no", "yes"]},
                                              {"id": "r", "outcomes": ["no", "yes"], "cost": 2}],
                                       hypotheses=[
        {"id": "minor", "prior": 0.7, "loss": {"home": 0, "hospital": 1},
         "likelihoods": {"q": {"no": 0.9, "yes": 0.1}, "r": {"no": 0.7, "yes": 0.3}}},
        {"id": "major", "prior": 0.3, "loss": {"home": 20, "hospital": 0},
         "likelihoods": {"q": {"no": 0.2, "yes": 0.8}, "r": {"no": 0.1, "yes": 0.9}}}]))
    report = evaluate(inst, ["hec", "direct"], samples=300, seed=3)
    truths = np.random.default_rng(3).choice(inst.n_hypotheses, size=300, p=inst.prior)
    for result in report.policies:
        runs = [engine.run_policy(inst, h, engine.POLICIES[result.policy], seed=3, rng=np.random.default_rng([3, i]))
                for i, h in enumerate(truths.tolist())]
        chosen = np.array([r.decision for r in runs])
        assert result.accuracy == pytest.approx(inst.acceptable[truths, chosen].mean())
        assert result.expected_loss == pytest.approx(inst.loss[truths, chosen].mean())
        assert 0 < result.accuracy < 1


def test_http_tree_takes_max_expected_loss(client):
    instance_id = client.post("/v1/instances", json=likelihood_toy()).get_json()["instance_id"]
    url = f"/v1/instances/{instance_id}/tree"
    stopped = client.get(url, query_string={"max_expected_loss": "0.7"}).get_json()
    assert stopped["root"]["stop_reason"] == "decided" and stopped["root"]["decision"] == "hospital"
    assert client.get(url, query_string={"max_expected_loss": "0"}).status_code == 200
    assert client.get(url, query_string={"max_expected_loss": "-1"}).status_code == 400
