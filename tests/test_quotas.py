"""Per-tenant quotas (instances, stored bytes, live sessions): the store contract over both
stores, then what a client sees over HTTP. Counted by hand: each test knows exactly how many
instances and sessions it stored, and the byte size from the codec's own encoding. Then the
per-worker caches, bounded by the bytes they really hold."""

from __future__ import annotations

import pytest

from api_support import NOISY, QUAD, TRIAGE, assert_problem
from schemas.instance import Instance
from service.app import create_app
from service.engine import compile_instance
from service.store import QuotaExceeded, Quotas, SessionRecord
from service.store.codec import encode, encoded_size
from service.sessions import Sessions
from service.store.cache import InstanceCache, resident_bytes
from service.store.memory import MemoryStore
from snapshots import snapshot


def compiled(payload):
    return compile_instance(Instance.model_validate(payload))


def record(sid: str, tenant: str = "public") -> SessionRecord:
    return SessionRecord(session_id=sid, instance_id="i", policy="ec2", tenant=tenant)


def binary(n: int, n_tests: int) -> dict:
    """Two outcomes per test: the store keeps the outcomes one bit per cell."""
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)],
            "matrix": [[(i >> (j % 12)) & 1 for j in range(n_tests)] for i in range(n)],
            "classes": [f"c{i % 7}" for i in range(n)]}


@pytest.mark.parametrize("payload", [TRIAGE, QUAD, NOISY, binary(2000, 100)], ids=["triage", "quad", "noisy", "binary"])
def test_encoded_size_is_exactly_what_the_codec_writes(payload):
    header, body = encode(compiled(payload))
    assert encoded_size(compiled(payload)) == len(header) + len(body)


def test_an_instance_of_exactly_the_byte_quota_is_stored(store_env):
    triage, quad = compiled(TRIAGE), compiled(QUAD)
    store = store_env.make(quotas=Quotas(stored_bytes=encoded_size(triage) + encoded_size(quad)))
    assert store.put_instance(triage) is True
    assert store.put_instance(quad) is True  # the quota reached exactly, not passed
    assert store.get_instance(quad.content_hash) is not None


def test_live_sessions_are_limited_per_tenant(store_env):
    store = store_env.make(session_ttl=1, quotas=Quotas(sessions=2))
    store.create_session(record("s1"))
    store.create_session(record("s2"))
    with pytest.raises(QuotaExceeded) as refused:
        store.create_session(record("s3"))
    assert refused.value.setting == "TENANT_MAX_SESSIONS" and refused.value.usage == 2
    assert store.get_session("s3") is None  # nothing written
    store.create_session(record("s3", tenant="clinic-b"))  # another tenant has its own quota
    assert store.delete_session("s1")
    store.create_session(record("s4"))  # a deleted session no longer counts
    store_env.elapse(1.3)  # both expire, and their quota entries 0.1 s later
    store.create_session(record("s5"))
    store.create_session(record("s6"))


def test_a_session_kept_alive_by_reads_still_counts(store_env):
    store = store_env.make(session_ttl=2, quotas=Quotas(sessions=1))
    store.create_session(record("s1"))
    store_env.elapse(1.2)
    assert store.get_session("s1") is not None  # slides its expiry
    store_env.elapse(1.2)  # past its first expiry, not its slid one
    with pytest.raises(QuotaExceeded):
        store.create_session(record("s2"))


def test_stored_instances_are_limited_per_tenant_by_count(store_env):
    store = store_env.make(quotas=Quotas(instances=1))
    triage, quad = compiled(TRIAGE), compiled(QUAD)
    assert store.put_instance(triage) is True
    assert store.put_instance(triage) is False  # the same content again costs nothing
    with pytest.raises(QuotaExceeded) as refused:
        store.put_instance(quad)
    assert refused.value.setting == "TENANT_MAX_INSTANCES"
    assert store.get_instance(quad.content_hash) is None
    assert store.put_instance(quad, tenant="clinic-b") is True


def test_a_deleted_instance_no_longer_counts(store_env):
    store = store_env.make(quotas=Quotas(instances=1))
    triage, quad = compiled(TRIAGE), compiled(QUAD)
    store.put_instance(triage)
    assert store.delete_instance(triage.content_hash) is True
    assert store.put_instance(quad) is True  # the freed place
    with pytest.raises(QuotaExceeded):
        store.put_instance(triage)


def test_stored_instances_are_limited_per_tenant_by_bytes(store_env):
    triage, quad = compiled(TRIAGE), compiled(QUAD)
    store = store_env.make(quotas=Quotas(stored_bytes=encoded_size(triage) + encoded_size(quad) - 1))
    assert store.put_instance(triage) is True
    with pytest.raises(QuotaExceeded) as refused:
        store.put_instance(quad)
    assert refused.value.setting == "TENANT_MAX_STORED_BYTES" and refused.value.usage == encoded_size(triage)


def test_quotas_over_http_name_the_variable_and_store_nothing(app_config):
    app = create_app({**app_config, "tenant_max_instances": 1, "tenant_max_sessions": 1})
    client = app.test_client()
    assert client.post("/v1/sessions", json={"instance": TRIAGE}).status_code == 201
    before = snapshot(app)
    body = assert_problem(client.post("/v1/sessions", json={"instance": TRIAGE}), 429, "quota-exceeded")
    assert "TENANT_MAX_SESSIONS" in body["detail"]
    body = assert_problem(client.post("/v1/instances", json=QUAD), 429, "quota-exceeded")
    assert "TENANT_MAX_INSTANCES" in body["detail"]
    assert snapshot(app) == before


def test_the_byte_quota_is_507_over_http(app_config):
    app = create_app({**app_config, "tenant_max_stored_bytes": encoded_size(compiled(TRIAGE)) + 10})
    client = app.test_client()
    assert client.post("/v1/instances", json=TRIAGE).status_code == 201
    before = snapshot(app)
    body = assert_problem(client.post("/v1/instances", json=QUAD), 507, "storage-quota-exceeded")
    assert "TENANT_MAX_STORED_BYTES" in body["detail"]
    assert snapshot(app) == before


# --- caches count what they hold ---------------------------------------------------------------


def label_heavy(n: int = 40, n_tests: int = 20, labels: int = 64) -> dict:
    """Arrays of a few kB, labels of a few hundred: the shape that took a worker to 822 MB."""
    return {"tests": [{"id": f"test-{j}-" + "t" * 150, "outcomes": [f"{k}-" + "o" * 150 for k in range(labels)]}
                      for j in range(n_tests)],
            "matrix": [[(i + j) % labels for j in range(n_tests)] for i in range(n)],
            "classes": [f"class-{i}-" + "c" * 150 for i in range(n)]}


def test_the_instance_cache_counts_labels_not_only_arrays():
    inst = compiled(label_heavy())
    characters = (sum(map(len, inst.test_ids)) + sum(len(o) for labels in inst.outcome_labels for o in labels)
                  + sum(map(len, inst.class_labels)) + sum(map(len, inst.hypothesis_ids)))
    assert resident_bytes(inst) >= inst.nbytes + characters  # every character is held somewhere
    assert characters > 10 * inst.nbytes
    cache = InstanceCache(max_bytes=10 * inst.nbytes)
    assert cache.put(("t", inst.content_hash), inst, 0.0) is False  # its arrays alone would fit


def ladder(n_tests: int) -> dict:
    tests = [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n_tests)]
    hypotheses = [{"id": "none", "class": "negative", "outcomes": {f"t{j}": "0" for j in range(n_tests)}}]
    hypotheses += [{"id": f"h{i}", "class": "positive",
                    "outcomes": {f"t{j}": "1" if j == i else "0" for j in range(n_tests)}} for i in range(n_tests)]
    return {"tests": tests, "hypotheses": hypotheses}


def test_the_step_cache_is_bounded_by_bytes():
    import orjson

    from schemas.api import SessionCreate

    budget = 60_000
    sessions = Sessions(MemoryStore(session_ttl=3600), session_ttl=3600, max_cells=10**6, max_compiled_bytes=10**8,
                        step_cache_bytes=budget)
    state = sessions.create(SessionCreate.model_validate({"instance": ladder(60)})).state
    steps = 0
    while not state["done"]:
        state = sessions.observe(state["session_id"], [(state["next_test"]["id"], "0")]).state
        steps += 1
    cache = sessions.steps.cache
    assert 0 < cache.nbytes <= budget
    assert len(cache) < steps  # long histories pushed the early steps out
    largest_json = len(orjson.dumps(state))
    assert cache.nbytes >= largest_json  # the last step is held: at least the size of its JSON


def test_one_tenant_at_its_byte_quota_leaves_half_of_composes_redis_for_everything_else():
    from service.api.reference import compose_maxmemory
    from service.settings import Settings

    assert 2 * Settings.model_fields["tenant_max_stored_bytes"].default <= compose_maxmemory()
