"""Item banks: the compiled likelihoods against the IRT formulas written out here, the θ grid and
its levels, every refusal with its path, the θ estimate in a session's state, and max_se."""

from __future__ import annotations

import copy
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.instance import Instance, json_path
from service import engine
from service.store import codec

from api_support import PROBLEM, TRIAGE

BANK = {"item_bank": {
    "items": [
        {"id": "i1", "model": "3PL", "a": 1.2, "b": -0.5, "c": 0.2, "content_area": "algebra"},
        {"id": "i2", "model": "GRM", "a": 1.0, "thresholds": [-1, 0, 1]},
        {"id": "i3", "model": "2PL", "a": 0.7, "b": 0.9},
        {"id": "i4", "model": "1PL", "b": 0.3},
        {"id": "i5", "model": "GPCM", "a": 1.3, "thresholds": [0.4, -0.6]},
    ],
    "prior": {"mean": 0, "sd": 1},
    "cut_scores": [-0.5, 0.8],
    "levels": ["basic", "proficient", "advanced"],
}}


# --- The formulas, written from their definitions, one θ at a time -------------------------

def p_3pl(theta, a, b, c, d=1.0):
    return c + (1 - c) / (1 + math.exp(-d * a * (theta - b)))


def p_grm(theta, a, thresholds, d=1.0):
    star = [1.0] + [1 / (1 + math.exp(-d * a * (theta - t))) for t in thresholds] + [0.0]
    return [star[k] - star[k + 1] for k in range(len(thresholds) + 1)]


def p_gpcm(theta, a, thresholds, d=1.0):
    numerators = [math.exp(sum(d * a * (theta - t) for t in thresholds[:k])) for k in range(len(thresholds) + 1)]
    return [x / sum(numerators) for x in numerators]


def naive_row(item, theta, d=1.0):
    model = item["model"]
    if model in ("1PL", "2PL", "3PL"):
        right = p_3pl(theta, item.get("a", 1.0), item["b"], item.get("c", 0.0), d)
        return [1 - right, right]
    return (p_grm if model == "GRM" else p_gpcm)(theta, item["a"], item["thresholds"], d)


def compiled(body=BANK, grid_points=61):
    return engine.compile_instance(Instance.model_validate(body), grid_points=grid_points)


@pytest.mark.parametrize("scaling", [1.0, 1.702])
def test_likelihoods_are_the_irt_probabilities_at_each_grid_point(scaling):
    body = copy.deepcopy(BANK)
    body["item_bank"]["scaling"] = scaling
    inst = compiled(body, grid_points=21)
    items = body["item_bank"]["items"]
    assert inst.kind == "likelihood" and inst.n_hypotheses == 21 and inst.test_ids == tuple(i["id"] for i in items)
    assert inst.outcome_labels == (("0", "1"), ("0", "1", "2", "3"), ("0", "1"), ("0", "1"), ("0", "1", "2"))
    for h, theta in enumerate(inst.theta):
        for t, item in enumerate(items):
            row = naive_row(item, float(theta), scaling)
            assert inst.likelihood[h, t, :len(row)] == pytest.approx(row, abs=1e-12)
            assert not inst.likelihood[h, t, len(row):].any()


def test_known_points():
    # At θ = b a 3PL item is right with (1 + c)/2; a GRM item with thresholds symmetric about θ
    # splits its outer outcomes equally; a GPCM item with equal steps at θ gives each outcome 1/(m+1).
    body = {"item_bank": {"items": [{"id": "x", "model": "3PL", "a": 2.0, "b": 0.0, "c": 0.2},
                                    {"id": "g", "model": "GRM", "a": 1.5, "thresholds": [-1, 1]},
                                    {"id": "p", "model": "GPCM", "a": 1.0, "thresholds": [0, 0, 0]}],
                          "prior": {"grid": [-1.0, 0.0, 1.0], "weights": [1, 2, 1]}}}
    inst = compiled(body)
    middle = list(inst.theta).index(0.0)
    assert inst.likelihood[middle, 0, :2] == pytest.approx([0.4, 0.6])
    grm = inst.likelihood[middle, 1, :3]
    assert grm[0] == pytest.approx(grm[2]) and grm.sum() == pytest.approx(1.0)
    assert inst.likelihood[middle, 2, :4] == pytest.approx([0.25] * 4)


def test_grid_prior_classes_and_ids():
    inst = compiled(grid_points=9)
    theta = np.linspace(-4, 4, 9)
    assert inst.theta.tolist() == pytest.approx(theta.tolist())
    density = np.exp(-theta ** 2 / 2)
    assert inst.prior == pytest.approx(density / density.sum())
    # A θ at a cut belongs to the level above it.
    levels = ["basic" if x < -0.5 else "proficient" if x < 0.8 else "advanced" for x in theta]
    assert [inst.class_labels[c] for c in inst.class_index] == levels
    assert inst.hypothesis_ids[4] == "theta=0"


def test_theta_estimation_without_cut_scores_and_a_given_grid():
    body = copy.deepcopy(BANK)
    del body["item_bank"]["cut_scores"], body["item_bank"]["levels"]
    body["item_bank"]["prior"] = {"grid": [-2, -0.5, 0.8, 2.5], "weights": [1, 3, 0, 2]}
    inst = compiled(body)
    assert inst.n_classes == 4 and inst.class_labels == inst.hypothesis_ids
    assert inst.prior.tolist() == pytest.approx([1 / 6, 3 / 6, 0, 2 / 6])


def test_same_content_same_id_and_the_grid_is_part_of_it():
    assert compiled().content_hash == compiled(copy.deepcopy(BANK)).content_hash
    assert compiled(grid_points=31).content_hash != compiled().content_hash
    inst = compiled()
    decoded = codec.decode(*codec.encode(inst), inst.content_hash)
    assert decoded.theta.tolist() == inst.theta.tolist()
    assert engine.CompiledInstance(**{f: getattr(decoded, f) for f in (
        "test_ids", "outcome_labels", "costs", "hypothesis_ids", "class_labels", "class_index", "prior",
        "likelihood", "theta")}).content_hash == inst.content_hash


@pytest.mark.parametrize("cut", ["0.8", "-2.4", "0.4", "1.2", "-0.4", "2.8", "-0.5", "0.05", "3.9"])
def test_a_grid_point_on_a_cut_score_is_in_the_level_above(cut):
    # By exact arithmetic: the default grid's points are -4 + k·(8/60), and the cut is the decimal
    # the client wrote; a point at the cut counts in the level above (docs/item-banks.md).
    body = copy.deepcopy(BANK)
    body["item_bank"].update(cut_scores=[float(cut)], levels=["below", "above"])
    inst = compiled(body)
    exact = [Fraction(-4) + Fraction(8, 60) * k for k in range(61)]
    expected = ["above" if x >= Fraction(cut) else "below" for x in exact]
    assert [inst.class_labels[c] for c in inst.class_index] == expected


def test_a_level_without_a_grid_point_is_a_warning():
    body = copy.deepcopy(BANK)
    body["item_bank"]["cut_scores"] = [0.01, 0.02]
    inst = compiled(body, grid_points=9)
    assert any("'proficient' holds no θ grid point" in w for w in inst.warnings)


# --- Every rule a 422 with its path ---------------------------------------------------------

def _with(change):
    body = copy.deepcopy(BANK)
    change(body["item_bank"])
    return body


RULES = [
    ("item_bank.items[0].a", lambda b: b["items"][0].update(a=0)),
    ("item_bank.items[0].a", lambda b: b["items"][0].update(a=-1.5)),
    ("item_bank.items[0].c", lambda b: b["items"][0].update(c=1)),
    ("item_bank.items[0].c", lambda b: b["items"][0].update(c=-0.1)),
    ("item_bank.items[0].c", lambda b: b["items"][0].pop("c")),
    ("item_bank.items[2].c", lambda b: b["items"][2].update(c=0.1)),
    ("item_bank.items[3].a", lambda b: b["items"][3].update(a=1.0)),
    ("item_bank.items[2].b", lambda b: b["items"][2].pop("b")),
    ("item_bank.items[1].thresholds[2]", lambda b: b["items"][1].update(thresholds=[-1, 1, 0])),
    ("item_bank.items[1].thresholds[1]", lambda b: b["items"][1].update(thresholds=[0, 0])),
    ("item_bank.items[1].thresholds", lambda b: b["items"][1].update(thresholds=[])),
    ("item_bank.items[1].b", lambda b: b["items"][1].update(b=0.0)),
    ("item_bank.items[4].a", lambda b: b["items"][4].pop("a")),
    ("item_bank.items[4].id", lambda b: b["items"][4].update(id="i1")),
    ("item_bank.items[0].model", lambda b: b["items"][0].update(model="4PL")),
    ("item_bank.items", lambda b: b.update(items=[])),
    ("item_bank.levels", lambda b: b.update(levels=["low", "high"])),
    ("item_bank.levels[1]", lambda b: b.update(levels=["low", "low", "high"])),
    ("item_bank.levels", lambda b: b.pop("cut_scores")),
    ("item_bank.cut_scores[1]", lambda b: b.update(cut_scores=[0.8, -0.5])),
    ("item_bank.cut_scores[1]", lambda b: b.update(cut_scores=[0.5, 0.5])),
    ("item_bank.cut_scores[1]", lambda b: b.update(cut_scores=[0.5, 4.5])),
    ("item_bank.cut_scores", lambda b: b.update(cut_scores=[], levels=["all"])),
    ("item_bank.scaling", lambda b: b.update(scaling=0)),
    ("item_bank.scaling", lambda b: b.update(scaling=1e7)),
    ("item_bank.items[0].a", lambda b: b["items"][0].update(a=1e7)),
    ("item_bank.items[2].b", lambda b: b["items"][2].update(b=-1e300)),
    ("item_bank.items[4].thresholds[0]", lambda b: b["items"][4].update(thresholds=[1e300, -1e300])),
    ("item_bank.prior.sd", lambda b: b.update(prior={"mean": 0, "sd": 0})),
    # Numbers whose grid would collapse to one point or overflow.
    ("item_bank.prior.mean", lambda b: b.update(prior={"mean": 1e308, "sd": 1}, cut_scores=None, levels=None)),
    ("item_bank.prior.sd", lambda b: b.update(prior={"mean": 0, "sd": 1e308})),
    ("item_bank.prior.sd", lambda b: b.update(prior={"mean": 1e6, "sd": 1e-12}, cut_scores=None, levels=None)),
    ("item_bank.prior.grid[1]", lambda b: b.update(prior={"grid": [0, 1e300], "weights": [1, 1]}, cut_scores=None,
                                                   levels=None)),
    ("item_bank.cut_scores[0]", lambda b: b.update(prior={"grid": [-1, 1], "weights": [1, 1]}, cut_scores=[-1e300],
                                                   levels=None)),
    ("item_bank.prior", lambda b: b.update(prior={"mean": 0, "sd": 1, "grid": [0, 1], "weights": [1, 1]})),
    ("item_bank.prior.weights", lambda b: b.update(prior={"grid": [-1, 0, 1], "weights": [1, 1]})),
    ("item_bank.prior.grid[2]", lambda b: b.update(prior={"grid": [-1, 1, 0], "weights": [1, 1, 1]})),
    ("item_bank.prior.weights[1]", lambda b: b.update(prior={"grid": [-1, 0, 1], "weights": [1, -1, 1]})),
    ("item_bank.prior.weights[1]", lambda b: b.update(prior={"grid": [-1, 0, 1], "weights": [1, 1e-12, 1]})),
    ("item_bank.prior.weights", lambda b: b.update(prior={"grid": [-1, 0, 1], "weights": [0, 0, 0]})),
    ("item_bank.items[0].exposure_parameter", lambda b: b["items"][0].update(exposure_parameter=0)),
    ("item_bank.items[2].exposure_parameter", lambda b: b["items"][2].update(exposure_parameter=1.5)),
    ("item_bank.enemies[0][1]", lambda b: b.update(enemies=[["i1", "nobody"]])),
    ("item_bank.enemies[1]", lambda b: b.update(enemies=[["i1", "i2"], ["i3", "i3"]])),
    ("item_bank.items[1].content_area", lambda b: b.update(content_balance={"targets": {"algebra": 1}})),
    ("item_bank.content_balance.targets", lambda b: [i.update(content_area="algebra") for i in b["items"]]
     and b.update(content_balance={"targets": {"algebra": 0.5}})),
    ("item_bank.content_balance.max.algebra", lambda b: [i.update(content_area="algebra") for i in b["items"]]
     and b.update(content_balance={"targets": {"algebra": 1}, "min": {"algebra": 3}, "max": {"algebra": 2}})),
    ("item_bank.content_balance.min.geometry", lambda b: [i.update(content_area="algebra") for i in b["items"]]
     and b.update(content_balance={"targets": {"algebra": 1}, "min": {"geometry": 1}})),
]


@pytest.mark.parametrize("path, change", RULES)
def test_every_rule_is_refused_at_its_path(path, change):
    with pytest.raises(ValidationError) as raised:
        Instance.model_validate(_with(change))
    assert path in {json_path(tuple(e["loc"])) for e in raised.value.errors()}


# Numbers from the whole float range, the scale's edges included.
EXTREME = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e6, -1e6, 1e-6, 5e-324, 0.0]),
                    st.floats(-10, 10))


@st.composite
def extreme_banks(draw):
    items = []
    for j in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(["1PL", "2PL", "3PL", "GRM", "GPCM"]))
        item = {"id": f"i{j}", "model": model}
        if model != "1PL":
            item["a"] = draw(EXTREME)
        if model in ("GRM", "GPCM"):
            item["thresholds"] = sorted(draw(st.lists(EXTREME, min_size=1, max_size=3)))
        else:
            item["b"] = draw(EXTREME)
        if model == "3PL":
            item["c"] = draw(st.floats(0, 0.99))
        items.append(item)
    if draw(st.booleans()):
        prior = {"mean": draw(EXTREME), "sd": draw(EXTREME)}
    else:
        grid = sorted(set(draw(st.lists(EXTREME, min_size=2, max_size=4))))
        prior = {"grid": grid, "weights": [1.0] * len(grid)}
    bank = {"items": items, "prior": prior, "scaling": draw(st.sampled_from([1.0, 1.702, 1e6]))}
    if draw(st.booleans()):
        bank["cut_scores"] = [draw(EXTREME)]
    return {"item_bank": bank}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(extreme_banks())
def test_every_accepted_bank_compiles_to_finite_likelihoods(body):
    # Refused at a path, or compiled: an accepted bank never fails later (a 500 to the client).
    try:
        instance = Instance.model_validate(body)
    except ValidationError:
        return
    inst = engine.compile_instance(instance, grid_points=61)
    likelihood = inst.likelihood
    assert np.isfinite(likelihood).all() and (likelihood >= 0).all()
    assert len(set(inst.hypothesis_ids)) == inst.n_hypotheses


def test_an_item_bank_takes_no_other_form():
    body = copy.deepcopy(BANK)
    body["tests"] = TRIAGE["tests"]
    with pytest.raises(ValidationError) as raised:
        Instance.model_validate(body)
    assert "tests" in {json_path(tuple(e["loc"])) for e in raised.value.errors()}
    with pytest.raises(ValidationError) as raised:
        Instance.model_validate({"hypotheses": TRIAGE["hypotheses"]})
    assert "tests" in {json_path(tuple(e["loc"])) for e in raised.value.errors()}


def test_rules_over_http_are_422_with_paths_and_store_nothing(client):
    response = client.post("/v1/instances", json=_with(lambda b: b["items"][0].update(a=0, c=1)))
    assert response.status_code == 422 and response.mimetype == PROBLEM
    paths = {e["path"] for e in response.get_json()["errors"]}
    assert {"item_bank.items[0].a", "item_bank.items[0].c"} <= paths
    assert client.get("/v1/instances").get_json()["items"] == []


# --- The θ estimate in the state, and max_se -------------------------------------------------

def naive_posterior(answers, grid_points=61):
    theta = np.linspace(-4, 4, grid_points)
    weights = np.exp(-theta ** 2 / 2)
    items = {i["id"]: i for i in BANK["item_bank"]["items"]}
    for test, outcome in answers:
        weights = weights * np.array([naive_row(items[test], float(x))[int(outcome)] for x in theta])
    weights = weights / weights.sum()
    eap = float((weights * theta).sum())
    return theta, weights, eap, math.sqrt(float((weights * (theta - eap) ** 2).sum()))


def test_state_carries_eap_and_sd_of_theta(client):
    created = client.post("/v1/instances", json=BANK)
    assert created.status_code == 201
    instance_id = created.get_json()["instance_id"]
    session = client.post("/v1/sessions", json={"instance_id": instance_id, "max_tests": 4})
    assert session.status_code == 201
    state = session.get_json()
    _, _, eap, sd = naive_posterior([])
    assert state["theta"] == pytest.approx({"eap": eap, "sd": sd}, abs=1e-9)
    answers = [("i1", "1"), ("i2", "3"), ("i5", "0")]
    url = f"/v1/sessions/{state['session_id']}/observations"
    state = client.post(url, json={"observations": [{"test": t, "outcome": o} for t, o in answers]}).get_json()
    theta, weights, eap, sd = naive_posterior(answers)
    assert state["theta"] == pytest.approx({"eap": eap, "sd": sd}, abs=1e-9)
    meant = np.round(theta, 9)  # the grid point -4 + 36·(8/60) is 0.8, though linspace rounds it below
    levels = {"basic": weights[meant < -0.5].sum(), "proficient": weights[(meant >= -0.5) & (meant < 0.8)].sum(),
              "advanced": weights[meant >= 0.8].sum()}
    assert state["class_posterior"] == pytest.approx({k: v for k, v in levels.items() if v > 0}, abs=1e-9)
    triage = client.post("/v1/sessions", json={"instance": TRIAGE}).get_json()
    assert "theta" not in triage


def test_max_se_stops_once_the_posterior_sd_is_small_enough():
    inst = compiled()
    rules = engine.StopRules(max_se=0.75)
    policy = engine.resolve_policy(inst, "infogain")
    observations: list = []
    while True:
        belief = engine.observe(inst, observations)
        decision = engine.decide(belief, policy, rules)
        _, _, _, sd = naive_posterior([(inst.test_ids[t], inst.outcome_labels[t][k]) for t, k in observations])
        if decision.done:
            break
        assert sd > 0.75
        t = decision.next_test
        observations.append((t, inst.arity[t] - 1))  # always the top outcome
    assert decision.stop_reason in ("max_se", "tests_exhausted")
    assert (decision.stop_reason == "max_se") == (sd <= 0.75)


def test_max_se_needs_an_item_bank(client):
    response = client.post("/v1/sessions", json={"instance": TRIAGE, "max_se": 0.3})
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert [e["path"] for e in response.get_json()["errors"]] == ["max_se"]
    assert client.get("/v1/instances").get_json()["items"] == []
    response = client.post("/v1/sessions", json={"instance": BANK, "max_se": 0})
    assert response.status_code == 422
    done = client.post("/v1/sessions", json={"instance": BANK, "max_se": 5.0}).get_json()
    assert done["done"] and done["stop_reason"] == "max_se"


# --- edgecut evaluate on an item bank ---------------------------------------------------------

TWO_POINTS = {"item_bank": {"items": [{"id": "sharp", "model": "2PL", "a": 60.0, "b": 0.0},
                                      {"id": "flat", "model": "2PL", "a": 0.05, "b": 0.0}],
                            "prior": {"grid": [-1.0, 1.0], "weights": [1, 1]}, "cut_scores": [0.0]}}


def test_evaluation_reports_theta_rmse_and_the_top_exposure():
    from service.evaluation import evaluate

    inst = compiled(TWO_POINTS)
    # No item: the EAP is the prior mean 0 and every examinee is 1 away from it.
    before = evaluate(inst, ["infogain"], engine.StopRules(max_tests=0), samples=200).policies[0]
    assert before.theta_rmse == pytest.approx(1.0) and before.top_exposure == 0.0
    # One item: the sharp one tells θ apart (P(right) = 1/(1 + e^±60)), so the EAP is the true θ.
    after = evaluate(inst, ["infogain"], engine.StopRules(max_tests=1), samples=200).policies[0]
    assert after.theta_rmse == pytest.approx(0.0, abs=1e-12)
    assert (after.top_exposure, after.top_exposure_item, after.expected_tests) == (1.0, "sharp", 1.0)
    assert after.accuracy == 1.0


def test_the_command_prints_them(tmp_path, capsys):
    import json

    from service.cli import main

    path = tmp_path / "bank.json"
    path.write_text(json.dumps(TWO_POINTS))
    assert main(["evaluate", str(path), "--policies", "infogain", "--samples", "50", "--max-tests", "1",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "θ RMSE" in out and "100.0% (sharp)" in out


# --- Exposure control: randomesque ------------------------------------------------------------

def bank_of(n_items=40, seed=3):
    rng = np.random.default_rng(seed)
    return {"item_bank": {"items": [{"id": f"q{j}", "model": "3PL", "a": float(rng.lognormal(0, 0.25)),
                                     "b": float(rng.normal()), "c": float(rng.uniform(0, 0.25))}
                                    for j in range(n_items)], "cut_scores": [0.0]}}


def test_randomesque_draws_uniformly_among_the_k_best():
    inst = compiled(bank_of())
    policy = engine.resolve_policy(inst, "infogain")
    belief = engine.observe(inst, [(0, 1), (5, 0)])
    scores = engine.decide(belief, policy).scores
    ranked = sorted((t for t in range(inst.n_tests) if not np.isnan(scores[t]) and t not in (0, 5)),
                    key=lambda t: (-scores[t], t))
    drawn = [engine.decide(belief, policy, engine.StopRules(randomesque=5), seed=s).next_test for s in range(400)]
    assert set(drawn) == set(ranked[:5])
    counts = np.bincount(drawn, minlength=inst.n_tests)[ranked[:5]]
    assert counts.min() > 400 / 5 * 0.6  # uniform: each about 80 of 400
    assert engine.decide(belief, policy, engine.StopRules(randomesque=5), seed=7).next_test == drawn[7]
    assert engine.decide(belief, policy, engine.StopRules(randomesque=1), seed=7).next_test == ranked[0]


def test_sessions_with_randomesque_differ_from_each_other_and_replay_themselves(client):
    bank = bank_of()
    instance_id = client.post("/v1/instances", json=bank).get_json()["instance_id"]
    best = [c["test"] for c in client.post("/v1/sessions?explain=true",
                                           json={"instance_id": instance_id}).get_json()["candidates"]]
    exposure = {"method": "randomesque", "k": 5}
    states = [client.post("/v1/sessions", json={"instance_id": instance_id, "exposure": exposure}).get_json()
              for _ in range(30)]
    first = [s["next_test"]["id"] for s in states]
    assert set(first) <= set(best[:5]) and len(set(first)) >= 3
    for state in states[:5]:  # a session's own choice does not change when read again
        again = client.get(f"/v1/sessions/{state['session_id']}").get_json()
        assert again["next_test"] == state["next_test"]
    # The same seed and id replay the same draw after an answer too.
    url = f"/v1/sessions/{states[0]['session_id']}/observations"
    answered = client.post(url, json={"observations": [{"test": first[0], "outcome": "1"}]}).get_json()
    assert client.get(f"/v1/sessions/{states[0]['session_id']}").get_json()["next_test"] == answered["next_test"]
    key = {"Idempotency-Key": "exposure-1"}
    made = client.post("/v1/sessions", json={"instance_id": instance_id, "exposure": exposure}, headers=key)
    retried = client.post("/v1/sessions", json={"instance_id": instance_id, "exposure": exposure}, headers=key)
    # The same session at the same step; its expiry is left out: the store gives it as of each read.
    assert made.status_code == 201
    assert {**retried.get_json(), "expires_at": None} == {**made.get_json(), "expires_at": None}


@pytest.mark.parametrize("exposure", [{"method": "randomesque", "k": 0}, {"method": "shuffle", "k": 5},
                                      {"method": "randomesque"}, {"method": "randomesque", "k": 5, "x": 1},
                                      {"method": "sympson_hetter", "k": 5}])
def test_bad_exposure_is_422_at_its_path(client, exposure):
    response = client.post("/v1/sessions", json={"instance": bank_of(5), "exposure": exposure})
    assert response.status_code == 422 and response.mimetype == PROBLEM
    assert all(e["path"].startswith("exposure") for e in response.get_json()["errors"])


# --- Exposure control: Sympson–Hetter -------------------------------------------------------

def sympson_hetter_bank(limit=0.3):
    """bank_of() with its first choice given an exposure parameter of ``limit``."""
    bank = bank_of()
    inst = compiled(bank)
    first = engine.decide(engine.observe(inst, []), engine.resolve_policy(inst, "infogain")).next_test
    bank["item_bank"]["items"][first]["exposure_parameter"] = limit
    return bank, inst.test_ids[first]


def test_sympson_hetter_gives_a_chosen_item_with_its_exposure_parameter():
    bank, top = sympson_hetter_bank(0.3)
    inst = compiled(bank)
    assert inst.content_hash != compiled(bank_of()).content_hash
    assert codec.decode(*codec.encode(inst), inst.content_hash).exposure_parameters.tolist() == \
        inst.exposure_parameters.tolist()
    policy = engine.resolve_policy(inst, "infogain")
    belief = engine.observe(inst, [])
    rules = engine.StopRules(sympson_hetter=True, max_tests=30)
    firsts = [inst.test_ids[engine.decide(belief, policy, rules, seed=s).next_test] for s in range(1000)]
    share = firsts.count(top) / 1000
    assert abs(share - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 1000)
    # Blocked, the item is never given in that run (the classic rule): not after an answer either.
    blocked = next(s for s, t in enumerate(firsts) if t != top)
    observations: list = []
    for _ in range(10):
        decision = engine.decide(engine.observe(inst, observations), policy, rules, seed=blocked)
        assert decision.next_test is not None and inst.test_ids[decision.next_test] != top
        observations.append((decision.next_test, 1))
    with pytest.raises(engine.StopRuleNotApplicable):
        engine.decide(engine.observe(compiled(bank_of()), []), policy, rules)


def test_sessions_with_sympson_hetter(client):
    bank, top = sympson_hetter_bank(0.3)
    instance_id = client.post("/v1/instances", json=bank).get_json()["instance_id"]
    exposure = {"method": "sympson_hetter"}
    states = [client.post("/v1/sessions", json={"instance_id": instance_id, "exposure": exposure}).get_json()
              for _ in range(60)]
    share = sum(s["next_test"]["id"] == top for s in states) / 60
    assert 0.05 < share < 0.6
    for state in states[:5]:
        assert client.get(f"/v1/sessions/{state['session_id']}").get_json()["next_test"] == state["next_test"]
    refused = client.post("/v1/sessions", json={"instance": bank_of(), "exposure": exposure})
    assert refused.status_code == 422 and refused.mimetype == PROBLEM
    assert [e["path"] for e in refused.get_json()["errors"]] == ["exposure.method"]


def test_evaluation_draws_exposure_control_per_examinee():
    from service.evaluation import evaluate

    inst = compiled(bank_of())
    plain = evaluate(inst, ["infogain"], engine.StopRules(max_tests=1), samples=300).policies[0]
    drawn = evaluate(inst, ["infogain"], engine.StopRules(max_tests=1, randomesque=5), samples=300).policies[0]
    # One item each: without control everyone gets the best; with k = 5 each of five gets about 1/5.
    assert plain.top_exposure == 1.0 and 0.1 < drawn.top_exposure < 0.35


# --- Enemies ------------------------------------------------------------------------------------

def enemy_bank():
    """bank_of() and, as enemies, the items the policy asks first and second (answers all right)."""
    bank = bank_of()
    inst = compiled(bank)
    policy = engine.resolve_policy(inst, "infogain")
    rules = engine.StopRules(max_tests=40)
    first = engine.decide(engine.observe(inst, []), policy, rules).next_test
    second = engine.decide(engine.observe(inst, [(first, 1)]), policy, rules).next_test
    pair = [inst.test_ids[first], inst.test_ids[second]]
    return {"item_bank": {**bank["item_bank"], "enemies": [pair]}}, pair


def test_enemies_are_never_asked_together():
    bank, (first, second) = enemy_bank()
    inst = compiled(bank)
    assert inst.content_hash != compiled(bank_of()).content_hash
    assert codec.decode(*codec.encode(inst), inst.content_hash).enemies.tolist() == inst.enemies.tolist()
    policy = engine.resolve_policy(inst, "infogain")
    observations: list = []
    while True:
        decision = engine.decide(engine.observe(inst, observations), policy, engine.StopRules(max_tests=40))
        if decision.done:
            break
        observations.append((decision.next_test, 1))
    asked = {inst.test_ids[t] for t, _ in observations}
    assert first in asked and second not in asked and len(asked) == 39
    # A skipped item counts as shown: its enemy is not asked either.
    skipped = engine.observe(inst, [(inst.test_index[first], engine.SKIPPED)])
    assert inst.test_ids[engine.decide(skipped, policy, engine.StopRules(max_tests=40)).next_test] != second


def test_sessions_keep_enemies_apart(client):
    bank, (first, second) = enemy_bank()
    state = client.post("/v1/sessions", json={"instance": bank, "max_tests": 40}).get_json()
    assert state["next_test"]["id"] == first
    url = f"/v1/sessions/{state['session_id']}/observations"
    state = client.post(url, json={"observations": [{"test": first, "outcome": "1"}]}).get_json()
    assert state["next_test"]["id"] not in (first, second)


# --- Content balancing ------------------------------------------------------------------------

def balanced_bank(**balance):
    bank = bank_of()
    for j, item in enumerate(bank["item_bank"]["items"]):
        item["content_area"] = ("algebra", "geometry", "number")[j % 3]
    bank["item_bank"]["content_balance"] = {"targets": {"algebra": 0.5, "geometry": 0.25, "number": 0.25}, **balance}
    return bank


def areas_asked(bank, answers=30):
    inst = compiled(bank)
    policy = engine.resolve_policy(inst, "infogain")
    observations: list = []
    for _ in range(answers):
        decision = engine.decide(engine.observe(inst, observations), policy, engine.StopRules(max_tests=answers))
        if decision.done:
            break
        observations.append((decision.next_test, len(observations) % 2))
    items = {i["id"]: i["content_area"] for i in bank["item_bank"]["items"]}
    return [items[inst.test_ids[t]] for t, _ in observations]


def test_content_balancing_keeps_each_prefix_at_its_targets():
    asked = areas_asked(balanced_bank(), 24)
    targets = {"algebra": 0.5, "geometry": 0.25, "number": 0.25}
    assert len(asked) == 24
    for n in range(1, 25):
        # The area furthest below its share is asked next: no area runs ahead by more than one item.
        for area, share in targets.items():
            assert abs(asked[:n].count(area) - share * n) <= 1
    assert [asked.count(a) for a in targets] == [12, 6, 6]


def test_content_balancing_least_and_most():
    asked = areas_asked(balanced_bank(min={"number": 4}, max={"algebra": 3}), 12)
    assert asked[:4] == ["number"] * 4  # below its least first
    assert asked.count("algebra") == 3  # never past its most
    inst = compiled(balanced_bank(max={"algebra": 3}))
    assert codec.decode(*codec.encode(inst), inst.content_hash).content_balance.tolist() == \
        inst.content_balance.tolist() and inst.content_hash != compiled(balanced_bank()).content_hash


def test_sessions_follow_the_content_targets(client):
    bank = balanced_bank()
    items = {i["id"]: i["content_area"] for i in bank["item_bank"]["items"]}
    state = client.post("/v1/sessions", json={"instance": bank, "max_tests": 8}).get_json()
    url = f"/v1/sessions/{state['session_id']}/observations"
    asked = []
    while not state["done"]:
        asked.append(items[state["next_test"]["id"]])
        state = client.post(url, json={"observations": [{"test": state["next_test"]["id"], "outcome": "1"}]}).get_json()
    assert [asked.count(a) for a in ("algebra", "geometry", "number")] == [4, 2, 2]
