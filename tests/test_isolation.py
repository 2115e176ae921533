"""A big request's instance is parsed, validated, compiled and encoded by its worker's isolated
process (service/api/isolation.py). Every body is posted to an app that parses it itself (the
reference: the code path every small body takes) and to one with an isolated process: the
answers must be the same, refusals included (status, type, detail, each error's path), and
what is stored must be the same instance. Then what makes the process isolated: another process,
a fresh one per request, a lower CPU priority, gone with its worker."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from api_support import TRIAGE
from live_server import child_pids
from schemas.arrays import encode
from service import engine
from service.api import isolation
from service.app import create_app
from service.store import codec

BIG = 4096
LIMITS = {"big_request_bytes": BIG, "max_cells": 400_000, "max_hypotheses": 20_000, "max_parse_bytes": 4_000_000}
BOUNDARY = "isolation-test-boundary"


def per_hypothesis(n: int, n_tests: int = 3, tag: str = "c") -> dict:
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)],
            "hypotheses": [{"id": f"h{i}", "class": f"{tag}{i % 5}",
                            "outcomes": {f"t{j}": str((i >> j) & 1) for j in range(n_tests)}} for i in range(n)]}


def columnar(n: int, n_tests: int = 20, tag: str = "c") -> tuple[dict, np.ndarray]:
    matrix = (np.arange(n)[:, None] >> np.arange(n_tests) % 16 & 1).astype(np.uint8)
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)],
            "classes": [f"{tag}{i % 5}" for i in range(n)]}, matrix


def multipart(document: bytes, name: str, array: np.ndarray | bytes) -> tuple[str, bytes]:
    npy = io.BytesIO()
    if isinstance(array, np.ndarray):
        np.save(npy, array)
    else:
        npy.write(array)
    body = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"instance\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + document
    body += (f"\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.npy\"\r\n"
             f"Content-Type: application/octet-stream\r\n\r\n").encode() + npy.getvalue()
    return f"multipart/form-data; boundary={BOUNDARY}", body + f"\r\n--{BOUNDARY}--\r\n".encode()


def as_json(document: dict) -> tuple[str, bytes]:
    return "application/json", json.dumps(document).encode()


def nested(depth: int, pad: int) -> bytes:
    return b'{"tests": ' + b"[" * depth + b"]" * depth + b', "classes": ["' + b"x" * pad + b'"]}'


_BIG_DOCUMENT, _BIG_MATRIX = columnar(300)
_TOO_MANY_CELLS, _ = columnar(20_001)
_DUPLICATE = json.dumps(per_hypothesis(200)).replace('"tests": [', '"hypotheses": [], "tests": [', 1).encode()

# (path, content type, body): each big (at least BIG bytes, or estimated to hold that once parsed).
REFUSED = {
    "malformed JSON": ("/v1/instances", "application/json", b'{"tests": [' + b" " * BIG),
    "a repeated key": ("/v1/instances", "application/json", _DUPLICATE),
    "too deep": ("/v1/instances", "application/json", nested(600, BIG)),
    "no tests": ("/v1/instances", *as_json({**per_hypothesis(200), "tests": []})),
    "an unknown test in a hypothesis": ("/v1/instances", *as_json(
        {**per_hypothesis(200), "tests": [{"id": "t0", "outcomes": ["0", "1"]}]})),
    "past MAX_PARSE_BYTES": ("/v1/instances", *as_json(per_hypothesis(3000))),
    "past MAX_HYPOTHESES with noisy copies": ("/v1/instances", *as_json(
        {**_BIG_DOCUMENT, "matrix": encode(_BIG_MATRIX), "noise": 0.1, "max_flips": 2})),
    "past MAX_CELLS, compiled": ("/v1/instances", *as_json(
        {**_TOO_MANY_CELLS, "matrix": encode(columnar(20_001)[1])})),
    "an instance part that is no object": ("/v1/instances", *multipart(b"[1, 2]", "matrix", _BIG_MATRIX)),
    "a matrix given twice": ("/v1/instances", *multipart(
        json.dumps({**_BIG_DOCUMENT, "matrix": [[0] * 20] * 300}).encode(), "matrix", _BIG_MATRIX)),
    "a broken .npy part": ("/v1/instances", *multipart(json.dumps(_BIG_DOCUMENT).encode(), "matrix", b"\x93NUMPY" + b"x" * BIG)),
    "a session with an unknown policy": ("/v1/sessions", *as_json({"instance": per_hypothesis(200), "policy": "nope"})),
    "a session with both instance and instance_id": ("/v1/sessions", *as_json(
        {"instance": per_hypothesis(200), "instance_id": "0" * 64})),
    "a session on an instance past MAX_CELLS": ("/v1/sessions", *as_json(
        {"instance": {**_TOO_MANY_CELLS, "matrix": encode(columnar(20_001)[1])}, "policy": "ec2"})),
    "a session excluding an unknown test": ("/v1/sessions", *as_json(
        {"instance": per_hypothesis(200), "exclude_tests": ["nope"]})),
    "a select with an unknown outcome": ("/v1/select", *as_json(
        {"instance": per_hypothesis(200), "observations": [{"test": "t0", "outcome": "7"}]})),
}

ACCEPTED = {
    "per-hypothesis": ("/v1/instances", *as_json(per_hypothesis(200))),
    "compact": ("/v1/instances", *as_json({**_BIG_DOCUMENT, "matrix": encode(_BIG_MATRIX)})),
    "binary .npy": ("/v1/instances", *multipart(json.dumps(_BIG_DOCUMENT).encode(), "matrix", _BIG_MATRIX)),
    "noisy copies": ("/v1/instances", *as_json({**per_hypothesis(200, tag="n"), "noise": 0.05, "max_flips": 1})),
    "likelihoods": ("/v1/instances", *as_json({**_BIG_DOCUMENT, "likelihood_matrix": encode(
        np.stack([0.2 + 0.6 * _BIG_MATRIX, 0.8 - 0.6 * _BIG_MATRIX], axis=2).astype(np.float64))})),
    "a session": ("/v1/sessions", *as_json({"instance": per_hypothesis(200), "policy": "ec2", "max_tests": 3})),
    "a select": ("/v1/select", *as_json({"instance": per_hypothesis(200), "observations": [
        {"test": "t0", "outcome": "1"}]})),
}


@pytest.fixture
def apps(app_config):
    """(an app that parses every body itself, one with an isolated process), separate stores."""
    inline = create_app({**app_config, **LIMITS})
    isolated_app = create_app({**app_config, **LIMITS, "key_prefix": app_config["key_prefix"] + "-isolated"})
    process = isolation.install(isolated_app)
    yield inline, isolated_app
    process.shutdown()


def answer(app, path: str, content_type: str, body: bytes) -> tuple[int, dict]:
    response = app.test_client().post(path, data=body, content_type=content_type)
    document = response.get_json(force=True)
    for varying in ("request_id", "session_id", "expires_at"):
        document.pop(varying, None)
    return response.status_code, document


def test_the_bodies_are_big():
    for path, content_type, body in (*REFUSED.values(), *ACCEPTED.values()):
        assert len(body) >= BIG or path != "/v1/instances" or b"hypotheses" in body, path


@pytest.mark.parametrize("name", REFUSED)
def test_a_big_body_is_refused_as_the_worker_refuses_it(apps, name):
    inline, isolated_app = apps
    reference = answer(inline, *REFUSED[name])
    assert 400 <= reference[0] < 500, reference
    assert answer(isolated_app, *REFUSED[name]) == reference
    assert isolated_app.test_client().get("/v1/instances").get_json()["items"] == []  # nothing stored


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_big_body_is_accepted_as_the_worker_accepts_it(apps, name):
    inline, isolated_app = apps
    reference = answer(inline, *ACCEPTED[name])
    assert reference[0] in (200, 201), reference
    assert answer(isolated_app, *ACCEPTED[name]) == reference
    if name == "a select":  # stores nothing
        return
    if name == "a session":  # its inline instance is stored beside it
        listed = [[item["instance_id"] for item in app.test_client().get("/v1/instances").get_json()["items"]]
                  for app in apps]
        assert len(listed[0]) == 1 and listed[1] == listed[0]
        instance_id = listed[0][0]
    else:
        instance_id = reference[1]["instance_id"]
    stored = [app.extensions["edgecut"].store.get_instance(instance_id) for app in apps]
    assert codec.encode(stored[0]) == codec.encode(stored[1])  # the same instance, byte for byte
    if name != "a session":
        assert answer(isolated_app, *ACCEPTED[name])[0] == 200  # known content: not stored again


def test_a_big_instance_is_compiled_outside_the_worker_and_runs_in_it(apps, monkeypatch):
    inline, isolated_app = apps
    compiled_here = []
    compile_instance = engine.compile_instance
    monkeypatch.setattr(engine, "compile_instance",
                        lambda instance, **kw: compiled_here.append(1) or compile_instance(instance, **kw))
    status, summary = answer(isolated_app, *ACCEPTED["per-hypothesis"])
    assert status == 201 and compiled_here == []
    client = isolated_app.test_client()
    session = client.post("/v1/sessions", json={"instance_id": summary["instance_id"], "policy": "ec2"})
    assert session.status_code == 201, session.get_json()
    assert answer(inline, *ACCEPTED["per-hypothesis"])[0] == 201 and compiled_here == [1]


def test_a_small_body_is_parsed_by_the_worker(app_config, monkeypatch):
    app = create_app(app_config)  # BIG_REQUEST_BYTES at its default: the triage instance is small
    process = isolation.install(app)
    monkeypatch.setattr(isolation, "parse_and_compile", lambda job: pytest.fail("sent to the isolated process"))
    try:
        assert app.test_client().post("/v1/instances", json=TRIAGE).status_code == 201
    finally:
        process.shutdown()


# --- the process ---------------------------------------------------------------------------------


@pytest.fixture
def process():
    isolated = isolation.IsolatedProcess()
    yield isolated
    isolated.shutdown()


def test_each_request_gets_a_fresh_process_of_lower_priority(process):
    first, second = process.run(os.getpid), process.run(os.getpid)
    assert len({first, second, os.getpid()}) == 3
    assert process.run(os.nice, 0) == min(os.nice(0) + isolation.ISOLATED_NICE, 19)


def resident_mib(status: str) -> float:
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024


@pytest.mark.parametrize("store_kind", ["memory"])
def test_the_isolated_process_keeps_the_workers_heap_reserve(app_config):
    """Written as the process starts (before its request), so a big request there does not pay
    for fresh pages; 0 keeps malloc's defaults, as in the worker."""
    sizes = {}
    for reserve in (0, 96 * 1024 * 1024):
        process = isolation.install(create_app({**app_config, "worker_heap_reserve_bytes": reserve}))
        try:
            sizes[reserve] = resident_mib(process.run(Path("/proc/self/status").read_text))
        finally:
            process.shutdown()
    assert sizes[96 * 1024 * 1024] - sizes[0] >= 90, sizes


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        new = child_pids(todo.pop())
        found |= new
        todo.extend(new)
    return found


def killed_worker(script: str, while_running: Callable[[str, int], None] = lambda line, pid: None
                  ) -> tuple[str, set[int]]:
    """Run ``script`` as a worker; once it has printed a line and its fork server has forked a
    process, call ``while_running(line, its pid)`` and SIGKILL it: (the line, every process the
    worker had started)."""
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    try:
        line = worker.stdout.readline().strip()
        deadline = time.monotonic() + 20
        while not (left := descendants(worker.pid)) - child_pids(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left - child_pids(worker.pid), left  # a process forked by the fork server
        while_running(line, worker.pid)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    return line, left


def test_the_isolated_process_and_its_server_exit_when_their_worker_is_killed():
    """A worker killed (its timeout, out of memory) never shuts its process down: it must not
    wait for a next job forever, keeping its fork server alive with it."""
    line, left = killed_worker(textwrap.dedent("""
        import time
        from service.api.isolation import IsolatedProcess
        process = IsolatedProcess()  # held, as a worker holds its own: a pool no one holds starts no next process
        process.warm()
        print("ready", flush=True)
        time.sleep(600)
    """))
    assert line == "ready"  # and a process waiting for a job
    assert not still_running(left)


def test_a_killed_workers_job_files_are_removed_by_its_isolated_process():
    """A worker killed in the middle of a big request never leaves its job directory's `with`."""
    def in_place(directory: str, pid: int) -> None:
        assert Path(directory).is_dir() and str(pid) in Path(directory).name

    directory, left = killed_worker(textwrap.dedent("""
        import threading, time
        from service.api.isolation import IsolatedProcess, job_directory
        process = IsolatedProcess()
        def job():
            with job_directory() as directory:
                print(directory, flush=True)
                process.run(time.sleep, 600)
        threading.Thread(target=job, daemon=True).start()
        time.sleep(600)
    """), in_place)
    assert not still_running(left)  # the process running the job
    assert not Path(directory).exists()


def still_running(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running after up to 20 s, killed so as not to be left behind."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
        time.sleep(0.1)
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_only_an_edgecut_app_is_given_an_isolated_process(app_config):
    from flask import Flask

    # The project's worker also serves apps that are not edgecut's (the benches' floor).
    assert isolation.install(Flask("floor")) is None
    app = create_app({**app_config, "worker_heap_reserve_bytes": 0})
    isolated = isolation.install(app)
    assert isinstance(isolated, isolation.IsolatedProcess) and isolation.install(app) is isolated
