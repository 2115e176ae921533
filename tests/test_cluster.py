"""Redis Cluster, for real: the API over a local cluster of 3 masters and 3 replicas (conftest's
``redis_cluster``), Redis's "not now" answers as 503, readiness that follows the cluster state,
and a failover under load — a master killed -9 while 8 clients stream observations through two
server processes. The store contract itself runs over the cluster in tests/test_store_contract.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest
import redis
import requests
from redis._parsers.base import BaseParser

from api_support import TRIAGE, assert_problem
from conftest import RedisClusterServers, RedisServer, free_port, wait_until_busy
from live_server import LiveServer
from service.app import create_app
from service.store import StoreUnavailable
from service.store.redis_client import is_full, is_unavailable, redis_errors
from service.store.redis_store import RedisStore
from tests.test_faults import ladder

pytestmark = pytest.mark.redis


def cluster_app(redis_cluster, **settings):
    return create_app({"redis_url": redis_cluster.url, "redis_cluster": True,
                       "key_prefix": f"test-{uuid.uuid4().hex[:12]}", **settings})


# --- the API over the cluster ------------------------------------------------------------------


def test_a_session_runs_over_the_cluster_with_rate_limits_and_idempotency(redis_cluster):
    app = cluster_app(redis_cluster, rate_limit="1000/second")
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    posted = client.post("/v1/instances", json=TRIAGE)
    assert posted.status_code == 201, posted.get_data(as_text=True)
    instance_id = posted.get_json()["instance_id"]
    created = client.post("/v1/sessions", json={"instance_id": instance_id}, headers={"Idempotency-Key": "k-1"})
    assert created.status_code == 201
    sid = created.get_json()["session_id"]
    again = client.post("/v1/sessions", json={"instance_id": instance_id}, headers={"Idempotency-Key": "k-1"})
    assert again.get_json()["session_id"] == sid
    test = created.get_json()["next_test"]["id"]
    outcome = created.get_json()["next_test"]["outcomes"][0]
    step = client.post(f"/v1/sessions/{sid}/observations", json={"test": test, "outcome": outcome},
                       headers={"If-Match": created.headers["ETag"]})
    assert step.status_code == 200, step.get_data(as_text=True)
    assert [h["test"] for h in step.get_json()["history"]] == [test]
    # Another worker (a fresh app: an empty instance cache) reads the same session and instance.
    other = cluster_app(redis_cluster, key_prefix=app.extensions["edgecut"].settings.key_prefix).test_client()
    assert other.get(f"/v1/sessions/{sid}").get_json()["history"] == step.get_json()["history"]
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert other.get(f"/v1/sessions/{sid}").status_code == 404


def test_every_key_of_an_operation_is_in_one_slot(redis_cluster):
    # The only multi-key operations would be scripts and transactions; each names one key, and
    # every key carries exactly one {hash tag}. CLUSTER KEYSLOT is the server's own answer.
    store = RedisStore(redis_cluster.url, cluster=True, key_prefix="slots")
    keys = [store.instance_key("a" * 64, "clinic:{a}"), store.session_key("s-1", "clinic:{a}"),
            store.idempotency_key("k}{", "clinic:{a}")]
    node = redis.Redis.from_url(redis_cluster.url)
    try:
        for key in keys:
            tag = key[key.index("{") + 1:key.index("}")]
            assert key.count("{") == 1 and key.count("}") == 1
            assert node.cluster("keyslot", key) == node.cluster("keyslot", tag)
    finally:
        node.close()
        store.close()


def test_wait_replicas_acknowledges_writes_on_the_cluster(redis_cluster):
    store = RedisStore(redis_cluster.url, cluster=True, key_prefix=f"wait-{uuid.uuid4().hex[:8]}", wait_replicas=1)
    app = create_app({"redis_url": redis_cluster.url, "redis_cluster": True, "redis_wait_replicas": 1},
                     store=store)
    client = app.test_client()
    instance_id = client.post("/v1/instances", json=ladder(3)).get_json()["instance_id"]
    created = client.post("/v1/sessions", json={"instance_id": instance_id}, headers={"Idempotency-Key": "w"})
    assert created.status_code == 201, created.get_data(as_text=True)
    sid = created.get_json()["session_id"]
    step = client.post(f"/v1/sessions/{sid}/observations", json={"test": "t0", "outcome": "0"})
    assert step.status_code == 200, step.get_data(as_text=True)
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    store.close()


def test_exposure_counts_share_their_instance_s_slot_and_go_with_it_on_the_cluster(redis_cluster):
    # Counted through WAIT (as a deployment with REDIS_WAIT_REPLICAS writes), read back by another
    # worker, and deleted in the instance's own transaction: a key in another slot fails it.
    prefix = f"exposure-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_cluster.url, cluster=True, key_prefix=prefix, wait_replicas=1)
    other = RedisStore(redis_cluster.url, cluster=True, key_prefix=prefix)
    node = redis.Redis.from_url(redis_cluster.url)
    try:
        instance_id = create_app({"redis_url": redis_cluster.url, "redis_cluster": True}, store=store).test_client() \
            .post("/v1/instances", json=TRIAGE).get_json()["instance_id"]
        key = store.exposure_key(instance_id, "clinic:{a}")
        assert node.cluster("keyslot", key) == node.cluster("keyslot", store.instance_key(instance_id, "clinic:{a}"))
        for _ in range(3):
            store.count_exposure(instance_id, sessions=1, tests=("ecg",))
        assert other.exposure_counts(instance_id) == (3, {"ecg": 3})
        assert other.delete_instance(instance_id) is True
        assert store.exposure_counts(instance_id) == (0, {})
    finally:
        node.close()
        store.close()
        other.close()


def test_wait_replicas_without_replicas_is_503_not_an_acknowledgement(redis_server):
    # One node, no replica: no write can be confirmed, so none may be acknowledged.
    app = create_app({"redis_url": redis_server.url, "redis_wait_replicas": 1, "redis_wait_timeout_ms": 20,
                      "key_prefix": f"nowait-{uuid.uuid4().hex[:8]}"})
    client = app.test_client()
    response = client.post("/v1/sessions", json={"instance": TRIAGE})
    assert_problem(response, 503, "store-unavailable")
    assert int(response.headers["Retry-After"]) >= 1


# --- Redis's "not now" answers are 503, never 500 (one mapping: service/store/redis_client.py) ---

# Replies as the server sends them, parsed by redis-py's own parser into its exception classes.
UNAVAILABLE = ["MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381", "CLUSTERDOWN The cluster is down",
               "TRYAGAIN Multiple keys request during rehashing of slot",
               "READONLY You can't write against a read only replica.",
               "LOADING Redis is loading the dataset",
               "BUSY Redis is busy running a script.", "MASTERDOWN Link with MASTER is down",
               "MISCONF Errors writing to the AOF file", "NOREPLICAS Not enough good replicas to write."]
BUGS = ["ERR unknown command 'FOO'", "WRONGTYPE Operation against a key holding the wrong kind of value",
        "CROSSSLOT Keys in request don't hash to the same slot", "NOSCRIPT No matching script."]


@pytest.mark.parametrize("reply", UNAVAILABLE)
def test_redis_replies_meaning_not_now_are_unavailable(reply):
    assert is_unavailable(BaseParser.parse_error(reply))


@pytest.mark.parametrize("reply", BUGS)
def test_redis_replies_meaning_a_bug_are_not_hidden_as_unavailable(reply):
    error = BaseParser.parse_error(reply)
    assert not is_unavailable(error) and not is_full(error)


def test_out_of_memory_is_full_not_unavailable():
    # 507 store-full (tests/test_hardening_api.py drives a real full Redis).
    error = BaseParser.parse_error("OOM command not allowed when used memory > 'maxmemory'.")
    assert is_full(error) and not is_unavailable(error)


def test_a_read_only_replica_answers_503(tmp_path):
    # A replica of a master that is not there: every write is refused READONLY.
    server = RedisServer(tmp_path, "--replicaof", "127.0.0.1", "1", "--replica-read-only", "yes")
    server.start()
    try:
        client = create_app({"redis_url": server.url, "key_prefix": "ro"}).test_client()
        response = client.post("/v1/sessions", json={"instance": TRIAGE})
        assert_problem(response, 503, "store-unavailable")
        assert int(response.headers["Retry-After"]) >= 1
    finally:
        server.stop()


def test_a_busy_redis_answers_503(tmp_path):
    server = RedisServer(tmp_path, "--busy-reply-threshold", "50")
    server.start()
    blocker = redis.Redis.from_url(server.url, socket_timeout=30)
    admin = redis.Redis.from_url(server.url)
    # A script that loops until killed: every other client gets BUSY meanwhile.
    busy = threading.Thread(target=lambda: _ignore(lambda: blocker.eval("while true do end", 0)), daemon=True)
    try:
        busy.start()
        wait_until_busy(server.url)
        client = create_app({"redis_url": server.url, "key_prefix": "busy"}).test_client()
        response = client.post("/v1/sessions", json={"instance": TRIAGE})
        assert_problem(response, 503, "store-unavailable")
    finally:
        _ignore(admin.script_kill)
        busy.join(timeout=10)
        blocker.close()
        admin.close()
        server.stop()


def _ignore(call):
    try:
        call()
    except redis.exceptions.RedisError:
        pass


def test_readyz_is_not_ready_while_the_cluster_state_is_not_ok(tmp_path):
    # A cluster-enabled node that owns no slots: cluster_state:fail.
    lonely = RedisServer(tmp_path, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-port", str(free_port()))  # not port + 10000: that may exceed 65535
    lonely.start()
    try:
        app = create_app({"redis_url": lonely.url, "redis_cluster": True, "key_prefix": "lonely"})
        response = app.test_client().get("/readyz")
        assert_problem(response, 503, "store-unavailable")
        with pytest.raises(StoreUnavailable):
            app.extensions["edgecut"].store.ping()
    finally:
        lonely.stop()


# --- failover under load -------------------------------------------------------------------------


LONG_LADDER_TESTS = 600  # more observations than a client streams in a run: sessions never finish


def long_ladder() -> dict:
    """tests/test_faults.py's ladder in the columnar form: a 'negative' row of zeros and one row
    per test with a 1 on that test; every t_j = 0 rules out one row."""
    n = LONG_LADDER_TESTS
    matrix = [[0] * n] + [[int(j == i) for j in range(n)] for i in range(n)]
    return {"tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n)], "matrix": matrix,
            "classes": ["negative"] + ["positive"] * n}


class Streamer:
    """One client streaming observations (t0, t1, … = "0") into its own session through the
    servers in turn, as behind a round-robin load balancer. A 503 is retried after 50 ms."""

    def __init__(self, number: int, urls: list[str], sid: str, stop: threading.Event):
        self.number, self.urls, self.sid, self.stop = number, urls, sid, stop
        self.acknowledged: list[str] = []
        self.unavailable_since: float | None = None
        self.longest_outage = 0.0
        self.statuses: dict[int, int] = defaultdict(int)
        self.errors: list[str] = []

    def run(self) -> None:
        http = requests.Session()
        j = sent = 0
        while not self.stop.is_set() and j < LONG_LADDER_TESTS - 1:
            url = self.urls[(self.number + sent) % len(self.urls)]
            sent += 1
            try:
                response = http.post(f"{url}/v1/sessions/{self.sid}/observations",
                                     json={"test": f"t{j}", "outcome": "0"}, timeout=5)
            except requests.RequestException as error:
                self.errors.append(repr(error))
                time.sleep(0.05)
                continue
            self.statuses[response.status_code] += 1
            if response.status_code == 200:
                self.acknowledged.append(f"t{j}")
                j += 1
                if self.unavailable_since is not None:
                    self.longest_outage = max(self.longest_outage, time.monotonic() - self.unavailable_since)
                    self.unavailable_since = None
            elif response.status_code == 503 or (response.status_code == 409
                                                 and response.json()["type"].endswith("concurrent-update")):
                if self.unavailable_since is None:
                    self.unavailable_since = time.monotonic()
                time.sleep(0.05)
            else:
                self.errors.append(f"{response.status_code} {response.text[:300]}")
                time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("wait_replicas", [0, 1], ids=["async-replication", "wait-1-replica"])
def test_killing_a_master_under_load_fails_over_without_restarting_the_service(tmp_path, wait_replicas):
    cluster = RedisClusterServers(tmp_path / "cluster")
    servers: list[LiveServer] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        cluster.start()
        env = {"REDIS_URL": cluster.url, "REDIS_CLUSTER": "true", "KEY_PREFIX": "failover",
               "REDIS_WAIT_REPLICAS": str(wait_replicas)}
        # Two "nodes" of the service, sharing only the cluster; started side by side.
        servers = [LiveServer(env, workers=1, threads=4, log=tmp_path / f"node-{i}.log") for i in range(2)]
        starting = [threading.Thread(target=server.start) for server in servers]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
        assert all(server.process is not None and server.process.poll() is None for server in servers)
        urls = [server.url for server in servers]
        instance_id = requests.post(urls[0] + "/v1/instances", json=long_ladder(), timeout=30).json()["instance_id"]
        sids = [requests.post(urls[i % 2] + "/v1/sessions", json={"instance_id": instance_id}, timeout=10)
                .json()["session_id"] for i in range(8)]

        # The victim: the master serving the most of these sessions (at least one).
        probe = redis.RedisCluster.from_url(cluster.url)
        slots = [probe.keyslot(f"failover:{{s:public:{sid}}}:state") for sid in sids]
        probe.close()
        by_master = defaultdict(list)
        for slot in slots:
            by_master[cluster.node_serving(slot).port].append(slot)
        victim = next(node for node in cluster.nodes if node.port == max(by_master, key=lambda p: len(by_master[p])))
        replica_port = int(redis.Redis(port=victim.port).role()[2][0][1])
        replica = next(node for node in cluster.nodes if node.port == replica_port)

        streamers = [Streamer(i, urls, sid, stop) for i, sid in enumerate(sids)]
        threads = [threading.Thread(target=s.run) for s in streamers]
        for thread in threads:
            thread.start()
        time.sleep(1.5)  # steady traffic first
        acknowledged_before = sum(len(s.acknowledged) for s in streamers)
        victim.stop(kill=True)  # SIGKILL, no persistence configured: what it had not replicated is gone
        killed_at = time.monotonic()

        # The replica takes over on its own (no operator); readiness follows the cluster.
        readiness = set()
        deadline = killed_at + 20
        while cluster.role_of(replica) != "master" and time.monotonic() < deadline:
            readiness.add(requests.get(urls[0] + "/readyz", timeout=5).status_code)
            time.sleep(0.1)
        promoted_after = time.monotonic() - killed_at
        assert cluster.role_of(replica) == "master", "the replica was not promoted"
        # The operator's part: the dead node restarts and rejoins as the new master's replica
        # (with REDIS_WAIT_REPLICAS=1 its shard refuses writes until it has a replica again).
        victim.start()
        while time.monotonic() < deadline:
            if (all(s.unavailable_since is None for s in streamers)
                    and requests.get(urls[0] + "/readyz", timeout=5).status_code == 200):
                break
            time.sleep(0.1)
        recovered_after = time.monotonic() - killed_at
        time.sleep(1.0)  # steady traffic after
        stop.set()
        for thread in threads:
            thread.join(timeout=10)

        errors = [e for s in streamers for e in s.errors]
        assert not errors, errors[:5]
        acknowledged = sum(len(s.acknowledged) for s in streamers)
        assert acknowledged > acknowledged_before + 8, "the service did not recover"
        lost = 0
        for streamer in streamers:
            history = requests.get(f"{urls[0]}/v1/sessions/{streamer.sid}", timeout=5).json()["history"]
            stored = {h["test"] for h in history}
            lost += sum(test not in stored for test in streamer.acknowledged)
        longest = max(s.longest_outage for s in streamers)
        unavailable = sum(s.statuses[503] for s in streamers)
        print(f"\nREDIS_WAIT_REPLICAS={wait_replicas}: promoted after {promoted_after:.1f} s, recovered after "
              f"{recovered_after:.1f} s, longest run of 503s {longest:.1f} s, {unavailable} × 503, "
              f"{acknowledged} observations acknowledged, {lost} lost; /readyz saw {sorted(readiness)}")
        assert unavailable > 0, "no request met the failover"
        assert longest < 10.0, f"clients saw 503s for {longest:.1f} s"
        if wait_replicas:
            assert lost == 0, f"{lost} acknowledged observations lost despite WAIT"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        stopping = [threading.Thread(target=server.stop) for server in servers]  # side by side too
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        cluster.stop()


@pytest.mark.parametrize("operation", ["script", "transaction"])
def test_keys_of_one_operation_in_two_slots_are_a_bug_not_a_503(redis_cluster, operation):
    # The cluster client refuses such an operation itself, before any server answers: that is a
    # mistake in our keys, and hiding it as "retry later" would retry it for ever.
    client = redis.RedisCluster.from_url(redis_cluster.url)
    keys = ["cross:{a}:x", "cross:{b}:y"]
    assert client.keyslot(keys[0]) != client.keyslot(keys[1])
    try:
        with pytest.raises((redis.exceptions.RedisError, redis.exceptions.RedisClusterException)) as raised:
            with redis_errors():
                if operation == "script":
                    client.execute_command("EVAL", "return 1", 2, *keys)
                else:
                    with client.pipeline(transaction=True) as pipe:
                        pipe.set(keys[0], 1).set(keys[1], 1).execute()
        assert not isinstance(raised.value, StoreUnavailable)
    finally:
        client.close()
