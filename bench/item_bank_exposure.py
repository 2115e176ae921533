"""The exposure section of bench/item_banks.py (``python3 -m bench.item_banks --only exposure``):
fixed length 20 at the two cut scores, without control and under each exposure control, paired
with the uncontrolled run on the same examinees and coins; catsim 0.21's own randomesque for
reference; then content balancing over three areas. ``--exposure-methods`` picks the rows (the
run without control is always there, as the rows' baseline)."""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from bench.item_banks import CUTS, accuracy_cell, item_bank, level_of, paired_cell, table
from schemas.instance import Instance
from service import engine
from service.engine.restricted import restriction

AREAS = {"number": 0.5, "algebra": 0.3, "geometry": 0.2}
# (name, target rate, randomesque k, progressive): the Sympson–Hetter calibrations measured.
CALIBRATED = (("Sympson–Hetter", 0.3, None, False), ("Sympson–Hetter", 0.28, None, False),
              ("Sympson–Hetter", 0.27, None, False), ("randomesque k = 5 + Sympson–Hetter", 0.3, 5, False),
              ("progressive + Sympson–Hetter", 0.3, None, True), ("progressive + Sympson–Hetter", 0.28, None, True),
              ("progressive + Sympson–Hetter", 0.27, None, True))


def fixed_length(inst, policy, rules, right, truth, reserve: bool = True) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """Every examinee to 20 items under ``rules``, each examinee's draws seeded by its number:
    (items given per item, right level per examinee, the items each was given). With
    ``rules.max_rate`` the examinees are sessions in order, as ``edgecut evaluate`` simulates them:
    examinee e holds back the items given to ``max_rate`` of the e + 1 sessions or more, and
    reserves those near it (service/engine/restricted.py) unless ``reserve`` is False (the 1998
    rule alone, for comparison)."""
    given = np.zeros(inst.n_tests)
    correct = np.zeros(truth.size, dtype=bool)
    asked = []
    for e in range(truth.size):
        observations: list = []
        belief = None
        restricted = None if rules.max_rate is None else restriction(given, e + 1, rules.max_rate)
        if restricted is not None and not reserve:
            restricted = restricted._replace(reserved=np.zeros(inst.n_tests, dtype=bool))
        while True:
            belief = engine.observe(inst, observations, belief)
            decision = engine.decide(belief, policy, rules, seed=e, restriction=restricted)
            if decision.done:
                break
            observations = observations + [(decision.next_test, int(right[e, decision.next_test]))]
        asked.append([t for t, _ in observations])
        given[asked[-1]] += 1
        correct[e] = int(np.argmax(belief.class_mass)) == truth[e]
    return given, correct, asked


def exposure(args, params, theta, right, catsim_parts) -> str:
    """No control, randomesque k = 5, progressive, Sympson–Hetter with parameters from
    ``calibrate_exposure`` (on its own examinees drawn from the prior, seed args.seed + 1) alone,
    under randomesque and under progressive, and the restricted method at each of
    ``args.restricted_rates`` (with and without its reserve); catsim's max info and randomesque k = 5 on the same coins; then
    content balancing; those of ``args.exposure_methods``. Accuracy, the share of examinees given
    the most-used item, the paired accuracy change against edgecut without control."""
    from service.evaluation.exposure import calibrate_exposure

    methods = args.exposure_methods
    body = item_bank(params, CUTS)
    inst = engine.compile_instance(Instance.model_validate(body))
    policy = engine.resolve_policy(inst, None)
    truth = level_of(theta)
    plain = engine.StopRules(max_tests=20)
    runs = [("none", inst, plain, True)]
    if "randomesque" in methods:
        runs.append(("randomesque k = 5", inst, plain._replace(randomesque=5), True))
    if "progressive" in methods:
        runs.append(("progressive", inst, plain._replace(progressive=True), True))
    for name, target, k, progressive in CALIBRATED if "sympson_hetter" in methods else ():
        rules = plain._replace(randomesque=k, sympson_hetter=True, progressive=progressive)
        started = time.perf_counter()
        calibration = calibrate_exposure(inst, target, rules, examinees=args.calibration_examinees,
                                         iterations=args.calibration_iterations, seed=args.seed + 1)
        seconds = time.perf_counter() - started
        calibrated = dataclasses.replace(inst, exposure_parameters=calibration.exposure_parameters)
        print(f"{name}, target {target}: top rate per iteration "
              f"{[round(step.top_rate, 3) for step in calibration.iterations]}, on the check's fresh examinees "
              f"{calibration.check.top_rate:.3f}, "
              f"{int((calibration.exposure_parameters < 1).sum())} items with K < 1, {seconds:.0f} s", file=sys.stderr)
        runs.append((f"{name} calibrated to {target}", calibrated, rules, True))
    for rate in args.restricted_rates if "restricted" in methods else ():
        runs.append((f"restricted, max_rate {rate:g}", inst, plain._replace(max_rate=rate), True))
        runs.append((f"restricted without the reserve, max_rate {rate:g}", inst, plain._replace(max_rate=rate), False))
    rows, baseline, restricted = [], None, []
    for name, compiled, rules, reserve in runs:
        given, correct, _ = fixed_length(compiled, policy, rules, right, truth, reserve)
        baseline = correct if baseline is None else baseline
        rows.append(exposure_row(name, given, correct, baseline, inst.test_ids, compiled.exposure_parameters))
        if rules.max_rate is not None:
            restricted.append(correct)
    for name, selector in catsim_selectors(catsim_parts) if "catsim" in methods else ():
        given, correct = catsim_fixed_length(catsim_parts, selector, right, truth)
        rows.append(exposure_row(f"catsim 0.21, {name} (MLE; for reference)", given, correct, baseline, inst.test_ids))
    exposure_table = table(["exposure control", "accuracy at 20 items", "most-used item's rate",
                            "items with K < 1: how many, mean rate", "change (paired)"], rows)
    for rate, with_reserve, without in zip(args.restricted_rates, restricted[::2], restricted[1::2]):
        exposure_table += (f"\n\nrestricted, max_rate {rate:g}: with the reserve against without it, paired: "
                           f"{paired_cell(with_reserve, without)}")
    if "content" not in methods:
        return exposure_table
    return exposure_table + "\n\n" + content_balancing(body, policy, plain, right, truth, baseline)


def exposure_row(name, given, correct, baseline, test_ids, parameters=None) -> list[str]:
    top = int(np.argmax(given))
    held = "-"
    if parameters is not None:  # Sympson–Hetter: how many items it holds back, and their mean rate
        held = f"{int((parameters < 1).sum())}, {given[parameters < 1].mean() / correct.size:.1%}"
    return [name, accuracy_cell(correct), f"{given[top] / correct.size:.1%} ({test_ids[top]})", held,
            "-" if correct is baseline else paired_cell(correct, baseline)]


def catsim_selectors(catsim_parts):
    import catsim.selection

    return [("max info", catsim.selection.MaxInfoSelector()),
            ("randomesque k = 5", catsim.selection.RandomesqueSelector(5))]


def catsim_fixed_length(catsim_parts, selector, right, truth) -> tuple[np.ndarray, np.ndarray]:
    """catsim item by item to 20 items, each examinee's draws from a generator keyed by its number:
    (items given per item, right level per examinee: the level holding θ̂)."""
    bank, _, estimator, _ = catsim_parts
    given = np.zeros(right.shape[1])
    correct = np.zeros(truth.size, dtype=bool)
    for e in range(truth.size):
        rng = np.random.default_rng([e, 7])
        administered: list[int] = []
        responses: list[bool] = []
        estimate = 0.0
        for _ in range(20):
            j = int(selector.select(item_bank=bank, administered_items=administered, est_theta=estimate, rng=rng))
            administered.append(j)
            responses.append(bool(right[e, j]))
            estimate = float(estimator.estimate(item_bank=bank, administered_items=administered,
                                                response_vector=responses, est_theta=estimate))
        given[administered] += 1
        correct[e] = level_of(np.array([estimate]))[0] == truth[e]
    return given, correct


def content_balancing(body, policy, rules, right, truth, baseline) -> str:
    """The same bank with its items dealt to three areas in turn (item j to area j mod 3) and
    ``AREAS``'s target shares: the paired accuracy change, and how closely 20 items keep them."""
    names = list(AREAS)
    items = [{**item, "content_area": names[j % len(names)]} for j, item in enumerate(body["item_bank"]["items"])]
    balanced = {"item_bank": {**body["item_bank"], "items": items, "content_balance": {"targets": AREAS}}}
    inst = engine.compile_instance(Instance.model_validate(balanced))
    given, correct, asked = fixed_length(inst, policy, rules, right, truth)
    counts = np.array([np.bincount(inst.content_area[a], minlength=len(names)) for a in asked])  # (E, areas)
    targets = np.array(list(AREAS.values())) * 20
    off = np.abs(counts - targets)
    top = int(np.argmax(given))
    rows = [["content balancing, " + ", ".join(f"{a} {share:.0%}" for a, share in AREAS.items()),
             accuracy_cell(correct), paired_cell(correct, baseline),
             " / ".join(f"{m:.1f}" for m in counts.mean(axis=0)),
             f"{(off <= 1).all(axis=1).mean():.1%} (at most {off.max():g} off)", f"{given[top] / truth.size:.1%} ({inst.test_ids[top]})"]]
    return table(["run", "accuracy at 20 items", "change (paired)", "mean items per area (targets "
                  + " / ".join(f"{t:g}" for t in targets) + ")", "examinees within 1 item of every target",
                  "most-used item's rate"], rows)


