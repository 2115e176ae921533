"""BIG_REQUEST_BYTES: a worker serves one big request at a time. Another that arrives meanwhile
is answered 503 ``server-busy`` with Retry-After, nothing stored: before its body is received
when its ``Content-Length`` says it is big, and, for a gzip body whose compressed length is
small, as soon as what it inflates to crosses the size (never after inflating the whole)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from api_support import assert_problem
from live_server import LiveServer
from service.app import create_app

BIG = 4096
JSON = "application/json"


def per_hypothesis(n: int, tag: str = "c") -> dict:
    return {"tests": [{"id": "t0", "outcomes": ["0", "1"]}],
            "hypotheses": [{"id": f"h{i}", "class": f"{tag}{i % 7}", "outcomes": {"t0": str(i % 2)}}
                           for i in range(n)]}


def instance_of_bytes(size: int, tag: str = "c") -> dict:
    """A valid per-hypothesis instance whose JSON is at least ``size`` bytes."""
    n = 8
    while len(json.dumps(per_hypothesis(n)).encode()) < size:
        n *= 2
    return per_hypothesis(n, tag)


@pytest.fixture
def big_app(app_config):
    return create_app({**app_config, "big_request_bytes": BIG})


def test_a_big_request_is_refused_busy_while_the_worker_serves_another(big_app):
    client = big_app.test_client()
    slot = big_app.extensions["edgecut.big-request"]
    assert slot.take()  # as a request thread serving a big body holds it
    try:
        busy = client.post("/v1/instances", json=instance_of_bytes(BIG))
        problem = assert_problem(busy, 503, "server-busy")
        assert "BIG_REQUEST_BYTES" in problem["detail"] and busy.headers["Retry-After"] == "1"
        assert client.get("/v1/instances").get_json()["items"] == []  # nothing stored
        small = client.post("/v1/instances", json=per_hypothesis(2))  # below the size: served
        assert small.status_code == 201, small.get_json()
    finally:
        slot.give_back()
    assert client.post("/v1/instances", json=instance_of_bytes(BIG)).status_code == 201


def test_the_slot_is_given_back_however_a_big_request_ends(big_app):
    client = big_app.test_client()
    refused = client.post("/v1/instances", json={**instance_of_bytes(BIG), "tests": []})
    assert refused.status_code == 422
    for tag in ("a", "b"):
        created = client.post("/v1/instances", json=instance_of_bytes(BIG, tag))
        assert created.status_code == 201, created.get_json()
    assert not big_app.extensions["edgecut.big-request"].busy


# --- a live worker holding a big request ---------------------------------------------------------

LIVE_BIG = 64 * 1024
LIVE_MAX_BODY = 16 * 1024 * 1024


@pytest.fixture
def held_worker(tmp_path):
    """A live worker (one process, 4 threads) whose big-request slot is held by a first request
    (tests/hold_big_request.py holds it until a file exists): yields the server, then lets the
    first request go and checks it was served."""
    holding, release = tmp_path / "holding", tmp_path / "release"
    server = LiveServer({"REDIS_URL": "", "BIG_REQUEST_BYTES": str(LIVE_BIG), "MAX_BODY_BYTES": str(LIVE_MAX_BODY),
                         "EDGECUT_TEST_HOLDING": str(holding), "EDGECUT_TEST_RELEASE": str(release)},
                        workers=1, threads=4, config=str(Path(__file__).parent / "hold_big_request.py"))
    server.start()
    answers: list = []
    first = None
    try:
        held = instance_of_bytes(LIVE_BIG, "held")
        held["tests"][0]["id"] = "hold"
        for h in held["hypotheses"]:
            h["outcomes"] = {"hold": h["outcomes"]["t0"]}
        first = threading.Thread(target=lambda: answers.append(
            requests.post(server.url + "/v1/instances", json=held, timeout=120)))
        first.start()
        deadline = time.monotonic() + 60
        while not holding.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert holding.exists(), "the first request never held the slot"
        yield server
    finally:
        release.touch()
        if first is not None:
            first.join(timeout=120)
        stored = requests.get(server.url + "/v1/instances", timeout=10).json()["items"]
        server.stop()
    assert answers and answers[0].status_code == 201, answers
    assert len(stored) == 1, stored  # the held one; nothing of the refused requests


def answer_of(server: LiveServer, head: bytes, body: bytes = b"") -> tuple[bytes, bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def assert_busy(head: bytes, body: bytes) -> None:
    assert head.split(b" ")[1] == b"503" and b"retry-after: 1" in head.lower(), head + body[:400]
    assert json.loads(body)["type"] == "urn:edgecut:problem:server-busy" and b"BIG_REQUEST_BYTES" in body


def test_the_worker_refuses_a_big_request_before_its_body_while_it_serves_another(held_worker):
    """A second big request is answered 503 as soon as its head announces a big body: the body
    is never sent."""
    assert_busy(*answer_of(held_worker, b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                        b"Content-Length: 100000\r\n\r\n"))


@pytest.mark.parametrize("inflated", [
    json.dumps(instance_of_bytes(4 * LIVE_BIG, "gz")).encode(),  # a valid instance, big once inflated
    b" " * (LIVE_MAX_BODY + 1),  # past MAX_BODY_BYTES: refused busy before it is inflated that far
], ids=["instance", "past MAX_BODY_BYTES"])
def test_a_small_gzip_body_that_inflates_big_is_refused_busy_while_the_worker_serves_another(held_worker, inflated):
    body = gzip.compress(inflated, compresslevel=9)
    assert len(body) < LIVE_BIG  # small on the wire: the event loop lets it through
    head = (f"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    assert_busy(*answer_of(held_worker, head, body))
