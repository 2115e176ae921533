"""Batch quality on the lottery study: accuracy after n answers when questions come in pages.

    python3 bench/batches.py                       # the table in docs/lotteries.md
    python3 bench/batches.py --subjects 100 --jobs 1

Strategies, all with EffECXtive and the same simulated subjects:

* ``k=1``: one question at a time (the adaptive baseline);
* ``joint k``: pages of k chosen greedily on their joint outcomes (``batch_size=k``; Chen &
  Krause 2013), what a session with ``batch_size: k`` proposes;
* ``top-k k``: pages of the k best single scores of the same step (the naive page).

A subject is a true hypothesis drawn as the paper draws it (``simulation.draw_subject``) and
answers each test the same way whenever it is asked, from one uniform number per (subject, test)
fixed in advance: every strategy faces exactly the same answers (common random numbers, so the
paired differences have little noise). A page is answered in its order, and the MAP class is
recorded after every answer, so "accuracy after n answers" compares strategies at equal numbers
of answers even in the middle of a page. The machine is shared: quote wall time as loaded.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import engine  # noqa: E402
from service.examples import lotteries  # noqa: E402
from service.examples.simulation import draw_subject, map_subjects, wilson_interval  # noqa: E402

STUDY_NUMBER = {"fixed": 0, "uncertain": 1}
CHECKPOINTS = (3, 5, 10, 15, 20, 30)
STRATEGIES = ("k=1", "joint 3", "top-k 3", "joint 5", "top-k 5")
_INSTANCE: dict[str, engine.CompiledInstance] = {}


def page_of(decision: engine.Decision, strategy: str) -> tuple[int, ...]:
    if strategy == "k=1" or strategy.startswith("joint"):
        return decision.batch
    k = int(strategy.split()[1])
    scores = decision.scores
    scored = np.flatnonzero(~np.isnan(scores) & (scores > 0))
    return tuple(scored[np.argsort(-scores[scored], kind="stable")][:k].tolist())


def run(task: tuple[str, str, int, int, int]) -> np.ndarray:
    """The MAP class after 0..answers answers of one subject under one strategy."""
    study, strategy, answers, seed, subject = task
    inst = _INSTANCE[study]
    hypothesis, _ = draw_subject(inst, seed, STUDY_NUMBER[study], subject)
    coins = np.random.default_rng([seed, STUDY_NUMBER[study], subject, 7]).random(inst.n_tests)
    policy = engine.resolve_policy(inst, "effecxtive")
    rules = engine.StopRules(max_tests=answers)
    batch_size = 1 if strategy == "k=1" or strategy.startswith("top-k") else int(strategy.split()[1])
    observations: list[engine.Observation] = []
    belief = engine.observe(inst, observations)
    map_classes = [int(np.argmax(belief.class_mass))]
    while len(observations) < answers:
        decision = engine.decide(belief, policy, rules, batch_size=batch_size)
        if decision.done:
            break
        for t in page_of(decision, strategy)[: answers - len(observations)]:
            # Outcome "1" (index 0) when the subject's fixed coin falls under P("1" | h, t).
            outcome = 0 if coins[t] < inst.likelihood[hypothesis, t, 0] else 1
            observations.append((t, outcome))
            belief = engine.observe(inst, observations)
            map_classes.append(int(np.argmax(belief.class_mass)))
    map_classes += [map_classes[-1]] * (answers + 1 - len(map_classes))
    return np.array([int(c == inst.class_index[hypothesis]) for c in map_classes])


def _load(study: str) -> None:
    _INSTANCE[study] = lotteries.compiled_instance(study)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=sorted(STUDY_NUMBER), default="uncertain")
    parser.add_argument("--subjects", type=int, default=500)
    parser.add_argument("--answers", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)

    tasks = [(args.study, strategy, args.answers, args.seed, subject)
             for strategy in STRATEGIES for subject in range(args.subjects)]
    started = time.perf_counter()
    results = list(map_subjects(run, tasks, args.jobs, _load, (args.study,)))
    wall = time.perf_counter() - started
    correct = {strategy: np.array(results[i * args.subjects:(i + 1) * args.subjects])
               for i, strategy in enumerate(STRATEGIES)}

    checkpoints = [n for n in CHECKPOINTS if n <= args.answers]
    print(f"Lottery study '{args.study}', {args.subjects} subjects, EffECXtive, seed {args.seed}: "
          f"accuracy (95% Wilson interval) after n answers; wall {wall:.0f} s with {args.jobs} jobs.\n")
    print("| strategy | " + " | ".join(f"n = {n}" for n in checkpoints) + " |")
    print("|---|" + "---|" * len(checkpoints))
    for strategy in STRATEGIES:
        cells = []
        for n in checkpoints:
            hits = int(correct[strategy][:, n].sum())
            low, high = wilson_interval(np.array([hits]), args.subjects)
            cells.append(f"{hits / args.subjects:.3f} [{low[0]:.3f}, {high[0]:.3f}]")
        print(f"| {strategy} | " + " | ".join(cells) + " |")
    print("\nPaired difference joint − top-k (mean [95% normal interval]) at equal answers:\n")
    print("| k | " + " | ".join(f"n = {n}" for n in checkpoints) + " |")
    print("|---|" + "---|" * len(checkpoints))
    for k in (3, 5):
        cells = []
        for n in checkpoints:
            diff = (correct[f"joint {k}"][:, n] - correct[f"top-k {k}"][:, n]).astype(float)
            half = 1.959963984540054 * diff.std(ddof=1) / math.sqrt(len(diff))
            cells.append(f"{diff.mean():+.3f} [{diff.mean() - half:+.3f}, {diff.mean() + half:+.3f}]")
        print(f"| {k} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
