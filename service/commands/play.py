"""``edgecut play lotteries``: answer the paper's lottery questions at the keyboard.

The engine picks each question (EffECXtive by default, as in the paper's human-subject study);
after every answer the posterior over the four theories is shown, and at the end the theory that
describes the choices best. Reads answers line by line from stdin, so it can be scripted:
``printf '1\\n2\\n...' | edgecut play lotteries``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import numpy as np

from service import engine
from service.examples import lotteries

BAR_WIDTH = 24


def register(subparsers) -> None:
    parser = subparsers.add_parser("play", help="answer a worked example's questions yourself")
    examples = parser.add_subparsers(dest="example", required=True, metavar="EXAMPLE")
    lot = examples.add_parser(
        "lotteries",
        help="which economic theory describes your choices between lotteries?",
        description="Answer up to 30 questions 'which lottery would you rather play?' "
        "(1 or 2, q to quit); the posterior over four theories is shown after each answer.",
    )
    lot.add_argument("--study", choices=lotteries.STUDIES, default="fixed",
                     help="fixed: one parameter set per theory; uncertain: a grid of 58 (default fixed)")
    lot.add_argument("--tests", type=int, default=30, help="number of questions (default 30)")
    lot.add_argument("--policy", default="effecxtive", help="selection policy (default effecxtive)")
    lot.add_argument("--seed", type=int, default=0, help="seed for the random policy")
    lot.set_defaults(handler=run_play)


def run_play(args: argparse.Namespace) -> int:
    inst = lotteries.compiled_instance(args.study)
    try:
        policy = engine.resolve_policy(inst, args.policy)
    except engine.EngineError as exc:
        print(exc, file=sys.stderr)
        return 2
    play(inst, policy, args.tests, args.seed, sys.stdin, sys.stdout)
    return 0


def play(inst: engine.CompiledInstance, policy: engine.Policy, tests: int, seed: int,
         answers: TextIO, out: TextIO) -> list[engine.Observation]:
    """The interactive loop; returns the observations made. Stops at ``tests`` answers, on ``q``,
    at the end of input, or when the engine finds no question that could still change anything."""
    grid, pairs = lotteries.lottery_grid(), lotteries.test_pairs()
    # A stop on confidence would end the session early; a person was promised ``tests`` questions.
    rules = engine.StopRules(max_tests=tests)
    observations: list[engine.Observation] = []
    say = out.write
    say("Which lottery would you rather play? Each lottery pays -$10, $0 or +$10 with the given\n"
        "chances. There are no right answers: choose as if the money were real.\n")
    while True:
        decision = engine.decide(engine.observe(inst, observations), policy, rules, seed)
        if decision.done:
            if decision.stop_reason != engine.StopReason.MAX_TESTS:
                say(f"\nNo further question could change the verdict ({decision.stop_reason}).\n")
            break
        t = decision.next_test
        first, second = grid[pairs[t, 0]], grid[pairs[t, 1]]
        say(f"\nQuestion {len(observations) + 1} of {tests}\n"
            f"  [1] {lotteries.describe_lottery(first)}\n"
            f"  [2] {lotteries.describe_lottery(second)}\n")
        choice = _ask(answers, out)
        if choice is None:
            say("\nStopped.\n")
            break
        observations.append((t, inst.outcome_index[t][choice]))
        _show_posterior(engine.observe(inst, observations), out)
    _verdict(engine.observe(inst, observations), out)
    return observations


def _ask(answers: TextIO, out: TextIO) -> str | None:
    """'1' or '2'; None on 'q' or end of input. Anything else asks again."""
    while True:
        out.write("Your choice (1, 2, or q to quit): ")
        out.flush()
        line = answers.readline()
        if not line:
            out.write("\n")
            return None
        reply = line.strip().lower()
        if not answers.isatty():
            out.write(reply + "\n")  # echo scripted answers, so a transcript reads like a session
        if reply in lotteries.OUTCOMES:
            return reply
        if reply in ("q", "quit", "exit"):
            return None
        out.write("  Please type 1 or 2 (or q to quit).\n")


def _show_posterior(belief: engine.Belief, out: TextIO) -> None:
    inst = belief.instance
    for i in np.argsort(-belief.class_posterior, kind="stable"):
        p = float(belief.class_posterior[i])
        filled = int(round(p * BAR_WIDTH))
        name = lotteries.THEORY_NAMES[inst.class_labels[i]]
        out.write(f"  {name:<32} {p:6.1%}  {'#' * filled}{'.' * (BAR_WIDTH - filled)}\n")


def _verdict(belief: engine.Belief, out: TextIO) -> None:
    inst = belief.instance
    if not belief.observations:
        out.write("No answers, no verdict.\n")
        return
    best = int(np.argmax(belief.class_posterior))
    # The most probable (theory, parameters) pair inside that theory, for the uncertain study.
    members = inst.class_index[belief.alive] == best
    top = belief.alive[members][int(np.argmax(belief.mass[members]))]
    out.write(f"\nAfter {len(belief.observations)} answers your choices are best described by "
              f"{lotteries.THEORY_NAMES[inst.class_labels[best]]} "
              f"(posterior {belief.class_posterior[best]:.1%}; hypothesis {inst.hypothesis_ids[top]}).\n")
