"""Hostile load: 8 hostile clients at once while a stream of ordinary observations goes on.

    python3 bench/hostile.py                       # 30 s, every kind, the figures in docs/reliability.md
    python3 bench/hostile.py --kinds http          # only the HTTP-level kinds
    python3 bench/hostile.py --duration 10         # a quick look
    python3 bench/hostile.py --kinds http --worker-class gthread   # the same against plain gthread

gunicorn (2 workers × 8 threads, the production worker class) + a private redis-server on
loopback, API keys on. First a quiet phase (the ordinary stream alone), then the same stream
while ``--hostile`` (8) client threads each send one hostile request after another, round robin
over the kinds below, for ``--duration`` seconds. The ordinary stream: ``--users`` (4) triage
front ends, each posting the next observation of its session every ``--think-ms`` (20 ms),
starting a new session when one is done. Reported per phase: observations, errors (any status
but 200/201, or a transport error), p50/p99/max latency of the observations; per hostile kind:
how many were sent and the statuses they got. The hostile clients connect from 127.0.0.2 and the
key guesser from 127.0.0.3, so the per-address throttling of failed authentication touches
neither the ordinary clients on 127.0.0.1 nor the other hostile kinds (as different clients on
the internet would be).

Kinds (``--kinds http`` or ``engine`` or ``all``):

* http: a stalled upload (headers and ``Content-Length: 100000``, one byte, then silence until
  the server gives up), a slow drip (one body byte every 0.5 s), an 8 000-character request
  line, a malformed chunked body, a chunked body past MAX_BODY_BYTES, a ``Content-Length`` past
  it, a burst of 50 wrong API keys;
* engine: ``max_flips: 1000000``, noise on an instance with 256 outcome labels (n = 1000,
  N = 250), ``evaluate`` on a 1 000-hypothesis chain, the tree of a 1 000-hypothesis chain,
  priors whose sum overflows. These are refused by the engine's limits (docs/reliability.md,
  "Limits and quotas"); without them they hold a worker for seconds to minutes;
* heavy: the largest instance body of each form the default limits accept (bench/heavy_bodies.py:
  per-hypothesis, nested lists, compact base64, binary ``.npy``, likelihoods, noisy copies,
  decisions), posted by another tenant than the ordinary stream's.

``--heavy`` measures what each of those bodies costs a worker instead, alone: one worker, each
form at its largest accepted size and one row past it, ``--rounds`` (3) times each with new
content, one request at a time. Per request: the status, the worker's peak resident memory
(``VmHWM`` from /proc, reset before each request through ``clear_refs``), the CPU seconds
of the worker process (utime + stime from /proc/<pid>/stat; its answers to the probes below
included), the slowest of the ``GET /healthz`` sent to the same worker 5 ms apart meanwhile (how
long the body kept it from another request), and what the worker's isolated process
(service/api/isolation.py) held and spent: its highest ``VmHWM``, read every 2 ms, and its CPU
seconds, counted by its fork server once it has exited; medians over the rounds. Then the
worker's resident memory at boot and once idle after them all, and its fork server's and idle
isolated process's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import argparse
import http.client
import itertools
import json
import socket
import statistics
import tempfile
import threading
import time
import uuid

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from conftest import RedisServer  # noqa: E402  (the test suite's redis-server launcher)
from live_server import LiveServer  # noqa: E402

import heavy_bodies  # noqa: E402  (bench/, beside this file)
import numpy as np  # noqa: E402
from schemas.arrays import encode  # noqa: E402
from service.settings import Settings  # noqa: E402

KEY = "bench-key-0123456789abcdefghij"
OTHER_TENANT_KEY = "heavy-key-0123456789abcdefghij"  # the heavy bodies come from another tenant
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
HOSTILE_ADDRESS = "127.0.0.2"
KEY_GUESSER_ADDRESS = "127.0.0.3"  # throttled for its wrong keys; the other hostile kinds are not
N_TESTS = 30


def ladder(n_tests: int) -> dict:
    """One 'negative' hypothesis and one 'positive' per test: a session answering 0 to every
    test takes n_tests observations, a long stream of ordinary writes."""
    tests = [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)]
    hypotheses = [{"id": "none", "class": "negative", "outcomes": {f"t{j}": "0" for j in range(n_tests)}}]
    hypotheses += [{"id": f"h{i}", "class": "positive",
                    "outcomes": {f"t{j}": "1" if j == i else "0" for j in range(n_tests)}} for i in range(n_tests)]
    return {"tests": tests, "hypotheses": hypotheses}


def chain(n: int) -> dict:
    """n hypotheses in a chain: test j separates the first j+1 from the rest (depth n−1)."""
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n - 1)],
            "matrix": encode(np.array([[int(i > j) for j in range(n - 1)] for i in range(n)], dtype=np.uint8)),
            "classes": [f"c{i}" for i in range(n)]}


# --- hostile kinds: each a function (port) → a short description of the answer -------------------


def _connect(port: int, timeout: float = 60.0, address: str = HOSTILE_ADDRESS) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _status(sock: socket.socket) -> str:
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return "closed" if not data else data[:12].decode("latin-1")
            data += chunk
    except OSError as error:
        return type(error).__name__
    return data.split(b" ", 2)[1].decode("latin-1")


def _raw(port: int, payload: bytes, address: str = HOSTILE_ADDRESS) -> str:
    with _connect(port, address=address) as sock:
        try:
            sock.sendall(payload)
        except OSError:
            pass
        return _status(sock)


def stalled_upload(port: int) -> str:
    return _raw(port, b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n{")


def slow_drip(port: int) -> str:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n")
        try:
            for _ in range(200):
                sock.sendall(b" ")
                time.sleep(0.5)
        except OSError:
            pass
        return _status(sock)


def long_request_line(port: int) -> str:
    return _raw(port, f"GET /v1/sessions/{'s' * 8000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def malformed_chunk(port: int) -> str:
    return _raw(port, b"POST /v1/select HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n")


def chunked_too_large(port: int) -> str:
    with _connect(port) as sock:
        sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b"100000\r\n" + b" " * 0x100000 + b"\r\n"
        try:
            for _ in range(Settings().max_body_bytes // 0x100000 + 1):  # 1 MiB pieces past MAX_BODY_BYTES
                sock.sendall(piece)
        except OSError:
            pass
        return _status(sock)


def content_length_too_large(port: int) -> str:
    return _raw(port, b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 999999999\r\n\r\n{")


def wrong_keys(port: int) -> str:
    statuses = set()
    for i in range(50):
        statuses.add(_raw(port, f"GET /v1/sessions/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong-{i:024d}"
                                f"\r\nConnection: close\r\n\r\n".encode(), KEY_GUESSER_ADDRESS))
    return "+".join(sorted(statuses))


def _post_json(port: int, path: str, body: dict, timeout: float = 120.0) -> str:
    return _post(port, path, "application/json", json.dumps(body).encode(), timeout)


def _post(port: int, path: str, content_type: str, data: bytes, timeout: float = 120.0, key: str = KEY) -> str:
    with _connect(port, timeout) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")
        try:
            # Not joined: a joined copy of an 80 MB body would hold this process's GIL, under
            # which the ordinary users' threads time their requests, for tens of milliseconds.
            sock.sendall(head.encode())
            sock.sendall(data)
        except OSError:
            pass
        return _status(sock)


def _get(port: int, path: str, timeout: float = 120.0) -> str:
    return _raw(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Connection: close\r\n\r\n".encode())


def many_flips(port: int) -> str:
    inst = ladder(6)
    return _post_json(port, "/v1/instances", {**inst, "max_flips": 1_000_000})


def noisy_labels(port: int) -> str:
    n, n_tests, labels = 1000, 250, 256
    tests = [{"id": f"t{j}", "outcomes": [f"o{k}" for k in range(labels)]} for j in range(n_tests)]
    matrix = [[(i * 7 + j * 13) % labels for j in range(n_tests)] for i in range(n)]
    return _post_json(port, "/v1/instances", {"tests": tests, "matrix": matrix,
                                              "classes": [f"c{i % 10}" for i in range(n)], "noise": 0.1})


def evaluate_chain(port: int, instance_id: str) -> str:
    return _post_json(port, f"/v1/instances/{instance_id}/evaluate", {})


def tree_of_chain(port: int, instance_id: str) -> str:
    return _get(port, f"/v1/instances/{instance_id}/tree?depth=6")


def overflowing_priors(port: int) -> str:
    inst = ladder(2)
    return _post_json(port, "/v1/instances", {**inst, "hypotheses": [
        {**h, "prior": 1e308} for h in inst["hypotheses"]]})


HTTP_KINDS = {"stalled upload": stalled_upload, "slow drip": slow_drip, "8 000-character request line":
              long_request_line, "malformed chunk": malformed_chunk, "chunked past MAX_BODY_BYTES": chunked_too_large,
              "Content-Length past MAX_BODY_BYTES": content_length_too_large, "50 wrong API keys": wrong_keys}


def engine_kinds(chain_id: str) -> dict:
    return {"max_flips 1e6": many_flips, "noise with 256 labels": noisy_labels,
            "evaluate a 1000-chain": lambda port: evaluate_chain(port, chain_id),
            "tree of a 1000-chain": lambda port: tree_of_chain(port, chain_id),
            "priors summing past 1e308": overflowing_priors}


def heavy_kinds() -> dict:
    """The largest accepted body of each form, built once, posted again and again."""
    kinds = {}
    for name, build, args, rows, _ in heavy_bodies.forms(Settings()):
        content_type, body = build(rows, *args, "h" * heavy_bodies.TAG_LENGTH)
        kinds[f"heavy: {name}"] = (lambda port, c=content_type, b=body:
                                   _post(port, "/v1/instances", c, b, timeout=300, key=OTHER_TENANT_KEY))
    return kinds


# --- the ordinary stream ------------------------------------------------------------------------


class Stream:
    """``users`` threads, each walking sessions of the ladder instance one observation at a time."""

    def __init__(self, port: int, instance_id: str, users: int, think_ms: float):
        self.port, self.instance_id, self.users, self.think = port, instance_id, users, think_ms / 1000
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run_user(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            try:
                conn.request("POST", "/v1/sessions", json.dumps({"instance_id": self.instance_id}), AUTH)
                response = conn.getresponse()
                state = json.loads(response.read())
                if response.status != 201:
                    raise RuntimeError(f"create {response.status}")
                while not state["done"] and not self.stop.is_set():
                    time.sleep(self.think)
                    body = json.dumps({"test": state["next_test"]["id"], "outcome": "0"})
                    started = time.perf_counter()
                    conn.request("POST", f"/v1/sessions/{state['session_id']}/observations", body, AUTH)
                    response = conn.getresponse()
                    payload = response.read()
                    elapsed = time.perf_counter() - started
                    with self.lock:
                        self.latencies.append(elapsed)
                    if response.status != 200:
                        raise RuntimeError(f"observe {response.status}")
                    state = json.loads(payload)
            except Exception as error:  # noqa: BLE001 — every failure is counted, the user goes on
                with self.lock:
                    self.errors.append(f"{type(error).__name__}: {error}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def measure(self, seconds: float) -> dict:
        threads = [threading.Thread(target=self.run_user, daemon=True) for _ in range(self.users)]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        self.stop.set()
        for thread in threads:
            thread.join(timeout=40)
        ms = sorted(1000 * t for t in self.latencies)
        return {"observations": len(ms), "errors": len(self.errors), "error_kinds": sorted(set(self.errors))[:5],
                "p50_ms": round(statistics.median(ms), 1) if ms else None,
                "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 1) if ms else None,
                "max_ms": round(ms[-1], 1) if ms else None}


def hostile_clients(port: int, kinds: dict, clients: int, stop: threading.Event) -> dict:
    sent: dict[str, dict[str, int]] = {name: {} for name in kinds}
    lock = threading.Lock()
    order = itertools.cycle(list(kinds))

    def client() -> None:
        while not stop.is_set():
            with lock:
                name = next(order)
            try:
                answer = kinds[name](port)
            except Exception as error:  # noqa: BLE001
                answer = type(error).__name__
            with lock:
                sent[name][answer] = sent[name].get(answer, 0) + 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    return {"threads": threads, "sent": sent}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of each phase (default 30)")
    parser.add_argument("--kinds", choices=["http", "engine", "heavy", "all"], default="all")
    parser.add_argument("--heavy", action="store_true",
                        help="measure each heavy body's peak memory and CPU alone instead (one worker)")
    parser.add_argument("--rounds", type=int, default=3, help="--heavy: requests per body (default 3)")
    parser.add_argument("--hostile", type=int, default=8, help="hostile clients at once (default 8)")
    parser.add_argument("--users", type=int, default=4, help="ordinary users (default 4)")
    parser.add_argument("--think-ms", type=float, default=20.0, help="pause between observations (default 20)")
    parser.add_argument("--worker-class", default="service.worker.BufferingWorker",
                        help="gunicorn worker class (gthread: as before requests were buffered)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.heavy:
        figures = heavy_bodies.measure(args.rounds, {"API_KEYS": f"bench:{KEY}"},
                                       lambda port, content_type, body: _post(port, "/v1/instances", content_type,
                                                                              body, timeout=300))
        return heavy_bodies.report(figures, args.json)

    redis_server = RedisServer(Path(tempfile.mkdtemp(prefix="edgecut-hostile-")))
    redis_server.start()
    server = LiveServer({"REDIS_URL": redis_server.url, "KEY_PREFIX": f"hostile-{uuid.uuid4().hex[:8]}",
                         "API_KEYS": f"bench:{KEY},heavy:{OTHER_TENANT_KEY}", "REQUEST_READ_TIMEOUT": "10"},
                        workers=2, threads=8,
                        worker_class=args.worker_class)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        ids = {}
        for name, inst in (("ladder", ladder(N_TESTS)), ("chain", chain(1000))):
            conn.request("POST", "/v1/instances", json.dumps(inst), AUTH)
            response = conn.getresponse()
            ids[name] = json.loads(response.read())["instance_id"]
        kinds = {}
        if args.kinds in ("http", "all"):
            kinds.update(HTTP_KINDS)
        if args.kinds in ("engine", "all"):
            kinds.update(engine_kinds(ids["chain"]))
        if args.kinds in ("heavy", "all"):
            kinds.update(heavy_kinds())

        quiet = Stream(server.port, ids["ladder"], args.users, args.think_ms).measure(args.duration)
        stop = threading.Event()
        hostile = hostile_clients(server.port, kinds, args.hostile, stop)
        time.sleep(1.0)  # let the hostile requests get going
        loaded = Stream(server.port, ids["ladder"], args.users, args.think_ms).measure(args.duration)
        stop.set()
        figures = {"quiet": quiet, "under_attack": loaded, "hostile_answers": hostile["sent"],
                   "kinds": args.kinds, "hostile_clients": args.hostile, "users": args.users,
                   "think_ms": args.think_ms, "duration_s": args.duration, "worker_class": args.worker_class}
    finally:
        server.stop()
        redis_server.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    ok = loaded["p99_ms"] is not None and loaded["p99_ms"] <= 250 and loaded["errors"] == 0
    print(f"edgecut bench: under {args.hostile} hostile clients ({args.kinds}) the observation p99 is "
          f"{loaded['p99_ms']} ms (quiet: {quiet['p99_ms']} ms), {loaded['errors']} errors: "
          f"{'within' if ok else 'OVER'} the 250 ms goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
