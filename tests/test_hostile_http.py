"""Hostile clients at the HTTP level, against a live gunicorn (the production worker class,
service/worker/) and a real Redis: stalled uploads, malformed framing, requests gunicorn itself
refuses, and the bad-input catalogue replayed over the wire with a time bound, byte-identical
stored state and the workers' peak memory measured. The event loop's request framing is also
tested on its own, byte by byte."""

from __future__ import annotations

import socket
import time
import uuid

import orjson
import pytest
import requests

from api_support import QUAD, TRIAGE
from live_server import LiveServer
from service.app import create_app
from service.worker.framing import Framing
from service.worker.refusals import problem_message
from snapshots import snapshot

PROBLEM = "application/problem+json"
READ_TIMEOUT = 2.0
MAX_BODY = 64 * 1024
ANSWER_WITHIN = 2.0
RSS_LIMIT_BYTES = 1 << 30


# --- the framing the event loop reads, on its own ---------------------------------------------


def framing_of(raw: bytes, max_body: int = 100) -> Framing:
    framing = Framing(max_header_bytes=200, max_body_bytes=max_body)
    framing.feed(raw)
    return framing


HEAD = b"POST /v1/select HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize("raw, verdict", [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", Framing.COMPLETE),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", Framing.INCOMPLETE),
    (HEAD + b"Content-Length: 5\r\n\r\nabcd", Framing.INCOMPLETE),
    (HEAD + b"Content-Length: 5\r\n\r\nabcde", Framing.COMPLETE),
    (HEAD + b"Content-Length: 101\r\n\r\n", Framing.TOO_LARGE),
    (HEAD + b"Content-Length: -1\r\n\r\n", Framing.MALFORMED),
    (HEAD + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", Framing.MALFORMED),
    (HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", Framing.MALFORMED),
    (HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n", Framing.MALFORMED),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", Framing.INCOMPLETE),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", Framing.COMPLETE),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", Framing.COMPLETE),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n", Framing.MALFORMED),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n", Framing.MALFORMED),
    # Refused as soon as the chunks' data, not yet their announced sizes, pass the limit.
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n40\r\n" + b"a" * 64 + b"\r\n40\r\n", Framing.INCOMPLETE),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n40\r\n" + b"a" * 64 + b"\r\n40\r\n" + b"a" * 40, Framing.TOO_LARGE),
    (HEAD + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nabcde", Framing.MALFORMED),
    (HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", Framing.MALFORMED),
    (b"GET /healthz HTTP/1.1\nHost: x\n\n", Framing.MALFORMED),
    (b"\x16\x03\x01\x02\x00\x01", Framing.MALFORMED),  # not HTTP: refused before any empty line
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n", Framing.COMPLETE),
    (b"GET /" + b"a" * 300, Framing.HEADERS_TOO_LARGE),
])
def test_framing_verdicts(raw, verdict):
    assert framing_of(raw).verdict() == verdict


def test_framing_fed_byte_by_byte_agrees_with_framing_fed_at_once():
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    framing = Framing(max_header_bytes=200, max_body_bytes=100)
    verdicts = []
    for i in range(len(raw)):
        framing.feed(raw[i:i + 1])
        verdicts.append(framing.verdict())
    assert verdicts[:-1] == [Framing.INCOMPLETE] * (len(raw) - 1)
    assert verdicts[-1] == Framing.COMPLETE


def test_framing_hands_over_the_headers_apart_and_a_length_body_joined_once():
    head = HEAD + b"Content-Length: 10\r\n\r\n"
    raw = head + b"0123456789" + b"GET /healthz HTTP/1.1\r\n\r\n"  # a pipelined request follows
    for cuts in ([len(head) + 3], [5, len(head) + 1, len(head) + 9], list(range(1, len(raw)))):
        framing = Framing(max_header_bytes=200, max_body_bytes=100)
        for start, end in zip([0, *cuts], [*cuts, len(raw)]):
            framing.feed(raw[start:end])
            framing.verdict()
        assert framing.verdict() == Framing.COMPLETE
        pieces = [bytes(piece) for piece in framing.pieces()]
        assert b"".join(pieces) == raw and pieces[0] == head
        assert framing.body() == b"0123456789"
    chunked = framing_of(HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert chunked.verdict() == Framing.COMPLETE and chunked.body() is None
    assert framing_of(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").body() is None


def test_held_unreader_gives_pieces_as_reads_and_skips_a_body_unread():
    from gunicorn.http.unreader import SocketUnreader

    from service.worker.held import HeldUnreader

    ours, theirs = socket.socketpair()
    try:
        held = HeldUnreader(SocketUnreader(ours))
        for piece in reversed([b"HEAD\r\n\r\n", memoryview(b"body-"), b"rest|next"]):
            held.unread(piece)
        assert held.read() == b"HEAD\r\n\r\n"  # no size: one piece, as a socket read
        held.skip(7)  # "body-re"
        assert held.read(4) == b"st|n"
        theirs.sendall(b"xt-from-socket")
        assert held.read(6) == b"extxt-"  # what is held, then the socket
    finally:
        ours.close()
        theirs.close()


def test_a_problem_message_is_a_whole_http_response():
    raw = problem_message("request-timeout", "too slow")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert b"Content-Type: application/problem+json" in head and b"Connection: close" in head
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
    assert orjson.loads(body) == {"type": "urn:edgecut:problem:request-timeout", "title": "Request timeout",
                                  "status": 408, "detail": "too slow"}


def test_every_refusal_of_gunicorns_parser_maps_to_a_known_problem():
    import inspect

    from gunicorn.http import errors

    from service.api.problems import PROBLEMS
    from service.worker.refusals import refusal_for

    ours = (errors.ConfigurationProblem, errors.InvalidResponseHeader, errors.InvalidResponseHeaderName)
    parse_errors = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                    if issubclass(cls, errors.ParseException)]
    assert len(parse_errors) > 10
    for cls in parse_errors:
        # Their constructors differ; only the type is mapped.
        error = type("Probe", (cls,), {"__init__": lambda self: None, "__str__": lambda self: "probe"})()
        code, _ = refusal_for(error)
        assert code in PROBLEMS, cls.__name__
        if issubclass(cls, ours):  # the server's own fault: a bare 500, as for any bug
            assert code == "internal-error", cls.__name__
        else:
            assert 400 <= PROBLEMS[code][0] < 500 or code == "unsupported-transfer-coding", cls.__name__


# --- a live gunicorn + Redis ------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(redis_server):
    from test_bad_input import LIMITS  # the catalogue's limits, so its entries mean the same here

    assert LIMITS["max_body_bytes"] == MAX_BODY
    config = {"REDIS_URL": redis_server.url, "KEY_PREFIX": f"hostile-{uuid.uuid4().hex[:8]}",
              "REQUEST_READ_TIMEOUT": str(READ_TIMEOUT), **{name.upper(): str(value) for name, value in LIMITS.items()}}
    server = LiveServer(config, workers=2, threads=8)
    server.start()
    yield server, {key.lower(): value for key, value in config.items()}
    server.stop()


def raw_exchange(port: int, request: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        return read_response(sock)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def assert_raw_problem(answer, status: int, code: str) -> None:
    got, headers, body = answer
    assert got == status, (got, body[:300])
    assert headers["content-type"] == PROBLEM, headers
    problem = orjson.loads(body)
    assert problem["status"] == status and problem["type"] == f"urn:edgecut:problem:{code}", problem
    assert "Traceback" not in problem["detail"] and "<html" not in body.decode("latin-1").lower()


def _ordinary_round(url: str) -> float:
    """Post an instance, start a session, observe: the slowest of the calls, seconds."""
    slowest = 0.0
    for method, path, body in [("post", "/v1/instances", TRIAGE), ("post", "/v1/sessions", {"instance": TRIAGE}),
                               ("get", "/healthz", None)]:
        started = time.monotonic()
        response = requests.request(method, url + path, json=body, timeout=5)
        slowest = max(slowest, time.monotonic() - started)
        assert response.status_code < 300, response.text
        if path == "/v1/sessions":
            sid = response.json()["session_id"]
            started = time.monotonic()
            observed = requests.post(f"{url}/v1/sessions/{sid}/observations",
                                     json={"test": "ecg", "outcome": "normal"}, timeout=5)
            slowest = max(slowest, time.monotonic() - started)
            assert observed.status_code == 200, observed.text
    return slowest


@pytest.mark.redis
def test_one_connection_serves_bodies_read_whole_unread_and_chunked_in_turn(live):
    server, _ = live
    body = orjson.dumps(TRIAGE)
    turns = [b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
             # Refused before the body is read: none of it may be taken for the next request.
             b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
             b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
             b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]
    statuses = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        answers = sock.makefile("rb")
        for request in turns:
            sock.sendall(request)
            statuses.append(_read_answer(answers))
    assert statuses[0] in (200, 201) and statuses[1:] == [415, 200, 200]


def _read_answer(answers) -> int:
    """One HTTP/1.1 response off the stream (its status), its body read by Content-Length."""
    status = int(answers.readline().split()[1])
    length = 0
    while (line := answers.readline()) != b"\r\n":
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    answers.read(length)
    return status


@pytest.mark.redis
def test_pipelined_requests_sent_in_one_write_are_each_answered_in_order(live):
    server, _ = live
    body = orjson.dumps(TRIAGE)
    requests_ = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
                 b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"".join(requests_))  # RFC 9112 §9.3.2: answered one by one, in order
        answers = sock.makefile("rb")
        statuses = [_read_answer(answers) for _ in requests_]
    assert statuses[0] == 200 and statuses[1] in (200, 201) and statuses[2:] == [404, 200]


@pytest.mark.redis
def test_64_stalled_uploads_leave_the_server_answering(live):
    server, _ = live
    stalled = []
    try:
        for _ in range(64):  # 4 × the 2 workers × 8 threads
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 60000\r\n\r\n{\"tests\": [")
            stalled.append(sock)
        for _ in range(3):
            assert _ordinary_round(server.url) < 1.0
        # Past REQUEST_READ_TIMEOUT each stalled upload is answered 408 and closed.
        for sock in stalled:
            assert_raw_problem(read_response(sock), 408, "request-timeout")
            assert sock.recv(1) == b""
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.redis
def test_a_slow_drip_is_cut_at_the_read_timeout(live):
    server, _ = live
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n")
        try:
            while time.monotonic() - started < 3 * READ_TIMEOUT:
                sock.sendall(b" ")
                time.sleep(0.2)
        except OSError:
            pass  # the server closed on us: the answer is already in the socket
        answer = read_response(sock)
        assert time.monotonic() - started < READ_TIMEOUT + 1.5
    assert_raw_problem(answer, 408, "request-timeout")


LONG_SESSION_ID = "s" * 8000
HOSTILE = {
    # name: (raw request, status, problem code)
    "malformed chunk": (HEAD + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"2\r\n{}\r\nzz\r\n", 400, "bad-request"),
    "chunked body over MAX_BODY_BYTES": (HEAD + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                                         + (b"8000\r\n" + b" " * 0x8000 + b"\r\n") * 3 + b"0\r\n\r\n",
                                         413, "body-too-large"),
    "request line of 8 000 characters": (f"GET /v1/sessions/{LONG_SESSION_ID} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
                                         414, "uri-too-long"),
    "negative Content-Length": (HEAD + b"Content-Length: -5\r\n\r\n", 400, "bad-request"),
    "Content-Length and Transfer-Encoding": (HEAD + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                                             b"0\r\n\r\n", 400, "bad-request"),
    "control character in a header": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x01b\r\n\r\n",
                                      400, "bad-request"),
    "header name with a space": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", 400, "bad-request"),
    "not HTTP at all": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "bad-request"),
    "headers over gunicorn's limits": (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 9000 + b"\r\n\r\n",
                                       431, "headers-too-large"),
    "unknown transfer coding": (HEAD + b"Transfer-Encoding: gzip\r\n\r\n", 400, "bad-request"),
}


@pytest.mark.redis
@pytest.mark.parametrize("name", list(HOSTILE))
def test_refusals_below_the_application_are_problems(live, name):
    server, config = live
    raw, status, code = HOSTILE[name]
    app = create_app(config)
    before = snapshot(app)
    started = time.monotonic()
    assert_raw_problem(raw_exchange(server.port, raw), status, code)
    assert time.monotonic() - started < ANSWER_WITHIN
    assert snapshot(app) == before


def _peak_rss(pids: list[int]) -> dict[int, int]:
    peaks = {}
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                peaks[pid] = int(line.split()[1]) * 1024
    return peaks


@pytest.mark.redis
def test_the_bad_input_catalogue_over_the_wire(live):
    """Every entry of tests/test_bad_input.py's catalogue, sent to gunicorn: its 4xx problem
    within 2 s, stored state byte-identical, and no worker's peak RSS over 1 GB."""
    server, config = live
    assert not replay_catalogue(server.url, config)
    peaks = _peak_rss(server.worker_pids())
    assert peaks and max(peaks.values()) < RSS_LIMIT_BYTES, peaks


def replay_catalogue(url: str, config: dict) -> list[tuple]:
    """Send every catalogue entry to ``url`` (a server of the catalogue's limits, with the store
    ``config`` names); the entries not answered their problem within 2 s with nothing stored."""
    from test_bad_input import CATALOGUE, _fill

    ids = {"iid": requests.post(url + "/v1/instances", json=TRIAGE).json()["instance_id"]}
    ids["sid"] = requests.post(url + "/v1/sessions", json={"instance_id": ids["iid"]}).json()["session_id"]
    assert requests.post(f"{url}/v1/sessions/{ids['sid']}/observations",
                         json={"test": "troponin", "outcome": "low"}).status_code == 200
    ids["quad"] = requests.post(url + "/v1/sessions", json={"instance": QUAD}).json()["session_id"]
    assert requests.post(f"{url}/v1/sessions/{ids['quad']}/observations",
                         json={"test": "a", "outcome": "0"}).status_code == 200
    ids["done"] = requests.post(url + "/v1/sessions", json={"instance_id": ids["iid"]}).json()["session_id"]
    assert requests.post(f"{url}/v1/sessions/{ids['done']}/observations",
                         json={"test": "ecg", "outcome": "normal"}).json()["done"] is True
    assert requests.post(url + "/v1/sessions", json={"instance_id": ids["iid"]},
                         headers={"Idempotency-Key": "used-once"}).status_code == 201
    app = create_app(config)
    failures = []
    for bad in CATALOGUE:
        data = bad.body if isinstance(bad.body, bytes) else orjson.dumps(_fill(bad.body, ids))
        headers = dict(bad.headers)
        if bad.content_type is not None:
            headers["Content-Type"] = bad.content_type
        before = snapshot(app)
        started = time.monotonic()
        response = requests.request(bad.method.upper(), url + bad.path.format(**ids),
                                    data=None if bad.method in ("get", "delete") or (bad.method == "put" and bad.body is None)
                                    else data,
                                    headers=headers,
                                    timeout=10)
        elapsed = time.monotonic() - started
        problem = response.json() if response.headers.get("Content-Type") == PROBLEM else {}
        if (response.status_code != bad.status or problem.get("type") != f"urn:edgecut:problem:{bad.code}"
                or elapsed > ANSWER_WITHIN or snapshot(app) != before):
            failures.append((bad.name, response.status_code, problem.get("type"), round(elapsed, 2)))
    return failures


# --- one small worker: its buffer budget, its connections, 100 Continue ----------------------

SMALL_BUDGET = 150_000
SMALL_CONNECTIONS = 16


@pytest.fixture(scope="module")
def small():
    """One worker of two threads with the embedded store, a 150 kB buffer budget and room for
    16 connections."""
    server = LiveServer({"REDIS_URL": "", "REQUEST_BUFFER_BYTES": str(SMALL_BUDGET), "MAX_BODY_BYTES": "100000",
                         "REQUEST_READ_TIMEOUT": "10"}, workers=1, threads=2,
                        gunicorn_args=("--worker-connections", str(SMALL_CONNECTIONS)))
    server.start()
    yield server
    server.stop()


def _answers_quickly(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture
def quiet_small(small):
    """The small server once every connection a previous test opened has been closed."""
    deadline = time.monotonic() + 5
    while not _answers_quickly(small.url) and time.monotonic() < deadline:
        time.sleep(0.1)
    return small


def _stalled_upload(port: int, sent: int, announced: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % announced + b" " * sent)
    return sock


def test_one_100_continue_for_a_request_that_waits_for_it(quiet_small):
    body = orjson.dumps(TRIAGE)
    with socket.create_connection(("127.0.0.1", quiet_small.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), received
        sock.sendall(body)
        while chunk := sock.recv(65536):  # Connection: close: the server ends the stream
            received += chunk
    assert received.count(b" 100 Continue") == 1, received
    assert b"HTTP/1.1 201 " in received, received


def test_a_request_past_the_buffer_budget_is_503_and_the_rest_still_served(quiet_small):
    port = quiet_small.port
    stalled = [_stalled_upload(port, 70_000, 90_000) for _ in range(2)]  # 140 kB of the 150 kB held
    try:
        # A round trip after both were sent: the event loop has read what they sent.
        assert _answers_quickly(quiet_small.url)
        with _stalled_upload(port, 20_000, 90_000) as third:
            assert_raw_problem(read_response(third), 503, "server-busy")
        status, headers, _ = raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200
    finally:
        for sock in stalled:
            sock.close()


def test_idle_connections_past_worker_connections_do_not_stall_a_request(quiet_small):
    idle = [socket.create_connection(("127.0.0.1", quiet_small.port), timeout=10)
            for _ in range(3 * SMALL_CONNECTIONS)]
    try:
        started = time.monotonic()
        assert requests.get(quiet_small.url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0
        # The ones idle longest were closed to make room.
        closed = 0
        for sock in idle[:2 * SMALL_CONNECTIONS]:
            sock.settimeout(2)
            closed += sock.recv(1) == b""
        assert closed == 2 * SMALL_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_past_worker_connections_all_busy_is_503_at_once(quiet_small):
    port = quiet_small.port
    busy = [_stalled_upload(port, 10, 1000) for _ in range(SMALL_CONNECTIONS - 1)]
    try:
        assert _answers_quickly(quiet_small.url) is False  # a 503, not a wait
        started = time.monotonic()
        assert_raw_problem(raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 503, "server-busy")
        assert time.monotonic() - started < 1.0
    finally:
        for sock in busy:
            sock.close()
