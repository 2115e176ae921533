"""Hardening of the HTTP layer, in process: unreadable and over-long chunked bodies, what
/readyz says, failed-authentication throttling, damaged session records, refused requests that
must leave nothing behind, and the one mapping of Redis failures (a real redis-server made busy,
full or absent). Live-server cases are in tests/test_hostile_http.py."""

from __future__ import annotations

import io
import threading
import uuid

import pytest
import redis
from gunicorn.http.errors import InvalidChunkSize

from api_support import QUAD, TRIAGE, assert_problem, new_session
from conftest import wait_until_busy
from service.app import create_app
from service.store import StoreFull, StoreUnavailable
from service.store.redis_store import redis_errors
from snapshots import snapshot

JSON = "application/json"
KEY = "alpha-key-0123456789abcdef"


def chunked(stream) -> dict:
    """The environ gunicorn gives a chunked request: a stream it terminates itself."""
    return {"wsgi.input": stream, "wsgi.input_terminated": True}


# --- bodies the server could not read, or that were longer than announced ---------------------


class MalformedChunks(io.BytesIO):
    """What gunicorn's chunked reader does on ``zz\\r\\n`` where a chunk size belongs."""

    def read(self, *args):
        raise InvalidChunkSize(b"zz")

    readinto = read


def test_a_malformed_chunked_body_is_a_400_problem(app):
    before = snapshot(app)
    response = app.test_client().post("/v1/instances", environ_overrides=chunked(MalformedChunks()),
                                      content_type=JSON, headers={"Transfer-Encoding": "chunked"})
    assert_problem(response, 400, "bad-request")
    assert snapshot(app) == before


@pytest.mark.parametrize("extra, status, code", [(1, 413, "body-too-large"), (0, 422, "validation-error")])
def test_a_chunked_body_over_max_body_bytes_is_413_not_cut(app_config, extra, status, code):
    limit = 2048
    app = create_app({**app_config, "max_body_bytes": limit})
    body = b" " * (limit - 2 + extra) + b"{}"  # valid JSON either way: only the length differs
    response = app.test_client().post("/v1/instances", environ_overrides=chunked(io.BytesIO(body)),
                                      content_type=JSON, headers={"Transfer-Encoding": "chunked"})
    assert_problem(response, status, code)


# --- /readyz is open to anyone: ready or not, nothing more ----------------------------------------


@pytest.mark.redis
def test_readyz_says_not_ready_without_saying_where_the_store_is(private_redis, caplog):
    private_redis.start()
    app = create_app({"redis_url": private_redis.url, "key_prefix": f"ready-{uuid.uuid4().hex[:8]}"})
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    private_redis.stop()
    response = client.get("/readyz")
    body = assert_problem(response, 503, "store-unavailable")
    text = response.get_data(as_text=True)
    assert str(private_redis.port) not in text and "127.0.0.1" not in text and "Error" not in text
    assert body["detail"] == "the session store does not answer"
    assert str(private_redis.port) in caplog.text  # the detail went to the log


# --- failed authentication is throttled per client address ----------------------------------------


def test_failed_authentications_are_throttled_per_address(app_config):
    app = create_app({**app_config, "api_keys": f"alpha:{KEY}", "auth_failure_limit": "5/minute"})
    client = app.test_client()
    attacker = {"REMOTE_ADDR": "203.0.113.7"}
    statuses = [client.get("/v1/sessions/x", headers={"Authorization": f"Bearer wrong-{i:020d}"},
                           environ_base=attacker).status_code for i in range(12)]
    assert statuses == [401] * 5 + [429] * 7
    throttled = client.get("/v1/sessions/x", headers={"Authorization": "Bearer nope-nope-nope-nope"},
                           environ_base=attacker)
    assert_problem(throttled, 429, "rate-limited")
    assert 1 <= int(throttled.headers["Retry-After"]) <= 12  # one failure per 12 s
    # While throttled even the right key is refused before it is looked at: guessing from this
    # address gets no faster by sending more ...
    right_key = client.get("/v1/sessions/x", headers={"Authorization": f"Bearer {KEY}"}, environ_base=attacker)
    assert right_key.status_code == 429
    # ... and other addresses are not affected.
    elsewhere = client.get("/v1/sessions/x", headers={"Authorization": f"Bearer {KEY}"},
                           environ_base={"REMOTE_ADDR": "198.51.100.2"})
    assert_problem(elsewhere, 404, "session-not-found")


PROXY = {"REMOTE_ADDR": "10.0.0.2"}  # nginx, as the service sees it


def wrong_keys_through_the_proxy(client, forwarded_for: str, times: int) -> list[int]:
    return [client.get("/v1/sessions/x", environ_base=PROXY,
                       headers={"Authorization": f"Bearer wrong-{i:020d}", "X-Forwarded-For": forwarded_for}).status_code
            for i in range(times)]


def test_behind_a_trusted_proxy_failed_authentications_are_counted_per_client(app_config):
    app = create_app({**app_config, "api_keys": f"alpha:{KEY}", "auth_failure_limit": "3/minute", "trusted_proxies": 1})
    client = app.test_client()
    # The attacker writes its own X-Forwarded-For; nginx appends the address it saw.
    assert wrong_keys_through_the_proxy(client, "198.51.100.9, 203.0.113.7", 5) == [401] * 3 + [429] * 2
    for other in ("198.51.100.2", "203.0.113.8"):  # every other client through the same proxy is served
        served = client.get("/v1/sessions/x", environ_base=PROXY,
                            headers={"Authorization": f"Bearer {KEY}", "X-Forwarded-For": other})
        assert_problem(served, 404, "session-not-found")
    # Writing another address further left does not make the attacker someone else.
    assert wrong_keys_through_the_proxy(client, "192.0.2.1, 203.0.113.7", 1) == [429]


def test_without_trusted_proxies_x_forwarded_for_is_ignored(app_config):
    app = create_app({**app_config, "api_keys": f"alpha:{KEY}", "auth_failure_limit": "3/minute"})
    client = app.test_client()
    statuses = [client.get("/v1/sessions/x", environ_base=PROXY,
                           headers={"Authorization": f"Bearer wrong-{i:020d}", "X-Forwarded-For": f"192.0.2.{i}"}
                           ).status_code for i in range(5)]
    assert statuses == [401] * 3 + [429] * 2  # one client however many addresses it writes


def test_valid_keys_are_never_counted_as_failures(app_config):
    app = create_app({**app_config, "api_keys": f"alpha:{KEY}", "auth_failure_limit": "2/minute"})
    client = app.test_client()
    for _ in range(10):
        assert client.get("/v1/sessions/x", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


# --- damaged session records: one defined problem ----------------------------------------------------


CORRUPT_RECORDS = {
    "not JSON": b"not json",
    "a JSON array": b"[]",
    "a field missing": b'{"session_id": 1}',
    "a pickle-shaped object": b'{"__reduce__": "os.system"}',
    "observations not pairs": None,  # built from the real record below
    "version a string": None,
    "another session's record": None,
}


def test_every_stored_record_field_has_a_checked_type():
    from service.store.records import _RECORD_FIELDS, _RECORD_TYPES

    assert set(_RECORD_TYPES) == set(_RECORD_FIELDS)


@pytest.mark.redis
@pytest.mark.parametrize("damage", list(CORRUPT_RECORDS))
def test_a_damaged_session_record_is_410_session_unreadable(redis_server, damage, caplog):
    import orjson

    app = create_app({"redis_url": redis_server.url, "key_prefix": f"corrupt-{uuid.uuid4().hex[:8]}"})
    client = app.test_client()
    sid = new_session(client)["session_id"]
    key = app.extensions["edgecut"].store.session_key(sid)
    direct = redis.Redis.from_url(redis_server.url)
    record = orjson.loads(direct.hget(key, "record"))
    damaged = CORRUPT_RECORDS[damage] or orjson.dumps({
        "observations not pairs": {**record, "observations": "ecg"},
        "version a string": {**record, "version": "1"},
        "another session's record": {**record, "session_id": "someone-else"},
    }[damage])
    direct.hset(key, "record", damaged)
    for response in (client.get(f"/v1/sessions/{sid}"),
                     client.post(f"/v1/sessions/{sid}/observations", json={"test": "ecg", "outcome": "normal"})):
        assert_problem(response, 410, "session-unreadable")
    assert sid in caplog.text
    assert direct.hget(key, "record") == damaged  # kept for the operator; nothing was written
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204  # and the client can remove it
    direct.close()


# --- a refused request leaves nothing behind -----------------------------------------------------------


def test_an_idempotency_key_reused_with_another_inline_instance_stores_nothing(app):
    client = app.test_client()
    first = client.post("/v1/sessions", json={"instance": TRIAGE}, headers={"Idempotency-Key": "visit-1"})
    assert first.status_code == 201
    before = snapshot(app)
    reused = client.post("/v1/sessions", json={"instance": QUAD}, headers={"Idempotency-Key": "visit-1"})
    assert_problem(reused, 409, "idempotency-key-reused")
    assert snapshot(app) == before  # QUAD was not stored


def test_a_replay_with_the_same_key_writes_nothing_either(app):
    client = app.test_client()
    first = client.post("/v1/sessions", json={"instance": TRIAGE}, headers={"Idempotency-Key": "visit-2"})
    before = snapshot(app)
    replay = client.post("/v1/sessions", json={"instance": TRIAGE}, headers={"Idempotency-Key": "visit-2"})
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json()["session_id"] == first.get_json()["session_id"]
    assert snapshot(app) == before


# --- Redis failures: one mapping for the store and the rate limiter -------------------------------


@pytest.mark.parametrize("reply, raised", [
    ("LOADING Redis is loading the dataset in memory", StoreUnavailable),
    ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", StoreUnavailable),
    ("READONLY You can't write against a read only replica.", StoreUnavailable),
    ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", StoreUnavailable),
    ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist", StoreUnavailable),
    ("OOM command not allowed when used memory > 'maxmemory'.", StoreFull),
])
def test_redis_error_replies_map_to_store_problems(reply, raised):
    from redis._parsers.base import BaseParser

    # As redis-py raises them: parsed into its own class where it has one, and annotated inside
    # a pipeline.
    error = BaseParser.parse_error(reply)
    for annotated in (error, type(error)(f"Command # 1 (HSETNX k f v) of pipeline caused error: {error}")):
        with pytest.raises(raised) as caught:
            with redis_errors():
                raise annotated
        assert type(caught.value) is raised, annotated


def test_a_redis_reply_that_means_a_bug_is_not_hidden():
    with pytest.raises(redis.exceptions.ResponseError):
        with redis_errors():
            raise redis.exceptions.ResponseError("ERR wrong number of arguments for 'hset' command")


@pytest.mark.redis
def test_a_redis_busy_with_a_script_is_503_for_the_rate_limiter_too(private_redis):
    private_redis.start()
    admin = redis.Redis(port=private_redis.port)
    admin.config_set("busy-reply-threshold", 100)
    app = create_app({"redis_url": private_redis.url, "rate_limit": "1000/second",
                      "key_prefix": f"busy-{uuid.uuid4().hex[:8]}"})
    client = app.test_client()
    assert client.get("/v1/sessions/x").status_code == 404
    spinner = threading.Thread(target=lambda: _ignore(lambda: redis.Redis(port=private_redis.port).eval(
        "while true do end", 0)), daemon=True)
    spinner.start()
    wait_until_busy(private_redis.url)  # past busy-reply-threshold: every other client now gets BUSY
    try:
        response = client.get("/v1/sessions/x")
        assert_problem(response, 503, "store-unavailable")
        assert response.headers["Retry-After"]
    finally:
        admin.script_kill()
        spinner.join(timeout=5)
    assert client.get("/v1/sessions/x").status_code == 404


def _ignore(call):
    try:
        call()
    except redis.exceptions.RedisError:
        pass


@pytest.mark.redis
def test_a_full_redis_is_507_for_writes_and_reads_still_work(private_redis):
    private_redis.start()
    app = create_app({"redis_url": private_redis.url, "rate_limit": "1000/second",
                      "key_prefix": f"full-{uuid.uuid4().hex[:8]}"})
    client = app.test_client()
    sid = new_session(client)["session_id"]
    before = snapshot(app)
    redis.Redis(port=private_redis.port).config_set("maxmemory", 1)  # noeviction: every write is OOM
    for response in (client.post("/v1/instances", json=QUAD), client.post("/v1/sessions", json={"instance": QUAD}),
                     client.post(f"/v1/sessions/{sid}/observations", json={"test": "ecg", "outcome": "normal"})):
        assert_problem(response, 507, "store-full")
        assert response.headers["Retry-After"]
    # The rate limiter cannot record a request either; it lets it through rather than refuse reads.
    assert client.get(f"/v1/sessions/{sid}").status_code == 200
    redis.Redis(port=private_redis.port).config_set("maxmemory", 0)
    assert snapshot(app) == before


# --- the contract says what the server enforces ---------------------------------------------------


@pytest.mark.parametrize("method", ["post", "delete"])
def test_an_empty_if_match_is_412_even_for_a_replay(app, method):
    client = app.test_client()
    sid = new_session(client)["session_id"]
    assert client.post(f"/v1/sessions/{sid}/observations", json={"test": "ecg", "outcome": "abnormal"}).status_code == 200
    before = snapshot(app)
    call = getattr(client, method)
    response = call(f"/v1/sessions/{sid}" + ("/observations" if method == "post" else ""),
                    json={"test": "ecg", "outcome": "abnormal"} if method == "post" else None,
                    headers={"If-Match": ""})
    assert_problem(response, 412, "precondition-failed")
    assert snapshot(app) == before


def test_the_contract_states_the_cross_field_rules():
    import jsonschema

    from service.api.openapi import build_spec
    from service.engine import POLICIES

    spec = build_spec()
    schemas = spec["components"]["schemas"]

    def valid(name, document):
        schema = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": schemas}}
        return jsonschema.Draft202012Validator(schema).is_valid(document)

    assert valid("SessionCreate", {"instance": TRIAGE}) and valid("SessionCreate", {"instance_id": "a" * 64})
    assert not valid("SessionCreate", {}) and not valid("SessionCreate", {"instance": None, "instance_id": None})
    assert not valid("SessionCreate", {"instance": TRIAGE, "policy": ""})
    assert valid("SessionCreate", {"instance": TRIAGE, "policy": sorted(POLICIES)[0]})
    assert not valid("ObservationsRequest", {}) and valid("ObservationsRequest", {"test": "a", "outcome": "b"})
    assert not valid("Instance", {"tests": TRIAGE["tests"], "hypotheses": None, "matrix": None})
    assert valid("Instance", TRIAGE)
    operations = [op for item in spec["paths"].values() for op in item.values()]
    for operation in operations:  # refusals below the application are documented everywhere
        assert {"400", "408", "413", "414", "431", "503"} <= set(operation["responses"]), operation["operationId"]

