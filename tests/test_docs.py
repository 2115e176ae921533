"""docs/api.md's and docs/reliability.md's generated tables match the code they are generated
from: a setting or a problem type added without its row, or a default changed, fails here
(regenerate: python3 -m service.api.reference)."""

from __future__ import annotations

import logging
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
