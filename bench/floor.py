"""What bench/http_api.py measures the service against and with: the *floor* (the cheapest
useful Redis-backed JSON endpoint, under the same gunicorn configuration as the service), the
launcher both run under, and the CPU their processes spend, read from /proc."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import free_port  # noqa: E402  (the test suite's launcher)


# --- the floor: one Redis GET + SET per request ------------------------------------------


def floor_app():
    """gunicorn ``bench.floor:floor_app()``: the cheapest useful Redis-backed JSON endpoint."""
    import redis
    from flask import Flask, Response, request

    app = Flask("floor")
    client = redis.Redis.from_url(os.environ["REDIS_URL"])

    @app.post("/floor/<key>")
    def floor(key: str) -> Response:
        body = orjson.loads(request.get_data())
        current = client.get(f"floor:{key}")
        client.set(f"floor:{key}", orjson.dumps({"previous": len(current or b""), **body}))
        return Response(orjson.dumps({"ok": True, "key": key}), content_type="application/json")

    return app


# --- processes ---------------------------------------------------------------------------


def wait_http(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port}")


def start_gunicorn(app: str, env: dict[str, str], workers: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen(
        # Workers are not recycled during the run: a worker restarting in the middle of a round
        # (service/gunicorn_conf.py: every 20 000 requests or so) would hit one side of it.
        [sys.executable, "-m", "gunicorn", "--config", "python:service.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--max-requests", "0", app],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, port
