"""The one settings object: every knob of the service, read from the environment.

``Settings()`` reads ``REDIS_URL``, ``SESSION_TTL``, … (names are case-insensitive); tests and
embedders pass a dict to :func:`service.app.create_app` instead. Invalid values fail at start
with :class:`ConfigurationError`, whose message names each bad variable and why.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class ConfigurationError(ValueError):
    """Bad configuration; the message is meant for the operator, verbatim."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="forbid", frozen=True)

    # Unset: the embedded in-memory store (one process only).
    redis_url: str | None = None
    # Sliding time to live of sessions (and of the instances they refer to), seconds.
    session_ttl: int = Field(default=86_400, ge=1, le=365 * 86_400)
    # Request bodies above this answer 413 before they are parsed.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # n·N above this answers 413 (instance-too-large) before any array is built.
    max_cells: int = Field(default=50_000_000, ge=1)
    log_level: LogLevel = "INFO"
    # gunicorn worker processes (forced to 1 with the in-memory store) and threads per worker.
    web_concurrency: int | None = Field(default=None, ge=1, le=64)
    web_threads: int = Field(default=8, ge=1, le=256)
    # Every Redis key starts with this (several deployments can share one Redis).
    key_prefix: str = Field(default="edgecut", pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    # Per-worker LRU of compiled instances, bytes.
    instance_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    # Seconds a client is told to wait (Retry-After) when the store is unavailable.
    retry_after_seconds: int = Field(default=1, ge=1, le=3600)
    # --- Security and worker-protecting limits (issue 6; docs/reliability.md) ---------------
    # API keys, comma-separated "tenant:key" (or a bare key: tenant "public"); a key may be given
    # as "sha256:<hex>" so only its hash is configured. Neither set: no authentication.
    api_keys: str | None = None
    api_keys_file: str | None = None  # the same entries, one per line (# comments)
    # Per-tenant request rate, "<count>/<second|minute|hour>" (e.g. "50/second"); unset: none.
    rate_limit: str | None = Field(default=None, pattern=r"^\s*[1-9][0-9]*\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
    # Requests a tenant may send at once before the rate applies; default: RATE_LIMIT's count.
    rate_limit_burst: int | None = Field(default=None, ge=1)
    # Browser origins allowed by CORS, comma-separated, or "*"; unset: no CORS headers.
    cors_origins: str | None = None
    # Each limit below is answered 413 limit-exceeded, naming the variable.
    max_json_depth: int = Field(default=32, ge=4, le=512)
    max_classes: int = Field(default=10_000, ge=2)
    max_outcomes_per_test: int = Field(default=256, ge=2)
    max_label_length: int = Field(default=200, ge=1, le=200)  # 200: the wire schema's own cap
    max_observations_per_request: int = Field(default=10_000, ge=1, le=10_000)  # ditto
    # --- Evaluation and tree export over HTTP (issue 5; docs/evaluation.md) ------------------
    # Past each limit the request is refused 422 naming it, so a worker is never held long.
    # Seconds of work per evaluation or tree request: well under gunicorn's 30 s worker timeout.
    evaluation_time_limit: float = Field(default=10.0, ge=0)
    evaluation_max_samples: int = Field(default=20_000, ge=1)
    evaluation_max_dp_states: int = Field(default=20_000, ge=0)
    # hypotheses × tests × policies per evaluation request (a 1000 × 100 instance, 7 policies).
    evaluation_max_policy_cells: int = Field(default=1_000_000, ge=1)
    tree_max_nodes: int = Field(default=2_000, ge=1)
    tree_max_depth: int = Field(default=6, ge=1)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("redis_url", mode="before")
    @classmethod
    def _redis_url(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip() or None
        if value is not None and not str(value).startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @property
    def uses_memory_store(self) -> bool:
        return self.redis_url is None

    @property
    def workers(self) -> int:
        """gunicorn workers: one with the in-memory store (its state lives in the process)."""
        if self.uses_memory_store:
            return 1
        return self.web_concurrency or min(2 * (os.cpu_count() or 1), 8)


def load_settings(config: Settings | dict[str, Any] | None = None) -> Settings:
    """The settings from ``config`` (a dict overrides the environment key by key), or from the
    environment alone. Raises :class:`ConfigurationError` with one line per bad variable."""
    if isinstance(config, Settings):
        return config
    overrides = {key.lower(): value for key, value in (config or {}).items()}
    try:
        return Settings(**overrides)
    except ValidationError as error:
        lines = []
        for problem in error.errors():
            name = ".".join(str(part) for part in problem["loc"]).upper() or "(settings)"
            given = problem.get("input")
            shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
            lines.append(f"  {name}: {problem['msg']}{shown}")
        raise ConfigurationError("invalid configuration:\n" + "\n".join(lines)) from None
