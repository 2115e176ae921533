"""Live servers on free loopback ports. :class:`LiveServer`: a real gunicorn serving the app, for
the fault tests, the live schemathesis run, the client's tests and bench/load.py; flags are given
explicitly (the production worker class, service/worker/) so a run depends only on the app and
the environment it is handed. :class:`EdgecutServe`: the ``edgecut serve`` command itself, as a
user starts it."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from conftest import free_port

REPO = Path(__file__).resolve().parent.parent


def child_pids(pid: int) -> set[int]:
    """A process's children, from /proc: each of its threads lists those it started."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(child) for child in (task / "children").read_text().split())
        except OSError:  # the thread, or the process, is gone
            continue
    return found


def close_abandoned_connections() -> None:
    """Close the kept-alive connections this process dropped without closing (a requests.Session
    or a third-party client left to the garbage collector): a stopping worker keeps each open up
    to 2 s for a request that might be on its way, so a stop would wait that out."""
    gc.collect()


class LiveServer:
    def __init__(self, env: dict[str, str], workers: int = 2, threads: int = 4, log: Path | None = None,
                 worker_class: str = "service.worker.BufferingWorker", config: str | None = None,
                 gunicorn_args: tuple[str, ...] = ()):
        self.port = free_port()
        self.worker_class = worker_class
        self.config = config  # a gunicorn --config (the project's: "python:service.gunicorn_conf")
        self.workers = workers
        self.threads = threads
        self.gunicorn_args = gunicorn_args  # more flags, e.g. ("--worker-connections", "16")
        self.env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
        self.log = log or Path(tempfile.mkstemp(prefix="edgecut-gunicorn-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        argv = [sys.executable, "-m", "gunicorn", *(("--config", self.config) if self.config else ()),
                "--workers", str(self.workers), "--worker-class", self.worker_class,
                "--threads", str(self.threads), "--bind", f"127.0.0.1:{self.port}", "--timeout", "30",
                "--graceful-timeout", "3", "--log-level", "warning",
                # gunicorn's control socket has one default path: servers side by side would remove
                # each other's (the project's config disables it too).
                "--no-control-socket", *self.gunicorn_args, "service.app:create_app()"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited ({self.process.returncode}); see {self.log}:\n"
                                   + self.log.read_text()[-2000:])
            try:
                if (requests.get(self.url + "/healthz", timeout=1).status_code == 200
                        and len(self.worker_pids()) == self.workers):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gunicorn did not answer on {self.url}; see {self.log}")

    def worker_pids(self) -> list[int]:
        """The master's children (gunicorn workers), from /proc."""
        return [] if self.process is None else sorted(child_pids(self.process.pid))

    def kill_worker(self) -> int:
        pid = self.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        if self.process is None:
            return
        close_abandoned_connections()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class EdgecutServe:
    """``edgecut serve --port <free port> *args`` with ``env`` added to the environment; its
    output goes to a file (a pipe nobody reads would fill and stall the server), read by
    :meth:`stop` into ``log``."""

    def __init__(self, env: dict[str, str], *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = ""
        self._log_file = tempfile.TemporaryFile(mode="w+", prefix="edgecut-serve-")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port), *args],
            cwd=REPO, env={**os.environ, **env, "PYTHONPATH": str(REPO)}, stdout=self._log_file,
            stderr=subprocess.STDOUT, text=True)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log_file.seek(0)
                raise AssertionError(f"server exited: {self._log_file.read()}")
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                # Not listening yet, or a worker still importing numpy on a loaded machine.
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server did not become ready:\n{self.log[-2000:]}")

    def stop(self) -> int:
        if self.process.poll() is None:
            close_abandoned_connections()
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log_file.seek(0)
        self.log = self._log_file.read()
        self._log_file.close()
        return code
