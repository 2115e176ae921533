"""gunicorn configuration: ``gunicorn -c python:service.gunicorn_conf 'service.app:create_app()'``
(what ``edgecut serve`` and the Dockerfile run). Command-line flags override these values.

* gthread workers: a step is short CPU work (numpy) plus Redis round trips; threads overlap the
  waits, processes use the cores (``WEB_CONCURRENCY`` workers × ``WEB_THREADS`` threads). The
  worker class is gthread's with whole requests read by its event loop first
  (service/worker/), so a stalled upload never holds a thread.
* With the in-memory store (``REDIS_URL`` unset) sessions live in one process, so exactly one
  worker runs, whatever was asked.
* With Redis, workers are recycled after ``max_requests`` (± jitter, so they do not all restart at
  once). With the in-memory store never, whatever a flag says: the store lives in the worker, and
  a recycled worker would take every instance and session with it. Workers get
  ``graceful_timeout`` to finish in-flight requests on shutdown or reload.
* One BLAS thread per worker thread (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``,
  ``MKL_NUM_THREADS`` default to 1; the environment overrides): the workers' processes and
  threads already use every core, and a BLAS pool per process spinning on the same cores made a
  small step's GEMM 3 to 10 times slower (noisy observations at 0.1 of the floor's req/s, 0.5
  with one thread). The engine splits its big sums over a helper thread of its own.
* Each worker freezes what loading the app allocated (``gc.freeze()``), so the garbage
  collector's full passes do not walk every module's objects again.
* Prometheus multiprocess mode: every worker writes its samples under
  ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary directory unless given), and ``/metrics``
  in any worker reports the sum over all of them.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

from gunicorn.glogging import Logger

from service.logs import logging_config
from service.settings import ConfigurationError, load_settings

try:
    settings = load_settings()
except ConfigurationError as error:  # fail at start, with the operator's message, no traceback
    sys.exit(f"edgecut: {error}")

bind = ["127.0.0.1:8000"]
worker_class = "service.worker.BufferingWorker"
workers = settings.workers
threads = settings.web_threads
timeout = 30
graceful_timeout = 20
keepalive = 5
max_requests = 0 if settings.uses_memory_store else 20_000
max_requests_jitter = 0 if settings.uses_memory_store else 2_000
loglevel = settings.log_level.lower()
# gunicorn's lines and the app's in one format on stderr; the app writes the access log itself
# (it knows the request id and tenant), so gunicorn's stays off.
logconfig_dict = logging_config(settings.log_level, settings.log_format)
accesslog = None


class AppWritesTheAccessLog(Logger):
    """gunicorn's logger, less its access log. Given a ``logconfig_dict``, gunicorn would build
    every request's access-log atoms (headers, times, the environ) only for the logger's level
    to drop the line."""

    def access(self, resp, req, environ, request_time) -> None:
        return None


logger_class = AppWritesTheAccessLog
forwarded_allow_ips = "127.0.0.1"
# No gunicornc control socket: one fixed path would collide between several servers on a host.
control_socket_disable = True

# Read once, when a worker first imports numpy (the app is imported in each worker, after this).
for _blas_threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas_threads, "1")

# Set here, in the master, before any worker imports prometheus_client (workers inherit it).
_metrics_dir_given = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
_metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="edgecut-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir
# A given directory that does not exist yet would make every worker fail to boot.
Path(_metrics_dir).mkdir(parents=True, exist_ok=True)


def _one_lasting_worker_for_the_memory_store(server) -> None:
    """The in-memory store lives in the worker: one worker, never recycled, whatever the flags or
    ``GUNICORN_CMD_ARGS`` asked (they override this file)."""
    if not settings.uses_memory_store:
        return
    if server.num_workers != 1:
        server.log.warning("in-memory store (REDIS_URL is unset): running exactly one worker instead of %d",
                           server.num_workers)
        server.num_workers = 1
    if server.cfg.max_requests:
        server.log.warning("in-memory store (REDIS_URL is unset): the worker is never recycled "
                           "(max_requests %d ignored)", server.cfg.max_requests)
        server.cfg.set("max_requests", 0)


def on_starting(server) -> None:
    _one_lasting_worker_for_the_memory_store(server)
    # Samples of a previous run would be summed into this one's.
    for stale in Path(_metrics_dir).glob("*.db"):
        stale.unlink()
    store = "in-memory store (one worker)" if settings.uses_memory_store else "Redis store"
    server.log.info("edgecut: %s, %d worker(s) × %d threads", store, server.num_workers, threads)


def post_worker_init(worker) -> None:
    # The app is loaded: its modules' objects (~70 000 containers) will never be garbage, so
    # they leave the collector's generations, and a full collection walks only what requests
    # made (bench/http_api.py, noisy: a worker's full collections pause it ~40 ms with the
    # freeze, 140-190 ms without).
    gc.freeze()


def child_exit(server, worker) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    if not _metrics_dir_given:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
