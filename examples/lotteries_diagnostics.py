#!/usr/bin/env python3
"""Diagnostics behind docs/lotteries.md's verdicts on the paper's findings (not a test).

``tests``: what each policy asks. For the tests it picks at steps 1, 5, 10, 20, 30, the mean over
subjects of (a) the expected information about the theory, I(class; X_t | answers so far) in
bits, under the current posterior, and (b) how decided the true subject is on that test,
|P(prefer L1 | h*) − ½| (0 = a coin flip, 0.5 = certain). Uncertainty sampling and GBS look for
tests whose *predicted* answer is a coin flip; (b) shows whether that is disagreement between
theories (informative) or indifference of the subject (noise).

``wealth``: sensitivity of effecxtive − infogain to CRRA's wealth offset W, the one convention
the paper leaves open (a larger W makes CRRA's utility differences smaller, its answers noisier).

    python3 examples/lotteries_diagnostics.py tests --subjects 300
    python3 examples/lotteries_diagnostics.py wealth --subjects 1000
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from service import engine
from service.engine.policies import infogain_gain
from service.examples import lotteries
from service.examples.simulation import draw_subject, paired_difference_interval, run_subject

STEPS = (1, 5, 10, 20, 30)


def chosen_test_profile(inst, policy_name: str, subjects: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(bits, decidedness), each (subjects, 30): NaN after the policy stops."""
    policy = engine.resolve_policy(inst, policy_name)
    rules = engine.StopRules(max_tests=max(STEPS))
    bits = np.full((subjects, max(STEPS)), np.nan)
    decided = np.full((subjects, max(STEPS)), np.nan)
    for k in range(subjects):
        hypothesis, policy_seed = draw_subject(inst, seed, 0, k)
        answers = np.random.default_rng([seed, 0, k, 1])
        observations: list[engine.Observation] = []
        while True:
            decision = engine.decide(engine.observe(inst, observations), policy, rules, policy_seed)
            if decision.done:
                break
            t = decision.next_test
            stats = decision.belief.outcome_stats({"sum_xlogx"})
            step = len(observations)
            bits[k, step] = infogain_gain(stats)[t]
            row = inst.likelihood[hypothesis, t]
            decided[k, step] = abs(row[0] - 0.5)
            observations.append((t, int(answers.choice(row.size, p=row))))
    return bits, decided


def tests_report(subjects: int, seed: int) -> str:
    inst = lotteries.compiled_instance("fixed")
    lines = [f"Figure 2a instance, {subjects} subjects per policy, seed {seed}. Each cell: mean bits "
             "about the theory expected from the chosen test / mean |P(prefer L1 | true h) − ½| "
             "(over subjects still being asked).", "",
             "| policy | " + " | ".join(f"test {s}" for s in STEPS) + " |",
             "|---|" + "---|" * len(STEPS)]
    for policy in ("effecxtive", "infogain", "voi", "uncertainty", "gbs", "random"):
        bits, decided = chosen_test_profile(inst, policy, subjects, seed)
        cells = []
        for s in STEPS:
            asked = ~np.isnan(bits[:, s - 1])
            cells.append(f"{np.mean(bits[asked, s - 1]):.3f} / {np.mean(decided[asked, s - 1]):.2f}"
                         if asked.any() else "—")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def wealth_report(subjects: int, seed: int, offsets=(11.0, 21.0, 51.0)) -> str:
    lines = [f"Figure 2a instance with CRRA wealth offset W, {subjects} paired subjects, seed {seed}: "
             "accuracy of effecxtive and infogain, and their paired difference (95% interval).", "",
             "| W | tests | effecxtive | infogain | effecxtive − infogain |", "|---|---|---|---|---|"]
    for wealth in offsets:
        inst = lotteries.compiled_instance("fixed", wealth)
        runs = {p: [run_subject(inst, p, 10, seed, 0, k) for k in range(subjects)]
                for p in ("effecxtive", "infogain")}
        for after in (3, 5, 10):
            acc = {p: np.mean([r.map_classes[after] == r.true_class for r in rs]) for p, rs in runs.items()}
            mean, low, high = paired_difference_interval(runs["effecxtive"], runs["infogain"], after)
            lines.append(f"| {wealth:g} | {after} | {acc['effecxtive']:.3f} | {acc['infogain']:.3f} | "
                         f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", choices=("tests", "wealth"), help="which diagnostic (described above)")
    parser.add_argument("--subjects", type=int, default=300, help="simulated subjects (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subjects")
    args = parser.parse_args(argv)
    report = tests_report if args.report == "tests" else wealth_report
    print(report(args.subjects, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
