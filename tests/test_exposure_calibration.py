"""Sympson–Hetter calibration (``edgecut calibrate-exposure``): a calibrated bank's items are each
given to at most about the target share of fresh examinees, counted here by running the engine
item by item with answers from the 3PL formula; the calibration is reproducible from its seed;
and ``edgecut evaluate`` compiles banks on ITEM_BANK_GRID_POINTS."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from service import engine
from service.cli import main
from service.evaluation.exposure import ExposureCalibration, ExposureIteration, calibrate_exposure

from exposure_support import bank_of, compiled, rates_given, with_parameters

RULES = engine.StopRules(max_tests=5)
FRESH = 600  # examinees counted item by item


def test_a_calibrated_bank_holds_the_target_on_fresh_examinees():
    body = bank_of()
    plain = rates_given(body, RULES, 200, 10_000)
    assert plain.max() == 1.0  # uncontrolled, the best first item goes to everyone
    calibration = calibrate_exposure(compiled(body), 0.4, RULES, examinees=500, iterations=6, seed=1)
    assert calibration.iterations[0].top_rate == 1.0 and (calibration.iterations[0].exposure_parameters == 1).all()
    parameters = calibration.exposure_parameters
    held = parameters < 1
    assert 0.4 <= parameters.min() and held.sum() >= 3 and parameters.max() == 1.0
    fresh = rates_given(with_parameters(body, parameters), RULES._replace(sympson_hetter=True), FRESH, 50_000)
    noise = math.sqrt(0.4 * 0.6 / FRESH)  # one standard error of this count at the target
    # Every item within this count's noise and the calibration's (on 1,500 pooled examinees, about
    # half of it) of the target, and the items held back at it on average.
    assert fresh.max() <= 0.4 + 3.5 * noise
    assert abs(fresh[held].mean() - 0.4) <= noise
    assert abs(fresh.sum() - 5) < 1e-9  # every examinee still given five items
    # The calibration's own check, on examinees none of its iterations drew, says the same.
    assert calibration.check.exposure_parameters.tolist() == parameters.tolist()
    assert abs(calibration.check.given_rate[held].mean() - fresh[held].mean()) <= noise


def test_the_parameters_come_from_the_estimate_pooled_over_the_second_half():
    inst = compiled(bank_of())
    calibration = calibrate_exposure(inst, 0.4, RULES, examinees=100, iterations=4, seed=2)
    second_half = calibration.iterations[2:]
    # P(S_j): items given over examinees whose coin the item would have passed.
    chosen = np.sum([step.given_rate for step in second_half], axis=0) / \
        np.sum([step.exposure_parameters for step in second_half], axis=0)
    expected = np.where(chosen > 0.4, 0.4 / np.maximum(np.minimum(chosen, 1.0), 0.4), 1.0)
    assert np.count_nonzero(expected == 1.0) >= 5  # enough items at 1 for a whole test here
    assert calibration.exposure_parameters.tolist() == pytest.approx(expected.tolist(), rel=1e-12)
    # The first half set each iteration's parameters from the one before alone.
    first = calibration.iterations[0].given_rate
    assert calibration.iterations[1].exposure_parameters.tolist() == \
        pytest.approx(np.where(first > 0.4, 0.4 / np.maximum(first, 0.4), 1.0).tolist(), rel=1e-12)


def test_calibration_is_reproducible_from_its_seed():
    inst = compiled(bank_of())
    first = calibrate_exposure(inst, 0.4, RULES, examinees=100, iterations=2, seed=7)
    again = calibrate_exposure(inst, 0.4, RULES, examinees=100, iterations=2, seed=7)
    other = calibrate_exposure(inst, 0.4, RULES, examinees=100, iterations=2, seed=8)
    assert first.exposure_parameters.tolist() == again.exposure_parameters.tolist()
    assert first.exposure_parameters.tolist() != other.exposure_parameters.tolist()


def test_every_item_keeps_k_at_one_when_the_test_needs_them_all():
    # 6 items, 5 asked, a target of 0.1: at most one item can be held back, so at least five
    # parameters stay at 1 and every examinee is given a whole test.
    body = bank_of(6)
    calibration = calibrate_exposure(compiled(body), 0.1, RULES, examinees=100, iterations=3, seed=0)
    for step in [*calibration.iterations, calibration.check]:
        assert np.count_nonzero(step.exposure_parameters == 1.0) >= 5
        assert abs(step.given_rate.sum() - 5) < 1e-9
    assert not calibration.reached  # five items of six go to everyone


def test_the_command_writes_the_bank_with_its_parameters(tmp_path, capsys):
    body = bank_of()
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(body))
    arguments = ["--max-rate", "0.4", "--max-tests", "5", "--examinees", "100", "--iterations", "2", "--seed", "3"]
    assert main(["calibrate-exposure", str(path), *arguments, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    written = json.loads(out)
    expected = calibrate_exposure(compiled(body), 0.4, RULES, examinees=100, iterations=2, seed=3)
    assert [item["exposure_parameter"] for item in written["item_bank"]["items"]] == \
        expected.exposure_parameters.tolist()
    assert compiled(written).exposure_parameters.tolist() == expected.exposure_parameters.tolist()
    assert err.count("top exposure") == 3  # two iterations and the check on fresh examinees
    assert "on fresh examinees: top exposure" in err


@pytest.mark.parametrize("arguments", [["--max-rate", "0"], ["--max-rate", "1.5"],
                                       ["--max-rate", "0.3", "--examinees", "0"]])
def test_the_command_refuses_bad_arguments(tmp_path, capsys, arguments):
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(bank_of()))
    assert main(["calibrate-exposure", str(path), *arguments, "--no-progress"]) == 2
    assert "edgecut: error:" in capsys.readouterr().err


def test_the_command_refuses_an_instance_without_items(tmp_path, capsys):
    path = tmp_path / "instance.json"
    path.write_text(json.dumps({"tests": [{"id": "t", "outcomes": ["0", "1"]}],
                                "hypotheses": [{"id": "a", "class": "x", "outcomes": {"t": "0"}},
                                               {"id": "b", "class": "y", "outcomes": {"t": "1"}}]}))
    assert main(["calibrate-exposure", str(path), "--max-rate", "0.3", "--no-progress"]) == 2
    assert "not an item bank" in capsys.readouterr().err


@pytest.mark.parametrize("points", [None, "7"])
def test_evaluate_compiles_banks_on_the_grid_setting(tmp_path, capsys, monkeypatch, points):
    if points is None:
        monkeypatch.delenv("ITEM_BANK_GRID_POINTS", raising=False)
    else:
        monkeypatch.setenv("ITEM_BANK_GRID_POINTS", points)
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(bank_of(5)))
    assert main(["evaluate", str(path), "--policies", "infogain", "--samples", "10", "--max-tests", "1",
                 "--format", "json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n_hypotheses"] == (61 if points is None else 7)


@pytest.mark.parametrize("held, examinees, target", [(1, 500, 0.3), (55, 1000, 0.3), (120, 2000, 0.2)])
def test_a_bank_held_exactly_at_its_target_is_rarely_reported_as_not_reached(held, examinees, target):
    """``reached``'s margin, against counts drawn directly: with every held-back item given at
    exactly the target, the largest counted rate passes it in about one check of a hundred."""
    parameters = np.where(np.arange(300) < held, 0.5, 1.0)
    maxima = np.random.default_rng(held).binomial(examinees, target, size=(20_000, held)).max(axis=1) / examinees
    reports = [ExposureCalibration(target, [], ExposureIteration(parameters, np.full(300, top)), examinees).reached
               for top in maxima[:2_000]]
    margin = ExposureCalibration(target, [], ExposureIteration(parameters, np.zeros(300)), examinees).margin
    false_alarms = np.mean(maxima > target + margin)
    assert 0.003 <= false_alarms <= 0.02, false_alarms
    assert np.mean(np.logical_not(reports)) == pytest.approx(np.mean(maxima[:2_000] > target + margin))
