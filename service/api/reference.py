"""Generates docs/api.md's configuration and problem-type tables from the settings object and
the problem table, so the docs cannot drift from what the service reads and answers.
tests/test_docs.py fails when the committed file is stale; regenerate with::

    python3 -m service.api.reference docs/api.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic_core import PydanticUndefined

from service.settings import Settings

from .problems import PROBLEMS, TYPE_PREFIX

# Read from the environment by something other than the settings object.
OTHER_VARIABLES = {
    "PROMETHEUS_MULTIPROC_DIR": ("a temporary directory",
                                 "where gunicorn workers write metrics (set by the gunicorn config)"),
}
_BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z-]+) -->\n).*?(<!-- /generated:(?P=name) -->)", re.DOTALL)


def _default(value: object) -> str:
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|")


def settings_table() -> str:
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        rows.append(f"| `{name.upper()}` | {_default(field.default)} | {_cell(field.description)} |")
    rows += [f"| `{name}` | {default} | {meaning} |" for name, (default, meaning) in OTHER_VARIABLES.items()]
    return "\n".join(rows) + "\n"


def problems_table() -> str:
    rows = [f"| Status | `type` (`{TYPE_PREFIX}…`) | Title | When |", "|---|---|---|---|"]
    for code, (status, title, when) in sorted(PROBLEMS.items(), key=lambda item: item[1][0]):
        rows.append(f"| {status} | `{code}` | {_cell(title)} | {_cell(when)} |")
    return "\n".join(rows) + "\n"


TABLES = {"settings": settings_table, "problems": problems_table}


def render(text: str) -> str:
    """``text`` with every ``<!-- generated:NAME -->`` block rewritten from the code."""
    return _BLOCK.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(3), text)


if __name__ == "__main__":
    for path in map(Path, sys.argv[1:] or ["docs/api.md"]):
        path.write_text(render(path.read_text()))
