"""Every path by which the engine reduces the masses α (Belief.outcome_stats) against α summed
from its definition, on random instances with the cases the fast paths treat apart.

Paths: whole α for small beliefs (singletons, classes padded to the longest run, one GEMM,
per-class sums) and streamed (cast-and-GEMV blocks, the answers' bit planes). Cases: every
hypothesis its own class or classes of several, zero-prior rows, one alive hypothesis, a
number of hypotheses that is not a multiple of eight, 2–4 outcomes with tests of fewer outcomes
than the widest, full and thinned-out version spaces."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from service import engine
from service.engine import alpha as alpha_module
from service.engine import belief as belief_module
from service.engine import compiled as compiled_module
from service.engine.belief import xlog2x
from service.engine.compiled import class_runs
from service.store.cache import resident_bytes

PATHS = {
    "dense": {},
    "dense, padded runs": {"_PADDED_RUNS": 1, "_PADDED_GROWTH": math.inf},
    "dense, one GEMM": {"_PADDED_RUNS": math.inf},
    "dense, per-class sums": {"_PADDED_RUNS": math.inf, "_DENSE_FLOPS": 0},
    "streamed, cast blocks": {"_DENSE_CELLS": 0, "_MIN_GROUP_FILL": math.inf},
    "streamed, bit planes": {"_DENSE_CELLS": 0, "_MIN_GROUP_FILL": 0},
}
STATISTIC_SETS = [frozenset(), frozenset({"sum_sq"}), frozenset({"sum_xlogx"}), frozenset({"max"}),
                  belief_module.CLASS_REDUCTIONS]


def random_instance(rng: np.random.Generator, kind: str, own_classes: bool, n: int | None = None,
                    n_tests: int | None = None) -> engine.CompiledInstance:
    """Rows grouped by class as compile_instance lays them out; about one prior in six is 0."""
    n = int(rng.integers(1, 41)) if n is None else n
    n_tests = int(rng.integers(1, 8)) if n_tests is None else n_tests
    width = int(rng.integers(2, 5))
    arity = rng.integers(1, width + 1, size=n_tests)
    arity[rng.integers(n_tests)] = width
    if own_classes:
        class_index = np.arange(n)
    else:
        class_index = np.sort(rng.integers(0, max(1, n // 3), size=n))
        class_index = np.unique(class_index, return_inverse=True)[1].reshape(-1)
    prior = rng.uniform(0.05, 1.0, size=n) * (rng.random(n) > 1 / 6)
    prior[rng.integers(n)] = 0.5  # at least one hypothesis is possible
    common = dict(
        test_ids=tuple(f"t{t}" for t in range(n_tests)),
        outcome_labels=tuple(tuple(f"o{k}" for k in range(a)) for a in arity),
        costs=np.ones(n_tests),
        hypothesis_ids=tuple(f"h{h}" for h in range(n)),
        class_labels=tuple(f"c{c}" for c in range(int(class_index.max()) + 1)),
        class_index=class_index.astype(np.intp),
        prior=prior / prior.sum(),
    )
    if kind == "deterministic":
        outcomes = (rng.random((n, n_tests)) * arity).astype(np.uint8)
        return engine.CompiledInstance(**common, outcomes=outcomes)
    likelihood = rng.uniform(0.02, 1.0, size=(n, width, n_tests)) * (np.arange(width)[:, None] < arity)
    exact = rng.random((n, n_tests)) < 0.15  # some exact answers: zero likelihoods happen
    stated = (rng.random((n, n_tests)) * arity).astype(int)
    one_hot = np.arange(width)[None, :, None] == stated[:, None, :]
    likelihood = np.where(exact[:, None, :], one_hot, likelihood)
    likelihood /= likelihood.sum(axis=1, keepdims=True)
    return engine.CompiledInstance(**common, likelihood=likelihood.transpose(0, 2, 1))


def beliefs(rng: np.random.Generator, inst: engine.CompiledInstance) -> list[engine.Belief]:
    """The prior belief, one after a few answers of a possible hypothesis, one with a random
    subset of the possible hypotheses alive, and one with a single hypothesis alive."""
    possible = np.flatnonzero(inst.prior > 0)
    truth = int(rng.choice(possible))
    answers = []
    for t in rng.permutation(inst.n_tests)[: rng.integers(1, 4)]:
        if inst.outcomes is not None:
            answers.append((int(t), int(inst.outcomes[truth, t])))
        else:
            answers.append((int(t), int(np.argmax(inst.likelihood[truth, t]))))
    subset = np.sort(rng.choice(possible, size=int(rng.integers(1, possible.size + 1)), replace=False))
    one = possible[rng.integers(possible.size)]
    return [engine.observe(inst, []), engine.observe(inst, answers),
            engine.Belief(inst, (), subset, inst.prior[subset]),
            engine.Belief(inst, (), np.array([one]), inst.prior[[one]])]


def alpha_by_definition(belief: engine.Belief) -> np.ndarray:
    """a(i, t, x) = Σ_{h ∈ H_i ∩ V} w(h) P(X_t = x | h) / M, one hypothesis and test at a time."""
    inst = belief.instance
    a = np.zeros((inst.n_classes, inst.n_tests, inst.max_outcomes))
    for h, w in zip(belief.alive, belief.mass / belief.mass.sum()):
        for t in range(inst.n_tests):
            if inst.outcomes is not None:
                a[inst.class_index[h], t, inst.outcomes[h, t]] += w
            else:
                a[inst.class_index[h], t, :] += w * inst.likelihood[h, t, :]
    return a


def assert_stats_match_definition(belief: engine.Belief, wanted: frozenset[str], what: str) -> None:
    a = alpha_by_definition(belief)
    stats = belief.outcome_stats(wanted)
    expected = {"p": a.sum(axis=0), "sum_sq": (a * a).sum(axis=0), "sum_xlogx": xlog2x(a).sum(axis=0),
                "max": a.max(axis=0)}
    np.testing.assert_allclose(stats.b, belief.class_mass / belief.total_mass, rtol=0, atol=1e-14)
    for name, value in expected.items():
        got = getattr(stats, name)
        if name != "p" and name not in wanted:
            assert got is None, f"{what}: {name} computed though not asked for"
            continue
        # Complements (outcome 0 as the total less the others) leave round-off where the exact value is 0.
        np.testing.assert_allclose(got, value, rtol=1e-9, atol=1e-12, err_msg=f"{what}: {name}")


def test_xlog2x_is_x_log2_x_with_0_at_0():
    # Against math.log2 one number at a time: the sums of α above are checked with xlog2x itself.
    values = np.array([[0.0, 1e-300, 0.25, 0.5], [1.0, 3.0, 1e-17, 0.0]])
    expected = [x * math.log2(x) if x > 0 else 0.0 for x in values.ravel().tolist()]
    assert xlog2x(values).shape == values.shape
    assert xlog2x(values).ravel().tolist() == pytest.approx(expected, rel=1e-15, abs=0)
    assert xlog2x(np.zeros(0)).shape == (0,)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
@pytest.mark.parametrize("own_classes", [True, False], ids=["class=hypothesis", "classes"])
def test_every_path_gives_the_statistics_of_alpha_by_its_definition(path, kind, own_classes, monkeypatch):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(alpha_module, name, value)
    rng = np.random.default_rng([sorted(PATHS).index(path), kind == "deterministic", own_classes])
    for case in range(25):
        inst = random_instance(rng, kind, own_classes)
        for number, belief in enumerate(beliefs(rng, inst)):
            for wanted in STATISTIC_SETS:
                assert_stats_match_definition(
                    belief, wanted, f"case {case}, belief {number} ({belief.alive.size} of {inst.n_hypotheses} "
                                    f"alive), {sorted(wanted)}")


@pytest.mark.parametrize("kind", ["deterministic", "likelihood"])
def test_bigger_instances_as_routed_by_default_match_the_definition(kind):
    # Past the dense limit: the bit planes for a full version space of singletons, the cast
    # blocks once answers thin it out, the class batches and blocks otherwise.
    rng = np.random.default_rng(7)
    for own_classes in (True, False):
        inst = random_instance(rng, kind, own_classes, n=1203, n_tests=61)
        for belief in beliefs(rng, inst):
            assert_stats_match_definition(belief, frozenset({"sum_sq", "sum_xlogx"}), f"{kind}, {own_classes}")


def test_the_bit_planes_serve_full_version_spaces_of_singletons_and_the_blocks_thinned_ones(monkeypatch):
    rng = np.random.default_rng(3)
    inst = random_instance(rng, "deterministic", True, n=3000, n_tests=60)
    calls = []
    add_bit_planes = alpha_module._Sums.add_bit_planes
    monkeypatch.setattr(alpha_module._Sums, "add_bit_planes",
                        lambda self, *args: calls.append(args) or add_bit_planes(self, *args))
    full = engine.observe(inst, [])
    full.outcome_stats({"sum_sq"})
    assert len(calls) == 1
    thinned = engine.Belief(inst, (), full.alive[::5], full.mass[::5])  # ≤ 2 alive per 8 rows
    thinned.outcome_stats({"sum_sq"})
    full.outcome_stats({"max"})  # max is not a weighted count: no table gives it
    assert len(calls) == 1


def test_outcome_bits_hold_each_outcome_of_eight_hypotheses_per_byte():
    rng = np.random.default_rng(11)
    for n in (1, 8, 13, 64):
        inst = random_instance(rng, "deterministic", True, n=n, n_tests=5)
        bits = inst.outcome_bits
        assert bits.shape == (inst.max_outcomes - 1, -(-n // 8), 5) and bits.dtype == np.uint8
        for k in range(1, inst.max_outcomes):
            for h in range(n):
                expected = inst.outcomes[h] == k
                assert np.array_equal((bits[k - 1, h // 8] >> (h % 8)) & 1 == 1, expected)
        for h in range(n, 8 * bits.shape[1]):  # the last byte's rows past n are 0
            assert not ((bits[:, -1] >> (h % 8)) & 1).any()


def test_derived_bytes_cover_what_the_engine_keeps_on_an_instance_and_the_cache_counts_them():
    rng = np.random.default_rng(5)
    for kind in ("deterministic", "likelihood"):
        inst = random_instance(rng, kind, False, n=37, n_tests=6)
        counted_before = resident_bytes(inst)
        engine.next_step(inst, [])
        for policy in ("eced", "infogain"):
            engine.next_step(inst, [], policy)
        kept = [inst.log_prior, inst.arity, inst.class_runs.run, inst.class_runs.slot, inst.largest_likelihood_ratios]
        kept += [a for a in (inst.outcome_bits, inst.packed_outcomes, inst.outcome_entropy, inst.likelihood_ratios)
                 if a is not None]
        assert inst.derived_nbytes >= sum(a.nbytes for a in kept)
        assert resident_bytes(inst) == counted_before >= inst.nbytes + inst.derived_nbytes


def test_ecds_ratio_table_is_each_likelihood_over_the_largest_of_its_test_and_counted_only_where_kept(monkeypatch):
    rng = np.random.default_rng(11)
    inst = random_instance(rng, "likelihood", False, n=30, n_tests=5)
    table = inst.likelihood_ratios
    for h in range(inst.n_hypotheses):
        for t in range(inst.n_tests):
            cells = [float(inst.likelihood[h, t, k]) for k in range(inst.max_outcomes)]
            assert table[h, :, t].tolist() == [c / max(cells) for c in cells]
    counted = inst.derived_nbytes
    assert counted >= table.nbytes + inst.outcome_entropy.nbytes
    # Past the bound nothing is kept, nor counted: the step computes the ratios itself.
    monkeypatch.setattr(compiled_module, "RATIO_TABLE_MAX_BYTES", table.nbytes - 1)
    past = dataclasses.replace(inst)
    assert past.likelihood_ratios is None and past.derived_nbytes == counted - table.nbytes


def test_the_padded_table_of_a_whole_version_space_is_kept_counted_and_holds_each_row_in_its_slot():
    rng = np.random.default_rng(8)
    for kind in ("deterministic", "likelihood"):
        inst = random_instance(rng, kind, True, n=64, n_tests=6)
        # 16 classes of 4 rows: the longest is 1/16 of the rows, the table exactly the rows.
        inst = dataclasses.replace(inst, class_index=np.repeat(np.arange(16), 4),
                                   class_labels=tuple(f"c{c}" for c in range(16)), prior=np.full(64, 1 / 64))
        assert inst.uses_padded_answers
        counted_before = inst.derived_nbytes
        # A policy that reads Σ_i a² per outcome: its dense pass is what lays the rows out by class.
        engine.next_step(inst, [], "ec2" if kind == "deterministic" else "effecxtive")
        padded = inst.__dict__["padded_answers"]  # built by the step, not by this read
        assert counted_before >= padded.nbytes + inst.log_prior.nbytes
        answers = (inst.outcomes[:, None, :] == np.arange(inst.max_outcomes)[:, None] if kind == "deterministic"
                   else inst.likelihood_by_outcome)
        for h in range(64):
            assert np.array_equal(padded[h // 4, h % 4], answers[h].reshape(-1))
    # One class of 8 rows beside 120 singletons: padding every singleton to 8 rows would make the
    # table 7.6 times the rows, so the pass does not keep (or count) one.
    inst = random_instance(rng, "likelihood", True, n=128, n_tests=6)
    inst = dataclasses.replace(inst, class_index=np.concatenate(([0] * 8, np.arange(1, 121))),
                               class_labels=tuple(f"c{c}" for c in range(121)), prior=np.full(128, 1 / 128))
    assert not inst.uses_padded_answers
    engine.next_step(inst, [])
    assert "padded_answers" not in inst.__dict__


@pytest.mark.parametrize("classes", [[0], [0, 0, 0], [0, 1, 2], [4, 4, 1, 1, 1, 7, 2, 2], list(range(9)) + [9] * 5])
def test_class_runs_number_the_runs_and_pad_them_to_the_longest(classes):
    runs = class_runs(np.array(classes))
    boundaries = [0] + [i for i in range(1, len(classes)) if classes[i] != classes[i - 1]] + [len(classes)]
    assert runs.count == len(boundaries) - 1
    assert runs.longest == max(b - a for a, b in zip(boundaries, boundaries[1:]))
    for r, (start, stop) in enumerate(zip(boundaries, boundaries[1:])):
        assert list(runs.run[start:stop]) == [r] * (stop - start)
        assert list(runs.slot[start:stop]) == [r * runs.longest + j for j in range(stop - start)]


def test_sums_over_runs_of_rows_equal_the_sums_by_definition():
    # Runs of one row, of a few, and beyond the position-by-position length, in every order.
    rng = np.random.default_rng(12)
    for _ in range(200):
        lengths = rng.choice([1, 1, 2, 3, 5, compiled_module._SHORT_RUN, compiled_module._SHORT_RUN + 1, 20],
                             size=int(rng.integers(1, 12)))
        firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        values = rng.random((int(lengths.sum()), 7))
        expected = np.array([values[f:f + n].sum(axis=0) for f, n in zip(firsts, lengths)])
        np.testing.assert_allclose(compiled_module.sum_runs(values, firsts), expected, rtol=1e-14, atol=0)
        # Some of the runs only, each row weighted: rows outside them are not read.
        chosen = rng.random(len(firsts)) < 0.5
        weight = rng.random(len(values))
        values[np.repeat(~chosen, lengths)] = np.nan
        weighted = np.array([weight[f:f + n] @ values[f:f + n] for f, n in zip(firsts[chosen], lengths[chosen])])
        np.testing.assert_allclose(compiled_module.sum_runs(values, firsts[chosen], lengths[chosen], weight),
                                   weighted.reshape(-1, 7), rtol=1e-14, atol=0)
