"""FHIR ``$next-question`` against ``/v1/select`` with the same answers, on the triage example.

    python3 -m bench.fhir                     # depths 0, 2, 4 answers; 7 rounds of 300 calls
    python3 -m bench.fhir --rounds 11 --calls 500
    python3 -m bench.fhir --redis             # over a fresh redis-server on a free port

In process (the Flask app over the in-memory store, no HTTP), so what is compared is each
request's own work: both replay the answers through the same path (the step cache answers both
after the first call); the FHIR call also parses the QuestionnaireResponse, checks its items and
renders the resource back. HTTP and network costs, the same for both, would only bring the ratio
nearer 1. Rounds are paired (the two endpoints back to back, the order alternating) and the
ratio is taken within a round; quoted: the medians over rounds of the wall time per call and of
the ratio. The goal: at most 2× (docs/integrations.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fhir_support import answer, last_question, start, truth_answers, worded_triage  # noqa: E402
from service.app import create_app  # noqa: E402

GOAL = 2.0
MIGRAINE = 5  # the hypothesis's index in examples/triage/instance.json
NEXT = "/fhir/Questionnaire/$next-question"


def bodies(client, depth: int) -> tuple[bytes, bytes]:
    """The two request bodies after ``depth`` answers of a hypothesis the example asks 5
    questions of (migraine)."""
    instance = worded_triage()
    instance_id = client.post("/v1/instances", json=instance).get_json()["instance_id"]
    response = start(client.get(f"/fhir/Questionnaire/{instance_id}").get_json())
    truths, observations = truth_answers(instance, MIGRAINE), []
    for _ in range(depth):
        response = client.post(NEXT, json=response).get_json()
        if response["status"] == "completed":
            raise SystemExit(f"the questionnaire stops before {depth} answers; choose smaller --depths")
        item = last_question(response)
        observations.append({"test": item["linkId"], "outcome": truths[item["linkId"]]})
        response = answer(response, item, truths[item["linkId"]])
    select = {"instance_id": instance_id, "observations": observations}
    return json.dumps(select).encode(), json.dumps(copy.deepcopy(response)).encode()


def per_call(client, path: str, body: bytes, content_type: str, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        reply = client.post(path, data=body, content_type=content_type)
        if reply.status_code != 200:
            raise SystemExit(f"{path}: {reply.status_code} {reply.get_data()[:300]!r}")
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="0,2,4")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--redis", action="store_true", help="the Redis store, not the in-memory one")
    args = parser.parse_args()
    if not args.redis:
        run(args, None)
        return
    from conftest import RedisServer

    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        try:
            run(args, server.url)
        finally:
            server.stop()


def run(args: argparse.Namespace, redis_url: str | None) -> None:
    client = create_app({"redis_url": redis_url, "log_level": "warning"}).test_client()
    print(f"store: {'Redis' if redis_url else 'memory'}")
    print(f"{'answers':>7}  {'/v1/select µs':>13}  {'$next-question µs':>17}  {'ratio':>5}")
    worst = 0.0
    for depth in map(int, args.depths.split(",")):
        select, fhir = bodies(client, depth)
        runs = [("/v1/select", select, "application/json"), (NEXT, fhir, "application/fhir+json")]
        for path, body, kind in runs:  # warm: the step cache, the first call's imports
            per_call(client, path, body, kind, 20)
        times: list[tuple[float, float]] = []
        for r in range(args.rounds):
            ordered = runs if r % 2 == 0 else runs[::-1]
            measured = {path: per_call(client, path, body, kind, args.calls) for path, body, kind in ordered}
            times.append((measured["/v1/select"], measured[NEXT]))
        ratio = statistics.median(f / s for s, f in times)
        worst = max(worst, ratio)
        print(f"{depth:>7}  {statistics.median(s for s, _ in times) * 1e6:>13.0f}  "
              f"{statistics.median(f for _, f in times) * 1e6:>17.0f}  {ratio:>5.2f}")
    print(f"worst median ratio {worst:.2f} (goal ≤ {GOAL:.0f}): {'met' if worst <= GOAL else 'NOT met'}")


if __name__ == "__main__":
    main()
