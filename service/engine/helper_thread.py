"""One helper thread per process for the engine's two-thread passes (service/engine/alpha.py):
started on first use, and forgotten in a forked child, which inherits the executor but not its
thread (work submitted there would never run)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_helper_thread: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def helper() -> ThreadPoolExecutor:
    """The process's helper thread (one worker)."""
    global _helper_thread
    with _helper_lock:
        if _helper_thread is None:
            _helper_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgecut-alpha")
        return _helper_thread


def _forget_helper_after_fork() -> None:
    # A gunicorn worker or multiprocessing child starts its own when it needs one.
    global _helper_thread, _helper_lock
    _helper_thread, _helper_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_helper_after_fork)
