"""A CAT results post on a stateless section against ``/v1/select`` with the same answers, on the
triage example.

    python3 -m bench.cat                      # after 1, 3 and 5 answers; 7 rounds of 300 calls
    python3 -m bench.cat --rounds 11 --calls 500

In process (the Flask app over the in-memory store, no HTTP), so what is compared is each
request's own work; both name the stored instance by id. The CAT call answers the d-th item from the state after d − 1 answers: it
decodes the state, replays the d − 1 answers to check the item was asked, replays all d for the
next stage (the step cache answers both after the first call), and writes the new state and the
assessment result; ``/v1/select`` replays the d answers once. Rounds are paired (the two back to
back, the order alternating) and the ratio is taken within a round; quoted: the medians over
rounds of the wall time per call and of the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.app import create_app  # noqa: E402

MIGRAINE = 5  # the hypothesis's index in examples/triage/instance.json: asked 5 questions
BASE = "/ims/cat/v1p0"


def results(state: str, test: str, outcome: str) -> dict:
    return {"sessionState": state, "assessmentResult": {"itemResult": [{"identifier": test, "responseVariable": [
        {"identifier": "RESPONSE", "candidateResponse": {"value": [{"value": outcome}]}}]}]}}


def bodies(client, depth: int) -> tuple[bytes, str, bytes]:
    """/v1/select's body after ``depth`` answers; the CAT results URL and body giving the last one."""
    instance = json.loads((ROOT / "examples" / "triage" / "instance.json").read_text())
    truths = instance["hypotheses"][MIGRAINE]["outcomes"]
    instance_id = client.post("/v1/instances", json=instance).get_json()["instance_id"]
    config = {"sectionConfiguration": {"instance_id": instance_id, "stateless": True}}
    section = client.post(f"{BASE}/sections", json=config).get_json()["sectionIdentifier"]
    session = client.post(f"{BASE}/sections/{section}/sessions").get_json()
    url = f"{BASE}/sections/{section}/sessions/{session['sessionIdentifier']}/results"
    state, items, observations = session["sessionState"], session["nextItems"]["itemIdentifiers"], []
    for answered in range(depth):
        if not items:
            raise SystemExit(f"the section stops after {answered} answers; choose smaller --depths")
        test = items[0]
        body = results(state, test, truths[test])
        observations.append({"test": test, "outcome": truths[test]})
        if answered == depth - 1:
            break
        reply = client.post(url, json=body).get_json()
        state, items = reply["sessionState"], reply["nextItems"]["itemIdentifiers"]
    select = {"instance_id": instance_id, "observations": observations}
    return json.dumps(select).encode(), url, json.dumps(body).encode()


def per_call(client, path: str, body: bytes, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        reply = client.post(path, data=body, content_type="application/json")
        if reply.status_code != 200:
            raise SystemExit(f"{path}: {reply.status_code} {reply.get_data()[:300]!r}")
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="1,3,5")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    client = create_app({"redis_url": None, "log_level": "warning"}).test_client()
    print(f"{'answers':>7}  {'/v1/select µs':>13}  {'CAT results µs':>14}  {'ratio':>5}")
    for depth in map(int, args.depths.split(",")):
        select, url, cat = bodies(client, depth)
        runs = [("/v1/select", select), (url, cat)]
        for path, body in runs:  # warm: the step cache, the first call's imports
            per_call(client, path, body, 20)
        times: list[tuple[float, float]] = []
        for r in range(args.rounds):
            ordered = runs if r % 2 == 0 else runs[::-1]
            measured = {path: per_call(client, path, body, args.calls) for path, body in ordered}
            times.append((measured["/v1/select"], measured[url]))
        print(f"{depth:>7}  {statistics.median(s for s, _ in times) * 1e6:>13.0f}  "
              f"{statistics.median(c for _, c in times) * 1e6:>14.0f}  "
              f"{statistics.median(c / s for s, c in times):>5.2f}")


if __name__ == "__main__":
    main()
