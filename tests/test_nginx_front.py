"""The production front (docker-compose.yml): Debian's nginx, configured by
deploy/nginx.conf.template, buffering every request before a live gunicorn (the project's
configuration) over a real Redis sees it. Slow and stalled uploads, bodies at and past
MAX_BODY_BYTES, nginx's own refusals in problem+json, the service's passed through unchanged,
and the template's limits held to the service's settings."""

from __future__ import annotations

import gzip
import re
import socket
import time
import uuid
from pathlib import Path

import orjson
import pytest
import requests
import yaml

from api_support import TRIAGE
from live_server import LiveServer
from nginx_front import NGINX, TEMPLATE, NginxFront, template_variables
from service.api.problems import PROBLEMS
from service.settings import Settings
from test_hostile_http import (HOSTILE, _ordinary_round, assert_raw_problem, raw_exchange, read_response,
                               replay_catalogue)

pytestmark = [pytest.mark.redis,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs Debian's)")]

REPO = Path(__file__).resolve().parent.parent
PROBLEM = "application/problem+json"
MAX_BODY = 2 * 1024 * 1024  # above nginx's in-memory body buffer (1 MiB): big bodies go through its temp files
READ_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def front(redis_server):
    service = LiveServer({"REDIS_URL": redis_server.url, "KEY_PREFIX": f"front-{uuid.uuid4().hex[:8]}",
                          "MAX_BODY_BYTES": str(MAX_BODY), "REQUEST_READ_TIMEOUT": str(READ_TIMEOUT)},
                         workers=2, threads=4, config="python:service.gunicorn_conf")
    service.start()
    nginx = NginxFront(service.port, MAX_BODY, READ_TIMEOUT)
    try:
        nginx.start()
        yield nginx, service
    finally:
        nginx.stop()
        service.stop()


def _post_instance(url: str, body: bytes, **headers: str) -> requests.Response:
    return requests.post(url + "/v1/instances", data=body, timeout=10,
                         headers={"Content-Type": "application/json", **headers})


def _padded(size: int) -> bytes:
    """TRIAGE as JSON of exactly ``size`` bytes (whitespace after it)."""
    body = orjson.dumps(TRIAGE)
    return body + b" " * (size - len(body))


def test_requests_and_the_services_own_answers_pass_through(front):
    nginx, service = front
    assert _ordinary_round(nginx.url) < 2.0
    for url in (nginx.url, service.url):
        missing = requests.get(url + "/v1/sessions/no-such-session", timeout=5)
        assert missing.status_code == 404 and missing.headers["Content-Type"] == PROBLEM
        assert missing.json()["type"] == "urn:edgecut:problem:session-not-found"
        assert "request_id" in missing.json()  # the service's body, not one of nginx's


def test_a_body_of_exactly_max_body_bytes_is_served_and_one_byte_more_is_413(front):
    nginx, _ = front
    assert _post_instance(nginx.url, _padded(MAX_BODY)).status_code in (200, 201)
    refused = _post_instance(nginx.url, _padded(MAX_BODY + 1))
    assert refused.status_code == 413 and refused.headers["Content-Type"] == PROBLEM
    assert refused.json() == {"type": "urn:edgecut:problem:body-too-large", "title": "Request body too large",
                              "status": 413,
                              "detail": f"the body exceeds the limit of {MAX_BODY} bytes (MAX_BODY_BYTES)"}


def test_a_chunked_body_past_max_body_bytes_is_413(front):
    nginx, _ = front
    chunk = b" " * 0x40000
    raw = (b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + (b"40000\r\n" + chunk + b"\r\n") * 9 + b"0\r\n\r\n")
    assert_raw_problem(raw_exchange(nginx.port, raw), 413, "body-too-large")


def test_the_services_own_413_passes_through(front):
    nginx, _ = front
    # Small on the wire, past MAX_BODY_BYTES once inflated: only the service can tell.
    bomb = gzip.compress(_padded(MAX_BODY + 1024))
    refused = _post_instance(nginx.url, bomb, **{"Content-Encoding": "gzip"})
    assert refused.status_code == 413 and refused.headers["Content-Type"] == PROBLEM
    assert refused.json()["type"] == "urn:edgecut:problem:body-too-large" and "request_id" in refused.json()


def test_a_slow_upload_arrives_whole(front):
    nginx, _ = front
    body = _padded(200_000)
    with socket.create_connection(("127.0.0.1", nginx.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for start in range(0, len(body), 50_000):  # 4 pieces, each well within client_body_timeout
            sock.sendall(body[start:start + 50_000])
            time.sleep(READ_TIMEOUT / 8)
        status, _, answer = read_response(sock)
    assert status in (200, 201), answer


def test_stalled_uploads_hold_no_thread_and_are_closed_at_the_read_timeout(front):
    nginx, _ = front
    stalled = []
    try:
        for _ in range(64):  # 8 × the 2 workers × 4 threads behind nginx
            sock = socket.create_connection(("127.0.0.1", nginx.port), timeout=10)
            sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 60000\r\n\r\n{\"tests\": [")
            stalled.append(sock)
        started = time.monotonic()
        assert _ordinary_round(nginx.url) < 1.0
        # nginx closes a client silent for client_body_timeout, without an answer.
        for sock in stalled:
            sock.settimeout(READ_TIMEOUT + 3)
            assert sock.recv(1) == b""
        assert time.monotonic() - started < READ_TIMEOUT + 3
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_refusals_through_nginx_are_problems(front, name):
    """The hostile requests gunicorn refuses (tests/test_hostile_http.py), sent to nginx: each is
    refused in problem+json, by nginx or by the service behind it."""
    nginx, _ = front
    raw, _, _ = HOSTILE[name]
    status, headers, body = raw_exchange(nginx.port, raw)
    assert headers["content-type"] == PROBLEM, (status, headers, body[:300])
    problem = orjson.loads(body)
    code = problem["type"].removeprefix("urn:edgecut:problem:")
    assert PROBLEMS[code][0] == status == problem["status"], problem
    assert 400 <= status < 500 or code == "unsupported-transfer-coding", problem


def test_the_bad_input_catalogue_through_nginx(redis_server):
    """tests/test_bad_input.py's catalogue through nginx in front of gunicorn, both with the
    catalogue's limits: every entry the same problem as without nginx, nothing stored."""
    from test_bad_input import LIMITS

    config = {"REDIS_URL": redis_server.url, "KEY_PREFIX": f"front-catalogue-{uuid.uuid4().hex[:8]}",
              **{name.upper(): str(value) for name, value in LIMITS.items()}}
    service = LiveServer(config, workers=1, threads=4, config="python:service.gunicorn_conf")
    service.start()
    nginx = NginxFront(service.port, LIMITS["max_body_bytes"], READ_TIMEOUT)
    try:
        nginx.start()
        assert not replay_catalogue(nginx.url, {key.lower(): value for key, value in config.items()})
    finally:
        nginx.stop()
        service.stop()


# --- the configuration itself -------------------------------------------------------------------


def test_nginx_answers_carry_the_services_problem_types():
    answers = re.findall(r"return (\d{3}) '(.*)';", TEMPLATE.read_text())
    assert len(answers) >= 6
    for status, text in answers:
        problem = orjson.loads(text.replace("\\'", "'").replace("${MAX_BODY_BYTES}", "1"))
        code = problem["type"].removeprefix("urn:edgecut:problem:")
        assert PROBLEMS[code][:2] == (int(status), problem["title"]) and problem["status"] == int(status), problem


def test_compose_gives_nginx_the_services_limits():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    given = {**compose["nginx"]["environment"]}
    service_env = compose["edgecut"]["environment"]
    assert template_variables() <= set(given), template_variables() - set(given)
    # A limit the service is given in compose is nginx's too; one it is not given is its default.
    for name, kind in (("MAX_BODY_BYTES", int), ("REQUEST_READ_TIMEOUT", float)):
        default = Settings.model_fields[name.lower()].default
        assert kind(given[name]) == kind(service_env.get(name, default)), name
    assert given["EDGECUT_UPSTREAM"].startswith("edgecut:")
