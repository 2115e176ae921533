"""The session-store contract (service/store/base.py), run against every store.

Each test uses a fresh store; Redis ones share the session's redis-server under a fresh key
prefix. Redis-only behaviours (stored bytes, key layout, outages, the worker cache) follow the
contract tests.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from schemas.instance import Instance
from service import engine
from service.store import SessionRecord, StoreUnavailable, VersionConflict

TRIAGE = {
    "tests": [
        {"id": "ecg", "cost": 2.0, "outcomes": ["normal", "abnormal"]},
        {"id": "troponin", "cost": 1.0},
    ],
    "hypotheses": [
        {"id": "mi", "class": "admit", "prior": 0.1, "outcomes": {"ecg": "abnormal", "troponin": "high"}},
        {"id": "angina", "class": "admit", "prior": 0.3, "outcomes": {"ecg": "abnormal", "troponin": "low"}},
        {"id": "reflux", "class": "home", "prior": 0.6, "outcomes": {"ecg": "normal", "troponin": "low"}},
    ],
}

NOISY = {**TRIAGE, "noise": 0.05}  # symmetric noise turns it into a likelihood instance


def compiled(payload=TRIAGE) -> engine.CompiledInstance:
    return engine.compile_instance(Instance.model_validate(payload))


def assert_same_instance(got: engine.CompiledInstance, want: engine.CompiledInstance) -> None:
    assert got.content_hash == want.content_hash
    for name in ("test_ids", "outcome_labels", "hypothesis_ids", "class_labels", "warnings"):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("costs", "class_index", "prior", "outcomes", "likelihood"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.shape == b.shape and np.array_equal(a, b), name


def session(sid: str = "s-1", tenant: str = "public", **fields) -> SessionRecord:
    return SessionRecord(session_id=sid, instance_id="i" * 64, policy="ec2", tenant=tenant,
                         created_at=1.0, **fields)


# --- Instances -------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [TRIAGE, NOISY], ids=["deterministic", "likelihood"])
def test_put_then_get_instance_round_trips_arrays_and_hash(store_env, payload):
    store = store_env.make()
    inst = compiled(payload)
    assert store.put_instance(inst) is True
    assert store.put_instance(compiled(payload)) is False  # same content, same id
    got = store.get_instance(inst.content_hash)
    assert got is not None
    assert_same_instance(got, inst)
    # A store freshly attached to the same backend (another worker) must decode it, not just
    # hand back the object it cached.
    if store_env.kind == "redis":
        assert_same_instance(store_env.make().get_instance(inst.content_hash), inst)


def test_unknown_instance_and_session_are_none(store_env):
    store = store_env.make()
    assert store.get_instance("0" * 64) is None
    assert store.get_session("nope") is None
    assert store.delete_session("nope") is False


def test_tenants_do_not_see_each_others_instances_or_sessions(store_env):
    store = store_env.make()
    inst = compiled()
    store.put_instance(inst, tenant="clinic-a")
    store.create_session(session("s-a", tenant="clinic-a"))

    assert store.get_instance(inst.content_hash, tenant="clinic-b") is None
    assert store.get_session("s-a", tenant="clinic-b") is None
    assert store.delete_session("s-a", tenant="clinic-b") is False
    with pytest.raises(VersionConflict):
        store.update_session(session("s-a", tenant="clinic-b", version=2), expected_version=1)
    # ... and none of that touched clinic-a's data.
    assert store.get_session("s-a", tenant="clinic-a").version == 1
    assert store.get_instance(inst.content_hash, tenant="clinic-a") is not None
    # Posting the same content as another tenant stores it for that tenant too.
    assert store.put_instance(inst, tenant="clinic-b") is True


# --- Sessions --------------------------------------------------------------------------------


def test_session_create_get_update_delete(store_env):
    store = store_env.make(session_ttl=3600)
    record = session(max_tests=5, max_cost=7.5, confidence=0.9, seed=42)
    store.create_session(record)
    got = store.get_session("s-1")
    assert replace(got, expires_at=0.0) == record
    assert got.expires_at > 0

    step = record.with_observations((("ecg", "abnormal"),))
    store.update_session(step, expected_version=1)
    got = store.get_session("s-1")
    assert got.version == 2 and got.observations == (("ecg", "abnormal"),)
    assert isinstance(got.observations[0], tuple)  # not a JSON list

    assert store.delete_session("s-1") is True
    assert store.get_session("s-1") is None
    assert store.delete_session("s-1") is False


def test_stale_version_raises_and_changes_nothing(store_env):
    store = store_env.make()
    record = session()
    store.create_session(record)
    store.update_session(record.with_observations((("ecg", "normal"),)), expected_version=1)

    stale = record.with_observations((("ecg", "abnormal"),))  # built from version 1
    with pytest.raises(VersionConflict):
        store.update_session(stale, expected_version=1)
    got = store.get_session("s-1")
    assert got.version == 2 and got.observations == (("ecg", "normal"),)


def test_update_of_a_missing_session_conflicts_and_creates_nothing(store_env):
    store = store_env.make()
    with pytest.raises(VersionConflict):
        store.update_session(session(version=2), expected_version=1)
    assert store.get_session("s-1") is None


def test_update_requires_the_next_version_number(store_env):
    store = store_env.make()
    store.create_session(session())
    with pytest.raises(ValueError):
        store.update_session(session(version=5), expected_version=1)
    assert store.get_session("s-1").version == 1


def test_creating_an_existing_session_id_with_other_content_conflicts(store_env):
    store = store_env.make()
    store.create_session(session(seed=1))
    store.create_session(session(seed=1))  # a retried identical create is harmless
    with pytest.raises(VersionConflict):
        store.create_session(session(seed=2))
    assert store.get_session("s-1").seed == 1


def test_concurrent_updates_on_one_version_have_exactly_one_winner(store_env):
    store = store_env.make()
    store.create_session(session())
    base = store.get_session("s-1")
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def contender(i: int) -> None:
        record = base.with_observations(((f"test-{i}", "yes"),))
        barrier.wait()
        try:
            store.update_session(record, expected_version=base.version)
            outcomes.append(f"won-{i}")
        except VersionConflict:
            outcomes.append("lost")

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o != "lost"]
    assert len(outcomes) == 20 and len(winners) == 1
    final = store.get_session("s-1")
    assert final.version == 2
    assert final.observations == ((f"test-{winners[0].split('-')[1]}", "yes"),)


# --- Time to live ----------------------------------------------------------------------------


def test_sessions_expire_after_the_ttl(store_env):
    store = store_env.make(session_ttl=1)
    store.create_session(session())
    store_env.elapse(1.2)
    assert store.get_session("s-1") is None
    with pytest.raises(VersionConflict):  # nothing to compare against any more
        store.update_session(session(version=2), expected_version=1)


def test_reads_and_writes_slide_the_session_ttl(store_env):
    store = store_env.make(session_ttl=2)
    record = session()
    store.create_session(record)
    store_env.elapse(1.3)
    assert store.get_session("s-1") is not None  # a read slides the TTL...
    store_env.elapse(1.3)  # ...so 2.6 s after creation it is still there
    store.update_session(record.with_observations((("ecg", "normal"),)), expected_version=1)
    store_env.elapse(1.3)  # ...and a write slides it too
    assert store.get_session("s-1").version == 2
    store_env.elapse(2.2)
    assert store.get_session("s-1") is None


def test_get_session_reports_when_it_expires(store_env):
    store = store_env.make(session_ttl=3600)
    store.create_session(session())
    now = store_env.clock() if store_env.kind == "memory" else __import__("time").time()
    got = store.get_session("s-1")
    assert now + 3600 - 5 <= got.expires_at <= now + 3600 + 5


def test_instances_outlive_the_sessions_that_use_them(store_env):
    store = store_env.make(session_ttl=1)
    inst = compiled()
    store.put_instance(inst)
    store_env.elapse(1.2)  # a session created now lives until t = 2.2 at least
    assert store.get_instance(inst.content_hash) is not None
    store_env.elapse(2.5)  # unused for twice the session TTL: gone
    assert store.get_instance(inst.content_hash) is None


# --- Idempotency keys ------------------------------------------------------------------------


def test_idempotency_key_binds_once_per_tenant(store_env):
    store = store_env.make()
    assert store.claim_idempotency_key("retry-me", "s-1") is None
    assert store.claim_idempotency_key("retry-me", "s-2") == "s-1"
    assert store.claim_idempotency_key("retry-me", "s-3") == "s-1"
    assert store.claim_idempotency_key("retry-me", "s-9", tenant="clinic-b") is None


def test_idempotency_keys_expire_with_sessions(store_env):
    store = store_env.make(session_ttl=1)
    assert store.claim_idempotency_key("k", "s-1") is None
    store_env.elapse(1.2)
    assert store.claim_idempotency_key("k", "s-2") is None


def test_ping_answers_when_the_store_is_up(store_env):
    store_env.make().ping()
