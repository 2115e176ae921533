"""Repeatable questions on the lottery study: accuracy after n answers under two answer models.

    python3 bench/repeatable.py --adopy /path/to/adopy-venv/bin/python   # the table in docs/lotteries.md
    python3 bench/repeatable.py --subjects 100 --jobs 1                    # edgecut and random only

* **persistent**: a subject answers a question the same way every time it is asked (one coin per
  (subject, question), fixed in advance), so asking again tells nothing: tests are not
  repeatable (the instance as it is).
* **fresh**: a new coin at every presentation, so a repeated question is a new independent
  observation: every test is ``repeatable`` (the same instance with ``"repeatable": true``).

Policies: EffECXtive (the instance's default) and random, or any class policies given with
``--policies``, on the same simulated subjects (drawn as in the paper by
``simulation.draw_subject``) and, within an answer model, the same coins; with ``--adopy PYTHON``
also ADOpy 0.4.1, run by that interpreter (a venv with ``adopy==0.4.1`` and ``numpy<1.24``)
through bench/adopy_lotteries.py on the same subjects and coins, in ``--jobs`` processes. Also
reported: the median time of one choice (edgecut: one ``decide``; ADOpy: ``get_design`` plus the
``update`` that recomputes its mutual information), on the shared machine.

Two estimates of each paired difference: of the 0/1 accuracy, and (fresh answers) of the
expected accuracy, the posterior probability of the MAP theory. The subjects are drawn from the
instance's prior and answer by its likelihoods, so given the answers the MAP theory is the true
one with exactly that probability: the same mean as the 0/1 outcome, with far less variance.
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

from service import engine  # noqa: E402
from service.examples import lotteries  # noqa: E402
from service.examples.simulation import draw_subject, map_subjects, wilson_interval  # noqa: E402

STUDY_NUMBER = {"fixed": 0, "uncertain": 1}
CHECKPOINTS = (5, 10, 20)
MODELS = ("persistent", "fresh")
POLICIES = ("effecxtive", "random")
# The policies that run on this instance (likelihoods, theories as classes).
CLASS_POLICIES = sorted(name for name, policy in engine.POLICIES.items()
                        if not policy.decision and not policy.deterministic_only)
_INSTANCES: dict[str, engine.CompiledInstance] = {}


def _load(study: str) -> None:
    _INSTANCES["persistent"] = lotteries.compiled_instance(study)
    _INSTANCES["fresh"] = lotteries.compiled_instance(study, repeatable=True)


def run(task: tuple[str, str, str, int, int, int]) -> tuple[np.ndarray, list[float]]:
    """(2, answers + 1): whether the MAP class is the true one after 0..answers answers, and its
    posterior probability; and each choice's seconds."""
    study, model, policy_name, answers, seed, subject = task
    inst = _INSTANCES[model]
    hypothesis, policy_seed = draw_subject(inst, seed, STUDY_NUMBER[study], subject)
    coins = np.random.default_rng([seed, STUDY_NUMBER[study], subject, 7])
    fixed_coins = coins.random(inst.n_tests)  # persistent: one per question
    policy = engine.resolve_policy(inst, policy_name)
    rules = engine.StopRules(max_tests=answers)
    observations: list[engine.Observation] = []
    belief = engine.observe(inst, observations)
    scores = [_score(belief, inst.class_index[hypothesis])]
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
        scores.append(_score(belief, inst.class_index[hypothesis]))
    scores += [scores[-1]] * (answers + 1 - len(scores))
    return np.array(scores, dtype=float).T, seconds


def _score(belief: engine.Belief, true_class: int) -> tuple[float, float]:
    posterior = belief.class_posterior
    return float(np.argmax(posterior) == true_class), float(posterior.max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=sorted(STUDY_NUMBER), default="uncertain")
    parser.add_argument("--subjects", type=int, default=500)
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--policies", nargs="+", choices=CLASS_POLICIES, default=list(POLICIES),
                        help="edgecut policies to run (random is the baseline every other is compared with)")
    parser.add_argument("--adopy", metavar="PYTHON", help="an interpreter with adopy==0.4.1 installed")
    args = parser.parse_args(argv)

    combos = [(model, policy) for model in MODELS for policy in args.policies]
    tasks = [(args.study, model, policy, args.answers, args.seed, subject)
             for model, policy in combos for subject in range(args.subjects)]
    started = time.perf_counter()
    results = list(map_subjects(run, tasks, args.jobs, _load, (args.study,)))
    wall = time.perf_counter() - started
    by_combo = {combo: results[i * args.subjects:(i + 1) * args.subjects] for i, combo in enumerate(combos)}
    peers = [p for p in ("random",) if p in args.policies]
    adopy_wall = 0.0
    if args.adopy:
        started = time.perf_counter()
        by_combo.update(run_adopy(args))
        adopy_wall = time.perf_counter() - started
        combos = [(model, policy) for model in MODELS for policy in (*args.policies, "adopy")]
        peers.insert(0, "adopy")

    checkpoints = [n for n in CHECKPOINTS if n <= args.answers]
    print(f"Lottery study '{args.study}', {args.subjects} subjects, seed {args.seed}, {args.jobs} jobs: "
          f"edgecut's part {wall:.0f} s wall" + (f", ADOpy's {adopy_wall:.0f} s" if args.adopy else "") + ".\n")
    print("Accuracy of the MAP theory after n answers (95% Wilson interval), and the median time of one choice:\n")
    print("| answers | policy | " + " | ".join(f"n = {n}" for n in checkpoints) + " | one choice (median ms) |")
    print("|---|---|" + "---|" * len(checkpoints) + "---|")
    for model, policy in combos:
        correct = np.array([scores[0] for scores, _ in by_combo[model, policy]])
        choice_ms = 1000 * statistics.median(s for _, seconds in by_combo[model, policy] for s in seconds)
        cells = []
        for n in checkpoints:
            hits = int(correct[:, n].sum())
            low, high = wilson_interval(np.array([hits]), args.subjects)
            cells.append(f"{hits / args.subjects:.3f} [{low[0]:.3f}, {high[0]:.3f}]")
        print(f"| {model} | {policy} | " + " | ".join(cells) + f" | {choice_ms:.1f} |")
    pairs = [(model, policy, peer) for model in MODELS for policy in args.policies if policy != "random"
             for peer in peers]
    # With fresh answers the model is exactly how the subjects are simulated (truth drawn from the
    # prior, independent answers at every presentation), so the posterior probability that the MAP
    # theory is the true one has the same expectation as the 0/1 outcome, with less variance. With
    # persistent answers a re-asked question repeats its answer, and a policy that re-asks (ADOpy)
    # holds a posterior that counts it twice: that estimate would be biased there.
    for row, models, title in (
            (0, MODELS, "Paired differences of accuracy (same subjects, same coins; mean [95% normal interval]):"),
            (1, ("fresh",), "Fresh answers, paired differences of expected accuracy: the posterior probability "
                            "of the MAP theory (same subjects and coins; mean [95% normal interval]):")):
        print(f"\n{title}\n")
        print("| answers | A − B | " + " | ".join(f"n = {n}" for n in checkpoints) + " |")
        print("|---|---|" + "---|" * len(checkpoints))
        for model, policy, peer in (pair for pair in pairs if pair[0] in models):
            a = np.array([scores[row] for scores, _ in by_combo[model, policy]])
            b = np.array([scores[row] for scores, _ in by_combo[model, peer]])
            cells = []
            for n in checkpoints:
                diff = a[:, n] - b[:, n]
                half = 1.959963984540054 * diff.std(ddof=1) / math.sqrt(len(diff))
                cells.append(f"{diff.mean():+.3f} [{diff.mean() - half:+.3f}, {diff.mean() + half:+.3f}]")
            print(f"| {model} | {policy} − {peer} | " + " | ".join(cells) + " |")
    return 0


def run_adopy(args: argparse.Namespace) -> dict:
    """ADOpy's results on the same subjects and coins, as {(model, "adopy"): [(scores, seconds)]}:
    ``args.jobs`` processes, each running a contiguous share of the subjects."""
    _load(args.study)
    inst = _INSTANCES["persistent"]
    hypotheses = [draw_subject(inst, args.seed, STUDY_NUMBER[args.study], k)[0] for k in range(args.subjects)]
    shares = np.array_split(np.arange(args.subjects), max(1, args.jobs))
    with tempfile.TemporaryDirectory() as work:
        processes, targets = [], []
        for j, share in enumerate(shares):
            source, target = Path(work) / f"subjects-{j}.npz", Path(work) / f"adopy-{j}.json"
            np.savez(source, likelihood=inst.likelihood, class_index=inst.class_index, prior=inst.prior,
                     subjects=share, hypotheses=np.array(hypotheses)[share], seed=args.seed,
                     study=STUDY_NUMBER[args.study], answers=args.answers)
            processes.append(subprocess.Popen(
                [args.adopy, str(Path(__file__).with_name("adopy_lotteries.py")), str(source), str(target)]))
            targets.append(target)
        for process in processes:
            if process.wait() != 0:
                raise SystemExit(f"ADOpy failed with exit status {process.returncode}")
        parts = [json.loads(target.read_text()) for target in targets]
    seconds = [s for part in parts for s in part["choice_seconds"]]
    return {(model, "adopy"): [(np.array(scores, dtype=float).T, seconds if k == 0 else [])
                               for k, scores in enumerate(s for part in parts for s in part[model])]
            for model in MODELS}


if __name__ == "__main__":
    raise SystemExit(main())
