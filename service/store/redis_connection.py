"""The Redis store's connection: its two pools and the one way it writes.

Small commands use a pool with 0.5 s connect and read timeouts (service/store/redis_client.py).
Instance bodies (up to hundreds of MB) go through a second pool whose read timeout is
``bulk_timeout`` (Python's ``sendall`` timeout bounds the whole upload); its connect timeout is the
same 0.5 s, so an unreachable server still fails fast.

Durability: a write is acknowledged once the master has it; replication is asynchronous, so a
master killed before its replica received the last writes loses them in a failover. With
``wait_replicas`` (REDIS_WAIT_REPLICAS) each write is followed by WAIT on the same connection and
acknowledged only when that many replicas hold it (else 503; the client's retry is a no-op).
docs/scaling.md measures both.
"""

from __future__ import annotations

import contextlib
import logging

import redis

from .base import StoreUnavailable
from .redis_client import COMMAND_TIMEOUT, LazyClient, connect, is_unavailable, redis_errors

log = logging.getLogger(__name__)

DEFAULT_BULK_TIMEOUT = 10.0
DEFAULT_WAIT_TIMEOUT_MS = 250


class RedisConnection:
    def __init__(self, url: str, *, cluster: bool = False, bulk_timeout: float = DEFAULT_BULK_TIMEOUT,
                 wait_replicas: int = 0, wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS):
        if wait_replicas < 0 or not 0 < wait_timeout_ms < COMMAND_TIMEOUT * 1000:
            raise ValueError(f"wait_replicas must be ≥ 0 and wait_timeout_ms in (0, {COMMAND_TIMEOUT * 1000:.0f}) "
                             f"(below the command timeout), got {wait_replicas}, {wait_timeout_ms}")
        self.cluster = cluster
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.redis = LazyClient(lambda: connect(url, cluster=cluster))
        # Bodies of up to hundreds of MB: 1 MiB socket reads, not 64 KiB (fewer syscalls and copies).
        self.bulk = LazyClient(lambda: connect(url, cluster=cluster, socket_timeout=bulk_timeout,
                                               read_size=1 << 20, big_values=True))
        self.round_trips = 0  # network round trips made (tests and /metrics read it)

    def write(self, key: str, commands: list[tuple], *, bulk: bool = False, atomic: bool = False,
              bookkeeping: list[tuple] = ()) -> list:
        """Run ``commands`` (all on ``key``'s slot; a trailing dict in one is redis-py's parsing
        options for it) in one round trip, as one MULTI/EXEC when ``atomic``, and return their
        replies. ``bookkeeping`` (not with ``atomic``: any slot) rides along in the same round
        trip and may fail alone, as in :func:`essential`.

        With ``wait_replicas`` (REDIS_WAIT_REPLICAS), ``WAIT`` follows them, and fewer replicas
        confirming within ``wait_timeout_ms`` is :class:`StoreUnavailable`: the write happened on
        the master but was not acknowledged, and the client's retry is a no-op (creates and
        observations are idempotent). WAIT counts the replicas holding *this connection's*
        writes, so it must follow them on the same connection to the key's master: a plain
        pipeline to that node (the cluster client names it), with MULTI/EXEC spelled out.
        """
        lazy = self.bulk if bulk else self.redis
        client = lazy.get()
        self.round_trips += 1
        if not self.wait_replicas:
            if len(commands) == 1 and not atomic and not bookkeeping:
                # A pipeline of one would cost the cluster client a second round trip.
                args, options = _options(commands[0])
                return [lazy.own().execute_command(*args, **options)]
            pipe = client.pipeline(transaction=atomic)
            for command in [*commands, *bookkeeping]:
                args, options = _options(command)
                pipe.execute_command(*args, **options)
            return essential(pipe, len(commands)) if bookkeeping else pipe.execute()
        replies = self._write_and_wait(client, key, commands, atomic)
        if bookkeeping:  # its slot may be another node's: a round trip of its own
            self.round_trips += 1
            with contextlib.suppress(redis.exceptions.RedisError):
                bookkeeper = client.pipeline(transaction=False)
                for command in bookkeeping:
                    bookkeeper.execute_command(*command)
                bookkeeper.execute()
        if atomic:
            return list(replies[-2])
        return replies[:-1]

    def _write_and_wait(self, client, key: str, commands: list[tuple], atomic: bool) -> list:
        """``commands`` then WAIT, on one connection to ``key``'s master; the replies, WAIT's last."""
        node = client.get_redis_connection(client.get_node_from_key(key)) if self.cluster else client
        pipe = node.pipeline(transaction=False)
        for command in [("MULTI",)] * atomic + commands + [("EXEC",)] * atomic:
            args, options = _options(command)
            pipe.execute_command(*args, **options)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        try:
            replies = pipe.execute()
        except redis.exceptions.RedisError as error:
            if self.cluster and is_unavailable(error):
                # This path bypasses the cluster client's redirect handling: have it re-read the
                # slot map so the client's retry goes to the node that now owns the slot.
                _refresh_slot_map(client)
            raise
        confirmed = int(replies[-1])
        if confirmed < self.wait_replicas:
            raise StoreUnavailable(f"{confirmed} of {self.wait_replicas} replicas confirmed the write within "
                                   f"{self.wait_timeout_ms} ms (REDIS_WAIT_REPLICAS)")
        return replies

    def ping(self) -> None:
        with redis_errors():
            self.round_trips += 1
            client = self.redis.get()
            if not self.cluster:
                client.ping()
                return
            # Ready only when the cluster says it serves every slot and every master answers.
            state = client.cluster_info().get("cluster_state")
            if state != "ok":
                raise StoreUnavailable(f"Redis Cluster state is {state!r}, not 'ok'")
            client.ping(target_nodes=redis.RedisCluster.PRIMARIES)

    def warm(self) -> None:
        # Both pools: a session's first step downloads its instance on one and writes the
        # session on the other, and each first connection (with CLIENT SETINFO) was 2–10 ms of
        # a new worker's first request.
        with redis_errors():
            for pool in (self.redis, self.bulk):
                self.round_trips += 1
                client = pool.get()
                if self.cluster:
                    client.ping(target_nodes=redis.RedisCluster.PRIMARIES)
                else:
                    client.ping()

    def close(self) -> None:
        self.redis.close()
        self.bulk.close()


def essential(pipe, count: int) -> list:
    """The replies of a pipeline whose first ``count`` commands are the point of it; the rest
    (sliding a quota entry) may fail alone — under OOM a ZADD is refused while reads still
    work, and a read must not fail for its bookkeeping."""
    replies = pipe.execute(raise_on_error=False)
    for reply in replies[:count]:
        if isinstance(reply, Exception):
            raise reply
    return replies[:count]


def _options(command: tuple) -> tuple[tuple, dict]:
    if command and isinstance(command[-1], dict):
        return command[:-1], command[-1]
    return command, {}


def _refresh_slot_map(client: redis.RedisCluster) -> None:
    try:
        client.nodes_manager.initialize()
    except Exception as error:  # the cluster may be unreachable as a whole; the 503 stands
        log.warning("could not refresh the Redis Cluster slot map: %s", error)
