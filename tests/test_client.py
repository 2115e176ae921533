"""The Python client (edgecut/) against live servers: ``edgecut serve`` with the embedded store,
and gunicorn with two workers over a real Redis, with API keys; retries across a worker killed
-9 mid-request, across a Redis outage (503 with Retry-After), and across answers lost after the
service acted (the replay semantics the client relies on)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from requests.adapters import HTTPAdapter

from edgecut import Client, EdgecutError
from edgecut.client import retry_after_seconds
import api_support
from conftest import RedisServer, free_port
from live_server import EdgecutServe, LiveServer
from schemas.responses import SessionState

ROOT = Path(__file__).resolve().parent.parent
TRIAGE = json.loads((ROOT / "examples" / "triage" / "instance.json").read_text())
README_TRIAGE = api_support.TRIAGE  # two classes, two tests: small enough to reason about by hand
API_KEY = "client-test-key-0123456789"


def truth_answers(instance: dict, hypothesis_id: str) -> tuple[dict[str, str], set[str]]:
    """A hypothesis's outcome on every test, and the results a session may end on when it is
    the truth, read off the wire form: its class, or on a decision instance the decisions it
    accepts (those within ``loss_tolerance`` of its least loss)."""
    hypothesis = next(h for h in instance["hypotheses"] if h["id"] == hypothesis_id)
    if "acceptable" in hypothesis:
        return hypothesis["outcomes"], set(hypothesis["acceptable"])
    if "loss" in hypothesis:
        least = min(hypothesis["loss"].values()) + instance.get("loss_tolerance", 0)
        return hypothesis["outcomes"], {d for d, loss in hypothesis["loss"].items() if loss <= least}
    return hypothesis["outcomes"], {hypothesis.get("class", hypothesis_id)}


def result(state: SessionState) -> str:
    """What the session settled: the decision on a decision instance, else the class."""
    return state.decision.id if state.decision is not None else state.map_class


STOPPED = "decided" if "decisions" in TRIAGE else "determined"


def run_to_done(client: Client, instance_id: str, answers: dict[str, str], **options) -> SessionState:
    state = client.start_session(instance_id, **options)
    while not state.done:
        state = client.observe(state.session_id, state.next_test.id, answers[state.next_test.id])
    return state


# --- the embedded store: edgecut serve, as a user starts it -----------------------------------


@pytest.fixture
def client(served):
    with Client(served.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("truth", [h["id"] for h in TRIAGE["hypotheses"][::3]])
def test_a_session_reaches_the_true_class_and_states_match_the_wire(client, served, truth):
    answers, true_results = truth_answers(TRIAGE, truth)
    instance_id = client.create_instance(TRIAGE)
    state = run_to_done(client, instance_id, answers)
    assert result(state) in true_results and state.stop_reason == STOPPED
    assert [h.outcome for h in state.history] == [answers[h.test] for h in state.history]
    # The model is the server's JSON, field for field (read here without the client).
    raw = requests.get(f"{served.url}/v1/sessions/{state.session_id}", timeout=5).json()
    dumped = client.get_session(state.session_id).model_dump(exclude={"expires_at"})
    assert {k: v for k, v in dumped.items() if k in raw or v is not None} == \
        {k: v for k, v in raw.items() if k != "expires_at"}
    assert dict(state)["map_class"] == state.map_class


def test_an_instance_model_posts_like_its_dict(client):
    from schemas.instance import Instance

    assert client.create_instance(Instance.model_validate(TRIAGE)) == client.create_instance(TRIAGE)
    summary = client.get_instance(client.create_instance(TRIAGE))
    assert (summary.n_hypotheses, summary.n_tests) == (len(TRIAGE["hypotheses"]), len(TRIAGE["tests"]))


def test_session_creation_is_idempotent_per_key(client):
    instance_id = client.create_instance(TRIAGE)
    first = client.start_session(instance_id, idempotency_key="visit-4711", policy="ec2")
    again = client.start_session(instance_id, idempotency_key="visit-4711", policy="ec2")
    assert again.session_id == first.session_id
    with pytest.raises(EdgecutError) as refused:
        client.start_session(instance_id, idempotency_key="visit-4711", policy="gbs")
    assert (refused.value.status, refused.value.code) == (409, "idempotency-key-reused")
    assert client.start_session(instance_id).session_id != first.session_id  # a fresh key each call


def test_errors_carry_the_problem_and_the_request_id(client):
    answered: list[requests.Response] = []
    client._http.hooks["response"].append(lambda response, *args, **kwargs: answered.append(response))
    state = client.start_session(client.create_instance(TRIAGE))
    with pytest.raises(EdgecutError) as refused:
        client.observe(state.session_id, "no_such_test", "yes")
    error = refused.value
    body = answered[-1].json()
    assert (error.status, error.code, error.type, error.title, error.detail) == \
        (422, "unknown-test", body["type"], body["title"], body["detail"])
    # The id the service logged it under: the one the client sent, echoed in header and body.
    assert error.request_id == answered[-1].request.headers["X-Request-ID"] == body["request_id"]
    assert "unknown-test" in str(error)
    with pytest.raises(EdgecutError) as invalid:
        client.create_instance({"tests": [{"id": "a", "cost": -1}], "hypotheses": [{"id": "h", "outcomes": {"a": "x"}}]})
    assert invalid.value.status == 422 and any(e["path"] == "tests[0].cost" for e in invalid.value.errors)


def test_if_match_uses_the_last_seen_etag(client, served):
    instance_id = client.create_instance(TRIAGE)
    answers, _ = truth_answers(TRIAGE, TRIAGE["hypotheses"][0]["id"])
    mine = client.start_session(instance_id)
    assert client.etag(mine.session_id) == '"1"'
    with Client(served.url) as other:  # another front end moves the session on
        theirs = other.get_session(mine.session_id)
        other.observe(theirs.session_id, theirs.next_test.id, answers[theirs.next_test.id])
    state = other.get_session(mine.session_id)
    with pytest.raises(EdgecutError) as stale:
        client.observe(mine.session_id, state.next_test.id, answers[state.next_test.id])
    assert stale.value.status == 412 and stale.value.code == "precondition-failed"
    assert client.get_session(mine.session_id).step == 1  # refused: nothing stored
    assert client.etag(mine.session_id) == '"2"'  # the read refreshed it
    moved = client.observe(mine.session_id, state.next_test.id, answers[state.next_test.id])
    assert moved.step == 2 and client.etag(mine.session_id) == '"3"'
    # if_match=False writes whatever the version (the store still compares-and-sets).
    assert client.observe(mine.session_id, state.next_test.id, answers[state.next_test.id], if_match=False).step == 2


def test_select_and_evaluate(client):
    instance_id = client.create_instance(TRIAGE)
    answers, _ = truth_answers(TRIAGE, TRIAGE["hypotheses"][-1]["id"])
    session = run_to_done(client, instance_id, answers)
    observed = [(h.test, h.outcome) for h in session.history]
    step = client.select(instance_id, observed, explain=True)
    assert step.model_dump(exclude={"candidates"}) == session.model_dump(exclude={"session_id", "expires_at", "candidates"})
    inline = client.select(observations=observed[:1], instance=TRIAGE, explain=True)
    assert inline.next_test.id == session.history[1].test and inline.candidates[0].test == inline.next_test.id
    report = client.evaluate(instance_id, policies=["ec2", "gbs"], optimum=False)
    assert [p["policy"] for p in report["policies"]] == ["ec2", "gbs"]


def test_delete_then_not_found(client):
    state = client.start_session(client.create_instance(TRIAGE))
    client.delete_session(state.session_id)
    assert client.etag(state.session_id) is None
    with pytest.raises(EdgecutError) as gone:
        client.get_session(state.session_id)
    assert (gone.value.status, gone.value.code) == (404, "session-not-found")


def test_an_unreachable_service_raises_the_one_error_type():
    with Client(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01) as client:
        with pytest.raises(EdgecutError) as unreachable:
            client.get_session("x")
    assert unreachable.value.status is None and "after 3 attempts" in str(unreachable.value)
    assert isinstance(unreachable.value.__cause__, requests.ConnectionError)


@pytest.mark.slow
def test_rate_limits_are_waited_out_or_raised_with_their_wait():
    server = EdgecutServe({"REDIS_URL": "", "LOG_LEVEL": "warning", "RATE_LIMIT": "4/second",
                           "RATE_LIMIT_BURST": "2"})
    server.wait_ready()
    statuses: list[int] = []
    try:
        with Client(server.url) as client:
            client._http.hooks["response"].append(lambda r, *a, **k: statuses.append(r.status_code))
            state = client.start_session(client.create_instance(TRIAGE))
            for _ in range(2):
                assert client.get_session(state.session_id).session_id == state.session_id
            assert 429 in statuses  # each was answered after waiting Retry-After
        # A client that will not wait that long gets the 429 at once, with the wait it asked for.
        with Client(server.url, max_retry_after=0.5) as impatient:
            with pytest.raises(EdgecutError) as limited:
                for _ in range(4):
                    impatient.get_session(state.session_id)
        assert (limited.value.status, limited.value.code, limited.value.retry_after) == (429, "rate-limited", 1.0)
    finally:
        server.stop()


class Recording(HTTPAdapter):
    """Sends each request to the real server and keeps its media type and body."""

    def __init__(self):
        super().__init__()
        self.sent: list[tuple[str, bytes]] = []

    def send(self, request, *args, **kwargs):
        self.sent.append((request.headers.get("Content-Type", ""), request.body or b""))
        return super().send(request, *args, **kwargs)


@pytest.mark.parametrize("field, dtype", [("matrix", "uint8"), ("matrix", "int32"), ("likelihood_matrix", "float64")])
def test_a_numpy_array_goes_as_npy_and_makes_the_instance_its_lists_make(served, field, dtype):
    import numpy as np

    from schemas.instance import Instance

    rng = np.random.default_rng(3)
    n, n_tests = 60, 7
    if field == "matrix":
        array = rng.integers(0, 3, size=(n, n_tests)).astype(dtype)
    else:
        array = rng.dirichlet(np.ones(3), size=(n, n_tests)).astype(dtype)
    document = {"tests": [{"id": f"q{j}", "outcomes": ["a", "b", "c"]} for j in range(n_tests)],
                "classes": [f"c{i % 4}" for i in range(n)]}
    http = requests.Session()
    recording = Recording()
    http.mount("http://", recording)
    with Client(served.url, http=http) as client:
        from_lists = client.create_instance({**document, field: array.tolist()})
        from_array = client.create_instance({**document, field: array})
        from_model = client.create_instance(Instance.model_validate({**document, field: array}))
    assert from_array == from_lists == from_model
    (lists_type, lists_body), (array_type, array_body), (model_type, _) = recording.sent
    assert lists_type == "application/json"
    assert array_type.startswith("multipart/form-data; boundary=")
    assert model_type.startswith("multipart/form-data; boundary=")
    assert array.tobytes() in array_body and b"[[" not in array_body  # the array's own bytes, no lists


class LoseAnswers(HTTPAdapter):
    """Sends each request to the real server, then drops the first ``n`` answers as a broken
    connection would: the service acted, the client never heard."""

    def __init__(self, n: int):
        super().__init__()
        self.to_lose = n
        self.lost: list[requests.Response] = []

    def send(self, request, *args, **kwargs):
        response = super().send(request, *args, **kwargs)
        if self.to_lose > 0:
            self.to_lose -= 1
            self.lost.append(response)
            raise requests.ConnectionError("connection reset after the request was sent")
        return response


def test_answers_lost_after_the_service_acted_are_retried_safely(served):
    http = requests.Session()
    adapter = LoseAnswers(0)
    http.mount("http://", adapter)
    with Client(served.url, backoff=0.01, http=http) as client:
        instance_id = client.create_instance(TRIAGE)
        adapter.to_lose = 1
        state = client.start_session(instance_id)
        assert state.session_id == adapter.lost[0].json()["session_id"]  # not a second session
        answers, _ = truth_answers(TRIAGE, TRIAGE["hypotheses"][4]["id"])
        adapter.to_lose = 2
        after = client.observe(state.session_id, state.next_test.id, answers[state.next_test.id])
        assert [r.status_code for r in adapter.lost[1:]] == [200, 200]  # applied, then replayed under a stale If-Match
        assert after.step == 1 and len(after.history) == 1 and client.etag(state.session_id) == '"2"'
        adapter.to_lose = 1
        client.delete_session(state.session_id)  # the retry's 404 means the first attempt did it
        assert adapter.lost[-1].status_code == 204


def test_states_from_a_newer_service_keep_the_fields_the_client_knows():
    from edgecut.client import _parse

    response = requests.Response()
    response.status_code = 200
    response._content = json.dumps({
        "session_id": "s", "expires_at": "2026-01-01T00:00:00Z", "policy": "ec2", "step": 1,
        "next_test": {"id": "a", "cost": 1.0, "outcomes": ["x"], "shown_as": "A?"}, "done": False,
        "stop_reason": None, "cost_spent": 1.0, "history": [{"test": "b", "outcome": "y", "cost": 1.0, "at": 3}],
        "class_posterior": {"c": 1.0}, "map_class": "c", "version_space_size": 2, "a_new_field": [1]}).encode()
    state = _parse(SessionState, response)
    assert state.next_test.id == "a" and state.history[0].outcome == "y" and not hasattr(state, "a_new_field")


def test_retry_after_is_read_as_seconds_or_a_date():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Thu, 01 Jan 2026 00:00:10 GMT", now=1767225600.0) == 10.0
    assert retry_after_seconds("Thu, 01 Jan 2026 00:00:10 GMT", now=1767225700.0) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_a_problem_parsed_from_a_response_with_a_request_id():
    response = requests.Response()
    response.status_code = 503
    response.headers["Retry-After"] = "2"
    response._content = json.dumps({"type": "urn:edgecut:problem:store-unavailable", "title": "Store unavailable",
                                    "status": 503, "detail": "retry shortly", "request_id": "abc-123"}).encode()
    error = EdgecutError.from_response(response)
    assert (error.code, error.request_id, error.retry_after) == ("store-unavailable", "abc-123", 2.0)
    response.headers["X-Request-ID"] = "from-header"
    assert EdgecutError.from_response(response).request_id == "from-header"
    proxy = requests.Response()
    proxy.status_code, proxy.reason, proxy._content = 502, "Bad Gateway", b"<html>upstream down</html>"
    assert EdgecutError.from_response(proxy).detail == "<html>upstream down</html>"


# --- gunicorn, two workers, a real Redis, API keys ---------------------------------------------


@pytest.fixture(scope="module")
def gunicorn_redis(redis_server):
    """One server for the module (the worker-killing test comes last: the master replaces them)."""
    server = LiveServer({"REDIS_URL": redis_server.url, "KEY_PREFIX": f"client-{uuid.uuid4().hex[:8]}",
                         "API_KEYS": f"clinic:{API_KEY}"}, workers=2, threads=4)
    server.start()
    yield server
    server.stop()


@pytest.mark.redis
def test_api_keys_and_sessions_over_two_workers(gunicorn_redis):
    with Client(gunicorn_redis.url) as anonymous:
        with pytest.raises(EdgecutError) as refused:
            anonymous.create_instance(TRIAGE)
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    answers, true_results = truth_answers(TRIAGE, TRIAGE["hypotheses"][7]["id"])
    with Client(gunicorn_redis.url, api_key=API_KEY) as client:
        state = run_to_done(client, client.create_instance(TRIAGE), answers)
        assert result(state) in true_results
        for _ in range(4):  # either worker answers the same
            assert client.get_session(state.session_id).history == state.history


def wait_until_a_request_waits_unread(port: int, timeout: float = 20.0) -> None:
    """Until a connection to ``port`` holds bytes no process has read yet (the kernel's
    /proc/net/tcp receive queue): the request has been sent, and the frozen worker has not
    read it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                rows = [line.split() for line in Path(table).read_text().splitlines()[1:]]
            except OSError:
                continue
            for row in rows:
                local, state, queues = row[1], row[3], row[4]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01" and int(queues.split(":")[1], 16) > 0:
                    return
        time.sleep(0.02)
    raise AssertionError(f"no request reached port {port} within {timeout} s")


@pytest.mark.redis
def test_a_request_cut_by_a_killed_worker_is_retried(gunicorn_redis):
    """The request reaches a worker that is frozen, then killed -9: the connection is reset, the
    client retries on a worker the master starts in its place, and the session goes on."""
    answers, true_results = truth_answers(TRIAGE, TRIAGE["hypotheses"][1]["id"])
    failures: list[str] = []
    with Client(gunicorn_redis.url, api_key=API_KEY, backoff=0.2) as client:
        sleep = client._sleep
        client._sleep = lambda seconds: (failures.append("retry"), sleep(seconds))  # type: ignore[method-assign]
        state = client.start_session(client.create_instance(TRIAGE))
        workers = gunicorn_redis.worker_pids()
        for pid in workers:  # every worker, so the request cannot land on a live one
            os.kill(pid, signal.SIGSTOP)
        outcome: dict = {}
        call = threading.Thread(target=lambda: outcome.update(
            state=client.observe(state.session_id, state.next_test.id, answers[state.next_test.id])))
        call.start()
        wait_until_a_request_waits_unread(gunicorn_redis.port)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        call.join(timeout=60)
        assert not call.is_alive() and "state" in outcome, "the observation did not come back"
        assert failures, "no attempt failed: the test did not cut a request"
        assert set(gunicorn_redis.worker_pids()).isdisjoint(workers)
        after = outcome["state"]
        assert after.step == 1 and after.history[0].test == state.next_test.id
        while not after.done:
            after = client.observe(after.session_id, after.next_test.id, answers[after.next_test.id])
        assert result(after) in true_results


@pytest.mark.redis
def test_a_store_outage_is_waited_out_with_retry_after(tmp_path):
    # Append-only, so the session written before the outage is there after it.
    private_redis = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    private_redis.start()
    server = LiveServer({"REDIS_URL": private_redis.url, "KEY_PREFIX": "outage", "RETRY_AFTER_SECONDS": "1"},
                        workers=1, threads=4)
    server.start()
    statuses: list[int] = []
    try:
        with Client(server.url, retries=6) as client:
            client._http.hooks["response"].append(lambda r, *a, **k: statuses.append(r.status_code))
            state = client.start_session(client.create_instance(TRIAGE))
            private_redis.stop()
            threading.Timer(1.5, private_redis.start).start()
            started = time.monotonic()
            again = client.get_session(state.session_id)  # 503 + Retry-After: 1 until Redis is back
            assert again.session_id == state.session_id
            assert 503 in statuses and time.monotonic() - started >= 1.0
    finally:
        server.stop()
        private_redis.stop()


@pytest.mark.parametrize("script, args, expected", [
    ("triage_client.py", ["--condition", "appendicitis"], "decided: emergency_department"),
    ("lotteries_client.py", ["--subjects", "1", "--tests", "3"], "after 3 tests (max_tests)"),
])
def test_the_example_scripts_run(served, script, args, expected):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--url", served.url, *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_skips_corrections_and_withdrawals(client):
    instance_id = client.create_instance(README_TRIAGE)
    skipper = client.start_session(instance_id)
    first = skipper.next_test.id
    skipped = client.skip(skipper.session_id, first)
    assert skipped.history[-1].test == first and skipped.history[-1].skipped and skipped.cost_spent == 0
    assert skipped.next_test is None or skipped.next_test.id != first
    assert client.skip(skipper.session_id, first).step == skipped.step  # a re-posted skip is a no-op

    state = client.start_session(instance_id)
    done = client.observe(state.session_id, "ecg", "abnormal")
    assert done.done and done.map_class == "admit"
    corrected = client.correct(state.session_id, "ecg", "normal")
    assert corrected.done and corrected.map_class == "home"
    assert [(h.test, h.outcome) for h in corrected.history] == [("ecg", "normal")]
    withdrawn = client.withdraw(state.session_id, "ecg")
    assert not withdrawn.done and withdrawn.history == [] and withdrawn.next_test.id == "ecg"
    with pytest.raises(EdgecutError) as again:  # a retry whose first attempt landed withdraws nothing more
        client.withdraw(state.session_id, "ecg", if_match='"2"')
    assert again.value.status == 404 and client.get_session(state.session_id).history == []


def test_instances_are_listed_and_deleted(client):
    instance_id = client.create_instance(README_TRIAGE)
    session = client.start_session(instance_id)
    assert instance_id in {item.instance_id for item in client.iter_instances(page_size=1)}
    client.delete_instance(instance_id)
    client.delete_instance(instance_id)  # again: harmless, so a retried delete is safe
    assert instance_id not in {item.instance_id for item in client.iter_instances()}
    with pytest.raises(EdgecutError) as gone:
        client.get_session(session.session_id)
    assert (gone.value.status, gone.value.code) == (410, "instance-gone")
