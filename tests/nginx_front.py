"""nginx in front of a live gunicorn, as docker-compose.yml runs it: Debian's nginx binary,
deploy/nginx.conf.template filled the way the nginx image fills it at start (``${NAME}`` from
the environment), on a free loopback port, with its pid, logs and temporary files in a
directory of its own."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import free_port

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "deploy" / "nginx.conf.template"
NGINX = shutil.which("nginx") or next((path for path in ("/usr/sbin/nginx",) if os.path.exists(path)), None)
_VARIABLE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")


def template_variables() -> set[str]:
    return set(_VARIABLE.findall(TEMPLATE.read_text()))


def render(values: dict[str, str]) -> str:
    """The template with every ``${NAME}`` replaced (as envsubst does); a name not given is an
    error here, where envsubst would leave it in and nginx would refuse the file."""
    return _VARIABLE.sub(lambda match: values[match.group(1)], TEMPLATE.read_text())


class NginxFront:
    def __init__(self, upstream_port: int, max_body_bytes: int, read_timeout: float):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="edgecut-nginx-"))
        self.values = {"NGINX_LISTEN": f"127.0.0.1:{self.port}", "EDGECUT_UPSTREAM": f"127.0.0.1:{upstream_port}",
                       "NGINX_TEMP_DIR": str(self.dir), "MAX_BODY_BYTES": str(max_body_bytes),
                       "REQUEST_READ_TIMEOUT": f"{read_timeout:g}"}
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def error_log(self) -> str:
        path = self.dir / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 10.0) -> None:
        config = self.dir / "nginx.conf"
        config.write_text(render(self.values))
        # Run as root (CI), nginx's workers would switch to an unprivileged user that cannot
        # write this directory; as anyone else the directive is ignored.
        user = "user root;" if os.geteuid() == 0 else ""
        directives = f"daemon off; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log info; {user}"
        self.process = subprocess.Popen([NGINX, "-p", str(self.dir), "-c", str(config), "-g", directives],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.process.stderr.read().decode()}\n{self.error_log}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not listen on {self.port}:\n{self.error_log}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)  # fast shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process.stderr.close()
            self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)
