"""Fixtures shared by the suite. Each section belongs to one concern; keep them apart."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

# --- Redis: a real redis-server on a free port, never the machine's shared 6379 -------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server child process. ``stop``/``start`` let fault tests take it away and back."""

    def __init__(self, workdir: Path, *extra_args: str):
        self.port = free_port()
        self.workdir = workdir
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--dir", str(self.workdir), *self.extra_args]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=10)
        self.process = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One redis-server for the whole run; tests isolate themselves with a fresh key prefix."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (.ci/run installs it)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served():
    """``edgecut serve`` with the embedded store, as a user starts it (one per test module)."""
    from live_server import EdgecutServe  # live_server imports this module

    server = EdgecutServe({"REDIS_URL": "", "LOG_LEVEL": "warning"})
    server.wait_ready()
    yield server
    server.stop()


class RedisClusterServers:
    """A local Redis Cluster: ``masters`` masters with ``replicas`` replicas each, every node a
    redis-server child on free ports (its cluster bus port too), joined by
    ``redis-cli --cluster create``. A test takes a node away with ``node.stop(kill=True)``."""

    NODE_TIMEOUT_MS = 1000  # how long a silent master stays unsuspected; failover follows in ~1–2 s

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 1):
        self.workdir = workdir
        self.nodes: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            node_dir = workdir / f"node-{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            # A master starts a replica's full sync at once: by default it waits 5 s for more
            # replicas to share the transfer, and each shard here has one.
            node = RedisServer(node_dir, "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                               "--cluster-config-file", "nodes.conf",
                               "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS), "--appendonly", "no",
                               "--repl-diskless-sync-delay", "0")
            self.nodes.append(node)
        self.replicas = replicas

    @property
    def url(self) -> str:
        """Any live node's URL: a cluster client discovers the others from it."""
        return next(node.url for node in self.nodes if node.process is not None)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas),
                        "--cluster-yes"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=60)
        self.wait_until_ok()

    def cluster_info(self, node: RedisServer) -> dict[str, str]:
        out = subprocess.run(["redis-cli", "-p", str(node.port), "cluster", "info"], capture_output=True,
                             text=True, timeout=5).stdout
        return dict(line.strip().split(":", 1) for line in out.splitlines() if ":" in line)

    def wait_until_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and every replica has synced (a replica
        still loading its first copy confirms no WAIT)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [node for node in self.nodes if node.process is not None]
            if all(self.cluster_info(node).get("cluster_state") == "ok" for node in live) and all(
                    self.role(node)[0] == "master" or self.role(node)[3] == "connected" for node in live):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok with synced replicas")

    def role(self, node: RedisServer) -> list[str]:
        """ROLE, flattened: ["master", offset, ...] or ["slave", host, port, state, offset]."""
        out = subprocess.run(["redis-cli", "-p", str(node.port), "role"], capture_output=True, text=True,
                             timeout=5).stdout
        return out.split() or ["unknown"]

    def role_of(self, node: RedisServer) -> str:
        return self.role(node)[0]

    def node_serving(self, slot: int) -> RedisServer:
        """The master currently serving ``slot``."""
        for node in self.nodes:
            if node.process is None:
                continue
            out = subprocess.run(["redis-cli", "-p", str(node.port), "cluster", "nodes"], capture_output=True,
                                 text=True, timeout=5).stdout
            for line in out.splitlines():
                fields = line.split()
                if "master" not in fields[2] or "fail" in fields[2]:
                    continue
                for span in fields[8:]:
                    low, _, high = span.partition("-")
                    if low.isdigit() and int(low) <= slot <= int(high or low):
                        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                        return next(n for n in self.nodes if n.port == port)
            break  # one live node's view is enough
        raise RuntimeError(f"no master serves slot {slot}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop(kill=True)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """One Redis Cluster (3 masters, 3 replicas) for the whole run; tests use fresh key prefixes.
    Tests that kill nodes make their own (``RedisClusterServers``)."""
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is not installed (it comes with redis-server; .ci/run installs it)")
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of the test's own, for tests that stop, kill or reconfigure it."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


# --- Stores: each contract test gets a fresh store; Redis ones a fresh key prefix -----------


class FakeClock:
    """A settable clock for the in-memory store, so TTL tests need no sleeping."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StoreUnderTest:
    """One store of a given kind plus a way to let its time pass (fake for memory, real sleep
    for Redis, whose TTLs the server enforces)."""

    def __init__(self, kind: str, redis_url: str | None = None):
        self.kind = kind  # "memory", "redis" (one node) or "cluster"
        self.redis_url = redis_url
        self.clock = FakeClock()
        self.key_prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.made: list = []

    def make(self, session_ttl: int = 3600, **options):
        if self.kind == "memory":
            from service.store.memory import MemoryStore

            return MemoryStore(session_ttl=session_ttl, clock=self.clock, quotas=options.get("quotas"))
        from service.store.redis_store import RedisStore

        options.setdefault("instance_cache_bytes", 64 * 1024 * 1024)
        store = RedisStore(self.redis_url, session_ttl=session_ttl, key_prefix=self.key_prefix,
                           cluster=self.kind == "cluster", **options)
        self.made.append(store)
        return store

    def close(self) -> None:
        for store in self.made:
            store.close()

    def elapse(self, seconds: float) -> None:
        if self.kind == "memory":
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)


@pytest.fixture(params=["memory", "redis"])
def store_kind(request) -> str:
    return request.param


# The store contract runs over every backend (as Optuna's STORAGE_MODES); the API suites run over
# memory and one Redis node (store_kind), and tests/test_cluster.py runs the API on the cluster.
STORAGE_MODES = ["memory", "redis", "cluster"]


@pytest.fixture(params=STORAGE_MODES)
def store_env(request):
    """A store maker of the parametrised kind (``store_env.make(session_ttl=...)``)."""
    if request.param == "redis":
        env = StoreUnderTest("redis", request.getfixturevalue("redis_server").url)
    elif request.param == "cluster":
        env = StoreUnderTest("cluster", request.getfixturevalue("redis_cluster").url)
    else:
        env = StoreUnderTest("memory")
    yield env
    env.close()


@pytest.fixture
def redis_env(redis_server):
    """A Redis store maker under a fresh key prefix, for the Redis-only tests."""
    env = StoreUnderTest("redis", redis_server.url)
    yield env
    env.close()


# --- App: the Flask app over each store kind (memory, Redis), and its test client ----------


@pytest.fixture
def app_config(store_kind, request) -> dict:
    """Settings for one test's app: the store kind under test and a fresh Redis key prefix."""
    config = {"redis_url": None, "session_ttl": 3600, "key_prefix": f"test-{uuid.uuid4().hex[:12]}"}
    if store_kind == "redis":
        config["redis_url"] = request.getfixturevalue("redis_server").url
    return config


@pytest.fixture
def app(app_config):
    from service.app import create_app

    return create_app(app_config)


@pytest.fixture
def client(app):
    return app.test_client()


def wait_until_busy(url: str, within: float = 10.0) -> None:
    """Return once Redis at ``url`` answers BUSY (a script is running past busy-reply-threshold):
    a condition polled, not a sleep that hopes the script has started."""
    import redis

    probe = redis.Redis.from_url(url, socket_timeout=within)
    deadline = time.monotonic() + within
    try:
        while True:
            try:
                probe.ping()
            except redis.exceptions.ResponseError as error:
                if str(error).startswith("BUSY"):
                    return
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"Redis at {url} was not busy within {within} s")
            time.sleep(0.005)
    finally:
        probe.close()


@pytest.fixture
def only_deterministic_policies():
    """The policy registry reduced to the policies refused on likelihood instances, then put back
    whole, in its order (registry order breaks ties: monkeypatch's delitem would reorder it)."""
    from service.engine import POLICIES

    saved = dict(POLICIES)
    for name, policy in saved.items():
        if not policy.deterministic_only:
            del POLICIES[name]
    yield
    POLICIES.clear()
    POLICIES.update(saved)

