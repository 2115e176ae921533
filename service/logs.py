"""Logs as twelve-factor services write them: one JSON object per line on stderr (or plain text
for a person at a terminal, ``LOG_FORMAT=text``), the same format for the app's loggers and for
gunicorn's own, and the request's id, method, path and tenant on every line logged while a
request is being served, so one ``grep`` of an id finds everything about it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

LogFormat = Literal["json", "text"]

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is logged too.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# Request fields, in the order a reader scans them.
REQUEST_FIELDS = ("request_id", "method", "path", "status", "duration_ms", "tenant")


def _request_fields() -> dict[str, Any]:
    """The current request's id, method, path and tenant; empty outside a request."""
    try:
        from flask import g, has_request_context, request
    except ImportError:  # the engine used as a library, without Flask
        return {}
    if not has_request_context():
        return {}
    fields = {"request_id": g.get("request_id"), "method": request.method, "path": request.path,
              "tenant": g.get("tenant")}
    return {key: value for key, value in fields.items() if value is not None}


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = _request_fields()
    fields.update({key: value for key, value in vars(record).items() if key not in _STANDARD_ATTRIBUTES})
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_record_fields(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _record_fields(record)
        ordered = [key for key in REQUEST_FIELDS if key in fields] + sorted(set(fields) - set(REQUEST_FIELDS))
        if ordered:
            text += " " + " ".join(f"{key}={fields[key]}" for key in ordered)
        return text


FORMATTERS = {"json": JsonFormatter, "text": TextFormatter}


def logging_config(level: str, log_format: LogFormat) -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for the app's and gunicorn's loggers alike (gunicorn
    takes it as ``logconfig_dict``)."""
    handler = {"class": "logging.StreamHandler", "formatter": log_format, "stream": "ext://sys.stderr"}
    logger = {"level": level, "handlers": ["stderr"], "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {name: {"()": formatter} for name, formatter in FORMATTERS.items()},
        "handlers": {"stderr": handler},
        "loggers": {"service": logger, "gunicorn.error": logger,
                    # gunicorn's own access log stays off: the app writes one line per request.
                    "gunicorn.access": {**logger, "level": "WARNING"}},
        "root": {"level": "WARNING", "handlers": ["stderr"]},
    }

