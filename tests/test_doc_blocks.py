"""Every shell and Python block in README.md and docs/*.md runs, in the page's order, against a
live ``edgecut serve``; a block that cannot run says why in a marker on the line before it::

    <!-- not run: installs the package (tests/test_cli_install.py runs this install) -->

What a run checks: every command of a shell block succeeds (``set -euo pipefail``, and ``curl``
fails on any HTTP error status); what the ``# →`` comments of a shell block show — each
``"field": value`` with a plain value, each ``ETag`` — appears in what the block printed (the
comments abbreviate answers, so fields are checked one by one, not whole bodies); every Python
block runs without an exception, and a Python ``print(...)`` line that ends in a comment prints
exactly that comment. Shell blocks of one page share their
variables and functions (a later block uses the ids an earlier one captured); Python blocks of
one page share one namespace. They run in a scratch directory holding a link to ``examples/``,
with ``localhost:8000`` and ``127.0.0.1:8000`` pointed at the test's server.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python"}
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->\s*$")
DEFAULT_ADDRESS = re.compile(r"(?:localhost|127\.0\.0\.1):8000")
# In a "# →" comment: a field with a plain JSON value (placeholders such as "<sid>" or "a7…" are
# not plain), and an ETag.
SHOWN_FIELD = re.compile(r'"(\w+)": ("[^"<…]*"|true|false|null|-?\d+(?:\.\d+)?)(?=[,}\]\s])')
SHOWN_ETAG = re.compile(r'ETag: ("\d+")')


@dataclass
class Block:
    page: Path
    line: int
    language: str  # "sh" or "python"
    code: str
    not_run: str | None  # the reason, when the page says the block is not run

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = RUN.get(match.group(1).lower())
        if language is None:
            continue  # json, http answers, plain text
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, language, match.group(2),
                           marker.group(1) if marker else None))
    return found


def runnable(language: str) -> list[Path]:
    return [page for page in PAGES if any(b.language == language and b.not_run is None for b in blocks(page))]


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_comments_are_read_field_by_field():
    fields, etags = shown_in_comments('curl x  # → {"done": true, "id": "<sid>", "n": 3}\n'
                                      '#    "history": [{"test": "ecg", "cost": 2.0}]}\nnext\n# unrelated: "x": 1\n'
                                      'curl y\n# → ETag: "3"  {"map_class": "home", ...}')
    assert fields == ['"done":true', '"n":3', '"test":"ecg"', '"cost":2.0', '"map_class":"home"']
    assert etags == ['etag: "3"']


def test_the_runner_sees_the_pages_blocks():
    every = [block for page in PAGES for block in blocks(page)]
    assert sum(b.language == "sh" for b in every) >= 10 and sum(b.language == "python" for b in every) >= 2
    for block in every:
        assert block.not_run is None or len(block.not_run.split()) >= 3, f"{block}: say why it is not run"


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def shown_in_comments(code: str) -> tuple[list[str], list[str]]:
    """The fields and ETags a shell block's "# →" comments (and the comment lines continuing
    them) say its commands print."""
    comments, inside = [], False
    for line in code.splitlines():
        stripped = line.strip()
        if "# →" in stripped:
            comments.append(stripped.split("# →", 1)[1])
            inside = True
        elif inside and stripped.startswith("#"):
            comments.append(stripped.lstrip("#"))
        else:
            inside = False
    text = " ".join(comments) + " "
    return ([f'"{key}":{value}' for key, value in SHOWN_FIELD.findall(text)],
            [f"etag: {tag}" for tag in SHOWN_ETAG.findall(text)])


def _assigned_names(code: str) -> tuple[set[str], set[str]]:
    variables = set(re.findall(r"^\s*([A-Za-z_]\w*)=", code, re.M))
    functions = set(re.findall(r"^\s*([A-Za-z_]\w*)\(\)\s*\{", code, re.M))
    return variables, functions


@pytest.mark.parametrize("page", runnable("sh"), ids=page_id)
def test_shell_blocks_run(page, served, scratch):
    state = scratch / ".state.sh"
    state.write_text("")
    address = served.url.removeprefix("http://")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for block in blocks(page):
        if block.language != "sh" or block.not_run is not None:
            continue
        variables, functions = _assigned_names(block.code)
        saved = " ".join(sorted(variables))
        script = "\n".join([
            "set -euo pipefail",
            "curl() { command curl --fail-with-body --silent --show-error \"$@\"; }",
            f". {state}",
            DEFAULT_ADDRESS.sub(address, block.code),
            # What this block defined, for the page's later blocks.
            *([f"declare -p {saved} >> {state}"] if saved else []),
            *([f"declare -f {' '.join(sorted(functions))} >> {state}"] if functions else []),
        ])
        result = subprocess.run(["bash", "-c", script], cwd=scratch, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, f"{block} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        fields, etags = shown_in_comments(block.code)
        printed = re.sub(r'(?<=[:,])\s+', "", result.stdout)  # JSON as orjson writes it, without spaces
        for field in fields:
            assert field in printed, f"{block}: the page shows {field}, the commands printed:\n{result.stdout[-3000:]}"
        for etag in etags:
            assert etag in result.stdout.lower(), f"{block}: the page shows {etag}, the commands printed other headers"


def _expected_prints(code: str) -> list[str | None]:
    """For each ``print(...)`` statement, in order, the comment that ends its line (or None)."""
    lines = code.splitlines()
    expected = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
            line = lines[node.end_lineno - 1]
            comment = line.split("#", 1)[1].strip() if "#" in line[node.end_col_offset:] else None
            expected.append((node.lineno, comment))
    return [comment for _, comment in sorted(expected)]


@pytest.mark.parametrize("page", runnable("python"), ids=page_id)
def test_python_blocks_run(page, served, scratch, monkeypatch):
    monkeypatch.chdir(scratch)
    namespace: dict = {"__name__": "__doc_block__"}
    for block in blocks(page):
        if block.language != "python" or block.not_run is not None:
            continue
        code = DEFAULT_ADDRESS.sub(served.url.removeprefix("http://"), block.code)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(block), "exec"), namespace)
        expected = _expected_prints(code)
        lines = printed.getvalue().splitlines()
        if len(lines) == len(expected):  # a print in a loop prints more often than it is written
            for shown, wanted in zip(lines, expected):
                assert wanted is None or shown == wanted, f"{block} printed {shown!r}, the page says {wanted!r}"
        else:
            assert all(wanted is None for wanted in expected), f"{block}: {len(lines)} lines for {len(expected)} prints"
