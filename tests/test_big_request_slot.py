"""BIG_REQUEST_BYTES: a worker serves one big request at a time. Another that arrives meanwhile
is answered 503 ``server-busy`` with Retry-After, nothing stored: before its body is received
when its ``Content-Length`` says it is big; for a gzip body whose compressed length is small, as
soon as what it inflates to crosses the size (never after inflating the whole); and for a JSON
body of few bytes that will hold that much once parsed, before it is parsed."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np

import orjson
import pytest
import requests

from api_support import assert_problem
from live_server import LiveServer
from service.api import bodies
from schemas.arrays import encode
from service.api.limits import ARRAY_BYTES, HELD_PER_BODY_BYTE, MEMBER_BYTES, OBJECT_BYTES, VALUE_BYTES
from service.app import create_app

BIG = 16 * 1024
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


def estimated(document: dict) -> int:
    """What MAX_PARSE_BYTES's estimate counts for ``document``, from its parsed structure (the
    weights of service/api/limits.py): a value per item, a member per key, an array or object
    per container."""
    values = members = arrays = objects = 0
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list)):
            values += max(len(item) - 1, 0)
            if isinstance(item, dict):
                objects, members = objects + 1, members + len(item)
                stack.extend(item.values())
            else:
                arrays += 1
                stack.extend(item)
    return VALUE_BYTES * (values + 1) + MEMBER_BYTES * members + ARRAY_BYTES * arrays + OBJECT_BYTES * objects


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
        assert estimated(per_hypothesis(2)) < BIG
        small = client.post("/v1/instances", json=per_hypothesis(2))  # below the size: served
        assert small.status_code == 201, small.get_json()
    finally:
        slot.give_back()
    assert client.post("/v1/instances", json=instance_of_bytes(BIG)).status_code == 201


def test_a_json_body_of_few_bytes_that_will_hold_much_once_parsed_is_a_big_request(big_app, monkeypatch):
    few_bytes = per_hypothesis(60)
    assert len(json.dumps(few_bytes)) < BIG <= estimated(few_bytes)
    parsed = []
    monkeypatch.setattr(bodies, "orjson", type("Counting", (), {
        "loads": staticmethod(lambda raw: parsed.append(raw) or orjson.loads(raw)),
        "JSONDecodeError": orjson.JSONDecodeError}))
    client = big_app.test_client()
    slot = big_app.extensions["edgecut.big-request"]
    assert slot.take()
    try:
        busy = client.post("/v1/instances", data=json.dumps(few_bytes), content_type=JSON)
        assert "BIG_REQUEST_BYTES" in assert_problem(busy, 503, "server-busy")["detail"]
        assert busy.headers["Retry-After"] == "1" and not parsed  # refused before it was parsed
    finally:
        slot.give_back()
    created = client.post("/v1/instances", data=json.dumps(few_bytes), content_type=JSON)
    assert created.status_code == 201, created.get_json()


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


@pytest.fixture(scope="module")
def held_worker(tmp_path_factory):
    """A live worker (one process, 4 threads) whose big-request slot is held by a first request
    (tests/hold_big_request.py holds it until a file exists) while the module's tests send it
    theirs: yields the server, then lets the first request go and checks it was served and that
    none of the refused requests stored anything."""
    files = tmp_path_factory.mktemp("held")
    holding, release = files / "holding", files / "release"
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


# --- a big request and the worker's instance cache: room made before it is parsed ----------------


def compact_instance(n: int, tag: str) -> dict:
    """n rows × 10 tests in the compact form, in 7 classes (hypothesis ids made by the service)."""
    matrix = (np.arange(n)[:, None] >> np.arange(10) & 1).astype(np.uint8)
    return {"tests": [{"id": f"{tag}{j}", "outcomes": ["0", "1"]} for j in range(10)], "matrix": encode(matrix),
            "classes": [f"c{i % 7}" for i in range(n)]}


def test_a_big_request_first_makes_room_in_the_instance_cache_for_what_it_will_hold(redis_server, monkeypatch):
    """With the cache full, a big request's instance is compiled only once the cache holds at
    most INSTANCE_CACHE_BYTES − HELD_PER_BODY_BYTE × its body: what the two hold together is
    bounded by the cache's budget, not added to it. Counted by the cache's own accounting."""
    from service import engine

    budget, big = 2_000_000, 64 * 1024
    app = create_app({"redis_url": redis_server.url, "key_prefix": f"room-{uuid.uuid4().hex[:8]}",
                      "instance_cache_bytes": budget, "big_request_bytes": big})
    client, cache = app.test_client(), app.extensions["edgecut"].store.cache
    for i in range(40):  # small requests fill the cache: each under BIG_REQUEST_BYTES
        body = json.dumps(compact_instance(1000, f"s{i}t"))
        assert len(body) < big and estimated(json.loads(body)) < big
        assert client.post("/v1/instances", data=body, content_type=JSON).status_code == 201
    assert cache.nbytes > budget - 100_000, cache.nbytes  # full, within one small instance

    cached_at_compile = []
    compile_instance = engine.compile_instance
    monkeypatch.setattr(engine, "compile_instance",
                        lambda instance, **kw: cached_at_compile.append(cache.nbytes) or compile_instance(instance, **kw))
    body = json.dumps(compact_instance(4000, "big"))
    assert big <= len(body) and HELD_PER_BODY_BYTE * len(body) < budget  # room for it leaves some cached
    created = client.post("/v1/instances", data=body, content_type=JSON)
    assert created.status_code == 201, created.get_json()
    assert cached_at_compile and cached_at_compile[0] + HELD_PER_BODY_BYTE * len(body) <= budget, cached_at_compile
    assert cached_at_compile[0] > 0  # only as much as it needs was given up
