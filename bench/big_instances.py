"""Posting big instances: ``python3 -m bench.big_instances [--rounds 5] [--hypotheses 10000] [--tests 1000]
[--list-hypotheses 400]``.

Starts a fresh ``redis-server`` and the service under gunicorn (the project's configuration,
service/gunicorn_conf.py, with 1 gthread worker of 4 threads) on loopback,
then, round after round (each round a new random binary instance, so every POST is a 201):

* **compact**: ``POST /v1/instances`` with ``matrix`` in the compact base64 form (uint8), against
  the bare cost of what any service must do with those bytes: base64-decode them, sha256 them,
  and one Redis ``SET`` of the decoded bytes (measured in the same round, same machine);
* **binary**: the same size of instance as the binary body (multipart/form-data: the JSON, and
  ``matrix`` as a ``.npy`` part, as edgecut.client sends a numpy array), against the same bare
  cost as the compact form's, and against its own bare cost: reading the ``.npy`` bytes as an
  array, sha256 and one ``SET``;
* **lists**: ``matrix`` as nested JSON lists, against the bare ``orjson.loads`` + ``np.asarray``
  of that body; ``--list-hypotheses`` (400) rows, not ``--hypotheses``: 10⁴ × 10³ nested lists
  are past ``MAX_PARSE_BYTES`` (413; JSON lists are not the transport for the biggest instances,
  the compact and binary forms above are), 400 × 10³ is within it;
* **first step, cold vs warm**: a fresh gunicorn worker's first ``POST /v1/sessions`` on a stored
  instance (download from Redis, verify its hash, decode, one EC² step) against the same worker's
  next session on it (a different ``max_tests``, far above what a run needs: the step is the same
  computation but not the same cache key, so it is computed again, not served from the cache).

Prints medians and the ratios the goals are stated in (the best form, binary, ≤ 1.5× the bare
decode + hash + SET; cold ≤ 2× warm; the compact and lists forms against their own bare costs), each as the median of the rounds' own ratios and as the ratio of the medians. 100 classes; all times wall-clock seconds on a loaded, shared machine.
"""

from __future__ import annotations

import argparse
import binascii
import hashlib
import http.client
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import redis
from urllib3 import encode_multipart_formdata

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import RedisServer  # noqa: E402  (the test suite's launchers)
from live_server import LiveServer  # noqa: E402

from schemas.arrays import encode  # noqa: E402

# The service as `edgecut serve` runs it (BLAS threads, garbage collector, metrics), one worker.
CONFIG = "python:service.gunicorn_conf"


def instance(rng: np.random.Generator, n: int, n_tests: int, compact: bool) -> tuple[dict, np.ndarray]:
    matrix = rng.integers(0, 2, size=(n, n_tests), dtype=np.uint8)
    payload = {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)],
               "classes": [f"c{i % 100}" for i in range(n)],
               "matrix": encode(matrix) if compact else matrix.tolist()}
    return payload, matrix


def binary_body(payload: dict, matrix: np.ndarray) -> tuple[bytes, str]:
    """The binary body edgecut.client sends for a numpy matrix."""
    npy = io.BytesIO()
    np.save(npy, matrix, allow_pickle=False)
    document = {name: value for name, value in payload.items() if name != "matrix"}
    return encode_multipart_formdata({"instance": ("instance.json", orjson.dumps(document), "application/json"),
                                      "matrix": ("matrix.npy", npy.getvalue(), "application/octet-stream")})


def post(port: int, path: str, body: bytes, content_type: str = "application/json") -> tuple[float, int, dict]:
    """One request on a connection opened beforehand (building a body can outlast keep-alive)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.connect()
    started = time.perf_counter()
    conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    response = conn.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed, response.status, orjson.loads(data)


def bare_compact(payload: dict, client: redis.Redis, key: str) -> float:
    started = time.perf_counter()
    raw = binascii.a2b_base64(payload["matrix"]["data"])  # the cheapest decode: no validation
    hashlib.sha256(raw).hexdigest()
    client.set(key, raw)
    return time.perf_counter() - started


def bare_binary(body: bytes, client: redis.Redis, key: str) -> float:
    """What any service must do with a .npy body: view its bytes as the array, hash, store."""
    started = time.perf_counter()
    npy = body[body.index(b"\x93NUMPY"):]
    stream = io.BytesIO(npy)
    np.lib.format.read_magic(stream)
    shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    raw = np.frombuffer(npy, dtype=dtype, count=int(np.prod(shape)), offset=stream.tell())
    hashlib.sha256(raw).hexdigest()
    client.set(key, raw.tobytes())
    return time.perf_counter() - started


def bare_lists(body: bytes) -> float:
    started = time.perf_counter()
    np.asarray(orjson.loads(body)["matrix"])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hypotheses", type=int, default=10_000)
    parser.add_argument("--tests", type=int, default=1_000)
    parser.add_argument("--list-hypotheses", type=int, default=400,
                        help="rows of the nested-lists instance (within MAX_PARSE_BYTES)")
    args = parser.parse_args()
    rng = np.random.default_rng(2010)

    workdir = Path(tempfile.mkdtemp(prefix="edgecut-bench-big-"))
    redis_server = RedisServer(workdir)
    redis_server.start()
    env = {"REDIS_URL": redis_server.url, "KEY_PREFIX": "bench-big", "LOG_LEVEL": "WARNING"}
    server = LiveServer(env, workers=1, threads=4, log=workdir / "gunicorn.log", config=CONFIG)
    server.start()
    direct = redis.Redis.from_url(redis_server.url)
    times: dict[str, list[float]] = {name: [] for name in ("compact", "bare compact", "binary", "bare binary",
                                                           "lists", "bare lists", "cold first step",
                                                           "warm first step")}
    stored: list[str] = []
    try:
        for round_no in range(args.rounds):
            payload, _ = instance(rng, args.hypotheses, args.tests, compact=True)
            body = orjson.dumps(payload)
            elapsed, status, answer = post(server.port, "/v1/instances", body)
            assert status == 201, (status, answer)
            stored.append(answer["instance_id"])
            times["compact"].append(elapsed)
            times["bare compact"].append(bare_compact(payload, direct, f"bench-big:bare:{round_no}"))

            payload, matrix = instance(rng, args.hypotheses, args.tests, compact=False)
            body, content_type = binary_body(payload, matrix)
            elapsed, status, answer = post(server.port, "/v1/instances", body, content_type)
            assert status == 201, (status, answer)
            times["binary"].append(elapsed)
            times["bare binary"].append(bare_binary(body, direct, f"bench-big:bare-binary:{round_no}"))

            payload, _ = instance(rng, args.list_hypotheses, args.tests, compact=False)
            body = orjson.dumps(payload)
            elapsed, status, answer = post(server.port, "/v1/instances", body)
            assert status == 201, (status, answer)
            times["lists"].append(elapsed)
            times["bare lists"].append(bare_lists(body))
            print(f"round {round_no + 1}: compact {times['compact'][-1]:.3f} s (bare {times['bare compact'][-1]:.3f}),"
                  f" binary {times['binary'][-1]:.3f} s (bare {times['bare binary'][-1]:.3f}),"
                  f" lists {times['lists'][-1]:.3f} s (bare {times['bare lists'][-1]:.3f})", flush=True)
        server.stop()

        for round_no in range(args.rounds):
            fresh = LiveServer(env, workers=1, threads=4, log=workdir / "gunicorn.log", config=CONFIG)
            fresh.start()
            try:
                request = {"instance_id": stored[round_no % len(stored)]}
                # Steps are cached per (instance, policy, stop rules, observations), whatever the seed.
                for name, max_tests in (("cold first step", 100_000 + round_no), ("warm first step", 200_000 + round_no)):
                    elapsed, status, answer = post(fresh.port, "/v1/sessions",
                                                   orjson.dumps({**request, "max_tests": max_tests}))
                    assert status == 201, (status, answer)
                    times[name].append(elapsed)
            finally:
                fresh.stop()
            print(f"round {round_no + 1}: cold {times['cold first step'][-1]:.3f} s, "
                  f"warm {times['warm first step'][-1]:.3f} s", flush=True)
    finally:
        direct.close()
        server.stop()
        redis_server.stop()

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n{args.hypotheses} × {args.tests} binary ({args.list_hypotheses} × {args.tests} as lists), "
          f"medians of {args.rounds} rounds (seconds):")
    for name, value in median.items():
        print(f"  {name:<17} {value:.3f}")
    # Each round's ratio pairs two measurements taken seconds apart: on a loaded machine their
    # median is steadier than the ratio of the two medians (both are printed).
    for name, over, under, goal in (("binary / bare", "binary", "bare compact", 1.5),
                                    ("binary / own bare", "binary", "bare binary", None),
                                    ("compact / bare", "compact", "bare compact", None),
                                    ("lists / bare", "lists", "bare lists", None),
                                    ("cold / warm", "cold first step", "warm first step", 2.0)):
        paired = statistics.median(a / b for a, b in zip(times[over], times[under]))
        print(f"  {name:<17} {paired:.2f}× median of rounds, {median[over] / median[under]:.2f}× of medians"
              + (f"  (goal ≤ {goal}×)" if goal else ""))


if __name__ == "__main__":
    main()
