"""Observation batches: the server CPU of one POST of n answers, against n.

    python3 -m bench.session_batches                  # n = 1 000, 2 000, 4 000, 8 000
    python3 -m bench.session_batches --sizes 500,5000 --rounds 5

In process (the Flask app over the in-memory store, no HTTP), so what is measured is the
request's own work: the body's validation, the session's walk through the batch (one engine
step per answer) and the one state rendered at the end. The instance has one repeatable test
whose answers cancel in pairs, so a session never stops by itself (the worst case: every answer
is new and kept). Quoted per size: the median over rounds of the request's CPU time (this
thread's) and of the CPU per answer; a batch linear in its length keeps the second flat, and the
last column is each size's per-answer CPU over the smallest size's, measured in the same round.
Also the CPU of 1 000 more answers posted to each session afterwards (a long session's next
request). ``SESSION_TIME_LIMIT`` and ``SESSION_MAX_OBSERVATIONS`` are raised out of the way.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.app import create_app  # noqa: E402

COIN = {"tests": [{"id": "swab", "outcomes": ["neg", "pos"], "repeatable": True}],
        "hypotheses": [{"id": "well", "class": "well", "likelihoods": {"swab": {"neg": 0.8, "pos": 0.2}}},
                       {"id": "ill", "class": "ill", "likelihoods": {"swab": {"neg": 0.2, "pos": 0.8}}}]}


def answers(n: int) -> list[dict]:
    return [{"test": "swab", "outcome": "pos" if i % 2 else "neg"} for i in range(n)]


def post_batch(client, n: int) -> tuple[float, float]:
    """CPU seconds of a POST of n answers to a new session, then of 1 000 more."""
    sid = client.post("/v1/sessions", json={"instance": COIN, "confidence": 0.999}).get_json()["session_id"]
    body = {"observations": answers(n)}
    started = time.thread_time()
    response = client.post(f"/v1/sessions/{sid}/observations", json=body, headers={"If-Match": '"1"'})
    first = time.thread_time() - started
    assert response.status_code == 200, response.get_data(as_text=True)
    started = time.thread_time()
    response = client.post(f"/v1/sessions/{sid}/observations", json={"observations": answers(1000)},
                           headers={"If-Match": '"2"'})
    more = time.thread_time() - started
    assert response.status_code == 200, response.get_data(as_text=True)
    return first, more


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,2000,4000,8000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    app = create_app({"session_time_limit": 3600.0, "session_max_observations": 10**6, "access_log": False})
    client = app.test_client()
    post_batch(client, 10)  # warm up
    runs: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
    for _ in range(args.rounds):
        measured = {n: post_batch(client, n) for n in sizes}
        base = measured[sizes[0]][0] / sizes[0]
        for n, (first, more) in measured.items():
            runs[n].append((first, more, first / n / base))
    print(f"{'answers':>8} {'CPU s':>8} {'µs/answer':>10} {'× smallest':>11} {'+1 000 after, s':>16}")
    for n in sizes:
        first = statistics.median(r[0] for r in runs[n])
        ratio = statistics.median(r[2] for r in runs[n])
        more = statistics.median(r[1] for r in runs[n])
        print(f"{n:>8} {first:>8.3f} {first / n * 1e6:>10.1f} {ratio:>11.2f} {more:>16.3f}")


if __name__ == "__main__":
    main()
