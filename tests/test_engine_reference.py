"""The fast policies against the naive reference (tests/reference.py), and the selection rules."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.instance import Instance
from service import engine
from service.engine import StopReason, StopRules

from tests import reference as ref

N_INSTANCES = 240
DETERMINISTIC_POLICIES = ["ec2", "effecxtive", "gbs", "infogain", "voi", "uncertainty", "random"]
LIKELIHOOD_POLICIES = ["effecxtive", "gbs", "infogain", "voi", "uncertainty", "random"]
# Units of each score: Δ_EC is a sum of P(h)P(h'), GBS a mass; the rest are posterior quantities.
POWER = {"ec2": 2, "gbs": 1}


def compile_model(model: ref.Model) -> engine.CompiledInstance:
    return engine.compile_instance(Instance.model_validate(ref.to_payload(model)))


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
def test_policies_agree_with_the_reference_on_random_instances(kind, policy):
    compared = 0
    for seed in range(N_INSTANCES):
        model, observations = random_case(seed, kind)
        inst = compile_model(model)
        # A likelihood instance would stop at the default confidence 0.95 before scoring anything;
        # a max_tests far away switches that default off and leaves the scores to compare.
        rules = StopRules(max_tests=100) if kind == "likelihood" else StopRules()
        decision = engine.next_step(inst, engine.parse_observations(inst, labelled(observations)), policy, rules)
        expected = ref.decide(model, observations, policy, max_tests=rules.max_tests)
        where = f"seed {seed}, {policy}, observations {observations}"
        assert (decision.stop_reason.value if decision.stop_reason else None) == expected.stop, where
        if expected.stop in (None, "no_informative_test"):
            compared += 1
            unit = sum(ref.version_space_mass(model, observations)) ** POWER.get(policy, 0)
            for t, score in enumerate(expected.scores):
                if score is None:
                    assert math.isnan(decision.scores[t]), f"{where}: test {t} was run, has a score"
                else:
                    assert_close(decision.scores[t], score, unit / model.costs[t], f"{where}, test {t}")
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


def test_the_class_posterior_matches_bayes_with_plain_loops():
    for seed in range(60):
        model, observations = random_case(seed, "likelihood")
        inst = compile_model(model)
        belief = engine.observe(inst, engine.parse_observations(inst, labelled(observations)))
        expected = ref.class_distribution(model, ref.version_space_mass(model, observations))
        for c, label in enumerate(inst.class_labels):
            assert abs(belief.class_posterior[c] - expected.get(label, 0.0)) <= 1e-12


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
    # After o0 on t0 the posterior of 'a' is 0.95·0.5 / (0.95·0.5 + 0.05·0.5) = 0.95 exactly.
    cells = [[[0.95, 0.05], [0.5, 0.5]], [[0.05, 0.95], [0.6, 0.4]]]
    _, inst = likelihood_instance(cells, ["a", "b"])
    assert engine.DEFAULT_LIKELIHOOD_CONFIDENCE == 0.95
    assert step(inst).next_test == 0
    assert step(inst, [(0, 0)]).stop_reason == StopReason.CONFIDENCE_REACHED
    # Any explicit stop rule replaces the default.
    assert step(inst, [(0, 0)], max_tests=5).next_test == 1
    assert step(inst, [(0, 0)], confidence=0.99).next_test == 1
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


def test_ec2_is_refused_on_likelihood_instances_naming_effecxtive():
    _, inst = likelihood_instance([[[0.9, 0.1]], [[0.1, 0.9]]], ["a", "b"])
    with pytest.raises(engine.PolicyNotApplicable, match="effecxtive"):
        step(inst, policy="ec2")
    with pytest.raises(engine.UnknownPolicy):
        step(inst, policy="nope")
    assert step(inst).next_test == 0  # the default on likelihood instances is effecxtive


def test_random_is_reproducible_per_seed_and_step_and_covers_the_uncertain_tests():
    _, inst = deterministic([[0, 0, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0]], ["a", "b", "c"])
    picks = {seed: step(inst, policy="random").next_test for seed in range(1)}
    chosen = set()
    for seed in range(40):
        first = engine.next_step(inst, [], "random", seed=seed).next_test
        assert first == engine.next_step(inst, [], "random", seed=seed).next_test
        chosen.add(first)
    # t3 is certain (every hypothesis says o0); the other three are uncertain and all get drawn.
    assert chosen == {0, 1, 2}
    assert picks[0] in chosen
