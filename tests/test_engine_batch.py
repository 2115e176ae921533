"""Pages of tests, skips and unavailable tests in the engine, against the naive reference."""

from __future__ import annotations

import numpy as np
import pytest

from service import engine
from service.engine import StopReason, StopRules

from tests import reference as ref
from tests.builders import compile_model, compile_wire
from tests.test_engine_reference import DETERMINISTIC_POLICIES, LIKELIHOOD_POLICIES, labelled, random_case

BATCH_INSTANCES = 80
BATCH_SIZE = 3

# Four equally likely hypotheses in three classes; test c repeats test a (see tests/api_support.py).
QUAD = {
    "tests": [{"id": "a", "outcomes": ["0", "1"]}, {"id": "b", "outcomes": ["0", "1"]},
              {"id": "c", "outcomes": ["0", "1"]}],
    "matrix": [[0, 0, 0], [0, 1, 0], [1, 0, 1], [1, 1, 1]],
    "classes": ["X", "Y", "Z", "Z"],
}


# random draws its batch; ECED's discounted edges are no expectation over joint outcomes of a
# function of the posterior, so it has no joint objective for the reference to enumerate (its
# batch is the generic greedy on the conditioned beliefs).
NO_JOINT_OBJECTIVE = {"random", "eced"}


def engine_batch(inst, observations, policy, size):
    parsed = engine.parse_observations(inst, labelled(observations))
    return engine.next_step(inst, parsed, policy, batch_size=size)


@pytest.mark.parametrize(
    "kind,policy",
    [("deterministic", p) for p in DETERMINISTIC_POLICIES if p not in NO_JOINT_OBJECTIVE]
    + [("likelihood", p) for p in LIKELIHOOD_POLICIES if p not in NO_JOINT_OBJECTIVE],
)
def test_a_batch_is_greedy_on_joint_outcomes_like_the_reference(kind, policy):
    """Each member after the first maximises [f(B ∪ {t}) − f(B)] / c(t), f enumerated over the
    joint outcomes by the reference; checked member by member on the engine's own prefix, so a
    near-tie resolved differently by round-off cannot derail the comparison."""
    power = ref.POWER.get(policy, 0)
    longer = 0
    for seed in range(BATCH_INSTANCES):
        model, observations = random_case(seed, kind)
        inst = compile_model(model)
        decision = engine_batch(inst, observations, policy, BATCH_SIZE)
        batch = list(decision.batch)
        where = f"seed {seed}, {policy}, observations {observations}, batch {batch}"
        assert (decision.next_test is None) == (not batch), where
        if not batch:
            continue
        assert batch[0] == decision.next_test and len(set(batch)) == len(batch), where
        total = sum(ref.version_space_mass(model, observations))
        ran = {t for t, _ in observations}
        for j in range(1, BATCH_SIZE + 1):
            if j > len(batch) or j == BATCH_SIZE:
                break
            base = ref.joint_gain(model, observations, batch[:j], policy)
            ratio = {}
            for t in range(model.n_tests):
                if t not in ran and t not in batch[:j]:
                    marginal = ref.joint_gain(model, observations, [*batch[:j], t], policy) - base
                    if marginal / total**power > ref.ZERO:
                        ratio[t] = marginal / model.costs[t]
            if j == len(batch):
                assert not ratio, f"{where}: the batch stopped while {ratio} still add gain"
                break
            chosen, best = batch[j], max(ratio.values())
            assert ratio.get(chosen, -np.inf) >= best * (1 - 2e-9), f"{where}: member {j}: {ratio}"
            assert all(ratio[t] < best * (1 - 0.5e-9) for t in ratio if t < chosen), f"{where}: member {j}"
        longer += len(batch) > 1
    assert longer >= BATCH_INSTANCES // 8, f"only {longer} batches had a second member"


def test_the_reference_greedy_batch_and_the_engine_agree_exactly_on_a_clear_case():
    inst = compile_wire(QUAD)
    model = ref.Model(arity=[2, 2, 2], costs=[1.0] * 3, classes=["X", "Y", "Z", "Z"], prior=[1.0] * 4,
                      outcomes=QUAD["matrix"])
    assert ref.greedy_batch(model, [], "ec2", 3) == [0, 1]
    assert engine.next_step(inst, [], "ec2", batch_size=3).batch == (0, 1)


def test_a_batch_is_not_the_top_k_single_scores():
    # Single scores rank a = c > b, but c repeats a: once a is in the page, c adds nothing, and b
    # (which separates X from Y) is the second question. Only two tests add anything.
    inst = compile_wire(QUAD)
    decision = engine.next_step(inst, [], "ec2", batch_size=3)
    top_two = np.argsort(-decision.scores, kind="stable")[:2]
    assert list(top_two) == [0, 2]
    assert decision.batch == (0, 1)


def test_a_batch_respects_the_remaining_tests_and_budget():
    inst = compile_wire({**QUAD, "tests": [{**t, "cost": c} for t, c in zip(QUAD["tests"], (1, 2, 1))]})
    assert engine.next_step(inst, [], "ec2", StopRules(max_tests=1), batch_size=3).batch == (0,)
    assert engine.next_step(inst, [], "ec2", StopRules(max_cost=2), batch_size=3).batch == (0,)
    assert engine.next_step(inst, [], "ec2", StopRules(max_cost=3), batch_size=3).batch == (0, 1)


def test_random_batches_are_distinct_seeded_and_start_with_the_single_choice():
    model, _ = random_case(3, "deterministic")
    inst = compile_model(model)
    for seed in range(20):
        single = engine.next_step(inst, [], "random", seed=seed)
        batch = engine.next_step(inst, [], "random", seed=seed, batch_size=3).batch
        assert batch[0] == single.next_test and len(set(batch)) == len(batch)
        assert batch == engine.next_step(inst, [], "random", seed=seed, batch_size=3).batch


def test_batch_work_is_bounded_before_any_step():
    wide = {"tests": [{"id": f"t{j}", "outcomes": [str(k) for k in range(10)]} for j in range(6)],
            "likelihood_matrix": [[[0.1] * 10] * 6, [[0.2, 0.8] + [0.0] * 8] * 6], "classes": ["a", "b"]}
    inst = compile_wire(wide)
    engine.check_batch(inst, 4)  # 10 + 100 + 1000 conditioned beliefs
    with pytest.raises(engine.InfeasibleComputation, match="MAX_BATCH_BRANCHES"):
        engine.check_batch(inst, 5)


# --- skips and unavailable tests ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
def test_skipped_and_excluded_tests_agree_with_the_reference(kind):
    """Random instances, random answers, then some unrun tests skipped and others excluded: the
    same stop reason and choice as the reference with those tests unavailable."""
    policies = DETERMINISTIC_POLICIES if kind == "deterministic" else LIKELIHOOD_POLICIES
    stops = set()
    for seed in range(120):
        model, observations = random_case(seed, kind)
        inst = compile_model(model)
        rng = np.random.default_rng(seed)
        ran = {t for t, _ in observations}
        unrun = [t for t in range(model.n_tests) if t not in ran]
        skipped = [t for t in unrun if rng.random() < 0.3]
        excluded = [t for t in unrun if t not in skipped and rng.random() < 0.3]
        mask = np.zeros(inst.n_tests, dtype=bool)
        mask[excluded] = True
        labelled_all = labelled(observations) + [(f"t{t}", None) for t in skipped]
        parsed = engine.parse_observations(inst, labelled_all)
        max_cost = None if seed % 3 else 1.5
        policy = policies[seed % len(policies)]
        decision = engine.next_step(inst, parsed, policy, StopRules(max_cost=max_cost), excluded=mask)
        expected = ref.decide(model, observations, policy, max_cost=max_cost,
                              unavailable=frozenset(skipped + excluded))
        where = f"seed {seed}, {policy}, observations {observations}, skipped {skipped}, excluded {excluded}"
        assert (None if decision.stop_reason is None else str(decision.stop_reason)) == expected.stop, where
        stops.add(expected.stop)
        if policy == "random" and expected.test is not None:
            assert decision.next_test in expected.test, where
        elif expected.test is not None:
            best = max(s for s in expected.scores if s is not None)
            assert expected.scores[decision.next_test] >= best * (1 - 2e-9), where
            assert decision.next_test not in skipped + excluded, where
    assert {None, "no_informative_test"} <= stops, stops


def test_a_skip_changes_no_belief_and_the_test_is_not_proposed_again():
    inst = compile_wire(QUAD)
    skipped = engine.parse_observations(inst, [("a", None)])
    assert skipped == [(0, engine.SKIPPED)]
    belief = engine.observe(inst, skipped)
    assert np.array_equal(belief.mass, engine.observe(inst, []).mass)
    assert belief.cost_spent == 0.0 and belief.answers == ()
    # a was the best; with a skipped, c (its twin) is.
    assert engine.next_step(inst, skipped, "ec2").next_test == 2


def test_a_charged_skip_costs_its_test():
    inst = compile_wire({**QUAD, "skip_cost": "charged", "tests": [{**t, "cost": 2} for t in QUAD["tests"]]})
    assert engine.observe(inst, engine.parse_observations(inst, [("a", None)])).cost_spent == 2.0


def test_skipping_the_last_informative_test_stops_with_no_informative_test():
    inst = compile_wire(QUAD)
    after_a = [("a", "0")]  # X or Y left: only b separates them
    decision = engine.next_step(inst, engine.parse_observations(inst, [*after_a, ("b", None)]), "ec2")
    assert decision.stop_reason == StopReason.NO_INFORMATIVE_TEST
    # Excluded tests stop the same way; answering every test is tests_exhausted.
    excluded = np.array([False, True, False])
    decision = engine.next_step(inst, engine.parse_observations(inst, after_a), "ec2", excluded=excluded)
    assert decision.stop_reason == StopReason.NO_INFORMATIVE_TEST


def test_excluded_tests_are_never_proposed_nor_put_in_a_batch():
    inst = compile_wire(QUAD)
    excluded = np.array([True, False, False])
    decision = engine.next_step(inst, [], "ec2", excluded=excluded, batch_size=3)
    assert decision.next_test == 2 and 0 not in decision.batch


def test_answers_and_skips_of_one_test_conflict():
    inst = compile_wire(QUAD)
    with pytest.raises(engine.ConflictingObservation):
        engine.parse_observations(inst, [("a", "0"), ("a", None)])
    with pytest.raises(engine.ConflictingObservation):
        engine.parse_observations(inst, [("a", None), ("a", "0")])
    assert engine.parse_observations(inst, [("a", None), ("a", None)]) == [(0, engine.SKIPPED)]


# --- repeatable tests --------------------------------------------------------------------------

NOISY_REPEATABLE = {
    "tests": [{"id": "swab", "outcomes": ["neg", "pos"], "repeatable": True}, {"id": "xray", "outcomes": ["n", "p"]}],
    "hypotheses": [
        {"id": "well", "likelihoods": {"swab": {"neg": 0.9, "pos": 0.1}, "xray": {"n": 0.6, "p": 0.4}}},
        {"id": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}, "xray": {"n": 0.4, "p": 0.6}}},
    ],
}


def test_a_repeatable_test_counts_every_answer_as_bayes_does():
    inst = compile_wire(NOISY_REPEATABLE)
    parsed = engine.parse_observations(inst, [("swab", "pos"), ("swab", "pos"), ("xray", "p"), ("xray", "p")])
    assert parsed == [(0, 1), (0, 1), (1, 1)]  # xray is not repeatable: its duplicate counts once
    belief = engine.observe(inst, parsed)
    # By hand: P(ill | +, +, p) ∝ 0.5 · 0.8² · 0.6 against 0.5 · 0.1² · 0.4.
    ill = 0.8**2 * 0.6 / (0.8**2 * 0.6 + 0.1**2 * 0.4)
    assert belief.class_posterior[inst.class_labels.index("ill")] == pytest.approx(ill, rel=1e-12)
    assert belief.cost_spent == 3.0
    # Still proposable after being answered (swab tells more than xray).
    assert engine.next_step(inst, parsed, "effecxtive", StopRules(confidence=0.9999)).next_test == 0


def test_deterministic_instances_refuse_repeatable_tests():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="repeatable"):
        compile_wire({**QUAD, "tests": [{**QUAD["tests"][0], "repeatable": True}, *QUAD["tests"][1:]]})
