#!/usr/bin/env python3
"""A triage session from Python with edgecut's client: post the triage instance, then answer
each test the service asks for as a given condition would, until the disposition is settled.

Run the service (``edgecut serve``), then::

    python3 examples/triage_client.py --condition appendicitis
    python3 examples/triage_client.py --ask            # answer at the keyboard instead
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgecut import Client, EdgecutError

INSTANCE = json.loads((Path(__file__).parent / "triage" / "instance.json").read_text())


def main(argv: list[str] | None = None) -> int:
    conditions = {h["id"]: h for h in INSTANCE["hypotheses"]}
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="service base URL (default %(default)s)")
    parser.add_argument("--api-key", help="when the service has API_KEYS set")
    parser.add_argument("--condition", choices=sorted(conditions), default="appendicitis", metavar="CONDITION",
                        help="the condition whose answers are given (default %(default)s): "
                        + ", ".join(sorted(conditions)))
    parser.add_argument("--ask", action="store_true", help="answer each test at the keyboard instead")
    args = parser.parse_args(argv)

    with Client(args.url, api_key=args.api_key) as client:
        try:
            state = client.start_session(client.create_instance(INSTANCE), explain=True)
            while not state.done:
                test = state.next_test
                if args.ask:
                    outcome = input(f"{test.id} (cost {test.cost:g}) {'/'.join(test.outcomes)}? ").strip()
                else:
                    outcome = conditions[args.condition]["outcomes"][test.id]
                    print(f"{test.id} (cost {test.cost:g}): {outcome}")
                try:
                    state = client.observe(state.session_id, test.id, outcome, explain=True)
                except EdgecutError as error:
                    if error.status != 422:  # a mistyped outcome: ask again
                        raise
                    print(error.detail)
        except EdgecutError as error:
            raise SystemExit(str(error)) from None
    # A decision instance settles a disposition; a class instance, a class.
    settled = state.decision.id if state.decision is not None else state.map_class
    posterior = state.decision_posterior if state.decision_posterior is not None else state.class_posterior
    shown = ", ".join(f"{label} {p:.2f}" for label, p in posterior.items())
    print(f"{state.stop_reason}: {settled} after cost {state.cost_spent:g} ({shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
