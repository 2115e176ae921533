"""edgecut: adaptive testing with EC² — serve the API, evaluate policies, reproduce the paper.

Each sub-command lives in its own module under ``service/commands/`` and exposes
``register(subparsers)``; ``COMMANDS`` is the only place that knows them all (a command's module
is its name with ``_`` for ``-``)."""

from __future__ import annotations

import argparse
import importlib
import sys

from service import __version__

COMMANDS = ("serve", "evaluate", "calibrate-exposure", "tree", "simulate", "play")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgecut", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"edgecut {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"service.commands.{name.replace('-', '_')}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
