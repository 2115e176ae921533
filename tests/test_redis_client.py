"""service/store/redis_client.py's clients, against a real redis-server: each thread's own client
for single commands keeps one connection of the shared pool, and gives it back when closed; the
pool that uploads instance bodies sends them as they are."""

from __future__ import annotations

import threading

import redis

from service.store.redis_client import LazyClient, connect


def test_each_thread_has_its_own_client_on_one_connection_of_the_shared_pool(redis_server):
    lazy = LazyClient(lambda: connect(redis_server.url))
    pool = lazy.get().connection_pool
    mine = lazy.own()
    assert lazy.own() is mine and mine.connection_pool is pool
    assert mine.execute_command("PING") and lazy.own().execute_command("PING")
    assert len(pool._in_use_connections) == 1  # held for good, not taken and given back per command
    others = []
    thread = threading.Thread(target=lambda: others.append((lazy.own(), lazy.own().execute_command("PING"))))
    thread.start()
    thread.join()
    assert others[0][0] is not mine and others[0][1]
    assert len(pool._in_use_connections) == 2
    lazy.close()
    assert not pool._in_use_connections


def test_a_thread_client_whose_connection_was_cut_reconnects_on_its_next_command(redis_server):
    lazy = LazyClient(lambda: connect(redis_server.url))
    mine = lazy.own()
    name = f"edgecut-test-{id(mine)}"
    mine.execute_command("CLIENT", "SETNAME", name)
    killer = redis.Redis.from_url(redis_server.url)
    assert killer.client_kill_filter(_type=None, skipme=True, _id=mine.client_id()) == 1
    # The dead connection is dropped and reopened (one retry, as for the pool's clients).
    assert mine.execute_command("PING")
    killer.close()
    lazy.close()


def test_the_store_uploads_an_instance_body_as_the_bytes_object_it_is(redis_server):
    """The bulk pool's packer hands a big value to the socket as it is: never copied into one
    buffer with its command (hiredis's packer does: ~60 MB more, and a long call holding the GIL,
    for an 80 MiB instance). Checked on what the connection would send, then stored and read back."""
    from service.store.redis_connection import RedisConnection

    bulk = RedisConnection(redis_server.url).bulk.get()
    body = bytes(range(256)) * 4096  # 1 MiB
    connection = bulk.connection_pool.get_connection()
    try:
        sent = connection.pack_commands([("HSETNX", "edgecut-test:upload", "body", body)])
        assert any(piece is body for piece in sent)
        assert b"".join(sent) == b"*4\r\n$6\r\nHSETNX\r\n$19\r\nedgecut-test:upload\r\n$4\r\nbody\r\n$%d\r\n" % len(body) \
            + body + b"\r\n"  # RESP, as the protocol spells it
    finally:
        bulk.connection_pool.release(connection)
    assert bulk.hsetnx("edgecut-test:upload", "body", body) == 1
    assert bulk.hget("edgecut-test:upload", "body") == body
    bulk.delete("edgecut-test:upload")
