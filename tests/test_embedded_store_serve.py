"""``edgecut serve`` with the embedded in-memory store (the README's quick start): the store lives
in the one worker, so that worker must last as long as the service does."""

from __future__ import annotations

import pytest
import requests

from api_support import QUAD
from live_server import EdgecutServe

pytestmark = pytest.mark.slow
MAX_REQUESTS = 4


def test_a_session_outlives_max_requests_with_the_embedded_store():
    # GUNICORN_CMD_ARGS overrides the configuration file, as an operator's flags would.
    server = EdgecutServe({"REDIS_URL": "", "LOG_LEVEL": "info",
                           "GUNICORN_CMD_ARGS": f"--max-requests {MAX_REQUESTS} --max-requests-jitter 0"})
    try:
        server.wait_ready()
        created = requests.post(server.url + "/v1/sessions", json={"instance": QUAD}, timeout=5)
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        for _ in range(3 * MAX_REQUESTS):
            assert requests.get(f"{server.url}/v1/sessions/{sid}", timeout=5).status_code == 200
    finally:
        server.stop()
    assert server.log.count("Booting worker") == 1, server.log[-2000:]
    assert f"max_requests {MAX_REQUESTS} ignored" in server.log
