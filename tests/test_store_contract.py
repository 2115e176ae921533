"""The session-store contract (service/store/base.py), run against every store.

Each test uses a fresh store over each of conftest's STORAGE_MODES: in memory, one redis-server,
and a local Redis Cluster of 3 masters and 3 replicas; Redis ones share the run's server (or
cluster) under a fresh key prefix. Redis-only behaviours (stored bytes, key layout, outages, the worker cache) follow the
contract tests.
"""

from __future__ import annotations

import random
import re
import sys
import threading
import time
import zlib
from dataclasses import replace

import numpy as np
import orjson
import pytest
import redis
from api_support import TRIAGE
from conftest import free_port

from tests.builders import compile_wire, section3
from service import engine
from service.store import Quotas, SessionRecord, StoreUnavailable, VersionConflict, codec
from service.store.cache import InstanceCache, _str_bytes, resident_bytes
from service.store.redis_store import RedisStore

NOISY = {**TRIAGE, "noise": 0.05}  # symmetric noise turns it into a likelihood instance


def compiled(payload=TRIAGE) -> engine.CompiledInstance:
    return compile_wire(payload)


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
    if store_env.kind != "memory":
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


def variant(i: int) -> engine.CompiledInstance:
    """Distinct content (and so a distinct id) per i: the triage instance with other priors."""
    hypotheses = [{**h, "prior": h["prior"] + i} for h in TRIAGE["hypotheses"]]
    return compiled({**TRIAGE, "hypotheses": hypotheses})


def test_instances_are_listed_in_creation_order_a_page_at_a_time(store_env):
    store = store_env.make()
    made = []
    for i in range(5):
        made.append(variant(i))
        store.put_instance(made[-1])
        store_env.elapse(0.01)  # distinct creation times
    store.put_instance(made[0])  # storing again keeps its first place
    store.put_instance(variant(9), tenant="clinic-b")

    pages, cursor = [], None
    while True:
        page, cursor = store.list_instances(limit=2, after=cursor)
        pages.append(page)
        if cursor is None:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    listed = [item for page in pages for item in page]
    assert [item.instance_id for item in listed] == [inst.content_hash for inst in made]
    assert [item.created_at for item in listed] == sorted(item.created_at for item in listed)
    first = listed[0]
    assert (first.kind, first.n_hypotheses, first.n_tests, first.n_classes) == ("deterministic", 3, 2, 2)
    everything, cursor = store.list_instances(limit=5)
    assert cursor is None and len(everything) == 5  # an exact fit has no next page
    assert [item.instance_id for item in store.list_instances(tenant="clinic-b")[0]] == [variant(9).content_hash]
    assert store.list_instances(tenant="nobody") == ([], None)


def test_a_rate_limiter_counts_per_tenant_and_per_scope_where_the_store_keeps_its_data(store_env):
    from service.store.ratelimit import AUTH_FAILURES, REQUESTS, parse_rate

    store = store_env.make()
    rate = parse_rate("2/minute")  # one request per 30 s, bursts of 2
    requests, failures = store.rate_limiter(rate, REQUESTS), store.rate_limiter(rate, AUTH_FAILURES)
    assert requests.wait_seconds("clinic-a", count=False) == 0  # asking counts nothing
    assert [requests.wait_seconds("clinic-a") for _ in range(2)] == [0, 0]
    assert 29 < requests.wait_seconds("clinic-a") <= 30  # until the burst's first emission is over
    assert requests.wait_seconds("clinic-b") == 0  # another tenant's budget
    assert failures.wait_seconds("clinic-a") == 0  # another scope's
    if store_env.kind != "memory":  # a second worker over the same Redis shares the budget
        assert store_env.make().rate_limiter(rate, REQUESTS).wait_seconds("clinic-a") > 29


def test_a_cursor_is_exactly_a_listing_position_and_nothing_after_it():
    from service.app import create_app
    from service.store.base import LISTING_CURSOR, listing_position

    position = listing_position(1_700_000_000.0, "a" * 64)
    assert LISTING_CURSOR.match(position)
    for forged in (position + "\n", position + "\r\n", " " + position, position[:-1]):
        assert not LISTING_CURSOR.match(forged), forged
    client = create_app({"redis_url": None}).test_client()
    assert client.get("/v1/instances", query_string={"cursor": position}).status_code == 200
    assert client.get("/v1/instances", query_string={"cursor": position + "\n"}).status_code == 400


def test_a_deleted_instance_is_gone_remembered_and_can_be_stored_again(store_env):
    store = store_env.make()
    inst, kept = variant(0), variant(1)
    store.put_instance(inst)
    store.put_instance(kept)
    store.put_instance(inst, tenant="clinic-b")
    assert store.instance_deleted(inst.content_hash) is False

    assert store.delete_instance(inst.content_hash) is True
    assert store.get_instance(inst.content_hash) is None
    assert store.instance_deleted(inst.content_hash) is True
    assert [i.instance_id for i in store.list_instances()[0]] == [kept.content_hash]
    assert store.delete_instance(inst.content_hash) is False  # nothing left to delete
    assert store.instance_deleted(inst.content_hash) is True  # ... and still remembered
    # Another tenant's copy of the same content is untouched.
    assert store.get_instance(inst.content_hash, tenant="clinic-b") is not None
    assert store.instance_deleted(inst.content_hash, tenant="clinic-b") is False
    if store_env.kind == "redis":  # nor does another worker's cache serve it
        assert store_env.make().get_instance(inst.content_hash) is None

    assert store.put_instance(inst) is True  # stored anew
    assert store.instance_deleted(inst.content_hash) is False
    assert [i.instance_id for i in store.list_instances()[0]] == [kept.content_hash, inst.content_hash]
    assert store.delete_instance("0" * 64) is False and store.instance_deleted("0" * 64) is False


def test_expired_instances_leave_the_listing(store_env):
    store = store_env.make(session_ttl=1)  # instances live 2 s
    store.put_instance(variant(0))
    store_env.elapse(1.0)
    store.put_instance(variant(1))
    store_env.elapse(1.3)  # the first has expired, the second has not
    assert [i.instance_id for i in store.list_instances()[0]] == [variant(1).content_hash]


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


def test_skips_exclusions_and_batch_size_round_trip(store_env):
    store = store_env.make()
    record = session(exclude_tests=("troponin",), batch_size=3)
    store.create_session(record)
    step = record.with_observations((("ecg", "abnormal"), ("troponin", None)))
    store.update_session(step, expected_version=1)
    reader = store_env.make() if store_env.kind == "redis" else store  # another worker reads it back
    got = reader.get_session("s-1")
    assert replace(got, expires_at=0.0) == replace(step, expires_at=0.0)
    assert got.exclude_tests == ("troponin",) and isinstance(got.exclude_tests, tuple)


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


def test_a_recalled_record_is_a_guess_that_only_a_compare_and_set_confirms(store_env):
    mine = store_env.make()
    theirs = store_env.make() if store_env.kind != "memory" else mine  # another worker, same data
    record = session()
    assert mine.recall_session("s-1") is None  # never seen
    mine.create_session(record)
    recalled = mine.recall_session("s-1")  # a store may remember nothing, never something else
    assert recalled is None or replace(recalled, expires_at=0.0) == record
    assert mine.recall_session("s-1", tenant="other") is None

    theirs.update_session(theirs.get_session("s-1").with_observations((("ecg", "normal"),)), expected_version=1)
    with pytest.raises(VersionConflict):  # what mine remembers is stale now
        mine.update_session(record.with_observations((("ecg", "abnormal"),)), expected_version=1)
    assert theirs.get_session("s-1").observations == (("ecg", "normal"),)
    learnt = mine.recall_session("s-1")  # the lost compare-and-set may tell it what is stored
    assert learnt is None or (learnt.version, learnt.observations) == (2, (("ecg", "normal"),))

    assert theirs.delete_session("s-1") is True
    with pytest.raises(VersionConflict):
        mine.update_session(replace(record, version=3), expected_version=2)
    assert mine.recall_session("s-1") is None and mine.get_session("s-1") is None


# --- Time to live ----------------------------------------------------------------------------
# Redis's waits are real. "Still there" checks get ~0.8 s of slack (a loaded machine may stall
# between steps); "gone" checks need little (a stall only makes a key more expired), so the TTLs
# are the smallest the checks allow.


def test_sessions_expire_after_the_ttl(store_env):
    store = store_env.make(session_ttl=1)
    store.create_session(session())
    store_env.elapse(1.2)
    assert store.get_session("s-1") is None
    with pytest.raises(VersionConflict):  # nothing to compare against any more
        store.update_session(session(version=2), expected_version=1)


def test_reads_and_writes_slide_the_session_ttl(store_env):
    # TTL 2 s with steps of 1.2 s: 0.8 s of slack for a loaded machine between steps.
    store = store_env.make(session_ttl=2)
    record = session()
    store.create_session(record)
    store_env.elapse(1.2)
    assert store.get_session("s-1") is not None  # a read slides the TTL...
    store_env.elapse(1.2)  # ...so 2.4 s after creation it is still there
    store.update_session(record.with_observations((("ecg", "normal"),)), expected_version=1)
    store_env.elapse(1.2)  # ...and a write slides it too
    assert store.get_session("s-1").version == 2
    store_env.elapse(2.2)
    assert store.get_session("s-1") is None


def test_get_session_reports_when_it_expires(store_env):
    store = store_env.make(session_ttl=3600)
    store.create_session(session())
    now = store_env.clock() if store_env.kind == "memory" else time.time()
    got = store.get_session("s-1")
    assert now + 3600 - 5 <= got.expires_at <= now + 3600 + 5


def test_instances_outlive_the_sessions_that_use_them(store_env):
    store = store_env.make(session_ttl=1)
    inst = compiled()
    store.put_instance(inst)
    store_env.elapse(1.2)  # past a session's TTL; a session created now lives until t = 2.2 at least
    assert store.get_instance(inst.content_hash) is not None
    store_env.elapse(2.2)  # unused for more than twice the session TTL: gone
    assert store.get_instance(inst.content_hash) is None


# --- Idempotency keys ------------------------------------------------------------------------


def test_idempotency_key_binds_once_per_tenant(store_env):
    store = store_env.make()
    assert store.claim_idempotency_key("retry-me", "s-1") is None
    assert store.claim_idempotency_key("retry-me", "s-2") == "s-1"
    assert store.claim_idempotency_key("retry-me", "s-3") == "s-1"
    assert store.claim_idempotency_key("retry-me", "s-9", tenant="clinic-b") is None


def test_reading_an_idempotency_binding_binds_nothing(store_env):
    store = store_env.make()
    assert store.idempotency_binding("look") is None
    assert store.claim_idempotency_key("look", "s-1") is None  # the look did not bind it
    assert store.idempotency_binding("look") == "s-1"
    assert store.idempotency_binding("look", tenant="clinic-b") is None


def test_idempotency_keys_expire_with_sessions(store_env):
    store = store_env.make(session_ttl=1)
    assert store.claim_idempotency_key("k", "s-1") is None
    store_env.elapse(1.2)
    assert store.claim_idempotency_key("k", "s-2") is None


def test_a_shared_value_is_the_first_one_stored_for_every_worker(store_env):
    store = store_env.make()
    assert store.get_value("auto:x") is None
    assert store.put_value("auto:x", b"first") == b"first"
    assert store.put_value("auto:x", b"second") == b"first"  # a racing worker adopts the first
    assert store.get_value("auto:x") == b"first"
    assert store.get_value("auto:x", tenant="clinic-b") is None
    assert store.put_value("auto:x", b"theirs", tenant="clinic-b") == b"theirs"
    if store_env.kind != "memory":  # another worker on the same Redis sees it
        assert store_env.make().get_value("auto:x") == b"first"


def test_shared_values_expire_with_instances(store_env):
    store = store_env.make(session_ttl=1)  # instances, and shared values, live 2 s
    store.put_value("auto:y", b"v")
    store_env.elapse(1.2)
    assert store.get_value("auto:y") == b"v"
    store_env.elapse(1.0)
    assert store.get_value("auto:y") is None
    assert store.put_value("auto:y", b"w") == b"w"


def test_ping_answers_when_the_store_is_up(store_env):
    store_env.make().ping()


def test_warm_opens_connections_and_changes_nothing_stored(store_env):
    store = store_env.make()
    store.warm()
    store.warm()  # twice: no new connections, no error
    if store_env.kind != "memory":
        for pool in (store._redis, store._bulk):
            nodes = (pool._client.get_primaries() if store_env.kind == "cluster"
                     else [pool._client])
            for node in nodes:
                client = node.redis_connection if store_env.kind == "cluster" else node
                assert client.connection_pool._created_connections == 1
        assert store.list_instances() == ([], None)
        nobody = RedisStore(f"redis://127.0.0.1:{free_port()}/0", session_ttl=60, key_prefix="nobody",
                            cluster=store_env.kind == "cluster")
        with pytest.raises(StoreUnavailable):
            nobody.warm()
        nobody.close()


def test_ping_fails_when_the_store_cannot_answer(store_env, monkeypatch):
    store = store_env.make()
    if store_env.kind != "memory":
        from conftest import free_port

        nobody = RedisStore(f"redis://127.0.0.1:{free_port()}/0", session_ttl=60, key_prefix="nobody",
                            cluster=store_env.kind == "cluster")
        with pytest.raises(StoreUnavailable):
            nobody.ping()
        nobody.close()
        return
    # The memory store is wedged when an operation holds its lock: ping must say so, not wait.
    from service.store import memory

    monkeypatch.setattr(memory, "PING_TIMEOUT", 0.05)
    with store._lock:
        with pytest.raises(StoreUnavailable):
            store.ping()
    store.ping()


def test_every_store_is_picked_by_create_store_and_made_by_this_suite():
    """A SessionStore written under service/store/ fails here until create_store can pick it and
    conftest's StoreUnderTest makes it for one of STORAGE_MODES, so the contract above runs on it
    (docs/architecture.md: adding a store)."""
    import importlib
    import inspect
    import pkgutil

    import service.store as package
    from conftest import STORAGE_MODES, StoreUnderTest
    from service.store import SessionStore, create_store

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    stores, pending = set(), [SessionStore]
    while pending:
        for subclass in pending.pop().__subclasses__():
            pending.append(subclass)
            if not inspect.isabstract(subclass) and subclass.__module__.startswith(package.__name__ + "."):
                stores.add(subclass)
    assert len(stores) >= 2
    made, picked = inspect.getsource(StoreUnderTest.make), inspect.getsource(create_store)
    for store in stores:
        assert re.search(rf"\b{store.__name__}\(", made), f"StoreUnderTest.make never makes {store.__name__}"
        assert re.search(rf"\b{store.__name__}\(", picked), f"create_store never picks {store.__name__}"
    assert {"memory", "redis", "cluster"} <= set(STORAGE_MODES)


# --- Codec: the bytes Redis holds --------------------------------------------------------------


@pytest.mark.parametrize("payload", [TRIAGE, NOISY], ids=["deterministic", "likelihood"])
def test_codec_round_trips_and_keeps_results(payload):
    inst = compiled(payload)
    header, body = codec.encode(inst)
    decoded = codec.decode(header, body, expected_hash=inst.content_hash)
    assert_same_instance(decoded, inst)
    if inst.likelihood is not None:
        # Decoded in the engine's outcome-major layout: the α pass gets a view, not a copy.
        assert np.shares_memory(decoded.likelihood_by_outcome, decoded.likelihood)
    # The decoded instance drives the engine to the same decision.
    assert engine.next_step(decoded).next_test == engine.next_step(inst).next_test


def test_codec_encodes_a_large_outcome_dtype_little_endian():
    inst = compiled()
    wide = replace(inst, outcomes=inst.outcomes.astype(">u4"))  # fields only, no cached values
    header, body = codec.encode(wide)
    assert b'"<u4"' in header
    assert_same_instance(codec.decode(header, body), wide)


def test_codec_stores_binary_outcomes_one_bit_per_cell():
    rng = np.random.default_rng(3)
    n, n_tests = 37, 13  # rows of 13 bits: two bytes each, the last 3 bits padding
    cells = rng.integers(0, 2, size=(n, n_tests))
    inst = compiled({"tests": [{"id": f"t{j}", "outcomes": ["no", "yes"]} for j in range(n_tests)],
                     "matrix": cells.tolist(), "classes": [f"c{i % 4}" for i in range(n)]})
    header, body = codec.encode(inst)
    (outcomes,) = [d for d in orjson.loads(header)["arrays"] if d["name"] == "outcomes"]
    assert outcomes["dtype"] == "bits" and outcomes["shape"] == [n, n_tests] and outcomes["nbytes"] == n * 2
    # By hand: each row's bits, first test in the highest bit of its first byte, zero padding.
    expected = bytearray()
    for row in inst.outcomes.tolist():
        bits = row + [0] * (16 - n_tests)
        expected += bytes(sum(bit << (7 - k) for k, bit in enumerate(bits[i:i + 8])) for i in (0, 8))
    assert body[outcomes["offset"]:] == bytes(expected)
    decoded = codec.decode(header, body, expected_hash=inst.content_hash)
    assert_same_instance(decoded, inst)
    assert decoded.outcomes.dtype == np.uint8


def _tampered_header(header: bytes, edit) -> bytes:
    fields = orjson.loads(header)
    edit(fields)
    return orjson.dumps(fields)


def _set_array(fields, name, key, value):
    next(d for d in fields["arrays"] if d["name"] == name)[key] = value


CORRUPTIONS = {
    "flipped body byte": lambda h, b: (h, b[:8] + bytes([b[8] ^ 1]) + b[9:]),
    "truncated body": lambda h, b: (h, b[:-1]),
    "extra body bytes": lambda h, b: (h, b + b"\0"),
    "not json": lambda h, b: (b"\x80\x04pickle", b),
    "wrong dtype": lambda h, b: (_tampered_header(h, lambda f: _set_array(f, "prior", "dtype", "<f4")), b),
    "object dtype": lambda h, b: (_tampered_header(h, lambda f: _set_array(f, "prior", "dtype", "|O")), b),
    "wrong shape": lambda h, b: (_tampered_header(h, lambda f: _set_array(f, "costs", "shape", [1])), b),
    "renamed label": lambda h, b: (_tampered_header(h, lambda f: f["class_labels"].reverse()), b),
    "other hash": lambda h, b: (_tampered_header(h, lambda f: f.update(content_hash="0" * 64)), b),
    "missing array": lambda h, b: (_tampered_header(h, lambda f: f["arrays"].pop()), b),
}


def _without_checksum(header: bytes) -> bytes:
    return _tampered_header(header, lambda f: f.pop("checksum"))


@pytest.mark.parametrize("checksummed", [True, False], ids=["checksum", "legacy-header-rehashed"])
@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_codec_refuses_corrupt_bytes(corruption, checksummed):
    inst = compiled()
    header, body = codec.encode(inst)
    if not checksummed:  # as written before headers carried a checksum: the hash is recomputed
        header = _without_checksum(header)
    header, body = CORRUPTIONS[corruption](header, body)
    with pytest.raises(codec.CorruptInstance):
        codec.decode(header, body, expected_hash=inst.content_hash)


def test_codec_decodes_equal_outcome_label_lists_as_one_shared_tuple():
    inst = compiled({**section3(9), "tests": [{"id": f"t{j}", "outcomes": ["0", "1"] if j % 3 else ["no", "yes"]}
                                             for j in range(9)]})
    header, body = codec.encode(inst)
    decoded = codec.decode(header, body, expected_hash=inst.content_hash)
    assert_same_instance(decoded, inst)
    assert [id(labels) for labels in decoded.outcome_labels].count(id(decoded.outcome_labels[1])) == 6
    assert len({id(labels) for labels in decoded.outcome_labels}) == 2


@pytest.mark.parametrize("payload", [TRIAGE, NOISY, {**section3(9), "classes": ["é", "ü", "ø"] * 3}])
def test_the_header_is_its_fields_then_the_checksum_of_them_and_the_body(payload):
    # Written from the format's definition: the fields as orjson writes them, then "checksum",
    # the CRC-32 of those bytes continued over the body.
    header, body = codec.encode(compiled(payload))
    fields = orjson.loads(header)
    checksum = fields.pop("checksum")
    assert header == orjson.dumps({**fields, "checksum": checksum})
    assert checksum == f"crc32:{zlib.crc32(body, zlib.crc32(orjson.dumps(fields))):08x}"


def test_codec_decodes_a_header_written_without_a_checksum():
    inst = compiled(NOISY)
    header, body = codec.encode(inst)
    assert_same_instance(codec.decode(_without_checksum(header), body, expected_hash=inst.content_hash), inst)


# --- Worker cache ------------------------------------------------------------------------------


def test_labels_are_counted_at_least_at_what_python_holds_for_them():
    rng = random.Random(4)
    alphabets = ["abc", "abcé", "ab€", "a😀", "é€😀"]
    for _ in range(200):
        labels = ["".join(rng.choice(rng.choice(alphabets)) for _ in range(rng.randrange(0, 30)))
                  for _ in range(rng.randrange(0, 20))]
        assert _str_bytes(labels) >= sum(map(sys.getsizeof, labels)), labels


def test_instance_cache_stays_within_its_byte_budget():
    small, big = compiled(), compile_wire(section3(40))
    size = resident_bytes(small)
    cache = InstanceCache(max_bytes=size * 2 + 1)
    cache.put(("t", "a"), small, 0.0)
    cache.put(("t", "b"), small, 0.0)
    assert cache.get(("t", "a")) is not None  # a is now the most recently used...
    cache.put(("t", "c"), small, 0.0)  # ...so b is the one evicted
    assert ("t", "b") not in cache and ("t", "a") in cache and ("t", "c") in cache
    assert cache.nbytes == 2 * size <= cache.max_bytes and cache.evictions == 1
    assert resident_bytes(big) > cache.max_bytes
    assert cache.put(("t", "big"), big, 0.0) is False  # bigger than the budget: not cached...
    assert len(cache) == 2  # ...and nothing flushed for it


# --- Redis only ----------------------------------------------------------------------------------


def raw_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def test_redis_holds_json_and_raw_arrays_never_pickle(redis_env):
    store = redis_env.make()
    inst = compiled(NOISY)
    store.put_instance(inst)
    record = session()
    store.create_session(record)
    store.claim_idempotency_key("k", "s-1")
    raw = raw_client(redis_env.redis_url)

    stored = raw.hgetall(store.instance_key(inst.content_hash))
    assert set(stored) == {b"header", b"body", b"summary"}
    header = orjson.loads(stored[b"header"])  # plain JSON
    assert orjson.loads(stored[b"summary"])["n_tests"] == inst.n_tests  # what a listing reads
    assert header["content_hash"] == inst.content_hash
    # The body is exactly the arrays' little-endian bytes, back to back.
    expected = b"".join(np.ascontiguousarray(getattr(inst, d["name"]), dtype=d["dtype"]).tobytes()
                        for d in header["arrays"])
    assert "likelihood_by_outcome" in [d["name"] for d in header["arrays"]]
    assert stored[b"body"] == expected

    state = raw.hgetall(store.session_key("s-1"))
    assert state[b"version"] == b"1"
    assert orjson.loads(state[b"record"])["session_id"] == "s-1"
    assert raw.get(store.idempotency_key("k")) == b"s-1"
    for value in [*stored.values(), *state.values()]:
        assert not value.startswith(b"\x80")  # the pickle protocol marker


def test_redis_keys_carry_the_prefix_and_one_hash_tag_per_session(redis_env):
    store = redis_env.make()
    store.create_session(session("s-1", tenant="clinic {a}:x"))
    keys = [k.decode() for k in raw_client(redis_env.redis_url).scan_iter(f"{redis_env.key_prefix}:*")]
    assert len(keys) == 1
    key = keys[0]
    # A tenant with braces and colons cannot break the tag: exactly one {…}, holding tenant + sid.
    assert key.count("{") == 1 and key.count("}") == 1
    tag = key[key.index("{") + 1:key.index("}")]
    assert tag == "s:clinic%20%7Ba%7D%3Ax:s-1"
    assert key == f"{redis_env.key_prefix}:{{{tag}}}:state"


def test_redis_corrupt_instance_bytes_are_dropped_instead_of_answering(redis_env):
    inst = compiled()
    redis_env.make().put_instance(inst)
    writer = redis_env.make()
    key = writer.instance_key(inst.content_hash)
    raw = raw_client(redis_env.redis_url)
    body = bytearray(raw.hget(key, "body"))
    body[0] ^= 0x40  # one bit of costs[0]
    raw.hset(key, "body", bytes(body))
    assert redis_env.make().get_instance(inst.content_hash) is None  # a worker without it cached
    assert not raw.exists(key)  # dropped, so a re-post stores good bytes again
    assert redis_env.make().put_instance(inst) is True
    assert redis_env.make().get_instance(inst.content_hash).content_hash == inst.content_hash


def test_redis_a_write_from_a_remembered_record_never_replaces_a_damaged_one(redis_env):
    store = redis_env.make()
    record = session()
    store.create_session(record)
    raw = raw_client(redis_env.redis_url)
    key = store.session_key("s-1")
    damaged = orjson.dumps({**orjson.loads(raw.hget(key, "record")), "observations": "ecg"})
    raw.hset(key, "record", damaged)  # the version field is left as it was
    with pytest.raises(VersionConflict):
        store.update_session(record.with_observations((("ecg", "normal"),)), expected_version=1)
    assert raw.hget(key, "record") == damaged
    assert store.recall_session("s-1") is None  # forgotten: the next attempt reads it, and refuses it


def test_redis_a_session_quota_entry_never_lapses_before_its_session(redis_env):
    # TTL 2 s: the entry may outlive its session by 0.2 s. Writes with no read between them
    # (each observation, from a remembered record) must slide it in time: 8 of them over more
    # than 0.2 s would see it lapse otherwise.
    store = redis_env.make(session_ttl=2, quotas=Quotas(sessions=10))
    record = session()
    store.create_session(record)
    raw = raw_client(redis_env.redis_url)
    quota, key = store.quota_key("sessions"), store.session_key("s-1")
    for step in range(8):
        time.sleep(0.06)
        updated = record.with_observations(((f"t{step}", "yes"),))
        store.update_session(updated, expected_version=record.version)
        record = updated
        expires_ms = raw.pexpiretime(key)
        assert expires_ms <= raw.zscore(quota, "s-1") <= expires_ms + 200


def test_redis_writes_slide_a_session_quota_entry_only_when_due(redis_env):
    store = redis_env.make(session_ttl=3600, quotas=Quotas(sessions=10))  # a slack of 60 s
    record = session()
    store.create_session(record)
    raw = raw_client(redis_env.redis_url)
    quota, key = store.quota_key("sessions"), store.session_key("s-1")
    created = raw.zscore(quota, "s-1")
    for step in range(5):
        updated = record.with_observations(((f"t{step}", "yes"),))
        store.update_session(updated, expected_version=record.version)
        record = updated
    assert raw.zscore(quota, "s-1") == created >= raw.pexpiretime(key)


def test_redis_repeated_get_instance_is_served_by_the_worker_cache(redis_env):
    inst = compiled(NOISY)
    redis_env.make().put_instance(inst)
    store = redis_env.make()
    raw = raw_client(redis_env.redis_url)

    def hmget_calls() -> int:
        return raw.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)

    before = hmget_calls()
    assert store.get_instance(inst.content_hash) is not None
    assert hmget_calls() == before + 1
    trips = store.round_trips
    for _ in range(50):
        assert store.get_instance(inst.content_hash) is not None
    assert hmget_calls() == before + 1  # the server saw no further download...
    assert store.round_trips == trips  # ...nor any other command from this store
    assert store.cache.hits == 50


def test_redis_cached_instance_is_rechecked_and_dropped_once_gone(redis_env):
    store = redis_env.make()
    inst = compiled()
    store.put_instance(inst)
    raw_client(redis_env.redis_url).delete(store.instance_key(inst.content_hash))
    # Set the interval rather than sleep past it: on a loaded machine a sleep-free step can still
    # take longer than a short interval, and the first read would already re-check.
    store.recheck_interval = 3600.0
    assert store.get_instance(inst.content_hash) is not None  # trusted within the interval...
    store.recheck_interval = 0.0
    assert store.get_instance(inst.content_hash) is None  # ...then re-checked and found gone
    assert len(store.cache) == 0


def test_redis_worker_cache_respects_its_byte_budget(redis_env):
    first, second = compiled(), compiled(NOISY)
    store = redis_env.make(instance_cache_bytes=max(resident_bytes(first), resident_bytes(second)))
    store.put_instance(first)
    store.put_instance(second)
    assert store.cache.nbytes <= store.cache.max_bytes and len(store.cache) == 1
    assert_same_instance(store.get_instance(first.content_hash), first)  # refetched from Redis


def test_redis_outage_fails_fast_and_recovers_without_restart(private_redis):
    private_redis.start()
    store = RedisStore(private_redis.url, session_ttl=60, key_prefix="outage")
    # A second worker that is idle during the outage: its pooled connection goes stale, and its
    # first call after the restart must still succeed (no restart of the worker, no 503 burst).
    idle = RedisStore(private_redis.url, session_ttl=60, key_prefix="outage")
    idle.ping()
    inst = compiled()
    store.put_instance(inst)
    store.create_session(session())
    store.ping()

    private_redis.stop()
    other = compiled(NOISY)
    calls = {
        "ping": store.ping,
        "get_session": lambda: store.get_session("s-1"),
        "update_session": lambda: store.update_session(session(version=2), expected_version=1),
        "create_session": lambda: store.create_session(session("s-2")),
        "delete_session": lambda: store.delete_session("s-1"),
        "claim_idempotency_key": lambda: store.claim_idempotency_key("k", "s-2"),
        "put_instance": lambda: store.put_instance(other),
        "get_instance (not cached)": lambda: store.get_instance(other.content_hash),
        "count_exposure": lambda: store.count_exposure(inst.content_hash, sessions=1, tests=("ecg",)),
        "exposure_counts": lambda: store.exposure_counts(inst.content_hash),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            call()
        assert time.monotonic() - started < 1.0, name

    private_redis.start()  # same port, empty data (no persistence configured)
    assert idle.get_session("s-1") is None
    store.ping()
    assert store.get_session("s-1") is None
    store.create_session(session("s-3"))
    assert store.get_session("s-3").version == 1
    assert store.put_instance(inst) is True
    store.close()
    idle.close()
