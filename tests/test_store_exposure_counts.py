"""The store's exposure counts (``ExposureCounts`` in service/store/base.py), run against every
store over conftest's STORAGE_MODES like tests/test_store_contract.py; then the record fields
restricted exposure control keeps (``max_rate``, ``held_back``, ``reserved``) through the record
codec and the stores; then Redis only: where the counts are kept, damaged counts, a full Redis (an absent one: tests/test_store_contract.py's outage test).

Expected counts are tallied here from the definition (each call adds its ``sessions``, and 1 per
test it names), never read from a store.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from dataclasses import replace
from fractions import Fraction

import orjson
import pytest
import redis

from service.engine.restricted import RESERVE_SHARE
from service.sessions.exposure import LISTED_SHARE
from service.store import CorruptRecord, StoreFull
from service.store.records import decode_record, encode_record
from service.store.redis_store import RedisStore
from tests.test_store_contract import compiled, session, variant


class Tally:
    """The counts by their definition: plain sums of what was counted."""

    def __init__(self):
        self.sessions = 0
        self.given: dict[str, int] = defaultdict(int)

    def count(self, sessions: int = 0, tests=()) -> None:
        self.sessions += sessions
        for test in tests:
            self.given[test] += 1

    def expected(self, at_least: float = 0.0) -> tuple[int, dict[str, int]]:
        """With the tests given fewer than ``at_least`` × sessions times left out (exact arithmetic)."""
        least = Fraction(str(at_least)) * self.sessions  # the share as written
        return self.sessions, {test: count for test, count in self.given.items() if count >= least}


INSTANCE = "a" * 64


def test_counts_start_at_nothing_and_add_up_as_counted(store_env):
    store = store_env.make()
    assert store.exposure_counts(INSTANCE) == (0, {})
    rng = random.Random(7)
    tests = ["ecg", "troponin", "x-ray", "mri"]
    tally = Tally()
    for _ in range(30):
        sessions = rng.choice([0, 0, 1, 2])
        given = rng.sample(tests, rng.randint(0, 3))
        store.count_exposure(INSTANCE, sessions=sessions, tests=given)
        tally.count(sessions, given)
        assert store.exposure_counts(INSTANCE) == tally.expected()
    assert tally.sessions > 0 and len(tally.given) > 1  # the draw did count something
    if store_env.kind != "memory":  # another worker on the same Redis reads the same counts
        assert store_env.make().exposure_counts(INSTANCE) == tally.expected()


def test_a_read_leaves_out_the_tests_below_its_share_of_the_sessions(store_env):
    store = store_env.make()
    tally = Tally()
    rng = random.Random(11)
    for _ in range(40):
        given = rng.sample([f"q{j}" for j in range(12)], 3)
        store.count_exposure(INSTANCE, sessions=1, tests=given)
        tally.count(1, given)
    for at_least in (0.0, 0.1, 0.25, 0.3, 0.5, 1.0):
        assert store.exposure_counts(INSTANCE, at_least=at_least) == tally.expected(at_least)
    listed = [len(store.exposure_counts(INSTANCE, at_least=a)[1]) for a in (0.0, 0.25, 0.5)]
    assert listed[0] > listed[1] > listed[2]  # the draw put tests on both sides of the shares
    # Sessions pass the store a share below the reserve's, so every test the engine reserves is read.
    assert LISTED_SHARE < RESERVE_SHARE


def test_a_test_named_twice_in_one_call_is_counted_twice(store_env):
    store = store_env.make()
    store.count_exposure(INSTANCE, sessions=1, tests=("ecg", "ecg", "troponin"))
    assert store.exposure_counts(INSTANCE) == (1, {"ecg": 2, "troponin": 1})
    # ...as two calls naming it once each would.
    store.count_exposure(INSTANCE, tests=("ecg",))
    store.count_exposure(INSTANCE, tests=("ecg",))
    assert store.exposure_counts(INSTANCE) == (1, {"ecg": 4, "troponin": 1})


def test_a_call_that_counts_nothing_changes_nothing(store_env):
    store = store_env.make()
    store.count_exposure(INSTANCE)
    assert store.exposure_counts(INSTANCE) == (0, {})
    store.count_exposure(INSTANCE, sessions=2, tests=("ecg",))
    store.count_exposure(INSTANCE, tests=[])
    assert store.exposure_counts(INSTANCE) == (2, {"ecg": 1})


def test_counts_are_kept_per_tenant_and_per_instance(store_env):
    store = store_env.make()
    other = "b" * 64
    store.count_exposure(INSTANCE, sessions=1, tests=("ecg",))
    store.count_exposure(INSTANCE, "clinic-b", sessions=2, tests=("troponin", "ecg"))
    store.count_exposure(other, sessions=5, tests=("mri",))
    assert store.exposure_counts(INSTANCE) == (1, {"ecg": 1})
    assert store.exposure_counts(INSTANCE, "clinic-b") == (2, {"troponin": 1, "ecg": 1})
    assert store.exposure_counts(other) == (5, {"mri": 1})
    assert store.exposure_counts(other, "clinic-b") == (0, {})


# Ids that look like where a store might keep the session count, or like its field prefixes,
# or that would break a key or a field if they were used unescaped.
ODD_TEST_IDS = ["sessions", "t:sessions", "t:", "", "n", "t", "s", "t:t:ecg", "é ü {x}:y", "a\nb", "\x00"]


def test_no_test_id_clashes_with_the_session_count(store_env):
    store = store_env.make()
    tally = Tally()
    store.count_exposure(INSTANCE, sessions=3, tests=ODD_TEST_IDS)
    tally.count(3, ODD_TEST_IDS)
    store.count_exposure(INSTANCE, sessions=1, tests=ODD_TEST_IDS[:3])
    tally.count(1, ODD_TEST_IDS[:3])
    assert store.exposure_counts(INSTANCE) == tally.expected() == (4, {**dict.fromkeys(ODD_TEST_IDS, 1),
                                                                       "sessions": 2, "t:sessions": 2, "t:": 2})


def test_counts_expire_the_instance_ttl_after_they_were_last_counted(store_env):
    store = store_env.make(session_ttl=1)  # instances, and exposure counts, live 2 s
    store.count_exposure(INSTANCE, sessions=1, tests=("ecg",))
    store_env.elapse(1.2)
    assert store.exposure_counts(INSTANCE) == (1, {"ecg": 1})  # a read does not keep them...
    store.count_exposure(INSTANCE, sessions=1)  # ...a count does: 2 s from now, for all of them
    store_env.elapse(1.2)  # past the first count's 2 s
    assert store.exposure_counts(INSTANCE) == (2, {"ecg": 1})
    store_env.elapse(1.0)  # past the last count's
    assert store.exposure_counts(INSTANCE) == (0, {})
    store.count_exposure(INSTANCE, tests=("ecg",))  # counting starts again from nothing
    assert store.exposure_counts(INSTANCE) == (0, {"ecg": 1})


def test_deleting_an_instance_deletes_its_counts_only(store_env):
    store = store_env.make()
    inst, kept = compiled(), variant(1)
    for tenant in ("public", "clinic-b"):
        store.put_instance(inst, tenant)
        store.count_exposure(inst.content_hash, tenant, sessions=2, tests=("ecg",))
    store.put_instance(kept)
    store.count_exposure(kept.content_hash, sessions=1, tests=("troponin",))

    assert store.delete_instance(inst.content_hash) is True
    assert store.exposure_counts(inst.content_hash) == (0, {})
    assert store.exposure_counts(inst.content_hash, "clinic-b") == (2, {"ecg": 1})
    assert store.exposure_counts(kept.content_hash) == (1, {"troponin": 1})
    # Stored again, the instance counts from nothing.
    assert store.put_instance(inst) is True
    assert store.exposure_counts(inst.content_hash) == (0, {})
    store.count_exposure(inst.content_hash, sessions=1)
    assert store.exposure_counts(inst.content_hash) == (1, {})


def test_counts_from_many_threads_add_up_exactly(store_env):
    store = store_env.make()
    # Two workers on a Redis store (each thread shares one of them); one store in memory.
    stores = [store, store if store_env.kind == "memory" else store_env.make()]
    threads_n, calls = 8, 50
    tally = Tally()
    for t in range(threads_n):
        for _ in range(calls):
            tally.count(1, (f"t{t % 3}", "shared"))
    start = threading.Barrier(threads_n)
    errors = []

    def count(t: int) -> None:
        try:
            start.wait()
            for _ in range(calls):
                stores[t % 2].count_exposure(INSTANCE, sessions=1, tests=(f"t{t % 3}", "shared"))
        except Exception as error:  # reported below: a thread's exception would vanish otherwise
            errors.append(error)

    threads = [threading.Thread(target=count, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.exposure_counts(INSTANCE) == tally.expected() == (400, {"t0": 150, "t1": 150, "t2": 100,
                                                                         "shared": 400})


# --- The record's max_rate, held_back and reserved -----------------------------------------------


def test_max_rate_held_back_and_reserved_round_trip_through_every_store(store_env):
    store = store_env.make()
    record = session(max_rate=0.25, held_back=("ecg", "x-ray"), reserved=("troponin",))
    store.create_session(record)
    step = record.with_observations((("troponin", "high"),), restriction=(("troponin",), ("ecg",)))
    store.update_session(step, expected_version=1)
    reader = store_env.make() if store_env.kind != "memory" else store  # another worker reads it back
    got = reader.get_session("s-1")
    assert got.max_rate == 0.25 and got.held_back == ("troponin",) and isinstance(got.held_back, tuple)
    assert got.reserved == ("ecg",) and isinstance(got.reserved, tuple)
    assert replace(got, expires_at=0.0) == replace(step, expires_at=0.0)
    # with_observations keeps the restriction unless told otherwise.
    kept = step.with_observations(())
    assert (kept.held_back, kept.reserved) == (("troponin",), ("ecg",))


def stored_json(record) -> dict:
    return orjson.loads(encode_record(record))


def test_the_record_codec_round_trips_max_rate_held_back_and_reserved():
    for record in (session(max_rate=0.1, held_back=("ecg",)), session(max_rate=1, held_back=()),
                   session(held_back=("ecg", "troponin")), session(max_rate=0.3, reserved=("ecg",)), session()):
        assert decode_record(encode_record(record), expires_at=0.0) == record
    fields = stored_json(session(max_rate=0.1, held_back=("ecg",), reserved=("troponin",)))
    assert fields["max_rate"] == 0.1 and fields["held_back"] == ["ecg"] and fields["reserved"] == ["troponin"]


def test_a_record_without_restriction_is_written_and_read_without_it():
    fields = stored_json(session())
    assert not {"max_rate", "held_back", "reserved"} & set(fields)  # as records were before them
    record = decode_record(orjson.dumps(fields), expires_at=0.0)
    assert record.max_rate is None and record.held_back == () and record.reserved == ()


@pytest.mark.parametrize("damage", [{"max_rate": "0.1"}, {"max_rate": True}, {"max_rate": [0.1]},
                                    {"held_back": "ecg"}, {"held_back": [1]}, {"held_back": [None]},
                                    {"held_back": None}, {"reserved": "ecg"}, {"reserved": [2]}])
def test_the_record_codec_refuses_a_mistyped_restriction(damage):
    with pytest.raises(CorruptRecord):
        decode_record(orjson.dumps({**stored_json(session()), **damage}), expires_at=0.0)


# --- Redis only ----------------------------------------------------------------------------------


def raw_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def test_redis_keeps_the_counts_in_one_hash_in_the_instance_s_slot(redis_env):
    store = redis_env.make(session_ttl=100)
    store.count_exposure(INSTANCE, "clinic {a}:x", sessions=2, tests=("sessions", "é"))
    raw = raw_client(redis_env.redis_url)
    keys = [k.decode() for k in raw.scan_iter(f"{redis_env.key_prefix}:*")]
    assert keys == [f"{redis_env.key_prefix}:{{i:clinic%20%7Ba%7D%3Ax:{INSTANCE}}}:exposure"]
    instance_key = store.instance_key(INSTANCE, "clinic {a}:x")
    assert keys[0].split("}")[0] == instance_key.split("}")[0]  # the same hash tag
    assert raw.hgetall(keys[0]) == {b"sessions": b"2", b"t:sessions": b"1", "t:é".encode(): b"1"}
    assert 199_000 < raw.pttl(keys[0]) <= 200_000  # the instance TTL: 2 × the session TTL


@pytest.mark.parametrize("damaged", [b"x", b"-1", b"007", b"1.5", b" 3", b"", b"1" * 19])
def test_redis_a_damaged_count_reads_as_absent_and_counts_again_from_its_increment(redis_env, damaged):
    store = redis_env.make()
    store.count_exposure(INSTANCE, sessions=2, tests=("ecg", "troponin"))
    raw = raw_client(redis_env.redis_url)
    key = store.exposure_key(INSTANCE)
    raw.hset(key, mapping={"t:ecg": damaged, "stray": b"1", b"t:\xff": b"1"})
    assert store.exposure_counts(INSTANCE) == (2, {"troponin": 1})
    raw.hset(key, "sessions", damaged)
    assert store.exposure_counts(INSTANCE) == (0, {"troponin": 1})
    store.count_exposure(INSTANCE, sessions=1, tests=("ecg", "troponin"))
    assert store.exposure_counts(INSTANCE) == (1, {"ecg": 1, "troponin": 2})


def test_redis_a_full_redis_refuses_counting_and_still_reads_the_counts(private_redis):
    private_redis.start()
    store = RedisStore(private_redis.url, session_ttl=60, key_prefix="full")
    store.count_exposure(INSTANCE, sessions=1, tests=("ecg",))
    admin = raw_client(private_redis.url)
    admin.config_set("maxmemory", 1)  # noeviction: every write is OOM
    try:
        with pytest.raises(StoreFull):
            store.count_exposure(INSTANCE, sessions=1, tests=("ecg",))
        assert store.exposure_counts(INSTANCE) == (1, {"ecg": 1})  # nothing of the refused call was written
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    store.count_exposure(INSTANCE, sessions=1)
    assert store.exposure_counts(INSTANCE) == (2, {"ecg": 1})
    store.close()
