"""Repeatable questions on the lottery study: accuracy after n answers under two answer models.

    python3 bench/repeatable.py --adopy /path/to/adopy-venv/bin/python   # the table in docs/lotteries.md
    python3 bench/repeatable.py --subjects 100 --jobs 1                    # edgecut and random only

* **persistent**: a subject answers a question the same way every time it is asked (one coin per
  (subject, question), fixed in advance), so asking again tells nothing: tests are not
  repeatable (the instance as it is).
* **fresh**: a new coin at every presentation, so a repeated question is a new independent
  observation: every test is ``repeatable`` (the same instance with ``"repeatable": true``).

Policies: EffECXtive (the instance's default) and random, on the same simulated subjects (drawn
as in the paper by ``simulation.draw_subject``) and, within an answer model, the same coins; with
``--adopy PYTHON`` also ADOpy 0.4.1, run by that interpreter (a venv with ``adopy==0.4.1`` and
``numpy<1.24``) through bench/adopy_lotteries.py on the same subjects and coins. Also reported:
the median time of one choice (edgecut: one ``decide``; ADOpy: ``get_design`` plus the
``update`` that recomputes its mutual information), on the shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas.instance import Instance  # noqa: E402
from service import engine  # noqa: E402
from service.examples import lotteries  # noqa: E402
from service.examples.simulation import draw_subject, map_subjects, wilson_interval  # noqa: E402

STUDY_NUMBER = {"fixed": 0, "uncertain": 1}
CHECKPOINTS = (5, 10, 20)
MODELS = ("persistent", "fresh")
POLICIES = ("effecxtive", "random")
_INSTANCES: dict[str, engine.CompiledInstance] = {}


def _load(study: str) -> None:
    wire = lotteries.wire_instance(study)
    _INSTANCES["persistent"] = lotteries.compiled_instance(study)
    repeatable = {**wire, "tests": [{**test, "repeatable": True} for test in wire["tests"]]}
    _INSTANCES["fresh"] = engine.compile_instance(Instance.model_validate(repeatable))


def run(task: tuple[str, str, str, int, int, int]) -> tuple[np.ndarray, list[float]]:
    """Whether the MAP class is right after 0..answers answers, and each choice's seconds."""
    study, model, policy_name, answers, seed, subject = task
    inst = _INSTANCES[model]
    hypothesis, policy_seed = draw_subject(inst, seed, STUDY_NUMBER[study], subject)
    coins = np.random.default_rng([seed, STUDY_NUMBER[study], subject, 7])
    fixed_coins = coins.random(inst.n_tests)  # persistent: one per question
    policy = engine.resolve_policy(inst, policy_name)
    rules = engine.StopRules(max_tests=answers)
    observations: list[engine.Observation] = []
    belief = engine.observe(inst, observations)
    correct = [int(np.argmax(belief.class_mass)) == inst.class_index[hypothesis]]
    seconds = []
    while len(observations) < answers:
        started = time.perf_counter()
        decision = engine.decide(belief, policy, rules, policy_seed)
        seconds.append(time.perf_counter() - started)
        if decision.done:
            break
        t = decision.next_test
        coin = fixed_coins[t] if model == "persistent" else coins.random()
        observations.append((t, 0 if coin < inst.likelihood[hypothesis, t, 0] else 1))
        belief = engine.observe(inst, observations)
        correct.append(int(np.argmax(belief.class_mass)) == inst.class_index[hypothesis])
    correct += [correct[-1]] * (answers + 1 - len(correct))
    return np.array(correct, dtype=int), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=sorted(STUDY_NUMBER), default="uncertain")
    parser.add_argument("--subjects", type=int, default=500)
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--adopy", metavar="PYTHON", help="an interpreter with adopy==0.4.1 installed")
    args = parser.parse_args(argv)

    combos = [(model, policy) for model in MODELS for policy in POLICIES]
    tasks = [(args.study, model, policy, args.answers, args.seed, subject)
             for model, policy in combos for subject in range(args.subjects)]
    started = time.perf_counter()
    results = list(map_subjects(run, tasks, args.jobs, _load, (args.study,)))
    wall = time.perf_counter() - started
    by_combo = {combo: results[i * args.subjects:(i + 1) * args.subjects] for i, combo in enumerate(combos)}
    if args.adopy:
        by_combo.update(run_adopy(args))
        combos = [(model, policy) for model in MODELS for policy in (*POLICIES, "adopy")]

    checkpoints = [n for n in CHECKPOINTS if n <= args.answers]
    print(f"Lottery study '{args.study}', {args.subjects} subjects, seed {args.seed}: accuracy (95% Wilson "
          f"interval) after n answers; wall {wall:.0f} s with {args.jobs} jobs.\n")
    print("| answers | policy | " + " | ".join(f"n = {n}" for n in checkpoints) + " | choice (median ms) |")
    print("|---|---|" + "---|" * len(checkpoints) + "---|")
    for model, policy in combos:
        correct = np.array([c for c, _ in by_combo[model, policy]])
        choice_ms = 1000 * statistics.median(s for _, seconds in by_combo[model, policy] for s in seconds)
        cells = []
        for n in checkpoints:
            hits = int(correct[:, n].sum())
            low, high = wilson_interval(np.array([hits]), args.subjects)
            cells.append(f"{hits / args.subjects:.3f} [{low[0]:.3f}, {high[0]:.3f}]")
        print(f"| {model} | {policy} | " + " | ".join(cells) + f" | {choice_ms:.1f} |")
    print("\nPaired differences (mean [95% normal interval]):\n")
    print("| answers | A − B | " + " | ".join(f"n = {n}" for n in checkpoints) + " |")
    print("|---|---|" + "---|" * len(checkpoints))
    for model in MODELS:
        for other in [p for p, in {(p,) for _, p in combos} if p != "effecxtive"]:
            a = np.array([c for c, _ in by_combo[model, "effecxtive"]])
            b = np.array([c for c, _ in by_combo[model, other]])
            cells = []
            for n in checkpoints:
                diff = (a[:, n] - b[:, n]).astype(float)
                half = 1.959963984540054 * diff.std(ddof=1) / math.sqrt(len(diff))
                cells.append(f"{diff.mean():+.3f} [{diff.mean() - half:+.3f}, {diff.mean() + half:+.3f}]")
            print(f"| {model} | effecxtive − {other} | " + " | ".join(cells) + " |")
    return 0


def run_adopy(args: argparse.Namespace) -> dict:
    """ADOpy's results on the same subjects and coins, as {(model, "adopy"): [(correct, seconds)]}."""
    _load(args.study)
    inst = _INSTANCES["persistent"]
    hypotheses = [draw_subject(inst, args.seed, STUDY_NUMBER[args.study], k)[0] for k in range(args.subjects)]
    with tempfile.TemporaryDirectory() as work:
        source, target = Path(work) / "subjects.npz", Path(work) / "adopy.json"
        np.savez(source, likelihood=inst.likelihood, class_index=inst.class_index, prior=inst.prior,
                 hypotheses=np.array(hypotheses), seed=args.seed, study=STUDY_NUMBER[args.study],
                 answers=args.answers)
        subprocess.run([args.adopy, str(Path(__file__).with_name("adopy_lotteries.py")), str(source), str(target)],
                       check=True)
        results = json.loads(target.read_text())
    seconds = results["choice_seconds"]
    return {(model, "adopy"): [(np.array(correct), seconds if k == 0 else []) for k, correct in
                               enumerate(results[model])] for model in MODELS}


if __name__ == "__main__":
    raise SystemExit(main())
