"""The heaviest instance bodies each form can carry, for bench/hostile.py (``--kinds heavy``, and
``--heavy``, whose measurement is :func:`measure` here).

Each builder takes a size (hypotheses, or rows) and returns ``(content_type, body bytes)``;
:func:`forms` names each form with the size of its largest body under the settings' limits.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from procfs import children, children_cpu_seconds  # bench/, beside this file

BOUNDARY = "edgecut-heavy-boundary"


def _tests(n_tests: int, labels: int = 2) -> list[dict]:
    return [{"id": f"t{j}", "outcomes": [str(k) for k in range(labels)]} for j in range(n_tests)]


def _json(document: dict) -> tuple[str, bytes]:
    return "application/json", json.dumps(document, separators=(",", ":")).encode()


def per_hypothesis(n: int, n_tests: int = 1, tag: str = "c") -> tuple[str, bytes]:
    """n hypotheses, each its own object, one outcome per test."""
    outcomes = ",".join(f'"t{j}":"{j % 2}"' for j in range(n_tests))
    head = json.dumps({"tests": _tests(n_tests)}, separators=(",", ":"))[:-1]
    rows = ",".join(f'{{"id":"h{i}","class":"{tag}{i % 100}","outcomes":{{{outcomes}}}}}' for i in range(n))
    return "application/json", f'{head},"hypotheses":[{rows}]}}'.encode()


def _matrix(n: int, n_tests: int) -> np.ndarray:
    rows = np.arange(n, dtype=np.int64)[:, None]
    return ((rows >> (np.arange(n_tests) % 20)) & 1).astype(np.uint8)


def _columnar(n: int, n_tests: int, tag: str = "c", **arrays) -> dict:
    return {"tests": _tests(n_tests), "classes": [f"{tag}{i % 100}" for i in range(n)], **arrays}


def matrix_lists(n: int, n_tests: int = 100, tag: str = "c") -> tuple[str, bytes]:
    """n × N outcome indices as nested lists: 2 bytes a cell."""
    row = "[" + ",".join("0" * n_tests) + "]"
    head = json.dumps(_columnar(n, n_tests, tag), separators=(",", ":"))[:-1]
    rows = ",".join(f"[{','.join('01'[(i >> (j % 20)) & 1] for j in range(n_tests))}]" if i < 64 else row
                    for i in range(n))
    return "application/json", f'{head},"matrix":[{rows}]}}'.encode()


def _encoded(array: np.ndarray) -> dict:
    return {"encoding": "base64", "dtype": {np.dtype("u1"): "uint8", np.dtype("<f8"): "float64"}[array.dtype],
            "shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def matrix_compact(n: int, n_tests: int = 1000, tag: str = "c") -> tuple[str, bytes]:
    """n × N uint8 in the compact base64 form: 4/3 bytes a cell."""
    return _json(_columnar(n, n_tests, tag, matrix=_encoded(_matrix(n, n_tests))))


def _multipart(document: dict, name: str, array: np.ndarray) -> tuple[str, bytes]:
    npy = io.BytesIO()
    np.save(npy, array)
    body = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"instance\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + json.dumps(document).encode()
    body += (f"\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.npy\"\r\n"
             f"Content-Type: application/octet-stream\r\n\r\n").encode() + npy.getvalue()
    return f"multipart/form-data; boundary={BOUNDARY}", body + f"\r\n--{BOUNDARY}--\r\n".encode()


def matrix_npy(n: int, n_tests: int = 1000, tag: str = "c") -> tuple[str, bytes]:
    """n × N uint8 as the binary body's .npy part: 1 byte a cell."""
    return _multipart(_columnar(n, n_tests, tag), "matrix", _matrix(n, n_tests))


def _likelihoods(n: int, n_tests: int) -> np.ndarray:
    p = np.where(_matrix(n, n_tests) == 1, 0.75, 0.25)
    return np.stack([1 - p, p], axis=2)


def likelihood_lists(n: int, n_tests: int = 100, tag: str = "c") -> tuple[str, bytes]:
    """n × N × 2 likelihoods as nested lists (`[0.25,0.75]`: 6 bytes a number)."""
    cell = ("[0.25,0.75]", "[0.75,0.25]")
    head = json.dumps(_columnar(n, n_tests, tag), separators=(",", ":"))[:-1]
    rows = ",".join("[" + ",".join(cell[(i >> (j % 20)) & 1] for j in range(n_tests)) + "]" if i < 64
                    else "[" + ",".join([cell[0]] * n_tests) + "]" for i in range(n))
    return "application/json", f'{head},"likelihood_matrix":[{rows}]}}'.encode()


def likelihood_compact(n: int, n_tests: int = 100, tag: str = "c") -> tuple[str, bytes]:
    """n × N × 2 float64 likelihoods, compact: 32/3 bytes a number."""
    return _json(_columnar(n, n_tests, tag, likelihood_matrix=_encoded(_likelihoods(n, n_tests))))


def likelihood_npy(n: int, n_tests: int = 100, tag: str = "c") -> tuple[str, bytes]:
    """n × N × 2 float64 likelihoods as a .npy part: 8 bytes a number."""
    return _multipart(_columnar(n, n_tests, tag), "likelihood_matrix", _likelihoods(n, n_tests))


def noisy(n: int, n_tests: int = 20, tag: str = "c", max_flips: int = 1) -> tuple[str, bytes]:
    """n hypotheses each expanded into its 1 + N noisy copies (max_flips 1), compact."""
    return _json({**_columnar(n, n_tests, tag, matrix=_encoded(_matrix(n, n_tests))), "noise": 0.05,
                  "max_flips": max_flips})


def decisions(n: int, n_decisions: int = 32, tag: str = "d") -> tuple[str, bytes]:
    """n hypotheses of a decision instance, ``acceptable_matrix`` n × D as nested lists."""
    n_tests = 20
    rows = ",".join("[" + ",".join("1" if d == i % n_decisions else "0" for d in range(n_decisions)) + "]"
                    for i in range(min(n, n_decisions)))
    plain = "[" + ",".join(["1"] + ["0"] * (n_decisions - 1)) + "]"
    rows += "," + ",".join([plain] * (n - min(n, n_decisions))) if n > n_decisions else ""
    head = json.dumps({"tests": _tests(n_tests), "matrix": _encoded(_matrix(n, n_tests)),
                       "decisions": [f"{tag}{d}" for d in range(n_decisions)]}, separators=(",", ":"))[:-1]
    return "application/json", f'{head},"acceptable_matrix":[{rows}]}}'.encode()


def per_hypothesis_likelihoods(n: int, n_tests: int = 1, tag: str = "c") -> tuple[str, bytes]:
    """n hypotheses, each its own object with a likelihood row per test."""
    rows = ",".join(f'"t{j}":{{"0":0.25,"1":0.75}}' for j in range(n_tests))
    head = json.dumps({"tests": _tests(n_tests)}, separators=(",", ":"))[:-1]
    body = ",".join(f'{{"id":"h{i}","class":"{tag}{i % 100}","likelihoods":{{{rows}}}}}' for i in range(n))
    return "application/json", f'{head},"hypotheses":[{body}]}}'.encode()


def largest(builder, limit: int, *args) -> int:
    """The most hypotheses (rows) ``builder`` can put in a JSON body whose estimated parse cost
    (service/api/limits.py) is within ``limit``: the cost counts punctuation only, so it is affine
    in the rows and two small bodies give it exactly."""
    from service.api.limits import parse_cost

    small, big = (parse_cost(builder(n, *args)[1])[0] for n in (100, 200))
    return 100 + (limit - small) // ((big - small) // 100)


def largest_body(builder, limit: int, *args) -> int:
    """The most rows whose body ``builder`` keeps within ``limit`` bytes (MAX_BODY_BYTES)."""
    small, big = (len(builder(n, *args)[1]) for n in (1000, 2000))
    n = 1000 + (limit - small) * 1000 // (big - small)
    while len(builder(n, *args)[1]) > limit:
        n -= max(1, n // 2000)
    return n


# Class labels of this length (the tag, then a number): a new tag makes new content of one size.
TAG_LENGTH = 6


def _within_parse_cost(row: tuple, cost: int) -> tuple:
    """A compact or binary form bound by another limit, unless the labels it carries as JSON
    (one class per row) reach MAX_PARSE_BYTES first."""
    name, builder, args, rows, binding = row
    parsed = largest(builder, cost, *args)
    return (name, builder, args, parsed, "MAX_PARSE_BYTES") if parsed < rows else row


def forms(settings) -> list[tuple[str, object, tuple, int, str]]:
    """Each form at its largest under ``settings``: (name, builder, its extra arguments, rows,
    the limit that binds it). One row more is past that limit. Built with a tag of TAG_LENGTH."""
    cost, body = settings.max_parse_bytes, settings.max_body_bytes
    rows_limit, cells = settings.max_hypotheses, settings.max_cells
    table = [
        ("per-hypothesis, 1 test", per_hypothesis, (1,), largest(per_hypothesis, cost, 1), "MAX_PARSE_BYTES"),
        ("per-hypothesis, 200 tests", per_hypothesis, (200,), largest(per_hypothesis, cost, 200), "MAX_PARSE_BYTES"),
        ("per-hypothesis likelihoods, 2 tests", per_hypothesis_likelihoods, (2,),
         largest(per_hypothesis_likelihoods, cost, 2), "MAX_PARSE_BYTES"),
        ("nested matrix, 100 tests", matrix_lists, (100,), largest(matrix_lists, cost, 100), "MAX_PARSE_BYTES"),
        ("nested matrix, 1000 tests", matrix_lists, (1000,), largest(matrix_lists, cost, 1000), "MAX_PARSE_BYTES"),
        ("nested likelihood_matrix, 100 tests x 2", likelihood_lists, (100,), largest(likelihood_lists, cost, 100),
         "MAX_PARSE_BYTES"),
        ("nested acceptable_matrix, 32 decisions", decisions, (32,), largest(decisions, cost, 32), "MAX_PARSE_BYTES"),
        ("compact uint8 matrix, 1000 tests", matrix_compact, (1000,), cells // 1000, "MAX_CELLS"),
        ("binary uint8 matrix, 1000 tests", matrix_npy, (1000,), cells // 1000, "MAX_CELLS"),
        ("compact uint8 matrix, 1 test", matrix_compact, (1,), rows_limit, "MAX_HYPOTHESES"),
        ("compact float64 likelihood_matrix, 100 tests x 2", likelihood_compact, (100,),
         largest_body(likelihood_compact, body, 100, "t" * TAG_LENGTH), "MAX_BODY_BYTES"),
        ("binary float64 likelihood_matrix, 100 tests x 2", likelihood_npy, (100,),
         largest_body(likelihood_npy, body, 100, "t" * TAG_LENGTH), "MAX_BODY_BYTES"),
        ("noisy copies (max_flips 1, 20 tests: 21 rows each)", noisy, (20,), rows_limit // 21, "MAX_HYPOTHESES"),
    ]
    return table[:7] + [_within_parse_cost(row, cost) for row in table[7:]]


# --- bench/hostile.py --heavy: one worker, one heavy request at a time ------------------------------


def _proc_status(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmHWM:", "VmRSS:")):
                fields[line.split(":")[0]] = int(line.split()[1]) * 1024
    return fields


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def fork_server_of(worker: int) -> int | None:
    """The worker's fork server, whose children are its isolated processes (service/api/isolation.py)."""
    for child in children(worker):
        try:
            if b"multiprocessing.forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:
            pass
    return None


class IsolatedPeak:
    """The highest VmHWM of the fork server's children (the isolated processes) while a request
    runs, read every 2 ms: a process's VmHWM only grows, so only what it adds after its last
    reading, just before it exits, can be missed."""

    def __init__(self, fork_server: int | None):
        self.fork_server, self.peak = fork_server, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set() and self.fork_server is not None:
            for child in children(self.fork_server):
                try:
                    self.peak = max(self.peak, _proc_status(child).get("VmHWM", 0))
                except OSError:
                    pass
            time.sleep(0.002)

    def __enter__(self) -> IsolatedPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


class Meanwhile:
    """GET /healthz again and again (5 ms apart, one kept-alive connection) while a heavy request
    runs in the same worker: the slowest answer is how long the heavy request kept the worker
    from another request (its longest hold of the GIL, and the waits for it)."""

    def __init__(self, port: int):
        self.port = port
        self.slowest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stop.is_set():
            started = time.perf_counter()
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            self.slowest = max(self.slowest, time.perf_counter() - started)
            time.sleep(0.005)
        conn.close()

    def __enter__(self) -> Meanwhile:
        self.thread.start()
        time.sleep(0.05)  # under way before the heavy request is sent
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def measure(rounds: int, env: dict[str, str], post) -> dict:
    """Each form's largest accepted body and one row more, alone on one worker (8 threads) with a
    private redis-server; ``post(port, content_type, body)`` sends one and gives its status."""
    from conftest import RedisServer  # the test suite's launchers (tests/ is on bench/hostile.py's path)
    from live_server import LiveServer

    from service.settings import Settings
    from service.worker import IDLE_CHECK_INTERVAL

    settings = Settings()
    redis_server = RedisServer(Path(tempfile.mkdtemp(prefix="edgecut-heavy-")))
    redis_server.start()
    server = LiveServer({"REDIS_URL": redis_server.url, "KEY_PREFIX": f"heavy-{uuid.uuid4().hex[:8]}", **env},
                        workers=1, threads=8)
    server.start()
    rows_out = []
    try:
        pid = server.worker_pids()[0]
        boot = _proc_status(pid)["VmRSS"]
        for name, build, args, rows, binding in forms(settings):
            for size, label in ((rows, "largest accepted"), (rows + 1, f"one row past {binding}")):
                peaks, cpus, stalls, statuses, length = [], [], [], set(), 0
                isolated_peaks, isolated_cpus = [], []
                for attempt in range(rounds):
                    tag = f"r{attempt}{uuid.uuid4().hex}"[:TAG_LENGTH]
                    content_type, body = build(size, *args, tag)
                    length = len(body)
                    with open(f"/proc/{pid}/clear_refs", "w") as clear:
                        clear.write("5")  # resets VmHWM to the current resident size
                    fork_server = fork_server_of(pid)
                    before = _cpu_seconds(pid)
                    isolated_before = children_cpu_seconds(fork_server) if fork_server else 0.0
                    with Meanwhile(server.port) as meanwhile, IsolatedPeak(fork_server) as isolated:
                        statuses.add(post(server.port, content_type, body))
                    cpus.append(_cpu_seconds(pid) - before)
                    stalls.append(meanwhile.slowest)
                    peaks.append(_proc_status(pid)["VmHWM"])
                    isolated_peaks.append(isolated.peak)
                    time.sleep(0.2)  # the isolated process exits after its answer: reaped by then
                    isolated_cpus.append(children_cpu_seconds(fork_server) - isolated_before if fork_server else 0.0)
                    del body
                row = {"form": name, "rows": size, "body": label, "body_mib": round(length / 2**20, 1),
                       "statuses": sorted(statuses), "peak_rss_mb": round(statistics.median(peaks) / 1e6),
                       "max_peak_rss_mb": round(max(peaks) / 1e6), "cpu_s": round(statistics.median(cpus), 2),
                       "max_cpu_s": round(max(cpus), 2), "healthz_slowest_ms": round(1000 * statistics.median(stalls)),
                       "max_healthz_slowest_ms": round(1000 * max(stalls)),
                       "isolated_peak_rss_mb": round(statistics.median(isolated_peaks) / 1e6),
                       "max_isolated_peak_rss_mb": round(max(isolated_peaks) / 1e6),
                       "isolated_cpu_s": round(statistics.median(isolated_cpus), 2),
                       "max_isolated_cpu_s": round(max(isolated_cpus), 2)}
                rows_out.append(row)
                print(json.dumps(row), flush=True)
        time.sleep(IDLE_CHECK_INTERVAL + 0.2)  # the idle check runs when a request ends, once per interval
        ending = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        ending.request("GET", "/healthz")  # a request that ends, so the idle check runs
        ending.getresponse().read()
        ending.close()
        time.sleep(0.5)
        idle = _proc_status(pid)["VmRSS"]
        fork_server = fork_server_of(pid)
        beside = [fork_server, *children(fork_server)] if fork_server else []
        isolated_idle = sum(_proc_status(process)["VmRSS"] for process in beside)
    finally:
        server.stop()
        redis_server.stop()
    return {"boot_rss_mb": round(boot / 1e6), "idle_rss_mb_after": round(idle / 1e6),
            "isolated_idle_rss_mb": round(isolated_idle / 1e6), "rounds": rounds, "requests": rows_out}


def report(figures: dict, json_path: Path | None) -> int:
    if json_path:
        json_path.write_text(json.dumps(figures, indent=2))
    worst_peak = max(row["max_peak_rss_mb"] for row in figures["requests"])
    worst_cpu = max(row["max_cpu_s"] for row in figures["requests"])
    worst_stall = max(row["max_healthz_slowest_ms"] for row in figures["requests"])
    worst_isolated = max(row["max_isolated_peak_rss_mb"] for row in figures["requests"])
    worst_isolated_cpu = max(row["max_isolated_cpu_s"] for row in figures["requests"])
    # The worker's and its isolated process's peaks added: an upper bound of what they held at once.
    # The worker's CPU counts its answers to the 5 ms probes too (Meanwhile), so each is held to 5 s.
    over = [row["form"] for row in figures["requests"]
            if row["max_peak_rss_mb"] + row["max_isolated_peak_rss_mb"] >= 1000
            or row["max_cpu_s"] >= 5 or row["max_isolated_cpu_s"] >= 5]
    print(f"edgecut bench: heaviest request peaked at {worst_peak} MB resident and {worst_cpu} s of CPU in the "
          f"worker, {worst_isolated} MB and {worst_isolated_cpu} s in its isolated process "
          f"(goal: below 1000 MB together, 5 s each{'; OVER: ' + ', '.join(over) if over else ''}); worker "
          f"{figures['boot_rss_mb']} MB at boot, {figures['idle_rss_mb_after']} MB idle after (its fork server and "
          f"idle isolated process {figures['isolated_idle_rss_mb']} MB); another request "
          f"meanwhile waited at most {worst_stall} ms")
    return 0
