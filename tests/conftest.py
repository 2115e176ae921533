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
        self.kind = kind
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
        store = RedisStore(self.redis_url, session_ttl=session_ttl, key_prefix=self.key_prefix, **options)
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


@pytest.fixture
def store_env(store_kind, request):
    """A store maker of the parametrised kind (``store_env.make(session_ttl=...)``)."""
    if store_kind == "redis":
        env = StoreUnderTest("redis", request.getfixturevalue("redis_server").url)
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
