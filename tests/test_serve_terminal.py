"""``edgecut serve`` speaks to whoever reads its stderr: plain text to a terminal, one JSON object
per line to anything else (``LOG_FORMAT`` decides when set), and a busy port in one line."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO), "REDIS_URL": "", "LOG_LEVEL": "info"}


@pytest.fixture
def busy_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def serve_on_a_terminal(port: int, env: dict[str, str], until: str, timeout: float = 30.0,
                        poke: Callable[[], None] = lambda: None) -> tuple[str, int | None]:
    """Run ``edgecut serve`` with stdout and stderr on a pseudo-terminal; return what it wrote
    until ``until`` appeared (then stop it) or it exited, and its exit status if it exited.
    ``poke`` runs whenever the terminal is quiet (a request that makes the server log a line)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                               cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while until.encode() not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
            else:
                poke()
    finally:
        try:
            code = process.wait(timeout=0 if until.encode() in output else 5)
        except subprocess.TimeoutExpired:
            code = None
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        os.close(controller)
    return output.decode(errors="replace").replace("\r\n", "\n"), code


def readyz(port: int) -> None:
    try:
        requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
    except requests.RequestException:
        pass  # not listening yet


def test_a_terminal_gets_plain_text_logs():
    from conftest import free_port

    # Stopped once its worker has answered (and logged) a request: a SIGTERM that lands while the
    # worker is still booting is lost, and gunicorn then waits out its 20 s graceful timeout.
    port = free_port()
    output, _ = serve_on_a_terminal(port, ENV, until="GET /readyz 200", poke=lambda: readyz(port))
    lines = [line for line in output.splitlines() if line.strip()]
    assert any("Booting worker" in line for line in lines), output
    assert any("GET /readyz 200" in line for line in lines), output
    assert not any(line.lstrip().startswith("{") for line in lines), output


def test_a_terminal_gets_one_plain_line_for_a_busy_port(busy_port):
    output, code = serve_on_a_terminal(busy_port, ENV, until="\n\n")
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2
    errors = [line for line in lines if "in use" in line]
    assert errors == [f"edgecut: error: port {busy_port} on 127.0.0.1 is in use (another edgecut serve?); "
                      "stop it or choose another with --port"], output
    assert "Traceback" not in output and not any(line.startswith("{") for line in lines)


def test_a_pipe_gets_json_lines_for_a_busy_port(busy_port):
    result = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--port", str(busy_port)],
                            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert records[-1]["level"] == "ERROR" and f"port {busy_port}" in records[-1]["message"]
    assert sum("in use" in record["message"] for record in records) == 1


def test_log_format_overrides_the_terminal(busy_port):
    output, code = serve_on_a_terminal(busy_port, {**ENV, "LOG_FORMAT": "json"}, until="\n\n")
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2 and lines and all(json.loads(line)["message"] for line in lines), output
