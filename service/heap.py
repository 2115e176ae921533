"""A worker's heap, faulted in once when it boots and kept (glibc's malloc; elsewhere nothing).

Why: the kernel hands memory over a page at a time, on first touch, and on this kind of machine
each fresh page costs ~3 µs. glibc gives every block above its mmap threshold (128 KiB, rising
to at most 32 MiB as such blocks are freed) back to the kernel when it is freed, trims the free
top of the heap, and gives each thread an arena of its own. So a worker faults its memory in
again and again: ~3 700–6 500 fresh pages (11–20 ms) to receive a 13 MB body that the event
loop's thread reads and a request thread parses, ~2 700 on a fresh worker's first step on a
10⁴ × 10³ instance (docs/scaling.md).

:func:`reserve_heap` makes blocks up to ``nbytes`` come from the one main heap whatever the
thread, keeps ``nbytes`` of its free top instead of trimming it, and touches that much once, so
a fresh worker starts with the memory a warm one has. Blocks larger than ``nbytes`` are still
mapped and unmapped as before; the cost is ``nbytes`` resident per worker from the start.

The other side of it: a heap that big blocks come from keeps the pages of what they freed, holes
between the blocks still in use, so a worker that parsed an 80 MB body stayed at several times
its boot size while idle. :func:`trim_heap` gives every free page back but ``keep`` bytes at the
top (glibc's ``malloc_trim``); the worker calls it when it falls idle well above its boot size.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8


def _glibc() -> ctypes.CDLL | None:
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr at all
        return None
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def reserve_heap(nbytes: int) -> bool:
    """Keep ``nbytes`` of heap faulted in for the life of the process; True when done (glibc,
    ``nbytes`` > 0). Call it once, before the process starts its threads."""
    if nbytes <= 0:
        return False
    libc = _glibc()
    if libc is None:
        log.info("heap reserve skipped: not glibc's malloc")
        return False
    size = min(nbytes, 2**31 - 1)  # mallopt takes an int
    settings = ((_M_ARENA_MAX, 1),  # one heap for every thread: the one faulted in below
                (_M_MMAP_THRESHOLD, size),  # blocks below this come from the heap and go back to it
                (_M_TOP_PAD, size),  # a trim keeps this much of the heap's free top
                (_M_TRIM_THRESHOLD, min(2 * size, 2**31 - 1)))
    if not all(libc.mallopt(parameter, value) == 1 for parameter, value in settings):
        log.warning("heap reserve skipped: malloc refused its settings")
        return False
    block = size - min(size // 2, 1 << 16)  # below the mmap threshold: carved from the heap
    address = libc.malloc(block)
    if not address:
        return False
    ctypes.memset(address, 0, block)  # the writes fault the pages in
    libc.free(address)
    return True


def trim_heap(keep: int) -> bool:
    """Give the kernel back every free page of the heap, from its middle too, except ``keep``
    bytes at its top; True when memory was released (glibc only)."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(max(0, keep)))


def resident_bytes() -> int:
    """This process's resident memory (Linux ``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
