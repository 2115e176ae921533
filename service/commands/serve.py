"""``edgecut serve [--host --port --workers]``: the HTTP service under gunicorn, configured by
service/gunicorn_conf.py and the environment (service/settings.py)."""

from __future__ import annotations

import argparse
import os
import sys

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
    workers = args.workers if args.workers is not None else settings.workers
    if workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {workers}")
    if settings.uses_memory_store:
        if workers != 1:
            print(f"edgecut: in-memory store (REDIS_URL is unset): running exactly one worker, not {workers}; "
                  "set REDIS_URL to run several", file=out)
        else:
            print("edgecut: in-memory store (REDIS_URL is unset): one worker; sessions live in this process",
                  file=out)
        workers = 1
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    return [sys.executable, "-m", "gunicorn", "--config", CONFIG, "--bind", f"{host}:{args.port}",
            "--workers", str(workers), APP]


def run(args: argparse.Namespace) -> int:
    try:
        argv = gunicorn_argv(args)
    except ConfigurationError as error:
        print(f"edgecut: {error}", file=sys.stderr)
        return 2
    sys.stderr.flush()
    os.execv(argv[0], argv)  # gunicorn becomes this process: signals reach its master directly
    return 0  # not reached
