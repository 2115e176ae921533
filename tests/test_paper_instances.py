"""The paper's own instances (section 3 and the appendix), and EC² against the exact optimum.

Expected costs asserted here are formulas derived by hand in the comments, never numbers the
engine produced. The engine breaks ties towards the earliest test in instance order, which turns
the paper's "GBS may select tests 1, 2, …, n in order" into exactly what happens.
"""

from __future__ import annotations

import math
import random

import pytest

from service import engine

from tests import reference as ref
from tests.builders import appendix, compile_model, compile_wire, section3


def tree_cost(inst, policy):
    return engine.expected_cost(engine.policy_tree(inst, engine.POLICIES[policy]))


def mean_run_cost(inst, policy):
    """Σ_h P(h) · cost of run_policy against h: the definition of c(π) in section 2."""
    return sum(
        inst.prior[h] * engine.run_policy(inst, h, engine.POLICIES[policy]).cost for h in range(inst.n_hypotheses)
    )


# --- section 3: GBS ignores the classes -----------------------------------------------------


@pytest.mark.parametrize("n", [3, 4, 5, 8, 12, 20])
def test_section3_ec2_pays_one_test_which_is_optimal(n):
    inst = compile_wire(section3(n))
    assert tree_cost(inst, "ec2") == pytest.approx(1.0, rel=1e-12)
    first = engine.next_step(inst, [], "ec2").next_test
    assert inst.test_ids[first] == f"t{n - 1}"  # the test that asks "is it hn?"
    if n <= 8:
        assert engine.optimal_expected_cost(inst) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("n", [3, 4, 5, 8, 12, 20])
def test_section3_gbs_pays_about_n_over_2(n):
    # Every test splits one hypothesis off the version space, so GBS sees a tie at every step and
    # runs t1, t2, … in order. Truth h_t (t < n) is found by test t (cost t); truth hn is found
    # once h1..h(n-1) are ruled out (cost n-1). With the uniform prior:
    #   c(GBS) = (1/n)[Σ_{t=1}^{n-1} t + (n-1)] = (n-1)(n+2) / (2n)  ≈ n/2.
    inst = compile_wire(section3(n))
    expected = (n - 1) * (n + 2) / (2 * n)
    assert tree_cost(inst, "gbs") == pytest.approx(expected, rel=1e-12)
    assert mean_run_cost(inst, "gbs") == pytest.approx(expected, rel=1e-12)
    assert expected >= (n - 1) / 2


# --- the appendix: posterior-based policies loop over sequential tests -----------------------


@pytest.mark.parametrize("q", [1, 2, 3, 4, 5, 6])
def test_appendix_ec2_costs_at_most_q_plus_1(q):
    inst = compile_wire(appendix(q))
    tree = engine.policy_tree(inst, engine.POLICIES["ec2"])
    assert engine.worst_case_cost(tree) <= q + 1 + 1e-12
    assert engine.expected_cost(tree) <= q + 1 + 1e-12
    assert all(leaf.decision.stop_reason == engine.StopReason.DETERMINED for leaf in tree.leaves())


@pytest.mark.parametrize("policy", ["infogain", "voi"])
@pytest.mark.parametrize("q", [1, 2, 3, 4, 5, 6])
def test_appendix_infogain_and_voi_pay_about_2_to_the_q_over_2(q, policy):
    # t0, the bit tests and the dummies leave the class posterior uniform, so their gain is 0 for
    # any posterior-based criterion; seq_k gains (it may reveal the class) and all live seq tests
    # tie. The policy runs seq1, seq2, … until one answers 1, or all but one class are ruled out:
    # with m = 2^q classes, truth in class a costs a (a < m) and class m costs m-1, so
    #   c = (1/m)[Σ_{a=1}^{m-1} a + (m-1)] = (m-1)(m+2) / (2m)  ≈ 2^q / 2.
    m = 2**q
    expected = (m - 1) * (m + 2) / (2 * m)
    inst = compile_wire(appendix(q))
    assert tree_cost(inst, policy) == pytest.approx(expected, rel=1e-12)
    if q >= 4:
        # The gap the appendix proves, Ω(n / log n): here already above EC²'s q + 1.
        assert expected > q + 1 >= tree_cost(inst, "ec2")


def test_appendix_the_optimum_is_at_most_q_plus_1():
    for q in (1, 2):
        inst = compile_wire(appendix(q, dummies=1))
        assert engine.optimal_expected_cost(inst) <= q + 1 + 1e-12


# --- EC² against the exact optimum on random instances ---------------------------------------

N_RANDOM = 120


def small_model(seed):
    return ref.random_model(random.Random(seed), "deterministic", max_hypotheses=8, max_tests=5)


def test_ec2_against_the_optimum_on_random_instances(record_property):
    worst = (0.0, None, None)
    for seed in range(N_RANDOM):
        model = small_model(seed)
        inst = compile_model(model)
        greedy = tree_cost(inst, "ec2")
        optimum = engine.optimal_expected_cost(inst)
        if optimum == 0:
            assert greedy == 0, seed  # nothing to separate: neither pays
            continue
        ratio = greedy / optimum
        # No policy beats the optimum; a failure here means the DP or the tree walk is wrong.
        assert ratio >= 1 - 1e-9, f"seed {seed}: EC² {greedy} below the optimum {optimum}"
        prior = model.normalised_prior()
        bound = 2 * math.log(1 / min(prior)) + 1
        if ratio > worst[0]:
            worst = (ratio, bound, seed)
    ratio, bound, seed = worst
    # Recorded, not asserted against: docs/engine.md quotes it.
    print(f"\nEC² / OPT on {N_RANDOM} random instances: largest ratio {ratio:.4f} (seed {seed}), "
          f"where 2 ln(1/p_min) + 1 = {bound:.2f}")
    record_property("largest_ec2_opt_ratio", ratio)
    assert ratio > 1  # the greedy is not optimal everywhere, so the comparison has teeth


def test_the_optimum_and_ec2_costs_match_the_naive_reference():
    for seed in range(40):
        model = small_model(seed)
        inst = compile_model(model)
        assert engine.optimal_expected_cost(inst) == pytest.approx(ref.optimal_cost(model), rel=1e-9, abs=1e-12)
        assert tree_cost(inst, "ec2") == pytest.approx(ref.expected_cost(model, "ec2"), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("policy", ["ec2", "gbs", "infogain"])
def test_the_tree_walk_equals_playing_every_hypothesis(policy):
    for seed in range(30):
        inst = compile_model(small_model(seed))
        tree = engine.policy_tree(inst, engine.POLICIES[policy])
        assert engine.expected_cost(tree) == pytest.approx(mean_run_cost(inst, policy), rel=1e-12, abs=1e-15)
        assert sum(leaf.probability for leaf in tree.leaves()) == pytest.approx(1.0, rel=1e-12)


def test_the_optimum_refuses_beyond_its_limit():
    model = ref.random_model(random.Random(3), "deterministic", max_hypotheses=40, max_tests=12)
    model.outcomes = [[random.Random(h * 31 + t).randrange(2) for t in range(12)] for h in range(model.n)]
    model.arity = [2] * 12
    model.costs = [1.0] * 12
    model.classes = [f"c{h % 4}" for h in range(model.n)]
    with pytest.raises(engine.InfeasibleComputation, match="small instances"):
        engine.optimal_expected_cost(compile_model(model), max_states=50)


def test_the_tree_has_no_branch_for_an_outcome_no_hypothesis_gives():
    # Seed 565: a 4-outcome test whose last outcome nobody gives. α's last column is β − Σ(others),
    # 5.6e-17 here; a branch opened on that round-off observed an impossible outcome and raised.
    model = small_model(565)
    inst = compile_model(model)
    tree = engine.policy_tree(inst, engine.POLICIES["ec2"])
    for node in tree.nodes():
        for k, child in node.children.items():
            assert any(inst.outcomes[h, node.test] == k for h in node.belief.alive)
            assert child.probability > 0
    assert engine.expected_cost(tree) == pytest.approx(ref.expected_cost(model, "ec2"), rel=1e-9)


def test_the_library_result_is_labelled_with_test_ids_and_classes():
    from api_support import TRIAGE
    from schemas.instance import Instance
    from service import engine

    inst = engine.compile_instance(Instance.model_validate(TRIAGE))
    first = engine.next_step(inst, engine.parse_observations(inst, []))
    assert first.next_test_id == TRIAGE["tests"][first.next_test]["id"]
    priors = {}
    for h in TRIAGE["hypotheses"]:
        priors[h["class"]] = priors.get(h["class"], 0.0) + h["prior"]
    total = sum(priors.values())
    assert first.class_posterior == pytest.approx({c: p / total for c, p in priors.items()})
    assert list(first.class_posterior.values()) == sorted(first.class_posterior.values(), reverse=True)
    done = engine.next_step(inst, engine.parse_observations(inst, [("ecg", "abnormal")]))
    assert done.next_test_id is None and done.class_posterior == {"admit": 1.0}
