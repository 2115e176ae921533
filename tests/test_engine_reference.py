"""The fast policies against the naive reference (tests/reference.py), and the selection rules."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import engine
from service.engine import StopReason, StopRules
from service.engine import alpha as alpha_module
from service.engine import compiled as compiled_module
from service.engine import statistics as statistics_module

from tests import reference as ref
from tests.builders import compile_model, compile_wire

N_INSTANCES = 240
DETERMINISTIC_POLICIES = ["ec2", "eced", "effecxtive", "gbs", "infogain", "voi", "uncertainty", "random"]
LIKELIHOOD_POLICIES = ["eced", "effecxtive", "gbs", "infogain", "voi", "uncertainty", "random"]
POWER = ref.POWER


def labelled(observations):
    return [(f"t{t}", f"o{k}") for t, k in observations]


def random_case(seed: int, kind: str):
    """A random model, and a few observations drawn from a random true hypothesis."""
    rng = random.Random(seed)
    model = ref.random_model(rng, kind)
    truth = rng.randrange(model.n)
    tests = list(range(model.n_tests))
    rng.shuffle(tests)
    observations = [(t, ref.sample_outcome(model, rng, truth, t)) for t in tests[: rng.randint(0, 2)]]
    return model, observations


# Small beliefs build α whole (alpha._dense_stats); bigger ones stream it, and stream singleton
# classes of a deterministic instance from the answers' bit planes when enough of the hypotheses
# are alive. The reference's instances are small, so each agreement test runs them all: as they
# come, whole with the classes' rows padded to the longest class, streamed by cast-and-GEMV
# blocks, and streamed from the bit planes whatever is alive.
STATISTICS_PATHS = {"dense": {},
                    "dense, padded runs": {"_PADDED_RUNS": 1, "_PADDED_GROWTH": math.inf},
                    "streamed": {"_DENSE_CELLS": 0, "_MIN_GROUP_FILL": math.inf},
                    "streamed, bit planes": {"_DENSE_CELLS": 0, "_MIN_GROUP_FILL": 0}}


@pytest.fixture(params=sorted(STATISTICS_PATHS))
def statistics_path(request, monkeypatch):
    for name, value in STATISTICS_PATHS[request.param].items():
        monkeypatch.setattr(alpha_module, name, value)
    return request.param


def assert_close(engine_value: float, reference_value: float, unit: float, what: str) -> None:
    # 1e-9 relative; the absolute floor only matters where the true gain is exactly 0 and the
    # engine's (Σa)² − Σa² leaves round-off of order 1e-17 of the unit.
    assert abs(engine_value - reference_value) <= 1e-9 * abs(reference_value) + 1e-13 * unit, (
        f"{what}: engine {engine_value!r} vs reference {reference_value!r}"
    )


@pytest.mark.parametrize(
    "kind,policy",
    [("deterministic", p) for p in DETERMINISTIC_POLICIES] + [("likelihood", p) for p in LIKELIHOOD_POLICIES],
)
def test_policies_agree_with_the_reference_on_random_instances(kind, policy, statistics_path):
    compared = 0
    for seed in range(N_INSTANCES):
        model, observations = random_case(seed, kind)
        where = f"seed {seed}, {policy}, observations {observations}"
        decision, expected, scored = compare_with_reference(model, observations, policy, where)
        compared += scored
        if policy == "random":
            assert (decision.next_test is None) == (expected.test is None), where
            if expected.test is not None:
                assert decision.next_test in expected.test, where
        elif expected.test is not None:
            best = max(s for s in expected.scores if s is not None)
            chosen = decision.next_test
            # The earliest test within relative 1e-9 of the best (margins keep float noise out).
            assert expected.scores[chosen] >= best * (1 - 2e-9), where
            assert all(s is None or s < best * (1 - 0.5e-9) for s in expected.scores[:chosen]), where
    # The comparison must have happened on most instances, not only stops.
    assert compared >= N_INSTANCES // 2, f"only {compared} instances were scored"


def parametrized(test, argument: str) -> list:
    """The values a test is parametrised with for ``argument``."""
    return [value for mark in test.pytestmark if mark.name == "parametrize" and mark.args[0] == argument
            for value in mark.args[1]]


def test_every_registered_policy_has_a_naive_reference_and_is_compared_with_it():
    """A row added to engine.POLICIES fails here until its gain is written from the definition in
    tests/reference.py (tests/reference_decisions.py for a decision policy) and the agreement
    test runs it on every kind of instance it accepts (docs/architecture.md: adding a policy)."""
    from tests import reference_decisions as refd
    from tests.test_decisions import test_region_objectives_agree_with_explicit_edge_lists as decisions_agree

    for name, policy in engine.POLICIES.items():
        if policy.decision:
            assert name in refd.GAINS, f"{name}: no naive gain in tests/reference_decisions.py"
            assert name in parametrized(decisions_agree, "policy"), f"{name}: not compared with its reference"
            continue
        assert name in ref.GAINS, f"{name}: no naive gain in tests/reference.py"
        assert ref.POWER.get(name, 0) == policy.score_power, f"{name}: the reference's units differ"
        assert name in DETERMINISTIC_POLICIES, f"{name}: not compared on deterministic instances"
        assert (name in LIKELIHOOD_POLICIES) == (not policy.deterministic_only), \
            f"{name}: compared on likelihood instances exactly when it accepts them"


def test_the_class_posterior_matches_bayes_with_plain_loops():
    for seed in range(60):
        model, observations = random_case(seed, "likelihood")
        inst = compile_model(model)
        belief = engine.observe(inst, engine.parse_observations(inst, labelled(observations)))
        expected = ref.class_distribution(model, ref.version_space_mass(model, observations))
        for c, label in enumerate(inst.class_labels):
            assert abs(belief.class_posterior[c] - expected.get(label, 0.0)) <= 1e-12


def assert_same_belief(carried, scratch, where: str) -> None:
    assert carried.observations == scratch.observations, where
    assert np.array_equal(carried.alive, scratch.alive), where
    assert np.array_equal(carried.mass, scratch.mass), where  # bit for bit, not merely close
    # What a carried belief takes over from the one before it, against its definition.
    answers = tuple((t, k) for t, k in scratch.observations if k != engine.SKIPPED)
    assert carried.answers == answers, where
    assert carried.run_tests.tolist() == [any(t == u for u, _ in answers) for t in range(scratch.instance.n_tests)]
    charged = scratch.observations if scratch.instance.skip_charged else answers
    assert carried.cost_spent == float(sum(scratch.instance.costs[t] for t, _ in charged)), where


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
@pytest.mark.parametrize("skip_charged", [False, True])
def test_a_belief_carried_forward_through_skips_and_repeated_answers_equals_the_belief_from_scratch(kind,
                                                                                                   skip_charged):
    for seed in range(40):
        rng = random.Random(seed)
        model = ref.random_model(rng, kind)
        inst = compile_model(model)
        repeatable = np.array([rng.random() < 0.4 for _ in range(inst.n_tests)])
        inst = dataclasses.replace(inst, repeatable=repeatable, skip_charged=skip_charged,
                                   costs=np.array([rng.choice([0.1, 0.7, 1.3, 2.0]) for _ in range(inst.n_tests)]))
        truth = rng.randrange(model.n)
        observations = []
        for t in rng.sample(range(inst.n_tests), inst.n_tests):
            if rng.random() < 0.3:
                observations.append((t, engine.SKIPPED))
                continue
            for _ in range(2 if repeatable[t] else 1):
                observations.append((t, ref.sample_outcome(model, rng, truth, t)))
        try:
            engine.observe(inst, observations)
        except engine.InconsistentObservation:
            continue  # a noisy repeat no hypothesis gives; the prefixes before it are what is compared
        previous = engine.observe(inst, [])
        for j in range(1, len(observations) + 1):
            carried = engine.observe(inst, observations[:j], previous=previous)
            scratch = engine.observe(inst, observations[:j])
            assert_same_belief(carried, scratch, f"seed {seed}, {j} observations")
            # Several observations at once, from an earlier belief that knows its answers.
            earlier = engine.observe(inst, observations[:j // 2])
            assert_same_belief(earlier, engine.observe(inst, observations[:j // 2]), "")
            assert_same_belief(engine.observe(inst, observations[:j], previous=earlier), scratch, f"seed {seed}, {j}")
            previous = carried


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
def test_a_belief_carried_forward_equals_the_belief_from_scratch(kind):
    for seed in range(60):
        rng = random.Random(seed)
        model = ref.random_model(rng, kind)
        inst = compile_model(model)
        truth = rng.randrange(model.n)
        tests = list(range(model.n_tests))
        rng.shuffle(tests)
        observations = [(t, ref.sample_outcome(model, rng, truth, t)) for t in tests]
        parsed = engine.parse_observations(inst, labelled(observations))
        previous = engine.observe(inst, [])
        for j in range(1, len(parsed) + 1):
            scratch = engine.observe(inst, parsed[:j])
            carried = engine.observe(inst, parsed[:j], previous=previous)
            assert_same_belief(carried, scratch, f"seed {seed}, {j} observations")
            # Several at once from an earlier belief, and a belief that is no prefix (ignored).
            assert_same_belief(engine.observe(inst, parsed[:j], previous=engine.observe(inst, [])), scratch, "")
            assert_same_belief(engine.observe(inst, parsed[j - 1:j], previous=carried), engine.observe(
                inst, parsed[j - 1:j]), f"seed {seed}: not a prefix")
            previous = carried


def test_a_carried_likelihood_belief_keeps_rows_whose_weight_underflowed():
    # h1's weight falls 10⁻⁸⁰⁰ below h0's (0 in floating point) and comes back when h0's does too:
    # the carried belief must still hold h1's log posterior to agree with the belief from scratch.
    eps = 1e-200
    cells = [[[1 - eps, eps]] * 8, [[eps, 1 - eps]] * 8]
    _, inst = likelihood_instance(cells, ["a", "b"])
    observations = [(t, 0) for t in range(4)] + [(t, 1) for t in range(4, 8)]
    previous = engine.observe(inst, [])
    for j in range(1, 9):
        carried = engine.observe(inst, observations[:j], previous=previous)
        assert_same_belief(carried, engine.observe(inst, observations[:j]), f"{j} observations")
        previous = carried
    assert engine.observe(inst, observations[:4]).alive.tolist() == [0]
    assert previous.alive.tolist() == [0, 1]


def test_an_inconsistent_observation_on_a_carried_belief_is_refused():
    _, inst = deterministic([[0, 0, 0], [0, 1, 1], [1, 1, 0]], ["a", "b", "c"])
    first = engine.observe(inst, [(0, 0)])
    with pytest.raises(engine.InconsistentObservation):
        engine.observe(inst, [(0, 0), (1, 1), (2, 0)], previous=first)
    assert first.alive.tolist() == [0, 1]


# --- selection rules ---------------------------------------------------------------------------


def deterministic(rows, classes, priors=None, costs=None, arity=None):
    """A compiled deterministic instance from an outcome table (rows: hypotheses, columns: tests)."""
    n_tests = len(rows[0])
    arity = arity or [max(r[t] for r in rows) + 1 for t in range(n_tests)]
    model = ref.Model(
        arity=arity,
        costs=costs or [1.0] * n_tests,
        classes=classes,
        prior=priors or [1.0] * len(rows),
        outcomes=rows,
        hypothesis_ids=[f"h{i}" for i in range(len(rows))],
    )
    return model, compile_model(model)


def likelihood_instance(cells, classes, priors=None, costs=None):
    """cells[h][t] = [P(o0 | h), P(o1 | h), …]."""
    model = ref.Model(
        arity=[len(c) for c in cells[0]],
        costs=costs or [1.0] * len(cells[0]),
        classes=classes,
        prior=priors or [1.0] * len(cells),
        likelihood=cells,
        hypothesis_ids=[f"h{i}" for i in range(len(cells))],
    )
    return model, compile_model(model)


def step(inst, observations=(), policy=None, **rules):
    return engine.next_step(inst, engine.parse_observations(inst, labelled(observations)), policy,
                            StopRules(**rules))


@pytest.mark.parametrize("policy", DETERMINISTIC_POLICIES)
def test_a_run_never_repeats_a_test_and_ends_with_a_known_reason(policy):
    for seed in range(40):
        model, _ = random_case(seed, "deterministic")
        inst = compile_model(model)
        for truth in range(inst.n_hypotheses):
            run = engine.run_policy(inst, truth, engine.POLICIES[policy], seed=seed)
            tests = [t for t, _ in run.observations]
            assert len(tests) == len(set(tests))
            assert run.stop_reason in set(StopReason)


def test_a_test_with_zero_gain_is_never_chosen_even_when_cheap():
    # t0 and t1 tell nothing (every hypothesis answers the same) and cost almost nothing; t2 splits.
    model, inst = deterministic([[0, 0, 0], [0, 0, 1], [0, 0, 1]], ["a", "b", "b"],
                                costs=[1e-6, 1e-6, 5.0], arity=[2, 2, 2])
    for policy in DETERMINISTIC_POLICIES:
        assert step(inst, policy=policy).next_test == 2, policy


def test_all_zero_gains_stop_as_no_informative_test():
    # voi: whatever t0 says the MAP class stays 'a' (o0: a .4 vs b .3; o1: a .2 vs c .1), so the
    # expected 0–1 risk cannot drop although t0 does cut edges.
    model, inst = deterministic([[0], [1], [0], [1]], ["a", "a", "b", "c"], priors=[0.4, 0.2, 0.3, 0.1])
    decision = step(inst, policy="voi")
    assert decision.stop_reason == StopReason.NO_INFORMATIVE_TEST
    assert ref.decide(model, [], "voi").stop == "no_informative_test"
    assert step(inst, policy="ec2").next_test == 0  # ec2 does see the edges t0 cuts


def test_ties_go_to_the_earliest_test_within_relative_1e9():
    rows = [[0, 0, 0], [1, 1, 1], [1, 1, 1]]
    # Identical columns: an exact tie, won by t0.
    _, inst = deterministic(rows, ["a", "b", "b"])
    assert step(inst).next_test == 0
    # t0 costs 5e-10 relatively more than t1: still a tie within 1e-9, still t0.
    _, inst = deterministic(rows, ["a", "b", "b"], costs=[1 + 5e-10, 1.0, 1.0])
    assert step(inst).next_test == 0
    # 1e-8 more is a real difference: t1 (the earliest of the cheaper two) wins.
    _, inst = deterministic(rows, ["a", "b", "b"], costs=[1 + 1e-8, 1.0, 1.0])
    assert step(inst).next_test == 1


def test_only_tests_within_the_remaining_budget_are_eligible():
    # Uniform prior. t0 separates all three classes (Δ_EC = 1/3, cost 1.2: 0.278 per unit);
    # t1 and t2 each split one class off (Δ_EC = 7/27 = 0.259 at cost 1).
    rows = [[0, 0, 0], [1, 1, 0], [2, 1, 1]]
    model, inst = deterministic(rows, ["a", "b", "c"], costs=[1.2, 1.0, 1.0])
    assert step(inst).next_test == 0
    assert step(inst, max_cost=3.0).next_test == 0
    # A budget of 1.1 leaves t0 out: the best affordable test is t1 (tied with t2, earliest wins).
    assert step(inst, max_cost=1.1).next_test == 1
    assert ref.decide(model, [], "ec2", max_cost=1.1).test == 1
    # After t1 (cost 1) 1.1 of 2.1 remains: t2 fits, t0 does not and shows no score.
    after = step(inst, [(1, 1)], max_cost=2.1)
    assert after.next_test == 2 and math.isnan(after.scores[0]) and not math.isnan(after.scores[2])
    # After t1 with 0.1 left nothing fits.
    assert step(inst, [(1, 1)], max_cost=1.1).stop_reason == StopReason.BUDGET_EXHAUSTED


def test_budget_exhausted_when_only_unaffordable_tests_would_help():
    # t1 is affordable but tells nothing; t0 would help and costs too much.
    model, inst = deterministic([[0, 0], [1, 0]], ["a", "b"], costs=[5.0, 1.0], arity=[2, 2])
    decision = step(inst, max_cost=2.0)
    assert decision.stop_reason == StopReason.BUDGET_EXHAUSTED
    assert ref.decide(model, [], "ec2", max_cost=2.0).stop == "budget_exhausted"


class TestEveryStopReason:
    def test_determined(self):
        _, inst = deterministic([[0, 0], [1, 0], [1, 1]], ["a", "b", "b"])
        assert step(inst, [(0, 1)]).stop_reason == StopReason.DETERMINED

    def test_confidence_reached(self):
        _, inst = deterministic([[0], [1], [1]], ["a", "b", "b"], priors=[0.04, 0.48, 0.48])
        assert step(inst, confidence=0.95).stop_reason == StopReason.CONFIDENCE_REACHED
        assert step(inst, confidence=0.97).next_test == 0

    def test_max_tests(self):
        _, inst = deterministic([[0, 0], [1, 0], [1, 1]], ["a", "b", "c"])
        assert step(inst, [(0, 1)], max_tests=1).stop_reason == StopReason.MAX_TESTS
        assert step(inst, [(0, 1)], max_tests=2).next_test == 1

    def test_budget_exhausted(self):
        _, inst = deterministic([[0], [1]], ["a", "b"], costs=[2.0])
        assert step(inst, max_cost=1.0).stop_reason == StopReason.BUDGET_EXHAUSTED

    def test_tests_exhausted(self):
        # A likelihood instance never becomes certain; once every test has run it must stop.
        _, inst = likelihood_instance([[[0.6, 0.4]], [[0.4, 0.6]]], ["a", "b"])
        assert step(inst, [(0, 0)]).stop_reason == StopReason.TESTS_EXHAUSTED

    def test_no_informative_test(self):
        # Every hypothesis has the same likelihoods on t0: it cannot move the posterior.
        _, inst = likelihood_instance([[[0.5, 0.5]], [[0.5, 0.5]]], ["a", "b"])
        assert step(inst).stop_reason == StopReason.NO_INFORMATIVE_TEST

    def test_indistinguishable(self):
        # h0 and h1 answer alike on every test but sit in different classes.
        _, inst = deterministic([[0, 1], [0, 1], [1, 0]], ["a", "b", "b"])
        assert inst.warnings and "indistinguishable" in inst.warnings[0]
        assert step(inst).next_test == 0
        assert step(inst, [(0, 0)]).stop_reason == StopReason.INDISTINGUISHABLE

    def test_indistinguishable_even_after_the_last_test(self):
        # Nothing is left to run, but the reason to report is that h0, h1 cannot be told apart.
        _, inst = deterministic([[0], [0], [1]], ["a", "b", "b"])
        assert step(inst, [(0, 0)]).stop_reason == StopReason.INDISTINGUISHABLE


def test_likelihood_instances_stop_at_confidence_095_by_default():
    # After o0 on t0 the posterior of 'a' is 0.95·0.5 / (0.95·0.5 + 0.05·0.5) = 0.95 (in floating
    # point 0.9500000000000001: the boundary itself, ≥ and not >, is tested on exact binary
    # fractions in tests/test_hardening.py). With 0.949 it stays below the default and goes on.
    cells = [[[0.95, 0.05], [0.5, 0.5]], [[0.05, 0.95], [0.6, 0.4]]]
    _, inst = likelihood_instance(cells, ["a", "b"])
    assert engine.DEFAULT_LIKELIHOOD_CONFIDENCE == 0.95
    assert step(inst, policy="effecxtive").next_test == 0
    assert step(inst, [(0, 0)], policy="effecxtive").stop_reason == StopReason.CONFIDENCE_REACHED
    _, below = likelihood_instance([[[0.949, 0.051], [0.5, 0.5]], [[0.051, 0.949], [0.6, 0.4]]], ["a", "b"])
    assert step(below, [(0, 0)], policy="effecxtive").next_test == 1
    # Any explicit stop rule replaces the default.
    assert step(inst, [(0, 0)], policy="effecxtive", max_tests=5).next_test == 1
    assert step(inst, [(0, 0)], policy="effecxtive", confidence=0.99).next_test == 1
    # And a deterministic instance has no default confidence.
    _, det = deterministic([[0], [1], [1]], ["a", "b", "b"], priors=[0.01, 0.495, 0.495])
    assert step(det).next_test == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["deterministic", "likelihood"]), data=st.data())
def test_observations_may_arrive_for_any_unrun_test(seed, kind, data):
    rng = random.Random(seed)
    model = ref.random_model(rng, kind)
    inst = compile_model(model)
    truth = rng.randrange(model.n)
    order = data.draw(st.permutations(range(model.n_tests)))
    count = data.draw(st.integers(0, model.n_tests))
    observations = [(t, ref.sample_outcome(model, rng, truth, t)) for t in order[:count]]
    policy = "ec2" if kind == "deterministic" else "effecxtive"
    decision = step(inst, observations, policy, max_tests=100)
    expected = ref.decide(model, observations, policy, max_tests=100)
    assert (decision.stop_reason.value if decision.stop_reason else None) == expected.stop
    if decision.next_test is not None:
        assert decision.next_test not in {t for t, _ in observations}
        best = max(s for s in expected.scores if s is not None)
        assert expected.scores[decision.next_test] >= best * (1 - 2e-9)


def test_an_inconsistent_observation_is_refused_and_changes_nothing():
    model, inst = deterministic([[0, 0], [1, 0], [1, 1]], ["a", "b", "c"])
    before = (inst.content_hash, inst.outcomes.copy(), inst.prior.copy())
    first = step(inst, [(0, 1)])
    observations = engine.parse_observations(inst, labelled([(0, 0), (1, 1)]))  # h0 says t1 = o0
    with pytest.raises(engine.InconsistentObservation) as refused:
        engine.next_step(inst, observations)
    assert refused.value.code == "inconsistent" and "t1" in str(refused.value)
    assert inst.content_hash == before[0]
    assert np.array_equal(inst.outcomes, before[1]) and np.array_equal(inst.prior, before[2])
    again = step(inst, [(0, 1)])
    assert again.next_test == first.next_test and np.array_equal(again.scores, first.scores, equal_nan=True)
    # Likelihood instances refuse an outcome with zero probability under every hypothesis alike.
    _, noisy = likelihood_instance([[[1.0, 0.0]], [[1.0, 0.0]]], ["a", "b"])
    with pytest.raises(engine.InconsistentObservation):
        step(noisy, [(0, 1)])


def test_conflicting_and_unknown_observations_are_refused():
    _, inst = deterministic([[0, 0], [1, 1]], ["a", "b"])
    with pytest.raises(engine.ConflictingObservation):
        engine.parse_observations(inst, [("t0", "o0"), ("t0", "o1")])
    assert engine.parse_observations(inst, [("t0", "o0"), ("t0", "o0")]) == [(0, 0)]
    with pytest.raises(engine.UnknownTest):
        engine.parse_observations(inst, [("nope", "o0")])
    with pytest.raises(engine.UnknownOutcome):
        engine.parse_observations(inst, [("t0", "o7")])


def test_500_observations_on_a_likelihood_instance_neither_underflow_nor_nan():
    rng = random.Random(7)
    n_tests = 600
    # Each answer carries little evidence (0.55 / 0.45), so the product of 600 of them is ~1e-200
    # per hypothesis: only a log-space posterior keeps the ratio between hypotheses.
    cells = [[[p, 1 - p] for p in (rng.choice((0.45, 0.55)) for _ in range(n_tests))] for _ in range(4)]
    model, inst = likelihood_instance(cells, ["a", "b", "c", "d"], priors=[0.4, 0.3, 0.2, 0.1])
    observations = [(t, ref.sample_outcome(model, rng, 2, t)) for t in range(n_tests - 50)]
    decision = step(inst, observations, "effecxtive", max_tests=1000)
    posterior = decision.belief.class_posterior
    assert np.isfinite(posterior).all() and abs(posterior.sum() - 1) < 1e-12
    expected = ref.class_distribution(model, ref.version_space_mass(model, observations))
    for c, label in enumerate(inst.class_labels):
        assert abs(posterior[c] - expected[label]) <= 1e-9 * max(expected[label], 1e-300) + 1e-300
    assert decision.next_test is not None and np.isfinite(decision.scores[decision.next_test])


def test_ec2_is_refused_on_likelihood_instances_naming_the_default():
    _, inst = likelihood_instance([[[0.9, 0.1]], [[0.1, 0.9]]], ["a", "b"])
    with pytest.raises(engine.PolicyNotApplicable, match=engine.DEFAULT_POLICIES["likelihood"]):
        step(inst, policy="ec2")
    with pytest.raises(engine.UnknownPolicy):
        step(inst, policy="nope")
    assert step(inst).next_test == 0


def test_random_draws_with_the_documented_generator_per_seed_and_step():
    # docs/engine.md: uniform over the informative tests, drawn with default_rng([seed, step]),
    # step = number of observations. t3 is certain (every hypothesis says o0), so never drawn.
    rows = [[0, 0, 0, 0, 0], [1, 1, 1, 0, 1], [1, 0, 1, 0, 0], [0, 1, 1, 0, 1]]
    _, inst = deterministic(rows, ["a", "b", "c", "d"])
    chosen = set()
    for seed in range(40):
        first = engine.next_step(inst, [], "random", seed=seed).next_test
        assert first == [0, 1, 2, 4][np.random.default_rng([seed, 0]).integers(4)], seed
        chosen.add(first)
        # After t1 = o0 (h0, h2 left) only t0 and t2 still split them: the draw is keyed by step 1.
        second = engine.next_step(inst, engine.parse_observations(inst, [("t1", "o0")]), "random", seed=seed)
        assert second.next_test == [0, 2][np.random.default_rng([seed, 1]).integers(2)], seed
    assert chosen == {0, 1, 2, 4}


# --- the streamed statistics: singleton classes, and big and small classes mixed -----------------


def with_classes(model: ref.Model, sizes: list[int], rng: random.Random) -> ref.Model:
    """``model`` with its hypotheses dealt into classes of the given sizes (in a shuffled order,
    so compilation has to regroup them)."""
    labels = [f"c{c}" for c, size in enumerate(sizes) for _ in range(size)]
    rng.shuffle(labels)
    return dataclasses.replace(model, classes=labels)


# The reference's decisions, by (model, observations, policy, max_tests): the agreement tests run
# the same instances once per statistics path, and the naive reference does not depend on it.
_REFERENCE_DECISIONS: dict[tuple, ref.Choice] = {}
# The compiled instances, by model and the engine's module settings when compiled: every policy's
# case compiles the same random models under the same path; one compile per (model, path) is
# enough (a compiled instance is immutable; what it caches it computes under that same path).
_COMPILED: dict[tuple, engine.CompiledInstance] = {}
_PATH_MODULES = (alpha_module, statistics_module, compiled_module)


def compiled_once(model: ref.Model) -> engine.CompiledInstance:
    settings = tuple((module.__name__, name, repr(value)) for module in _PATH_MODULES
                     for name, value in vars(module).items() if name.lstrip("_").isupper())
    key = (repr(model), settings)
    if key not in _COMPILED:
        _COMPILED[key] = compile_model(model)
    return _COMPILED[key]


@pytest.fixture(autouse=True, scope="module")
def _forget_compiled():
    yield
    _COMPILED.clear()
    _REFERENCE_DECISIONS.clear()


def reference_decision(model: ref.Model, observations, policy: str, max_tests) -> ref.Choice:
    key = (repr(model), repr(observations), policy, max_tests)
    if key not in _REFERENCE_DECISIONS:
        _REFERENCE_DECISIONS[key] = ref.decide(model, observations, policy, max_tests=max_tests)
    return _REFERENCE_DECISIONS[key]


def compare_with_reference(model: ref.Model, observations, policy: str, where: str):
    """The engine's stop and scores against the reference. Returns (decision, the reference's
    decision, whether scores were compared)."""
    inst = compiled_once(model)
    # A likelihood instance would stop at the default confidence 0.95 before scoring anything;
    # a max_tests far away switches that default off and leaves the scores to compare.
    rules = StopRules(max_tests=100) if not model.deterministic else StopRules()
    parsed = engine.parse_observations(inst, labelled(observations))
    decisions = [engine.next_step(inst, parsed, policy, rules)]
    if policy == "eced" and not model.deterministic:
        # ECED's ratios read from the instance's table (these instances are small), and computed in
        # the step as past the table's size bound: both against the same reference.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(compiled_module, "RATIO_TABLE_MAX_BYTES", 0)
            decisions.append(engine.next_step(compile_model(model), parsed, policy, rules))
    expected = reference_decision(model, observations, policy, rules.max_tests)
    for decision in decisions:
        assert (decision.stop_reason.value if decision.stop_reason else None) == expected.stop, where
        if expected.stop not in (None, "no_informative_test"):
            continue
        unit = sum(ref.version_space_mass(model, observations)) ** POWER.get(policy, 0)
        for t, score in enumerate(expected.scores):
            if score is None:
                assert math.isnan(decision.scores[t]), f"{where}: test {t} was run, has a score"
            else:
                assert_close(decision.scores[t], score, unit / model.costs[t], f"{where}, test {t}")
    return decisions[0], expected, expected.stop in (None, "no_informative_test")


@pytest.mark.parametrize(
    "kind,policy",
    [("deterministic", p) for p in DETERMINISTIC_POLICIES] + [("likelihood", p) for p in LIKELIHOOD_POLICIES],
)
def test_every_hypothesis_its_own_class_agrees_with_the_reference(kind, policy, statistics_path):
    # The default class (= the hypothesis id): the singleton path, which never builds α.
    compared = 0
    for seed in range(80):
        model, observations = random_case(10_000 + seed, kind)
        model = dataclasses.replace(model, classes=list(model.hypothesis_ids))
        compared += compare_with_reference(model, observations, policy, f"seed {seed}, {policy}")[2]
    assert compared >= 40, f"only {compared} instances were scored"


# (small-class cells, block cells, cells that split a batch over two threads) as multiples of the
# number of tests, for the streamed pass: the defaults, then classes of ≥ 4 rows taken as big with
# 3-row blocks, so big classes span several blocks and runs of small classes are cut into blocks of
# whole classes (one class larger than a block is a block alone). "dense" is the whole-α path these
# small instances take by default (class sums by one GEMM), "dense, padded runs" the same with the
# classes' rows padded to the longest class, "dense, per-class sums" with np.add.reduceat. The
# passes over likelihood rows (ECED, infogain) sum a block's classes by one GEMM on these sizes;
# "tiny blocks, classes by runs" takes sum_runs instead.
PATH_SETTINGS = {"dense": None, "dense, padded runs": None, "dense, per-class sums": None,
                 "streamed": (None, None, None), "tiny blocks": (4, 3, None),
                 "tiny blocks, classes by runs": (4, 3, None),
                 "big classes split over two threads": (4, 40, 0)}


def mixed_classes_case(seed: int, kind: str):
    """Several hypotheses per class in some classes, one in others (sizes 1–9), ≤ 5 tests of 2–4
    outcomes, non-uniform priors and costs, a few observations from a random true hypothesis."""
    rng = random.Random(seed)
    shape = ref.random_model(rng, kind, max_hypotheses=2, max_tests=5)
    sizes = [rng.choice((1, 1, 1, 2, 3, 5, 9)) for _ in range(rng.randint(3, 8))]
    n = sum(sizes)
    rows = [ref.random_model(rng, kind, max_hypotheses=2, max_tests=5) for _ in range(n)]
    model = ref.Model(
        arity=shape.arity, costs=shape.costs, classes=[], prior=[rng.uniform(0.05, 1.0) for _ in range(n)],
        hypothesis_ids=[f"h{i}" for i in range(n)],
    )
    if kind == "deterministic":
        model.outcomes = [[rng.randrange(a) for a in shape.arity] for _ in range(n)]
    else:
        model.likelihood = [[random_likelihood_cell(rng, a) for a in shape.arity] for _ in rows]
    model = with_classes(model, sizes, rng)
    truth = rng.randrange(n)
    tests = list(range(model.n_tests))
    rng.shuffle(tests)
    observations = [(t, ref.sample_outcome(model, rng, truth, t)) for t in tests[: rng.randint(0, 2)]]
    return model, observations, sizes


def random_likelihood_cell(rng: random.Random, arity: int) -> list[float]:
    """As in reference.random_model: sometimes an exact answer (zero likelihoods happen)."""
    if rng.random() < 0.15:
        cell = [0.0] * arity
        cell[rng.randrange(arity)] = 1.0
        return cell
    raw = [rng.uniform(0.02, 1.0) for _ in range(arity)]
    return [x / sum(raw) for x in raw]


@pytest.mark.parametrize("setting", sorted(PATH_SETTINGS))
@pytest.mark.parametrize(
    "kind,policy",
    [("deterministic", p) for p in DETERMINISTIC_POLICIES] + [("likelihood", p) for p in LIKELIHOOD_POLICIES],
)
def test_big_and_small_classes_mixed_agree_with_the_reference(kind, policy, setting, monkeypatch):
    compared = 0
    for seed in range(30):
        model, observations, sizes = mixed_classes_case(20_000 + seed, kind)
        if setting == "dense, padded runs":
            monkeypatch.setattr(alpha_module, "_PADDED_RUNS", 1)
            monkeypatch.setattr(alpha_module, "_PADDED_GROWTH", math.inf)
        if setting == "tiny blocks, classes by runs":
            monkeypatch.setattr(statistics_module, "_CLASS_PRODUCT_FLOPS", 0)
        if setting == "dense, per-class sums":
            monkeypatch.setattr(alpha_module, "_PADDED_RUNS", math.inf)
            monkeypatch.setattr(alpha_module, "_DENSE_FLOPS", 0)
        if PATH_SETTINGS[setting] is not None:
            small, block, parallel = PATH_SETTINGS[setting]
            monkeypatch.setattr(alpha_module, "_DENSE_CELLS", 0)
            if small is not None:
                monkeypatch.setattr(alpha_module, "_SMALL_CLASS_CELLS", small * model.n_tests)
                monkeypatch.setattr(alpha_module, "_BLOCK_CELLS", block * model.n_tests)
                # ECED's pass over the likelihood ratios: blocks of a row or a few, classes cut.
                monkeypatch.setattr(statistics_module, "_RATIO_BLOCK_CELLS", block * model.n_tests)
            if parallel is not None:
                monkeypatch.setattr(alpha_module, "_PARALLEL_CELLS", parallel)
        compared += compare_with_reference(model, observations, policy, f"seed {seed}, {policy}, sizes {sizes}")[2]
    assert compared >= 12, f"only {compared} instances were scored"


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
def test_streamed_statistics_equal_the_dense_alpha_at_the_default_block_sizes(kind, monkeypatch):
    # Big enough for every path at the default sizes: a 700-row class (700 × 20 cells ≥ 2¹³, so
    # per-class GEMVs), runs of singletons and of small classes (2–5 rows), with part of the
    # hypotheses ruled out so the alive rows are gathered, not sliced. Checked against α built
    # densely here, (classes, tests, outcomes), and reduced in the obvious way.
    rng = np.random.default_rng(3)
    n_tests, width = 20, 3
    sizes = [700] + [1] * 900 + list(rng.integers(2, 6, size=150)) + [1] * 300
    labels = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(labels)
    n = len(labels)
    tests = [{"id": f"t{t}", "outcomes": ["a", "b", "c"]} for t in range(n_tests)]
    payload = {"tests": tests, "classes": [f"c{c}" for c in labels],
               "priors": list(rng.uniform(0.05, 1.0, size=n))}
    if kind == "deterministic":
        payload["matrix"] = rng.integers(0, width, size=(n, n_tests)).tolist()
        observations = [("t0", "b")]
    else:
        raw = rng.uniform(0.02, 1.0, size=(n, n_tests, width))
        payload["likelihood_matrix"] = (raw / raw.sum(axis=2, keepdims=True)).tolist()
        observations = [("t0", "b"), ("t1", "a")]
    inst = compile_wire(payload)
    belief = engine.observe(inst, engine.parse_observations(inst, observations))
    monkeypatch.setattr(alpha_module, "_DENSE_CELLS", 0)
    stats = belief.outcome_stats()

    if kind == "deterministic":
        per_hypothesis = np.eye(width)[inst.outcomes[belief.alive]]  # (|V|, N, ℓ) one-hot
    else:
        per_hypothesis = inst.likelihood[belief.alive]
    alpha = np.zeros((inst.n_classes, n_tests, width))
    np.add.at(alpha, inst.class_index[belief.alive], belief.mass[:, None, None] * per_hypothesis)
    a = alpha / belief.total_mass
    dense = {"p": a.sum(axis=0), "sum_sq": (a * a).sum(axis=0),
             "sum_xlogx": alpha_module.xlog2x(a).sum(axis=0), "max": a.max(axis=0)}
    for name, expected in dense.items():
        got = getattr(stats, name)
        assert got.shape == (n_tests, width)
        assert np.allclose(got, expected, rtol=1e-9, atol=1e-15), name
    # The maximum is exact (no smooth bound): it differs from the dense one by summation order only.
    assert np.allclose(stats.max, dense["max"], rtol=1e-13, atol=0)
    # b(i) = Σ_x a(i, t, x) for any test t: the class posterior from the dense α built above.
    assert np.allclose(stats.b, a[:, 0, :].sum(axis=1), rtol=1e-12, atol=0)


def test_parsing_continued_from_an_earlier_parse_equals_parsing_everything():
    wire = {"tests": [{"id": "a", "outcomes": ["0", "1"]}, {"id": "b", "outcomes": ["0", "1"], "repeatable": True},
                      {"id": "c", "outcomes": ["0", "1", "2"]}],
            "classes": ["X", "Y"],
            "likelihood_matrix": [[[0.9, 0.1, 0.0], [0.8, 0.2, 0.0], [0.2, 0.3, 0.5]],
                                  [[0.1, 0.9, 0.0], [0.3, 0.7, 0.0], [0.6, 0.3, 0.1]]]}
    inst = compile_wire(wire)
    labels = [("a", "0"), ("a", "1"), ("a", None), ("b", "0"), ("b", "1"), ("b", None), ("c", "2"), ("c", None),
              ("c", "3"), ("z", "0")]
    rng = random.Random(3)

    def outcome(labelled, parsed_before=(), start=0):
        try:
            return engine.parse_observations(inst, labelled, parsed_before, start)
        except engine.EngineError as error:
            return type(error), str(error)

    compared = 0
    for _ in range(400):
        labelled = [rng.choice(labels) for _ in range(rng.randrange(1, 7))]
        for cut in range(len(labelled)):
            head = outcome(labelled[:cut])
            if isinstance(head, tuple):
                continue  # a refused prefix is never continued from
            assert outcome(labelled[cut:], head, cut) == outcome(labelled), labelled
            compared += 1
    assert compared > 500


# --- ECED: the noise-aware successor of EC² -----------------------------------------------------


@pytest.mark.parametrize("max_flips", [None, 1])
def test_eced_coincides_with_ec2_where_likelihoods_are_0_or_1(max_flips):
    # Deterministic outcomes, and the noisy copies max_flips expands them into: λ is 0 or 1, the
    # offset 0 wherever an outcome is possible, so the discount is the cut (same scores, same stop).
    compared = 0
    for seed in range(80):
        model, observations = random_case(30_000 + seed, "deterministic")
        payload = ref.to_payload(model)
        if max_flips is not None:
            payload = {**payload, "max_flips": max_flips, "noise": 0.1}
        inst = compile_wire(payload)
        parsed = engine.parse_observations(inst, labelled(observations))
        eced, ec2 = (engine.next_step(inst, parsed, policy) for policy in ("eced", "ec2"))
        assert eced.stop_reason == ec2.stop_reason and eced.next_test == ec2.next_test, seed
        scored = ~np.isnan(ec2.scores)
        assert np.array_equal(scored, ~np.isnan(eced.scores)), seed
        scale = np.nanmax(np.abs(ec2.scores), initial=0.0)
        assert np.allclose(eced.scores[scored], ec2.scores[scored], rtol=1e-9, atol=1e-13 * scale), seed
        compared += eced.next_test is not None
    assert compared >= 30


def test_eced_gives_a_test_every_root_cause_answers_alike_nothing_however_noisy():
    # t0's answers do not depend on the hypothesis (noise only); t1 tells 'a' from 'b', noisily.
    cells = [[[0.7, 0.3], [0.8, 0.2]], [[0.7, 0.3], [0.3, 0.7]], [[0.7, 0.3], [0.25, 0.75]]]
    model, inst = likelihood_instance(cells, ["a", "b", "b"])
    decision = step(inst, policy="eced", max_tests=5)
    assert decision.next_test == 1 and abs(decision.scores[0]) <= 1e-15
    assert abs(ref.eced_gain(model, [], 0)) <= 1e-15 and ref.eced_gain(model, [], 1) > 0.01

