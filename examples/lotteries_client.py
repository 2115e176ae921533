#!/usr/bin/env python3
"""Drive a running edgecut service over HTTP with simulated subjects (the paper's section 5).

A copy-paste starting point for integrators, with edgecut's Python client (``from edgecut
import Client``: retries, idempotent session creation, ETags). Steps:

1. ``client.create_instance`` posts the lottery instance (likelihood form, 2346 tests);
2. ``client.start_session`` with ``policy="effecxtive"`` and ``max_tests=30`` (giving
   ``max_tests`` also turns off the engine's default 0.95-confidence stop, so every subject
   answers 30 tests);
3. ``client.observe`` answers each ``next_test`` until ``done``; then print the
   ``class_posterior``.

The simulated subject is one (theory, parameters) hypothesis answering with the paper's softmax,
P(prefer lottery 1) = 1 / (1 + exp(U(L2) − U(L1))). A test id names its two lotteries as
``P(−$10)/P($0)/P(+$10) vs …``, so the client needs no lookup table. A real front end would show
the two lotteries to a person instead (see ``edgecut play lotteries``).

Run the service (``edgecut serve``), then::

    python3 examples/lotteries_client.py --url http://127.0.0.1:8000 --subjects 3
"""

from __future__ import annotations

import argparse
import math
import random
import sys

from edgecut import Client, EdgecutError
from schemas.responses import SessionState
from service.examples import lotteries


def answer(subject: lotteries.Hypothesis, test_id: str, rng: random.Random) -> str:
    """The subject's choice on a test: "1" or "2", drawn from the softmax over utilities."""
    first, second = lotteries.parse_test_id(test_id)
    u1, u2 = subject.utilities(first[None, :])[0], subject.utilities(second[None, :])[0]
    p_first = 1.0 / (1.0 + math.exp(min(u2 - u1, 700.0)))
    return "1" if rng.random() < p_first else "2"


def run_subject(client: Client, instance_id: str, subject: lotteries.Hypothesis, tests: int,
                rng: random.Random) -> SessionState:
    state = client.start_session(instance_id, policy="effecxtive", max_tests=tests)
    while not state.done:
        test = state.next_test.id
        state = client.observe(state.session_id, test, answer(subject, test, rng))
    client.delete_session(state.session_id)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="service base URL (default %(default)s)")
    parser.add_argument("--study", choices=lotteries.STUDIES, default="fixed",
                        help="fixed: one parameter set per theory (0.6 MB of JSON); uncertain: a grid of "
                        "parameters (6.1 MB, within the default MAX_BODY_BYTES) (default %(default)s)")
    parser.add_argument("--subjects", type=int, default=3, help="simulated subjects (default %(default)s)")
    parser.add_argument("--tests", type=int, default=30, help="tests per subject (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subjects and their answers")
    args = parser.parse_args(argv)
    with Client(args.url, timeout=60) as client:
        try:
            return run_study(client, args)
        except EdgecutError as error:
            hint = " (raise the service's MAX_BODY_BYTES)" if error.status == 413 else ""
            raise SystemExit(f"{error}{hint}") from None


def run_study(client: Client, args: argparse.Namespace) -> int:
    instance_id = client.create_instance(lotteries.wire_instance(args.study))
    created = client.get_instance(instance_id)
    print(f"instance {instance_id[:12]}…: {created.n_hypotheses} hypotheses, "
          f"{created.n_tests} tests, {created.n_classes} classes")

    rng = random.Random(args.seed)
    hypotheses = lotteries.hypotheses(args.study)
    correct = 0
    for k in range(args.subjects):
        # As in the paper: a theory uniformly, then its parameters uniformly.
        theory = rng.choice(lotteries.THEORIES)
        subject = rng.choice([h for h in hypotheses if h.theory == theory])
        state = run_subject(client, instance_id, subject, args.tests, rng)
        posterior = ", ".join(f"{c} {p:.3f}" for c, p in state.class_posterior.items())
        correct += state.map_class == subject.theory
        print(f"subject {k + 1}: true {subject.id}; after {state.step} tests "
              f"({state.stop_reason}) MAP {state.map_class}; posterior {posterior}")
    print(f"{correct}/{args.subjects} subjects classified correctly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
