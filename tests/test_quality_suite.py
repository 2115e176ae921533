"""The quality suite's instances (service/examples/real_data.py) against calculations by hand, on
small subsets, and its harness (bench/quality.py) against engine.run_policy."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench import quality
from service import engine
from service.examples import real_data

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wine_parts():
    return real_data.held_out_parts("wine", folds=3, seed=0, respondents_per_fold=3)


def by_hand_bin(value: float, edges) -> int:
    return sum(1 for e in edges if e <= value)


def test_held_out_rows_are_disjoint_from_training_rows(wine_parts):
    from sklearn.datasets import load_wine

    n = load_wine().data.shape[0]
    tested = []
    for part in wine_parts:
        assert not set(part.train_rows) & set(part.test_rows)
        assert len(set(part.train_rows)) + len(part.test_rows) <= n
        tested += list(part.test_rows)
    assert len(tested) == len(set(tested)) == 9  # each row held out at most once


def test_held_out_respondents_answer_with_their_own_bins_and_label(wine_parts):
    from sklearn.datasets import load_wine

    data = load_wine()
    part = wine_parts[0]
    inst = part.instance
    answers = {tuple(r.answers): r for r in part.respondents}
    for row in part.test_rows:
        expected = []
        for t, column in enumerate(part.features):
            train = sorted(data.data[part.train_rows, column])
            # Linear-interpolation quartiles, written out: position q·(m − 1) between order statistics.
            edges = set()
            for q in (0.25, 0.5, 0.75):
                position = q * (len(train) - 1)
                low = math.floor(position)
                high = min(low + 1, len(train) - 1)
                edges.add(train[low] + (position - low) * (train[high] - train[low]))
            expected.append(by_hand_bin(data.data[row, column], sorted(edges)))
            assert inst.test_ids[t] == data.feature_names[column]
        respondent = answers[tuple(expected)]
        assert inst.class_labels[respondent.true_class] == data.target_names[data.target[row]]
        assert respondent.hypothesis == -1


def test_prototype_likelihood_is_the_smoothed_frequency_of_its_training_rows(wine_parts):
    from sklearn.datasets import load_wine

    data = load_wine()
    part = wine_parts[1]
    inst = part.instance
    prototype = inst.hypothesis_ids[-1]
    members = [row for row, p in zip(part.train_rows, part.prototype_of_row) if p == prototype]
    assert len(members) >= real_data.MIN_PROTOTYPE_ROWS
    h = inst.hypothesis_ids.index(prototype)
    t = 2
    column, edges = part.features[t], part.edges[t]
    bins = [by_hand_bin(data.data[row, column], edges) for row in members]
    for b in range(real_data.BINS):
        expected = (bins.count(b) + 1.0) / (len(members) + 1.0 * real_data.BINS)
        assert abs(inst.likelihood[h, t, b] - expected) < 1e-9
    assert abs(inst.prior[h] - len(members) / len(part.train_rows)) < 1e-9
    assert prototype.split("/")[0] == data.target_names[data.target[members[0]]]
    assert {data.target[row] for row in members} == {data.target[members[0]]}


HPOA = """#description: a hand-made excerpt
database_id\tdisease_name\tqualifier\thpo_id\treference\tevidence\tonset\tfrequency\tsex\tmodifier\taspect\tbiocuration
ORPHA:1\tOne\t\tHP:0000001\tx\tTAS\t\tHP:0040281\t\t\tP\tb
ORPHA:1\tOne\t\tHP:0000002\tx\tTAS\t\t3/4\t\t\tP\tb
ORPHA:1\tOne\t\tHP:0000002\tx\tTAS\t\tHP:0040283\t\t\tP\tb
ORPHA:1\tOne\t\tHP:0000003\tx\tTAS\t\tHP:0040280\t\t\tP\tb
ORPHA:1\tOne\tNOT\tHP:0000004\tx\tTAS\t\tHP:0040281\t\t\tP\tb
ORPHA:2\tTwo\t\tHP:0000001\tx\tTAS\t\t45%\t\t\tP\tb
ORPHA:2\tTwo\t\tHP:0000005\tx\tTAS\t\tHP:0040284\t\t\tI\tb
ORPHA:2\tTwo\t\tHP:0000006\tx\tTAS\t\t\t\t\tP\tb
OMIM:3\tThree\t\tHP:0000007\tx\tTAS\t\t1/1\t\t\tP\tb
OMIM:3\tThree\t\tHP:0000008\tx\tTAS\t\t1/1\t\t\tP\tb
OMIM:3\tThree\t\tHP:0000009\tx\tTAS\t\t1/1\t\t\tP\tb
"""


def test_phenotype_table_from_a_hand_made_annotation_file(tmp_path):
    path = tmp_path / "phenotype.hpoa"
    path.write_text(HPOA)
    diseases, terms, present = real_data.phenotype_table(diseases=5, phenotypes=5, path=path)
    # OMIM rows, NOT rows, other aspects and rows without a frequency are left out; ORPHA:1 has
    # three annotated phenotypes, ORPHA:2 one; HP:0000001 is annotated twice.
    assert diseases == ["ORPHA:1", "ORPHA:2"]
    assert terms == ["HP:0000001", "HP:0000002", "HP:0000003"]
    expected = np.array([[0.895, 0.75, 0.99],   # 3/4 beats "occasional"; obligate clipped to 0.99
                         [0.45, 0.01, 0.01]])   # unannotated: the background
    assert np.abs(present - expected).max() < 1e-12
    part = real_data.phenotype_part(diseases=5, phenotypes=5, respondents=4, path=path)
    inst = part.instance
    h = inst.hypothesis_ids.index("ORPHA:2")
    assert abs(inst.likelihood[h, 0, 1] - 0.45) < 1e-12 and abs(inst.likelihood[h, 0, 0] - 0.55) < 1e-12
    assert np.allclose(inst.prior, 0.5)


def test_phenotype_table_from_the_shipped_annotations():
    diseases, terms, present = real_data.phenotype_table(diseases=20, phenotypes=30)
    assert len(diseases) == 20 and len(terms) == 30 and all(d.startswith("ORPHA:") for d in diseases)
    assert present.min() >= 0.01 and present.max() <= 0.99
    # Every chosen term is annotated above the background for some chosen disease.
    assert (present > 0.01).any(axis=0).all()


def test_model_respondents_answer_by_the_inverse_of_the_cumulative_likelihood(tmp_path):
    path = tmp_path / "phenotype.hpoa"
    path.write_text(HPOA)
    part = real_data.phenotype_part(diseases=5, phenotypes=5, respondents=8, seed=7, path=path)
    inst = part.instance
    for r, respondent in enumerate(part.respondents):
        rng = np.random.default_rng([7, r])
        h = int(rng.choice(inst.n_hypotheses, p=inst.prior))
        uniforms = rng.random(inst.n_tests)
        assert respondent.hypothesis == h and respondent.true_class == inst.class_index[h]
        for t in range(inst.n_tests):
            present = inst.likelihood[h, t, 1]
            assert respondent.answers[t] == (1 if uniforms[t] >= 1.0 - present else 0)


def test_triage_read_as_classes_makes_each_condition_a_class():
    part = real_data.example_part(ROOT / "examples" / "triage" / "instance.json", 5, classes_are_hypotheses=True)
    inst = part.instance
    assert not inst.is_decision and sorted(inst.class_labels) == sorted(inst.hypothesis_ids)
    for respondent in part.respondents:
        assert (respondent.answers == inst.outcomes[respondent.hypothesis]).all()


def test_the_harness_plays_a_policy_as_run_policy_does():
    part = real_data.example_part(ROOT / "examples" / "triage" / "instance.json", 20, seed=3)
    inst = part.instance
    policy = engine.POLICIES["hec"]
    runs = quality.Runs()
    for respondent in part.respondents:
        quality.play(inst, policy, respondent, 0, 16, runs)
        reference = engine.run_policy(inst, respondent.hypothesis, policy)
        assert runs.stop_answers[-1] == len(reference.observations)
        assert abs(runs.stop_cost[-1] - reference.cost) < 1e-9
        right = bool(inst.acceptable[respondent.hypothesis, reference.decision])
        assert runs.stop_right[-1] == right and runs.right_at[-1][-1] == right


def test_paired_difference_from_the_best_by_hand():
    a, b = quality.Runs(), quality.Runs()
    a.stop_right = [True, True, False, True]
    b.stop_right = [True, False, False, False]
    cells = quality.accuracy_cells({"a": a, "b": b}, lambda r: np.array(r.stop_right))
    d = [0, -1, 0, -1]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert cells["a"].gap == 0 and cells["a"].within
    assert abs(cells["b"].gap - mean) < 1e-12
    assert abs(cells["b"].gap_interval[1] - (mean + 1.959963984540054 * sd / 2)) < 1e-12
    assert cells["b"].within  # [-1.07, 0.07] reaches 0 with four respondents
