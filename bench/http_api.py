"""HTTP benchmark: ``python3 -m bench.http_api [--seconds 15] [--connections 32] [--large/--no-large]``.

Starts, on loopback only and for a bounded time:

* a fresh ``redis-server`` on a free port (no persistence);
* the edgecut service under gunicorn with the project's configuration (service/gunicorn_conf.py,
  2 gthread workers) and that Redis;
* the *floor*: a bare Flask app under the same gunicorn configuration whose one endpoint does a
  single Redis GET and SET of a small JSON body (what any Redis-backed endpoint pays at least).

Then drives ``POST /v1/sessions/{sid}/observations`` on a random deterministic instance
(n = 200 hypotheses, N = 50 binary tests, 50 classes: about 8 steps per session) from ``--connections`` keep-alive
connections (processes × threads, so the client is not one GIL), each answering the test the
service asks for with the outcome of a hidden true hypothesis, session after session (sessions are
created before the clock starts). The floor gets the same connections and the same request size.
Last, with the service warmed up, the p50 latency of an observation on a 10 000 × 1 000 instance.

Prints requests/s, p50 and p99 for each, and the ratios the goals are stated in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import argparse
import http.client
import json
import multiprocessing
import os
import subprocess
import tempfile
import threading
import time

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import RedisServer, free_port  # noqa: E402  (the test suite's launchers)

PROCESSES = 4


# --- the floor: one Redis GET + SET per request ------------------------------------------


def floor_app():
    """gunicorn ``bench.http_api:floor_app()``: the cheapest useful Redis-backed JSON endpoint."""
    import orjson
    import redis
    from flask import Flask, Response, request

    app = Flask("floor")
    client = redis.Redis.from_url(os.environ["REDIS_URL"])

    @app.post("/floor/<key>")
    def floor(key: str) -> Response:
        body = orjson.loads(request.get_data())
        current = client.get(f"floor:{key}")
        client.set(f"floor:{key}", orjson.dumps({"previous": len(current or b""), **body}))
        return Response(orjson.dumps({"ok": True, "key": key}), content_type="application/json")

    return app


# --- processes ---------------------------------------------------------------------------


def wait_http(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port}")


def start_gunicorn(app: str, env: dict[str, str], workers: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--config", "python:service.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), app],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, port


# --- instances ---------------------------------------------------------------------------


def random_instance(n: int, n_tests: int, outcomes: int, classes: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "tests": [{"id": f"t{j}", "cost": float(rng.integers(1, 4)), "outcomes": [str(k) for k in range(outcomes)]}
                  for j in range(n_tests)],
        "matrix": rng.integers(0, outcomes, size=(n, n_tests)).tolist(),
        "classes": [f"c{int(c)}" for c in rng.integers(0, classes, size=n)],
        "priors": rng.dirichlet(np.ones(n)).tolist(),
    }


# --- the load ----------------------------------------------------------------------------


class Client:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.conn.request(method, path, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else {})


def _session_worker(port, instance_id, matrix, test_index, sessions, seconds, start_at, out, seed):
    """One connection: sessions one after another, answering as a hidden true hypothesis."""
    rng = np.random.default_rng(seed)
    client = Client(port)
    prepared = []
    for _ in range(sessions):
        status, state = client.call("POST", "/v1/sessions", {"instance_id": instance_id,
                                                             "seed": int(rng.integers(0, 2**62))})
        assert status == 201, state
        prepared.append((state, int(rng.integers(0, len(matrix)))))
    while time.time() < start_at:
        time.sleep(0.001)
    latencies, errors, deadline = [], 0, start_at + seconds
    for state, truth in prepared:
        while not state["done"] and time.time() < deadline:
            test = state["next_test"]["id"]
            outcome = str(matrix[truth][test_index[test]])
            began = time.perf_counter()
            status, body = client.call("POST", f"/v1/sessions/{state['session_id']}/observations",
                                       {"test": test, "outcome": outcome})
            latencies.append(time.perf_counter() - began)
            if status != 200:
                errors += 1
                break
            state = body
        if time.time() >= deadline:
            break
    else:
        out.put(("exhausted", 1))
    out.put(("result", latencies, errors))


def _floor_worker(port, key, seconds, start_at, out, seed):
    client = Client(port)
    body = {"test": "t17", "outcome": "2"}
    while time.time() < start_at:
        time.sleep(0.001)
    latencies, errors, deadline = [], 0, start_at + seconds
    while time.time() < deadline:
        began = time.perf_counter()
        status, _ = client.call("POST", f"/floor/{key}", body)
        latencies.append(time.perf_counter() - began)
        errors += status != 200
    out.put(("result", latencies, errors))


def _process(kind: str, args: tuple, threads: int, out, seed: int) -> None:
    pool = []
    for i in range(threads):
        target = _session_worker if kind == "session" else _floor_worker
        thread_args = (*args, out, seed * 1000 + i) if kind == "session" else (args[0], f"k{seed}-{i}", *args[1:], out,
                                                                                seed * 1000 + i)
        pool.append(threading.Thread(target=target, args=thread_args))
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def drive(kind: str, args: tuple, connections: int, seconds: float, warmup: float) -> dict:
    out = multiprocessing.Queue()
    start_at = time.time() + warmup
    per_process = [connections // PROCESSES + (i < connections % PROCESSES) for i in range(PROCESSES)]
    if kind == "session":
        port, instance_id, matrix, test_index, sessions = args
        full = (port, instance_id, matrix, test_index, sessions, seconds, start_at)
    else:
        full = (args[0], seconds, start_at)
    processes = [multiprocessing.Process(target=_process, args=(kind, full, n, out, i)) for i, n in
                 enumerate(per_process) if n]
    for process in processes:
        process.start()
    latencies, errors, results, exhausted = [], 0, 0, 0
    while results < connections:
        message = out.get(timeout=seconds + warmup + 120)
        if message[0] == "exhausted":
            exhausted += 1
            continue
        latencies += message[1]
        errors += message[2]
        results += 1
    for process in processes:
        process.join()
    lat = np.array(latencies) * 1000
    return {"requests": len(lat), "errors": errors, "rps": len(lat) / seconds,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "ran_out_of_sessions": exhausted}


def combine(runs: list[dict]) -> dict:
    """Rounds → one row: the median round's requests/s; latency percentiles of the median round."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    middle = ordered[len(ordered) // 2]
    return {**middle, "requests": sum(r["requests"] for r in runs), "errors": sum(r["errors"] for r in runs),
            "rps_rounds": [round(r["rps"]) for r in runs],
            "ran_out_of_sessions": sum(r["ran_out_of_sessions"] for r in runs)}


def large_p50(port: int, instance: dict, sessions: int, rng_seed: int = 7) -> dict:
    client = Client(port)
    began = time.perf_counter()
    status, summary = client.call("POST", "/v1/instances", instance)
    post_seconds = time.perf_counter() - began
    assert status in (200, 201), summary
    test_index = {t["id"]: j for j, t in enumerate(instance["tests"])}
    rng = np.random.default_rng(rng_seed)
    latencies = []
    for _ in range(sessions):
        # A seed of its own per session: no step is served from the worker's step cache.
        status, state = client.call("POST", "/v1/sessions", {"instance_id": summary["instance_id"],
                                                             "seed": int(rng.integers(0, 2**62))})
        assert status == 201, state
        truth = int(rng.integers(0, len(instance["matrix"])))
        steps = 0
        while not state["done"] and steps < 12:
            test = state["next_test"]["id"]
            t0 = time.perf_counter()
            status, state = client.call("POST", f"/v1/sessions/{state['session_id']}/observations",
                                        {"test": test, "outcome": str(instance["matrix"][truth][test_index[test]])})
            latencies.append(time.perf_counter() - t0)
            assert status == 200, state
            steps += 1
    lat = np.array(latencies) * 1000
    return {"post_instance_s": post_seconds, "observations": len(lat), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per run; each endpoint runs --rounds times")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--large", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)

    redis_server = RedisServer(Path(tempfile.mkdtemp(prefix="edgecut-bench-")), "--appendonly", "no")
    redis_server.start()
    redis_url = redis_server.url
    servers = []
    try:
        env = {"REDIS_URL": redis_url, "LOG_LEVEL": "warning", "MAX_BODY_BYTES": str(256 * 1024 * 1024),
               "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="edgecut-bench-metrics-")}
        edgecut, edgecut_port = start_gunicorn("service.app:create_app()", env, args.workers)
        floor, floor_port = start_gunicorn("bench.http_api:floor_app()", {**env, "PROMETHEUS_MULTIPROC_DIR":
                                           tempfile.mkdtemp(prefix="edgecut-bench-metrics-")}, args.workers)
        servers += [edgecut, floor]
        wait_http(edgecut_port, "/readyz")
        wait_http(floor_port, "/nothing")

        small = random_instance(200, 50, 2, 50, seed=1)
        status, summary = Client(edgecut_port).call("POST", "/v1/instances", small)
        assert status in (200, 201), summary
        test_index = {t["id"]: j for j, t in enumerate(small["tests"])}
        # Enough sessions that no connection runs out within the time (≈ 5 steps per session).
        sessions = int(args.seconds * 1500 / args.connections / 4) + 20
        print(f"edgecut bench: gunicorn {args.workers} gthread workers, redis {redis_url}, "
              f"{args.connections} connections, {args.rounds} alternating rounds of {args.seconds:.0f} s each, "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        # Alternate short runs of the two, so background load on a shared machine hits both alike.
        floor_runs, service_runs = [], []
        for _ in range(args.rounds):
            floor_runs.append(drive("floor", (floor_port,), args.connections, args.seconds, warmup=1.0))
            service_runs.append(drive("session", (edgecut_port, summary["instance_id"], small["matrix"], test_index,
                                                  sessions), args.connections, args.seconds, warmup=3.0))
        floor_result, service_result = combine(floor_runs), combine(service_runs)
        rows = [("floor: Flask + Redis GET+SET", floor_result),
                ("POST observations (n=200, N=50)", service_result)]
        print(f"\n| {'endpoint':<34} | {'requests':>8} | {'errors':>6} | {'req/s':>7} | {'p50 ms':>6} | {'p99 ms':>6} |")
        print(f"|{'-' * 36}|{'-' * 10}|{'-' * 8}|{'-' * 9}|{'-' * 8}|{'-' * 8}|")
        for name, r in rows:
            print(f"| {name:<34} | {r['requests']:>8} | {r['errors']:>6} | {r['rps']:>7.0f} | {r['p50_ms']:>6.1f} "
                  f"| {r['p99_ms']:>6.1f} |")
        ratio = service_result["rps"] / floor_result["rps"]
        print(f"\nreq/s by round: floor {floor_result['rps_rounds']}, observations {service_result['rps_rounds']}")
        print(f"observations at {ratio:.0%} of the floor's requests/s (goal ≥ 70%); "
              f"p99 {service_result['p99_ms']:.1f} ms (goal ≤ 25 ms)")
        if service_result["ran_out_of_sessions"]:
            print(f"warning: {service_result['ran_out_of_sessions']} connections ran out of sessions")
        result = {"floor": floor_result, "observations": service_result, "ratio": ratio}
        if args.large:
            large = random_instance(10_000, 1_000, 2, 20, seed=2)
            # Warm each worker's instance cache, then measure.
            large_result = large_p50(edgecut_port, large, sessions=4)
            large_result = {**large_p50(edgecut_port, large, sessions=10), "post_instance_s":
                            large_result["post_instance_s"]}
            print(f"\n10 000 × 1 000 instance (posted and compiled in {large_result['post_instance_s']:.1f} s): "
                  f"p50 {large_result['p50_ms']:.1f} ms, p99 {large_result['p99_ms']:.1f} ms per observation over "
                  f"{large_result['observations']} observations (goal p50 ≤ 20 ms)")
            result["large"] = large_result
        print("\n" + json.dumps(result))
    finally:
        for process in servers:
            process.terminate()
        for process in servers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
