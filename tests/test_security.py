"""Security: API keys and tenants, rate limits, worker-protecting limits, CORS, and what
is trusted when read back from Redis. Over both stores unless a test says otherwise."""

from __future__ import annotations

import base64
import hmac
import re
import time
from pathlib import Path

import pytest
import redis

from api_support import NOISY, TRIAGE, assert_problem, new_session
from conftest import FakeClock
from service.api import auth
from service.app import create_app
from service.settings import ConfigurationError, load_settings
from service.store.memory import MemoryStore
from snapshots import snapshot

KEY_A = "alpha-key-0123456789abcdef"
KEY_B = "bravo-key-0123456789abcdef"
AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
AUTH_B = {"Authorization": f"Bearer {KEY_B}"}


@pytest.fixture
def keyed_app(app_config):
    return create_app({**app_config, "api_keys": f"alpha:{KEY_A}, bravo:{KEY_B}"})


# --- API keys ------------------------------------------------------------------------------


def test_keys_are_off_by_default(client):
    assert client.post("/v1/instances", json=TRIAGE).status_code == 201


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer ", f"Basic {KEY_A}", f"Bearer {KEY_A}x",
                                           f"Bearer {KEY_A[:-1]}", "Bearer " + "x" * 5000, f"{KEY_A}"])
def test_every_v1_route_needs_a_valid_bearer_key(keyed_app, authorization):
    client = keyed_app.test_client()
    headers = {} if authorization is None else {"Authorization": authorization}
    before = snapshot(keyed_app)
    for method, path, body in [("post", "/v1/instances", TRIAGE), ("get", "/v1/instances/" + "0" * 64, None),
                               ("post", "/v1/sessions", {"instance": TRIAGE}), ("get", "/v1/sessions/x", None),
                               ("delete", "/v1/sessions/x", None), ("post", "/v1/sessions/x/observations", {}),
                               ("post", "/v1/select", {"instance": TRIAGE}), ("get", "/v1/no-such-route", None)]:
        response = getattr(client, method)(path, json=body, headers=headers)
        assert_problem(response, 401, "unauthorized")
        challenge = response.headers["WWW-Authenticate"]
        assert challenge.startswith('Bearer realm="edgecut"')
        # RFC 6750 §3.1: error="invalid_token" only when a token was actually presented.
        presented = auth.bearer_token(authorization) is not None
        assert ('error="invalid_token"' in challenge) == presented
    assert snapshot(keyed_app) == before


def test_operations_routes_stay_open(keyed_app):
    client = keyed_app.test_client()
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.yaml"):
        assert client.get(path).status_code == 200, path


def test_another_tenant_gets_404_never_403_and_changes_nothing(keyed_app):
    client = keyed_app.test_client()
    instance_id = client.post("/v1/instances", json=TRIAGE, headers=AUTH_A).get_json()["instance_id"]
    sid = client.post("/v1/sessions", json={"instance_id": instance_id}, headers=AUTH_A).get_json()["session_id"]
    before = snapshot(keyed_app)
    attempts = [
        client.get(f"/v1/instances/{instance_id}", headers=AUTH_B),
        client.post("/v1/sessions", json={"instance_id": instance_id}, headers=AUTH_B),
        client.post("/v1/select", json={"instance_id": instance_id}, headers=AUTH_B),
        client.get(f"/v1/sessions/{sid}", headers=AUTH_B),
        client.post(f"/v1/sessions/{sid}/observations", json={"test": "ecg", "outcome": "normal"}, headers=AUTH_B),
        client.delete(f"/v1/sessions/{sid}", headers=AUTH_B),
    ]
    for response in attempts:
        body = assert_problem(response, 404, response.get_json()["type"].rsplit(":", 1)[1])
        assert body["type"] in ("urn:edgecut:problem:instance-not-found", "urn:edgecut:problem:session-not-found")
    # No existence oracle: B's answer for A's session is the answer for a session nobody has.
    unknown = client.get("/v1/sessions/never-existed", headers=AUTH_B).get_json()
    assert {k: v for k, v in attempts[3].get_json().items() if k not in ("detail", "request_id")} == \
        {k: v for k, v in unknown.items() if k not in ("detail", "request_id")}
    assert snapshot(keyed_app) == before
    assert client.get(f"/v1/sessions/{sid}", headers=AUTH_A).status_code == 200


def test_the_same_content_is_stored_per_tenant(keyed_app):
    client = keyed_app.test_client()
    assert client.post("/v1/instances", json=TRIAGE, headers=AUTH_A).status_code == 201
    assert client.post("/v1/instances", json=TRIAGE, headers=AUTH_B).status_code == 201  # not "already there"


def test_only_digests_are_kept_and_hashed_keys_are_accepted(tmp_path, app_config):
    hashed = auth.digest_of(KEY_B)
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# clinic keys\nbravo:{hashed}  # rotated 2024\n\n{KEY_A}\n")
    app = create_app({**app_config, "api_keys_file": str(keys_file)})
    ring = app.extensions["edgecut.security"]["keyring"]
    assert KEY_A.encode() not in repr(ring).encode() and KEY_B not in repr(ring)
    assert all(len(digest) == 32 for digest, _ in ring.entries)
    client = app.test_client()
    assert client.post("/v1/instances", json=TRIAGE, headers=AUTH_B).status_code == 201
    assert ring.tenant_of(KEY_A) == "public"  # a bare key belongs to the default tenant
    assert client.post("/v1/instances", json=TRIAGE, headers={"Authorization": f"bearer {KEY_A}"}).status_code == 201


def test_every_digest_is_compared_in_constant_time(monkeypatch):
    ring = auth.load_keyring(load_settings({"api_keys": f"a:{KEY_A},b:{KEY_B},c:{'c' * 32}"}))
    calls = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert ring.tenant_of(KEY_A) == "a"
    assert len(calls) == 3  # no early exit on the first (matching) entry
    assert ring.tenant_of("wrong") is None and len(calls) == 6


@pytest.mark.parametrize("config, message", [
    ({"api_keys": "short"}, "at least 16"),
    ({"api_keys": "bad tenant:" + "k" * 20}, "tenant"),
    ({"api_keys": "alpha\n:" + "k" * 20}, "tenant"),  # a trailing newline is not part of a name
    ({"api_keys": f"a:{KEY_A},b:{KEY_A}"}, "more than once"),
    ({"api_keys": " , "}, "holds no key"),
    ({"api_keys_file": "/nonexistent/keys"}, "cannot read"),
    ({"rate_limit": "ten per second"}, "RATE_LIMIT"),
    ({"max_json_depth": 1}, "MAX_JSON_DEPTH"),
    ({"max_label_length": 500}, "MAX_LABEL_LENGTH"),
])
def test_bad_security_configuration_fails_at_start(config, message):
    with pytest.raises(ConfigurationError, match=message):
        create_app({"redis_url": None, **config})


def test_session_ids_carry_at_least_128_random_bits(client):
    ids = {new_session(client)["session_id"] for _ in range(64)}
    assert len(ids) == 64
    for sid in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]+", sid)
        assert len(base64.urlsafe_b64decode(sid + "=" * (-len(sid) % 4))) * 8 >= 128


# --- rate limits ---------------------------------------------------------------------------


def test_rate_limit_per_tenant_answers_429_with_retry_after(app_config):
    app = create_app({**app_config, "api_keys": f"alpha:{KEY_A}, bravo:{KEY_B}", "rate_limit": "2/second",
                      "rate_limit_burst": 3})
    client = app.test_client()
    statuses = [client.get("/v1/sessions/x", headers=AUTH_A).status_code for _ in range(5)]
    assert statuses == [404, 404, 404, 429, 429]
    limited = client.get("/v1/sessions/x", headers=AUTH_A)
    body = assert_problem(limited, 429, "rate-limited")
    assert limited.headers["Retry-After"] == "1" and "RATE_LIMIT" in body["detail"]
    assert client.get("/v1/sessions/x", headers=AUTH_B).status_code == 404  # another tenant's budget
    assert client.get("/healthz").status_code == 200


def test_a_limited_tenant_conforms_again_one_emission_interval_later():
    clock = FakeClock()  # the limiter is timed by the store's clock
    app = create_app({"redis_url": None, "rate_limit": "2/second", "rate_limit_burst": 3},
                     store=MemoryStore(session_ttl=3600, clock=clock))
    client = app.test_client()
    assert [client.get("/v1/sessions/x").status_code for _ in range(4)] == [404, 404, 404, 429]
    clock.advance(0.25)  # half the emission interval (0.5 s)
    assert client.get("/v1/sessions/x").status_code == 429
    clock.advance(0.25)
    assert [client.get("/v1/sessions/x").status_code for _ in range(2)] == [404, 429]  # one more, no burst


@pytest.mark.redis
def test_the_redis_rate_limit_is_shared_by_every_worker(redis_server):
    # Two apps over one Redis are two gunicorn workers: one budget between them.
    config = {"redis_url": redis_server.url, "key_prefix": f"rl-{time.time_ns()}", "rate_limit": "4/minute"}
    workers = [create_app(config).test_client(), create_app(config).test_client()]
    statuses = [workers[i % 2].get("/v1/sessions/x").status_code for i in range(6)]
    assert statuses == [404, 404, 404, 404, 429, 429]
    retry = int(workers[0].get("/v1/sessions/x").headers["Retry-After"])
    assert 1 <= retry <= 15  # 4/minute: the next request conforms 15 s after the burst began


# --- limits that protect the workers -------------------------------------------------------

MANY_OUTCOMES = {"tests": [{"id": "t", "outcomes": [str(i) for i in range(5)]}],
                 "hypotheses": [{"id": f"h{i}", "class": f"c{i}", "outcomes": {"t": str(i)}} for i in range(5)]}


@pytest.mark.parametrize("setting, value, path, body", [
    ("max_json_depth", 4, "/v1/select", {"instance": {"tests": [{"id": "a", "outcomes": ["0", "1"]}],
                                                      "hypotheses": [{"id": "h", "outcomes": {"a": "0"}}]}}),
    ("max_classes", 4, "/v1/instances", MANY_OUTCOMES),
    ("max_outcomes_per_test", 4, "/v1/instances", MANY_OUTCOMES),
    ("max_outcomes_per_test", 4, "/v1/instances",
     {"tests": [{"id": "t"}], "hypotheses": [{"id": f"h{i}", "outcomes": {"t": f"o{i}"}} for i in range(5)]}),
    ("max_outcomes_per_test", 4, "/v1/sessions",
     {"instance": {"tests": [{"id": "t"}], "matrix": [[4], [0]], "classes": ["x", "y"]}}),
    ("max_label_length", 8, "/v1/instances", {"tests": [{"id": "t"}], "hypotheses": [
        {"id": "myocardial-infarction", "outcomes": {"t": "0"}}, {"id": "reflux", "outcomes": {"t": "1"}}]}),
    ("max_observations_per_request", 2, "/v1/select",
     {"instance": TRIAGE, "observations": [{"test": "ecg", "outcome": "normal"}] * 3}),
    ("max_cells", 4, "/v1/instances", MANY_OUTCOMES),  # 5 × 1 cells
    ("max_body_bytes", 1024, "/v1/instances", {**TRIAGE, "pad": "x" * 2000}),
])
def test_each_limit_is_413_naming_it_and_stores_nothing(app_config, setting, value, path, body):
    app = create_app({**app_config, setting: value})
    client = app.test_client()
    before = snapshot(app)
    response = client.post(path, json=body)
    assert response.status_code == 413, response.get_data(as_text=True)
    problem = response.get_json()
    assert response.mimetype == "application/problem+json"
    named = setting.upper() in problem["detail"] or (setting == "max_cells" and "limit is 4" in problem["detail"]) \
        or (setting == "max_body_bytes" and "1024" in problem["detail"])
    assert named, problem
    assert snapshot(app) == before


def test_nesting_depth_ignores_brackets_inside_strings():
    from service.api.limits import json_depth

    assert json_depth(b'{"a": "[[[[[[[[[[[["}') == 1
    assert json_depth(b'{"a": "\\"[[[[", "b": [[1]]}') == 3
    assert json_depth(b"[" * 100 + b"]" * 100) == 100
    assert json_depth(b'"just a string"') == 0


def test_the_default_depth_admits_every_real_shape(client):
    # The deepest legitimate body: a session with an inline likelihood instance (depth 6).
    assert client.post("/v1/sessions", json={"instance": NOISY}).status_code == 201


# --- CORS ----------------------------------------------------------------------------------


def test_cors_is_off_by_default(client):
    response = client.get("/healthz", headers={"Origin": "https://triage.example"})
    assert "Access-Control-Allow-Origin" not in response.headers


def test_cors_allows_configured_origins_and_exposes_etag_and_retry_after(app_config):
    app = create_app({**app_config, "cors_origins": "https://triage.example", "api_keys": KEY_A})
    client = app.test_client()
    preflight = client.options("/v1/sessions", headers={
        "Origin": "https://triage.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, if-match, idempotency-key"})
    assert preflight.status_code == 200  # no key needed for a preflight
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://triage.example"
    assert {"authorization", "if-match", "idempotency-key"} <= \
        {h.strip().lower() for h in preflight.headers["Access-Control-Allow-Headers"].split(",")}
    created = client.post("/v1/sessions", json={"instance": TRIAGE},
                          headers={"Origin": "https://triage.example", "Authorization": f"Bearer {KEY_A}"})
    exposed = {h.strip() for h in created.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"ETag", "Retry-After"} <= exposed
    other = client.get("/v1/sessions/x", headers={"Origin": "https://evil.example", "Authorization": f"Bearer {KEY_A}"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_a_preflight_allows_every_method_a_guarded_route_answers(app_config):
    from service.api.security import PROTECTED_PREFIXES

    app = create_app({**app_config, "cors_origins": "https://triage.example"})
    client = app.test_client()
    guarded = [rule for rule in app.url_map.iter_rules() if rule.rule.startswith(PROTECTED_PREFIXES)]
    assert {prefix for prefix in PROTECTED_PREFIXES if any(r.rule.startswith(prefix) for r in guarded)} == \
        set(PROTECTED_PREFIXES)  # the API and each façade have routes here
    for rule in guarded:
        path = re.sub(r"<(?:\w+:)?(\w+)>", "x", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            preflight = client.options(path, headers={"Origin": "https://triage.example",
                                                      "Access-Control-Request-Method": method})
            allowed = {m.strip() for m in preflight.headers.get("Access-Control-Allow-Methods", "").split(",")}
            assert method in allowed, (rule.rule, method, dict(preflight.headers))


# --- what is read back from Redis ----------------------------------------------------------


def test_the_stores_never_unpickle_or_evaluate():
    files = sorted((Path(__file__).resolve().parent.parent / "service" / "store").glob("*.py"))
    assert {"codec.py", "memory.py", "redis_store.py"} <= {f.name for f in files}  # from any directory
    source = "\n".join(p.read_text() for p in files)
    for forbidden in ("import pickle", "pickle.loads", "marshal", "eval(", "exec(", "allow_pickle=True",
                      "yaml.load(", "shelve"):
        assert forbidden not in source, forbidden


def _corruptions(header: bytes, body: bytes):
    import orjson

    parsed = orjson.loads(header)
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0x01
    as_object = {**parsed, "arrays": [{**a, "dtype": "|O"} for a in parsed["arrays"]]}
    other_hash = {**parsed, "content_hash": "f" * 64}
    wrong_shape = {**parsed, "arrays": [{**a, "shape": [a["shape"][0] + 1, *a["shape"][1:]]} if a["name"] == "prior"
                                        else a for a in parsed["arrays"]]}
    import pickle  # only to build a hostile payload: it must be refused, never loaded

    return {
        "one bit flipped in the arrays": (header, bytes(flipped)),
        "body truncated": (header, body[:-8]),
        "body extended": (header, body + b"\0" * 8),
        "dtype object (pickle)": (orjson.dumps(as_object), body),
        "header of another instance": (orjson.dumps(other_hash), body),
        "shape disagrees with labels": (orjson.dumps(wrong_shape), body),
        "header is a pickle": (pickle.dumps({"format": "edgecut.compiled-instance/1"}), body),
        "header is not JSON": (b"\x80\x04not json", body),
    }


@pytest.mark.redis
def test_corrupt_instance_bytes_in_redis_are_refused_not_used(redis_server, caplog):
    config = {"redis_url": redis_server.url, "key_prefix": f"corrupt-{time.time_ns()}"}
    writer = create_app(config)
    client = writer.test_client()
    state = new_session(client)
    instance_id = client.post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
    store = writer.extensions["edgecut"].store
    key = store.instance_key(instance_id)
    direct = redis.Redis.from_url(redis_server.url)
    header, body = direct.hget(key, "header"), direct.hget(key, "body")
    for name, (bad_header, bad_body) in _corruptions(header, body).items():
        direct.hset(key, mapping={"header": bad_header, "body": bad_body})
        # A fresh worker: nothing cached, so it must read (and check) the bytes in Redis.
        fresh = create_app(config).test_client()
        # The first read finds the bytes corrupt and drops them: the instance reads as gone (404;
        # 410 for its session, and for an observation to it), never a 500 ...
        assert_problem(fresh.get(f"/v1/instances/{instance_id}"), 404, "instance-not-found")
        assert not direct.exists(key), name
        direct.hset(key, mapping={"header": bad_header, "body": bad_body})
        fresh = create_app(config).test_client()
        assert_problem(fresh.post(f"/v1/sessions/{state['session_id']}/observations",
                                  json={"test": "ecg", "outcome": "abnormal"}), 410, "instance-expired")
        assert_problem(fresh.get(f"/v1/sessions/{state['session_id']}"), 410, "instance-expired")
        assert not direct.exists(key), name
    # ... and posting it again repairs every session that refers to it.
    fresh = create_app(config).test_client()
    assert fresh.post("/v1/instances", json=TRIAGE).status_code == 201
    assert fresh.get(f"/v1/instances/{instance_id}").status_code == 200
    # Nothing was recorded while the instance was corrupt.
    assert fresh.get(f"/v1/sessions/{state['session_id']}").get_json()["history"] == []
    direct.close()


@pytest.mark.redis
def test_a_corrupt_session_record_is_a_problem_not_a_traceback(redis_server):
    config = {"redis_url": redis_server.url, "key_prefix": f"corrupt-{time.time_ns()}"}
    app = create_app(config)
    client = app.test_client()
    sid = new_session(client)["session_id"]
    key = app.extensions["edgecut"].store.session_key(sid)
    direct = redis.Redis.from_url(redis_server.url)
    for record in (b"not json", b'{"session_id": 1}', b"[]", b'{"__reduce__": "os.system"}'):
        direct.hset(key, "record", record)
        response = client.get(f"/v1/sessions/{sid}")
        assert response.status_code >= 400 and response.mimetype == "application/problem+json"
        assert "Traceback" not in response.get_data(as_text=True)
    direct.close()
