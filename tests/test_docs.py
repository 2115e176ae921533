"""docs/api.md's and docs/reliability.md's generated tables match the code they are generated
from: a setting or a problem type added without its row, or a default changed, fails here
(regenerate: python3 -m service.api.reference)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import orjson
import pytest

from service.api import reference
from service.api.problems import PROBLEMS
from service.logs import JsonFormatter, TextFormatter
from service.settings import Settings

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
RELIABILITY_DOC = API_DOC.with_name("reliability.md")


def test_the_generated_tables_in_docs_api_md_are_current():
    text = API_DOC.read_text()
    assert "<!-- generated:settings -->" in text and "<!-- generated:problems -->" in text
    assert reference.render(text) == text, "docs/api.md is stale: run python3 -m service.api.reference docs/api.md"


def test_the_limits_table_in_docs_reliability_md_is_current():
    text = RELIABILITY_DOC.read_text()
    assert "<!-- generated:limits -->" in text
    assert reference.render(text) == text, \
        "docs/reliability.md is stale: run python3 -m service.api.reference docs/reliability.md"


def test_a_changed_default_would_make_the_limits_table_stale(monkeypatch):
    text = RELIABILITY_DOC.read_text()
    monkeypatch.setattr(Settings.model_fields["max_body_bytes"], "default", 16 * 1024 * 1024)
    assert "| `MAX_BODY_BYTES` | 16 MiB |" in reference.render(text) != text


def test_every_setting_and_problem_type_has_its_row():
    text = API_DOC.read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description for docs/api.md"
        assert f"| `{name.upper()}` |" in text
    for code, (_, _, when) in PROBLEMS.items():
        assert when, f"{code} says nothing about when a client gets it"
        assert f"| `{code}` |" in text


def test_a_new_setting_would_make_the_docs_stale(monkeypatch):
    text = API_DOC.read_text()
    monkeypatch.setitem(PROBLEMS, "brand-new", (418, "Teapot", "never"))
    assert reference.render(text) != text


def _record(message: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord("service.test", logging.INFO, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    return record


def test_json_log_lines_are_one_object_with_the_extra_fields():
    line = JsonFormatter().format(_record("hello \"world\"\nsecond line", status=201, duration_ms=1.5))
    assert "\n" not in line
    parsed = orjson.loads(line)
    assert parsed["message"] == "hello \"world\"\nsecond line" and parsed["level"] == "INFO"
    assert parsed["logger"] == "service.test" and parsed["status"] == 201 and parsed["duration_ms"] == 1.5
    assert parsed["time"].endswith("+00:00")


@pytest.mark.parametrize("formatter", [JsonFormatter, TextFormatter])
def test_log_lines_carry_the_request_fields_inside_a_request(formatter):
    from service.app import create_app

    app = create_app({"redis_url": None})
    with app.test_request_context("/v1/sessions/x", method="DELETE", headers={"X-Request-ID": "r-1"}):
        app.preprocess_request()
        line = formatter().format(_record("inside"))
    assert "r-1" in line and "DELETE" in line and "/v1/sessions/x" in line and "public" in line


# --- links between the pages ----------------------------------------------------------------

ROOT = API_DOC.parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in heading_anchors(linked), f"{page.name} links to {target}: no such heading"


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    listed = set(LINK.findall(index))
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert page.name in listed, f"docs/README.md does not list {page.name}"
