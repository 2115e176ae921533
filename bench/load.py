"""Load run: gunicorn + a private redis-server on loopback, 64 concurrent sessions for 60 s.

    python3 bench/load.py                      # the paced run in docs/reliability.md
    python3 bench/load.py --think-ms 0         # closed loop, no pause: the saturation point
    python3 bench/load.py --duration 10        # a quick look
    python3 bench/load.py --cluster --nodes 2  # two server processes on a local Redis Cluster

With ``--nodes N`` there are N gunicorn processes (standing for N hosts behind a load balancer)
sharing nothing but Redis; each user sends its requests to the nodes in turn, as a round-robin
balancer would, so every session is served by every node. ``--cluster`` replaces the single
redis-server with a local Redis Cluster of 3 masters and 3 replicas (tests/conftest.py's
launcher; no persistence) and sets ``REDIS_CLUSTER=true``.

Each virtual user plays a triage front end: create a session (with an Idempotency-Key) on a
small instance (n = 200 hypotheses, N = 50 tests, 10 classes), answer each ``next_test`` with the
outcome of a hidden true hypothesis until the session is done, delete it, start again. With
``--think-ms`` > 0 each user pauses that long between requests (a person answering); 0 is a
closed loop that measures what the two cores can do. Clients run in ``--procs`` processes of
threads with keep-alive connections, so the client's own GIL is not the bottleneck.

Everything stays on 127.0.0.1, bounded in time (``--duration``) and users (``--sessions``).
Reported: requests and errors (any status other than the expected 200/201/204, or a transport
error), throughput, p50/p90/p99/max latency by request kind, and Redis memory per session:
``INFO memory`` before and after ``--memory-sessions`` extra sessions with 5 observations each,
and ``MEMORY USAGE`` of sampled session keys.
"""

from __future__ import annotations

import sys
from pathlib import Path

import argparse
import http.client
import json
import multiprocessing
import random
import statistics
import tempfile
import time
import uuid

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from conftest import RedisClusterServers, RedisServer  # noqa: E402  (the test suite's launchers)
from live_server import LiveServer  # noqa: E402

N_HYPOTHESES, N_TESTS, N_CLASSES = 200, 50, 10


def small_instance(seed: int = 7) -> dict:
    """Columnar, binary outcomes, random answers: every pair of hypotheses is told apart by
    some test with overwhelming probability, so sessions end 'determined' after a few steps."""
    rng = np.random.default_rng(seed)
    matrix = rng.integers(0, 2, size=(N_HYPOTHESES, N_TESTS))
    return {
        "tests": [{"id": f"q{j}", "cost": float(rng.uniform(0.5, 2.0)), "outcomes": ["no", "yes"]}
                  for j in range(N_TESTS)],
        "matrix": matrix.tolist(),
        "classes": [f"c{i % N_CLASSES}" for i in range(N_HYPOTHESES)],
        "priors": rng.dirichlet(np.ones(N_HYPOTHESES)).round(8).tolist(),
    }


class Client:
    """One keep-alive HTTP/1.1 connection; reconnects after a transport error."""

    def __init__(self, port: int):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        payload = None if body is None else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})} if payload else dict(headers or {})
        try:
            self.conn.request(method, path, body=payload, headers=all_headers)
            response = self.conn.getresponse()
            data = response.read()
            return response.status, data
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            return None, b""


def user(ports: list[int], instance_id: str, matrix: list[list[int]], deadline: float, think: float, seed: int,
         out: list) -> None:
    """One virtual user; appends (kind, status, seconds) per request to ``out``. Its requests go
    to the nodes (``ports``) in turn, one keep-alive connection each."""
    rng = random.Random(seed)
    clients = [Client(port) for port in ports]
    sent = [seed]
    expected = {"create": 201, "observe": 200, "delete": 204}

    def timed(kind: str, method: str, path: str, body=None, headers=None):
        client = clients[sent[0] % len(clients)]
        sent[0] += 1
        started = time.perf_counter()
        status, data = client.call(method, path, body, headers)
        out.append((kind, status, time.perf_counter() - started, status == expected[kind]))
        if think:
            time.sleep(think * rng.uniform(0.5, 1.5))
        return status, data

    # Users arrive spread over one think time, not as one burst of simultaneous creates.
    time.sleep(rng.uniform(0, think))
    while time.monotonic() < deadline:
        truth = rng.randrange(N_HYPOTHESES)
        status, data = timed("create", "POST", "/v1/sessions", {"instance_id": instance_id},
                             {"Idempotency-Key": uuid.uuid4().hex})
        if status != 201:
            continue
        state = json.loads(data)
        sid = state["session_id"]
        while not state["done"] and time.monotonic() < deadline:
            test = state["next_test"]["id"]
            outcome = state["next_test"]["outcomes"][matrix[truth][int(test[1:])]]
            status, data = timed("observe", "POST", f"/v1/sessions/{sid}/observations",
                                 {"test": test, "outcome": outcome})
            if status != 200:
                break
            state = json.loads(data)
        timed("delete", "DELETE", f"/v1/sessions/{sid}")


def client_process(ports, instance_id, matrix, deadline, think, users, first_seed, queue) -> None:
    import threading

    results: list = []
    threads = [threading.Thread(target=user, args=(ports, instance_id, matrix, deadline, think, first_seed + i,
                                                   results)) for i in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put(results)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def measure_memory(port: int, redis_url: str, key_prefix: str, instance_id: str, matrix, count: int,
                   cluster: bool = False) -> dict:
    """Redis bytes per session: the growth of ``used_memory`` summed over the masters, and
    ``MEMORY USAGE`` of sampled keys (found on every master of a cluster)."""
    import redis

    if cluster:
        probe = redis.RedisCluster.from_url(redis_url)
        masters = [redis.Redis(host=node.host, port=node.port) for node in probe.get_primaries()]
        probe.close()
    else:
        masters = [redis.Redis.from_url(redis_url)]

    def used_memory() -> int:
        return sum(int(m.info("memory")["used_memory"]) for m in masters)

    def keys(pattern: str, limit: int) -> list[tuple]:
        return [(m, k) for m in masters for k in m.scan_iter(match=pattern, count=1000)][:limit]

    client = Client(port)
    for m in masters:
        m.execute_command("MEMORY", "PURGE")
    before = used_memory()
    rng = random.Random(1)
    for _ in range(count):
        status, data = client.call("POST", "/v1/sessions", {"instance_id": instance_id})
        state = json.loads(data)
        truth = rng.randrange(N_HYPOTHESES)
        for _ in range(5):
            if state["done"]:
                break
            test = state["next_test"]["id"]
            outcome = state["next_test"]["outcomes"][matrix[truth][int(test[1:])]]
            status, data = client.call("POST", f"/v1/sessions/{state['session_id']}/observations",
                                       {"test": test, "outcome": outcome})
            state = json.loads(data)
    after = used_memory()
    usage = [int(m.memory_usage(k, samples=0)) for m, k in keys(f"{key_prefix}:{{s:*", 200)]
    instance_keys = keys(f"{key_prefix}:{{i:*", 1)
    result = {"sessions_added": count, "used_memory_delta_per_session_bytes": (after - before) / count,
              "memory_usage_per_session_key_bytes": statistics.mean(usage) if usage else None,
              "instance_bytes": int(instance_keys[0][0].memory_usage(instance_keys[0][1], samples=0))
              if instance_keys else None,
              "used_memory_bytes": after}
    for m in masters:
        m.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions (default 64)")
    parser.add_argument("--think-ms", type=float, default=100.0,
                        help="mean pause between a user's requests, ms (default 100; 0 = closed loop)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2: one per core)")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (default 8)")
    parser.add_argument("--procs", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--memory-sessions", type=int, default=1000, help="sessions for the memory figure")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--nodes", type=int, default=1, help="server processes sharing Redis (default 1)")
    parser.add_argument("--cluster", action="store_true", help="a local Redis Cluster (3 masters + 3 replicas)")
    args = parser.parse_args(argv)
    if not (1 <= args.sessions <= 512 and 0 < args.duration <= 600 and 1 <= args.nodes <= 8):
        parser.error("bounded runs only: 1..512 sessions, at most 600 s, 1..8 nodes")

    workdir = Path(tempfile.mkdtemp(prefix="edgecut-load-"))
    if args.cluster:
        redis_server = RedisClusterServers(workdir / "cluster")
    else:
        redis_server = RedisServer(workdir, "--appendonly", "yes", "--appendfsync", "everysec")  # as docker-compose
    redis_server.start()
    key_prefix = "load"
    env = {"REDIS_URL": redis_server.url, "KEY_PREFIX": key_prefix, "LOG_LEVEL": "WARNING",
           "REDIS_CLUSTER": "true" if args.cluster else "false"}
    servers = [LiveServer(env, workers=args.workers, threads=args.threads, log=workdir / f"gunicorn-{i}.log")
               for i in range(args.nodes)]
    try:
        for server in servers:
            server.start()
        ports = [server.port for server in servers]
        instance = small_instance()
        setup = Client(ports[0])
        status, data = setup.call("POST", "/v1/instances", instance)
        assert status in (200, 201), data
        instance_id = json.loads(data)["instance_id"]
        # Warm every worker's instance cache and step cache a little before timing.
        for port in ports:
            for _ in range(4 * args.workers):
                Client(port).call("POST", "/v1/sessions", {"instance_id": instance_id})

        think = args.think_ms / 1000
        deadline = time.monotonic() + args.duration
        queue: multiprocessing.Queue = multiprocessing.Queue()
        per_proc = [args.sessions // args.procs + (1 if i < args.sessions % args.procs else 0)
                    for i in range(args.procs)]
        started = time.perf_counter()
        procs = [multiprocessing.Process(target=client_process, args=(
            ports, instance_id, instance["matrix"], deadline, think, n, 1000 * i, queue))
            for i, n in enumerate(per_proc)]
        for proc in procs:
            proc.start()
        results = [row for _ in procs for row in queue.get()]
        for proc in procs:
            proc.join()
        elapsed = time.perf_counter() - started

        ok = [seconds for _, _, seconds, good in results if good]
        errors = [(kind, status) for kind, status, _, good in results if not good]
        figures = {
            "duration_s": round(elapsed, 1), "sessions": args.sessions, "think_ms": args.think_ms,
            "nodes": args.nodes, "redis": "cluster (3 masters + 3 replicas)" if args.cluster else "one node (AOF)",
            "workers": args.workers, "threads": args.threads, "requests": len(results), "errors": len(errors),
            "error_rate": len(errors) / max(1, len(results)),
            "throughput_rps": len(results) / elapsed,
            "sessions_completed": sum(1 for kind, _, _, good in results if kind == "delete" and good),
            "p50_ms": percentile(ok, 50), "p90_ms": percentile(ok, 90), "p99_ms": percentile(ok, 99),
            "max_ms": max(ok) * 1000 if ok else float("nan"),
            "by_kind": {kind: {"count": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)}
                        for kind in ("create", "observe", "delete")
                        for v in [[s for k, _, s, good in results if k == kind and good]]},
            "error_samples": errors[:10],
        }
        figures["redis_memory"] = measure_memory(ports[0], redis_server.url, key_prefix, instance_id,
                                                 instance["matrix"], args.memory_sessions, cluster=args.cluster)
    finally:
        for server in servers:
            server.stop()
        redis_server.stop()

    print(f"load: {figures['sessions']} sessions, think {figures['think_ms']:.0f} ms, {figures['duration_s']} s, "
          f"{figures['nodes']} node(s) of gunicorn {figures['workers']}×{figures['threads']} gthread, "
          f"Redis: {figures['redis']}")
    print(f"  requests {figures['requests']}, errors {figures['errors']} ({figures['error_rate']:.2%}), "
          f"throughput {figures['throughput_rps']:.0f} req/s, sessions completed {figures['sessions_completed']}")
    print(f"  latency p50 {figures['p50_ms']:.1f} ms, p90 {figures['p90_ms']:.1f} ms, "
          f"p99 {figures['p99_ms']:.1f} ms, max {figures['max_ms']:.1f} ms")
    for kind, row in figures["by_kind"].items():
        print(f"    {kind:8s} {row['count']:7d}  p50 {row['p50_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms")
    memory = figures["redis_memory"]
    print(f"  redis: {memory['used_memory_delta_per_session_bytes']:.0f} B per session (INFO used_memory delta "
          f"over {memory['sessions_added']} sessions of 5 observations), MEMORY USAGE of a session key "
          f"{memory['memory_usage_per_session_key_bytes']:.0f} B; the instance {memory['instance_bytes']} B, once")
    if figures["error_samples"]:
        print(f"  first errors: {figures['error_samples']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if figures["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
