"""One way to connect to Redis (a single node or a Redis Cluster) and one reading of its
failures, for the whole service: the store's two pools and the rate limiters.

:func:`connect` returns redis-py's own clients, configured to fail fast: 0.5 s connect timeout,
the caller's read timeout, a 5 s health-check interval and at most one immediate retry, on
connection errors only. With ``cluster=True`` it is :class:`redis.RedisCluster`, which learns the
slot map from any node named in the URL and follows ``MOVED``/``ASK`` itself; the service only
chooses keys whose ``{hash tag}`` keeps everything one operation touches in one slot.

:func:`redis_errors` is the one mapping of Redis failures: unreachable or timed out, ``LOADING``,
``BUSY``, ``READONLY``, ``MISCONF``, ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``,
``NOREPLICAS``, and a ``MOVED``/``ASK`` the cluster client gave up following (a failover or a
resharding in progress) → :class:`StoreUnavailable` (503 + Retry-After); out of memory →
:class:`StoreFull` (507 + Retry-After). Any other error reply is a bug of ours and propagates.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator

import redis
from redis.backoff import NoBackoff
from redis.connection import Encoder, PythonRespSerializer
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry

from .base import StoreFull, StoreUnavailable

CONNECT_TIMEOUT = 0.5
COMMAND_TIMEOUT = 0.5
HEALTH_CHECK_INTERVAL = 5

Client = redis.Redis | redis.RedisCluster

# redis-py parses some replies into their own classes (and strips the prefix); the rest are plain
# ResponseErrors whose message starts with the prefix, or carries it after a pipeline's
# "Command # n (...) caused error: " annotation. An error raised inside a Lua script arrives the
# same way.
_UNAVAILABLE_CLASSES = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ReadOnlyError,
                        ClusterDownError, ClusterError, TryAgainError, AskError, RedisClusterException)
_UNAVAILABLE_REPLY = re.compile(r"(?:^|: )(?:LOADING|MASTERDOWN|READONLY|MISCONF|CLUSTERDOWN|TRYAGAIN|BUSY|NOREPLICAS)\b")
_FULL_REPLY = re.compile(r"(?:^|: )OOM\b")
# The cluster client refuses a command whose keys map to several slots itself, with the same
# RedisClusterException it raises when no node answers: told apart by its message only.
_CROSS_SLOT = re.compile(r"all keys must map to the same key slot")
# What CLIENT SETINFO tells Redis, read from the package metadata once: redis-py otherwise looks
# its own version up for every new connection (~5 ms each, paid by a new worker's first request).
try:
    from redis.driver_info import DriverInfo

    _DRIVER_INFO = {"driver_info": DriverInfo()}
except ImportError:  # redis-py before DriverInfo: it looks the version up per connection, as it must
    _DRIVER_INFO = {}


# redis-py's own: values longer than this go to the socket as they are, not joined to the command.
BUFFER_CUTOFF = 6000


def connect(url: str, *, cluster: bool = False, socket_timeout: float = COMMAND_TIMEOUT,
            read_size: int = 65536, big_values: bool = False) -> Client:
    """A client for ``url``; a Redis Cluster client (any node's URL) when ``cluster``.
    ``read_size``: bytes per socket read (larger for the pool that downloads instance bodies).
    ``big_values`` (the pool that uploads them): each value past a few kB is sent as the object
    it is, never copied into one buffer with its command, as hiredis's packer does: for an 80 MiB
    instance that copy was ~60 MB more at the request's peak and 0.16–0.24 s in one call holding
    the GIL from the worker's other requests (bench/hostile.py --heavy)."""
    options = dict(socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=socket_timeout, socket_read_size=read_size,
                   health_check_interval=HEALTH_CHECK_INTERVAL, socket_keepalive=True,
                   retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
                   **_DRIVER_INFO)
    if big_values and not cluster:  # the cluster client takes no packer: its nodes keep hiredis's
        options["command_packer"] = PythonRespSerializer(BUFFER_CUTOFF, Encoder("utf-8", "strict", False).encode)
    if cluster:
        # One retry after a connection error or CLUSTERDOWN: the client re-reads the slot map in
        # between, so a request right after a promotion lands on the new master.
        return redis.RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


class LazyClient:
    """A client made on first use: a cluster client reads the slot map when it is made, and a
    worker must start (and answer /readyz 503) while the cluster is still unreachable."""

    def __init__(self, factory: Callable[[], Client]):
        self._factory = factory
        self._client: Client | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._owned: list[redis.Redis] = []

    def get(self) -> Client:
        client = self._client
        if client is None:
            with self._lock, redis_errors():
                if self._client is None:
                    self._client = self._factory()
                client = self._client
        return client

    def own(self) -> Client:
        """This thread's client for single commands: on a single node, a client holding one
        connection of the shared pool for good, so a command neither takes a connection from the
        pool (and polls it for stray data) nor gives it back (bench/redis_store.py, row "pool's
        client": 1.3 × a session write's CPU without it). A failed command drops and reopens that connection as the pool's clients do. A cluster
        client picks each command's node: the shared one."""
        client = getattr(self._local, "client", None)
        if client is None:
            shared = self.get()
            if isinstance(shared, redis.RedisCluster):
                return shared
            with redis_errors():
                client = redis.Redis(connection_pool=shared.connection_pool, single_connection_client=True)
            with self._lock:
                self._owned.append(client)
            self._local.client = client
        return client

    def close(self) -> None:
        with self._lock:
            owned, self._owned = self._owned, []
        for client in owned:
            client.close()  # its connection back to the pool, which the shared client closes
        if self._client is not None:
            self._client.close()


def is_full(error: BaseException) -> bool:
    return isinstance(error, OutOfMemoryError) or (isinstance(error, ResponseError)
                                                   and bool(_FULL_REPLY.search(str(error))))


def is_unavailable(error: BaseException) -> bool:
    """True when ``error`` means Redis cannot serve the request right now (retry later)."""
    if isinstance(error, (CrossSlotTransactionError, InvalidPipelineStack)) or _CROSS_SLOT.search(str(error)):
        return False  # keys of one operation in several slots: our bug, not Redis's state
    if isinstance(error, _UNAVAILABLE_CLASSES):
        return True
    return isinstance(error, ResponseError) and bool(_UNAVAILABLE_REPLY.search(str(error))
                                                     or (error.status_code or "") in ("BUSY", "NOREPLICAS", "MISCONF"))


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """The one mapping of Redis failures: "not now" → :class:`StoreUnavailable`, out of memory →
    :class:`StoreFull`; any other error propagates."""
    try:
        yield
    except (redis.exceptions.RedisError, RedisClusterException) as error:
        if is_full(error):
            raise StoreFull(f"Redis is out of memory: {error}") from error
        if is_unavailable(error):
            raise StoreUnavailable(f"Redis cannot serve the request: {type(error).__name__}: {error}") from error
        raise
