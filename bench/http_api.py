"""HTTP benchmark: ``python3 -m bench.http_api [--seconds 6] [--rounds 5] [--connections 32]
[--max-rate R]``.

Starts, on loopback only and for a bounded time:

* a fresh ``redis-server`` on a free port (no persistence);
* the edgecut service under gunicorn with the project's configuration (service/gunicorn_conf.py,
  2 gthread workers) and that Redis;
* the *floor*: a bare Flask app under the same gunicorn configuration whose one endpoint does a
  Redis GET and a SET of a small JSON body and answers with orjson, no metrics (what any
  Redis-backed JSON endpoint pays at least).

Then drives ``POST /v1/sessions/{sid}/observations`` from ``--connections`` keep-alive connections
(processes × threads, so the client is not one GIL) on two instances of n = 200 hypotheses,
N = 50 binary tests and 50 classes: a deterministic one (EC²) and a noisy one (likelihoods,
EffECXtive). Each connection answers the test the service asks for as a hidden true hypothesis
would (on the noisy instance, one draw from its likelihoods per test, made while the session is
prepared), session after session; with ``--max-rate R``, every session under restricted exposure
control at that rate (its counts read before and written after each observation). Every connection
creates all its sessions first and the clock starts when the last one is ready; request bodies
are encoded and responses decoded with orjson, as the floor does.

Rounds are paired: each round runs the floor and the service back to back (the order alternating
between rounds), and the ratios are taken within a round, so background load on a shared machine
hits both alike. Quoted: medians over rounds of req/s, p99 and the two ratios, and the CPU the
server's processes spent per request (gunicorn's workers, redis-server), which background load
inflates far less than it does rates and latencies. Last, with the service warmed, the latency
of an observation on a 10 000 × 1 000 instance (``--no-large`` skips).
"""

from __future__ import annotations

import sys
from pathlib import Path

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import RedisServer  # noqa: E402  (the test suite's launcher)

from bench.floor import start_gunicorn, wait_http  # noqa: E402
from bench.procfs import cpu_seconds  # noqa: E402

PROCESSES = 4
RPS_GOAL, P99_GOAL = 0.8, 1.5  # × the floor's: the service's goals (docs/api.md, "Benchmark")


# --- instances ---------------------------------------------------------------------------


def random_instance(n: int, n_tests: int, outcomes: int, classes: int, seed: int, noisy: bool = False) -> dict:
    """Random answers (or, ``noisy``, random likelihoods: each row a Dirichlet(1) draw)."""
    rng = np.random.default_rng(seed)
    instance = {
        "tests": [{"id": f"t{j}", "cost": float(rng.integers(1, 4)), "outcomes": [str(k) for k in range(outcomes)]}
                  for j in range(n_tests)],
        "classes": [f"c{int(c)}" for c in rng.integers(0, classes, size=n)],
        "priors": rng.dirichlet(np.ones(n)).tolist(),
    }
    if noisy:
        instance["likelihood_matrix"] = rng.dirichlet(np.ones(outcomes), size=(n, n_tests)).tolist()
    else:
        instance["matrix"] = rng.integers(0, outcomes, size=(n, n_tests)).tolist()
    return instance


class Answers:
    """The hidden true hypothesis's answers to every test: its outcomes, or one draw from its
    likelihoods per test, drawn when the session is prepared (a respondent's answer to a question
    does not change), so the timed loop looks answers up and the client's CPU per request is what
    the floor's client spends: a request and its response."""

    def __init__(self, instance: dict):
        self.test_ids = [t["id"] for t in instance["tests"]]
        self.matrix = instance.get("matrix")
        self.likelihood = None if self.matrix is not None else np.array(instance["likelihood_matrix"])
        self.n = len(instance["classes"])

    def sheet(self, truth: int, rng: np.random.Generator) -> dict[str, str]:
        if self.matrix is not None:
            return {test: str(k) for test, k in zip(self.test_ids, self.matrix[truth])}
        cells = self.likelihood[truth]  # (N, ℓ)
        drawn = (rng.random((len(cells), 1)) > np.cumsum(cells, axis=1)).sum(axis=1)
        return {test: str(int(k)) for test, k in zip(self.test_ids, np.minimum(drawn, cells.shape[1] - 1))}


# --- the load ----------------------------------------------------------------------------


class Client:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the connection while it idled past its keep-alive timeout (slow
            # preparation of the other connections): reconnect and send again, as any keep-alive
            # client does. Every request sent here is safe to repeat.
            self.conn.close()
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
        raw = response.read()
        return response.status, (orjson.loads(raw) if raw else {})


def _session_connection(port, instance_id, answers, sessions, seconds, exposure, ready, go, start_at, out, seed):
    """One connection: creates its sessions (with ``exposure`` control, when given), waits for
    the start, then answers session after session as a hidden true hypothesis."""
    rng = np.random.default_rng(seed)
    client = Client(port)
    prepared = []
    for _ in range(sessions):
        body = {"instance_id": instance_id, "seed": int(rng.integers(0, 2**62))}
        status, state = client.call("POST", "/v1/sessions", body if exposure is None else {**body, "exposure": exposure})
        assert status == 201, state
        prepared.append((state, answers.sheet(int(rng.integers(0, answers.n)), rng)))
    ready.put(1)
    go.wait()
    latencies, errors, deadline = [], 0, start_at.value + seconds
    while time.time() < start_at.value:
        time.sleep(0.0005)
    for state, sheet in prepared:
        while not state["done"] and time.time() < deadline:
            test = state["next_test"]["id"]
            began = time.perf_counter()
            status, body = client.call("POST", f"/v1/sessions/{state['session_id']}/observations",
                                       {"test": test, "outcome": sheet[test]})
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


def _floor_connection(port, key, seconds, ready, go, start_at, out, seed):
    client = Client(port)
    body = {"test": "t17", "outcome": "1"}
    client.call("POST", f"/floor/{key}", body)
    ready.put(1)
    go.wait()
    while time.time() < start_at.value:
        time.sleep(0.0005)
    latencies, errors, deadline = [], 0, start_at.value + seconds
    while time.time() < deadline:
        began = time.perf_counter()
        status, _ = client.call("POST", f"/floor/{key}", body)
        latencies.append(time.perf_counter() - began)
        errors += status != 200
    out.put(("result", latencies, errors))


def _process(kind: str, args: tuple, threads: int, sync: tuple, out, seed: int) -> None:
    pool = []
    for i in range(threads):
        if kind == "session":
            thread_args = (*args, *sync, out, seed * 1000 + i)
            target = _session_connection
        else:
            port, seconds = args
            thread_args = (port, f"k{seed}-{i}", seconds, *sync, out, seed * 1000 + i)
            target = _floor_connection
        pool.append(threading.Thread(target=target, args=thread_args))
    for thread in pool:
        thread.start()
    go = sync[1]
    go.wait()
    while time.time() < sync[2].value:
        time.sleep(0.0005)
    started = time.process_time()
    for thread in pool:
        thread.join()
    out.put(("client_cpu", time.process_time() - started))


def drive(kind: str, args: tuple, connections: int, seconds: float, server: list[int], redis_pid: int) -> dict:
    """One timed run: every connection prepares, then all start together. Besides the client's
    view, the CPU the server's processes (gunicorn's workers; and redis-server) spent per request
    while the clock ran: what a request costs, whatever else the machine runs."""
    ready, out, go = multiprocessing.Queue(), multiprocessing.Queue(), multiprocessing.Event()
    start_at = multiprocessing.Value("d", 0.0)
    per_process = [connections // PROCESSES + (i < connections % PROCESSES) for i in range(PROCESSES)]
    processes = [multiprocessing.Process(target=_process, args=(kind, args, n, (ready, go, start_at), out, i))
                 for i, n in enumerate(per_process) if n]
    for process in processes:
        process.start()
    for _ in range(connections):
        ready.get(timeout=600)
    start_at.value = time.time() + 0.2
    go.set()
    time.sleep(max(0.0, start_at.value - time.time()))
    before = cpu_seconds([*server, redis_pid])
    latencies, errors, results, exhausted, client_cpu, clients = [], 0, 0, 0, 0.0, 0
    while results < connections or clients < len(processes):
        message = out.get(timeout=seconds + 120)
        if message[0] == "exhausted":
            exhausted += 1
            continue
        if message[0] == "client_cpu":
            client_cpu += message[1]
            clients += 1
            continue
        latencies += message[1]
        errors += message[2]
        results += 1
        if results == 1:  # the first connection is done: the clock has run out
            after = cpu_seconds([*server, redis_pid])
    for process in processes:
        process.join()
    lat = np.array(latencies) * 1000
    spent = {pid: after[pid] - before[pid] for pid in after if pid in before}
    redis_ms = spent.pop(redis_pid, 0.0) * 1000 / max(1, len(lat))
    return {"requests": len(lat), "errors": errors, "rps": len(lat) / seconds,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "cpu_ms": sum(spent.values()) * 1000 / max(1, len(lat)), "redis_cpu_ms": redis_ms,
            "client_cpu_ms": client_cpu * 1000 / max(1, len(lat)),
            "ran_out_of_sessions": exhausted}


def paired_rounds(floor_port: int, session_args: tuple, rounds: int, connections: int, seconds: float,
                  pids: dict[str, int]) -> dict:
    floors, services = [], []
    for i in range(rounds):
        order = (("floor", floors), ("session", services)) if i % 2 == 0 else (("session", services), ("floor", floors))
        for kind, runs in order:
            args = (floor_port, seconds) if kind == "floor" else session_args
            runs.append(drive(kind, args, connections, seconds, [pids[kind]], pids["redis"]))
    median = statistics.median
    return {
        "cpu_ms": median(r["cpu_ms"] for r in services), "floor_cpu_ms": median(r["cpu_ms"] for r in floors),
        "redis_cpu_ms": median(r["redis_cpu_ms"] for r in services),
        "floor_redis_cpu_ms": median(r["redis_cpu_ms"] for r in floors),
        "client_cpu_ms": median(r["client_cpu_ms"] for r in services),
        "floor_client_cpu_ms": median(r["client_cpu_ms"] for r in floors),
        "floor_rps": median(r["rps"] for r in floors), "floor_p99_ms": median(r["p99_ms"] for r in floors),
        "floor_p50_ms": median(r["p50_ms"] for r in floors),
        "rps": median(r["rps"] for r in services), "p99_ms": median(r["p99_ms"] for r in services),
        "p50_ms": median(r["p50_ms"] for r in services),
        "rps_ratio": median(s["rps"] / f["rps"] for s, f in zip(services, floors)),
        "p99_ratio": median(s["p99_ms"] / f["p99_ms"] for s, f in zip(services, floors)),
        "rounds": [{"floor_rps": round(f["rps"]), "rps": round(s["rps"]), "floor_p99_ms": round(f["p99_ms"], 1),
                    "p99_ms": round(s["p99_ms"], 1), "floor_cpu_ms": round(f["cpu_ms"], 3),
                    "cpu_ms": round(s["cpu_ms"], 3)} for s, f in zip(services, floors)],
        "errors": sum(r["errors"] for r in services + floors),
        "ran_out_of_sessions": sum(r["ran_out_of_sessions"] for r in services),
    }


def large_p50(port: int, instance: dict, sessions: int, rng_seed: int = 7) -> dict:
    client = Client(port)
    began = time.perf_counter()
    status, summary = client.call("POST", "/v1/instances", instance)
    post_seconds = time.perf_counter() - began
    assert status in (200, 201), summary
    test_index = {t["id"]: j for j, t in enumerate(instance["tests"])}
    rng = np.random.default_rng(rng_seed)
    latencies = []
    for i in range(sessions):
        # Stop rules of its own per session (a max_tests never reached): no step is served from
        # the worker's step cache, each observation computes its step.
        status, state = client.call("POST", "/v1/sessions", {"instance_id": summary["instance_id"],
                                                             "max_tests": 100 + i + int(rng.integers(0, 10**6))})
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


LABELS = {"deterministic": "deterministic (EC²)", "noisy": "noisy (likelihoods, EffECXtive)"}


def print_table(results: dict, title: str, columns: list[tuple[str, str, int]]) -> None:
    """A markdown table of ``results``, a row per instance: ``columns`` are (heading, key, decimals)."""
    widths = [max(len(heading), 6) for heading, _, _ in columns]
    print(f"\n| {title:<36} | " + " | ".join(f"{h:>{w}}" for (h, _, _), w in zip(columns, widths)) + " |")
    print(f"|{'-' * 38}|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for name, r in results.items():
        print(f"| {LABELS[name]:<36} | " + " | ".join(f"{r[key]:>{w}.{decimals}f}"
                                                     for (_, key, decimals), w in zip(columns, widths)) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per run; each round runs the floor and the service")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--instances", default="deterministic,noisy", help="comma-separated: deterministic, noisy")
    parser.add_argument("--large", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--max-rate", type=float, default=None,
                        help="sessions under restricted exposure control at this rate (its counts cost two Redis "
                        "commands per observation); default: none")
    args = parser.parse_args(argv)
    exposure = None if args.max_rate is None else {"method": "restricted", "max_rate": args.max_rate}

    redis_server = RedisServer(Path(tempfile.mkdtemp(prefix="edgecut-bench-")), "--appendonly", "no")
    redis_server.start()
    redis_url = redis_server.url
    servers = []
    try:
        env = {"REDIS_URL": redis_url, "LOG_LEVEL": "warning", "MAX_BODY_BYTES": str(256 * 1024 * 1024),
               "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="edgecut-bench-metrics-")}
        edgecut, edgecut_port = start_gunicorn("service.app:create_app()", env, args.workers)
        floor, floor_port = start_gunicorn("bench.floor:floor_app()", {**env, "PROMETHEUS_MULTIPROC_DIR":
                                           tempfile.mkdtemp(prefix="edgecut-bench-metrics-")}, args.workers)
        servers += [edgecut, floor]
        wait_http(edgecut_port, "/readyz")
        wait_http(floor_port, "/nothing")
        print(f"edgecut bench: gunicorn {args.workers} gthread workers, redis {redis_url}, "
              f"{args.connections} connections, {args.rounds} paired rounds of {args.seconds:g} s, "
              f"exposure control {exposure or 'none'}, "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)

        results = {}
        # Sessions per connection: enough for ~2000 observations/s; (≈ steps per session).
        for name in args.instances.split(","):
            noisy = name == "noisy"
            instance = random_instance(200, 50, 2, 50, seed=1, noisy=noisy)
            status, summary = Client(edgecut_port).call("POST", "/v1/instances", instance)
            assert status in (200, 201), summary
            steps_per_session = 12 if noisy else 5
            sessions = int(args.seconds * 2000 / args.connections / steps_per_session) + 10
            session_args = (edgecut_port, summary["instance_id"], Answers(instance), sessions, args.seconds, exposure)
            results[name] = paired_rounds(floor_port, session_args, args.rounds, args.connections, args.seconds,
                                          {"floor": floor.pid, "session": edgecut.pid, "redis": redis_server.process.pid})
            r = results[name]
            print(f"{name}: rounds {r['rounds']}", flush=True)

        print_table(results, "POST observations, n = 200, N = 50",
                    [("req/s", "rps", 0), ("floor req/s", "floor_rps", 0), ("× floor", "rps_ratio", 2),
                     ("p50 ms", "p50_ms", 1), ("p99 ms", "p99_ms", 1), ("floor p99", "floor_p99_ms", 1),
                     ("p99 × floor", "p99_ratio", 2)])
        for name, r in results.items():
            if r["errors"] or r["ran_out_of_sessions"]:
                print(f"warning: {name}: {r['errors']} errors, {r['ran_out_of_sessions']} connections ran out of sessions")
        print(f"(medians over the rounds; goals: req/s ≥ {RPS_GOAL} × the floor's, p99 ≤ {P99_GOAL} × the floor's)")
        print_table(results, "CPU per request, ms",
                    [("workers", "cpu_ms", 3), ("floor", "floor_cpu_ms", 3), ("redis", "redis_cpu_ms", 3),
                     ("floor", "floor_redis_cpu_ms", 3), ("client", "client_cpu_ms", 3),
                     ("floor", "floor_client_cpu_ms", 3)])
        if args.large:
            large = random_instance(10_000, 1_000, 2, 20, seed=2)
            # Warm each worker's instance cache, then measure.
            warm = large_p50(edgecut_port, large, sessions=4)
            large_result = {**large_p50(edgecut_port, large, sessions=10), "post_instance_s": warm["post_instance_s"]}
            print(f"\n10 000 × 1 000 instance (posted and compiled in {large_result['post_instance_s']:.1f} s): "
                  f"p50 {large_result['p50_ms']:.1f} ms, p99 {large_result['p99_ms']:.1f} ms per observation over "
                  f"{large_result['observations']} observations, one client")
            results["large"] = large_result
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        print("\n" + json.dumps(results))
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
