"""A worker's heap reserve (service/heap.py): the memory is really faulted in (the kernel's own
counts: resident pages, page faults), it serves big blocks from any thread without fresh pages,
the gunicorn worker applies ``WORKER_HEAP_RESERVE_BYTES``, and gives the heap's free pages back
once it is idle well above its boot size. mallopt changes the whole process,
so each check runs in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from live_server import LiveServer

from service.heap import reserve_heap

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
                                reason="the reserve is for glibc's malloc")

# Reserves, then allocates and writes blocks from a new thread, as a request thread would; prints
# what the kernel counted: resident bytes before and after the reserve, and page faults taken
# by the blocks after it.
PROBE = """
import json, resource, sys, threading
from service.heap import reserve_heap

def resident():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

before = resident()
reserved = reserve_heap(int(sys.argv[1]))
after = resident()
counted = []

def requests_of_a_thread():
    for _ in range(3):
        start = faults()
        blocks = [bytearray(b"x") * (8 << 20), bytearray(b"y") * (12 << 20)]  # written: faulted in
        del blocks
        counted.append(faults() - start)

thread = threading.Thread(target=requests_of_a_thread)
thread.start()
thread.join()
print(json.dumps({"reserved": reserved, "grew": after - before, "faults": counted}))
"""


def probe(nbytes: int) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(nbytes)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_reserve_is_resident_and_serves_a_threads_big_blocks_without_fresh_pages():
    reserved, plain = probe(64 * MiB), probe(0)
    pages = (20 * MiB) // 4096  # what the blocks span
    assert reserved["reserved"] is True and plain["reserved"] is False
    assert reserved["grew"] >= 60 * MiB, reserved  # the kernel counts it resident
    assert plain["grew"] < 4 * MiB, plain
    # Every round, the first included, finds its pages already there.
    assert max(reserved["faults"]) < pages // 20, reserved
    # Without it, a thread's first blocks come as fresh pages (what the reserve saves) — unless
    # the kernel backs every mapping with huge pages, and a fault brings 2 MB.
    if "[always]" not in _transparent_huge_pages():
        assert plain["faults"][0] > pages // 2, plain


def _transparent_huge_pages() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""


def test_no_reserve_leaves_malloc_alone():
    assert reserve_heap(0) is False


def worker_resident_bytes(server: LiveServer) -> int:
    deadline = time.monotonic() + 10
    while not server.worker_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    status = Path(f"/proc/{server.worker_pids()[0]}/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


def test_the_worker_applies_worker_heap_reserve_bytes():
    resident = {}
    for reserve in (0, 96 * MiB):
        server = LiveServer({"WORKER_HEAP_RESERVE_BYTES": str(reserve)}, workers=1, threads=2)
        server.start()
        try:
            resident[reserve] = worker_resident_bytes(server)
        finally:
            server.stop()
    assert resident[96 * MiB] - resident[0] >= 90 * MiB, resident


def test_an_idle_worker_gives_back_what_a_big_request_left_in_its_heap():
    """Two 75 MB bodies, refused once parsed (a 75 MB JSON string where a list belongs), leave
    the worker's heap holding their pages; once it is idle it is back within IDLE_EXCESS_BYTES of
    its size at boot (without the trim it stayed ~175 MB above it)."""
    from service.worker import IDLE_CHECK_INTERVAL, IDLE_EXCESS_BYTES

    server = LiveServer({"REDIS_URL": ""}, workers=1, threads=4, config="python:service.gunicorn_conf")
    server.start()
    try:
        booted = worker_resident_bytes(server)
        body = b'{"tests": "' + b"x" * (75 * MiB) + b'", "hypotheses": []}'
        for _ in range(2):
            refused = requests.post(server.url + "/v1/instances", data=body, timeout=120,
                                    headers={"Content-Type": "application/json"})
            assert refused.status_code == 422, refused.text[:300]
        # The check runs when a request ends, at most once per interval: one more, past it.
        time.sleep(IDLE_CHECK_INTERVAL + 0.1)
        assert requests.get(server.url + "/healthz", timeout=5).status_code == 200
        # The trim runs once that answer is sent: read until it shows, or give up after 10 s.
        deadline = time.monotonic() + 10
        idle = worker_resident_bytes(server)
        while idle > booted + IDLE_EXCESS_BYTES and time.monotonic() < deadline:
            time.sleep(0.1)
            idle = worker_resident_bytes(server)
    finally:
        server.stop()
    assert idle <= booted + IDLE_EXCESS_BYTES, (booted >> 20, idle >> 20)
