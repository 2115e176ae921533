"""``edgecut serve [--host --port --workers]``: the HTTP service under gunicorn, configured by
service/gunicorn_conf.py and the environment (service/settings.py).

Logs are plain text when stderr is a terminal and ``LOG_FORMAT`` is unset (a person is reading),
JSON lines otherwise (a log shipper is); ``LOG_FORMAT`` decides when set. A port already in use
is reported in one line, in that format, before gunicorn starts."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys

from service.logs import JsonFormatter
from service.settings import ConfigurationError, load_settings

APP = "service.app:create_app()"
CONFIG = "python:service.gunicorn_conf"


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="run the HTTP service (gunicorn)",
                                   description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default WEB_CONCURRENCY, or 2 per core; 1 with the in-memory store)")
    parser.set_defaults(handler=run)


def gunicorn_argv(args: argparse.Namespace, out=sys.stderr) -> list[str]:
    """The gunicorn command line for these arguments; says so when the store forces one worker."""
    settings = load_settings()

    def say(message: str) -> None:
        report(message, logging.INFO, settings.log_format, out)

    workers = args.workers if args.workers is not None else settings.workers
    if workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {workers}")
    if settings.uses_memory_store:
        if workers != 1:
            say(f"in-memory store (REDIS_URL is unset): running exactly one worker, not {workers}; "
                "set REDIS_URL to run several")
        else:
            say("in-memory store (REDIS_URL is unset): one worker; sessions live in this process")
        workers = 1
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    return [sys.executable, "-m", "gunicorn", "--config", CONFIG, "--bind", f"{host}:{args.port}",
            "--workers", str(workers), APP]


def choose_log_format() -> None:
    """``LOG_FORMAT=text`` for a terminal when the variable is unset; gunicorn inherits it."""
    if not os.environ.get("LOG_FORMAT") and sys.stderr.isatty():
        os.environ["LOG_FORMAT"] = "text"


def port_in_use(host: str, port: int) -> bool:
    """Whether binding fails as gunicorn's would (it sets SO_REUSEADDR too, so a port left in
    TIME_WAIT by a stopped server is free)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False  # gunicorn reports a bad host itself
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def report(message: str, level: int, log_format: str, out=None) -> None:
    """One line before gunicorn starts, in the format its log lines will have."""
    out = out or sys.stderr
    if log_format == "json":
        record = logging.LogRecord("service.cli", level, __file__, 0, message, None, None)
        print(JsonFormatter().format(record), file=out)
    else:
        prefix = "edgecut: error: " if level >= logging.ERROR else "edgecut: "
        print(prefix + message, file=out)


def run(args: argparse.Namespace) -> int:
    choose_log_format()
    try:
        argv = gunicorn_argv(args)
    except ConfigurationError as error:
        print(f"edgecut: {error}", file=sys.stderr)
        return 2
    if port_in_use(args.host, args.port):
        report(f"port {args.port} on {args.host} is in use (another edgecut serve?); "
               "stop it or choose another with --port", logging.ERROR, load_settings().log_format)
        return 2
    sys.stderr.flush()
    os.execv(argv[0], argv)  # gunicorn becomes this process: signals reach its master directly
    return 0  # not reached
