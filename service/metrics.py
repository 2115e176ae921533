"""Prometheus metrics, defined once per process.

Multi-process gunicorn: when ``PROMETHEUS_MULTIPROC_DIR`` is set before this module is first
imported (service/gunicorn_conf.py sets it in the master, before workers fork), every worker
writes its samples to files there and ``/metrics`` aggregates all workers
(prometheus_client's multiprocess mode). Without it (tests, a bare ``flask run``) the numbers
are this process's own.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = Counter("edgecut_http_requests_total", "HTTP requests by route template, method and status",
                   ["route", "method", "status"])
REQUEST_SECONDS = Histogram("edgecut_http_request_duration_seconds", "HTTP request latency by route",
                            ["route", "method"], buckets=LATENCY_BUCKETS)
SELECTION_SECONDS = Histogram("edgecut_selection_duration_seconds",
                              "Time to compute one belief and selection step (engine only)",
                              buckets=LATENCY_BUCKETS)
SESSIONS_CREATED = Counter("edgecut_sessions_created_total", "Sessions created (idempotent replays excluded)")
OBSERVATIONS_APPLIED = Counter("edgecut_observations_applied_total", "Observations recorded in sessions")


def render() -> tuple[bytes, str]:
    """The exposition text: every worker's samples in multiprocess mode, else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
