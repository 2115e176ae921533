"""The one settings object: every knob of the service, read from the environment.

``Settings()`` reads ``REDIS_URL``, ``SESSION_TTL``, … (names are case-insensitive); tests and
embedders pass a dict to :func:`service.app.create_app` instead. Invalid values fail at start
with :class:`ConfigurationError`, whose message names each bad variable and why.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.logs import LogFormat

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class ConfigurationError(ValueError):
    """Bad configuration; the message is meant for the operator, verbatim."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="forbid", frozen=True)

    redis_url: str | None = Field(default=None, description=(
        "`redis://`, `rediss://` or `unix://` URL; unset: the embedded in-memory store (one process)"))
    redis_cluster: bool = Field(default=False, description=(
        "`true`: `REDIS_URL` names any node of a Redis Cluster; redis-py's cluster client finds the rest "
        "(docs/scaling.md)"))
    redis_wait_replicas: int = Field(default=0, ge=0, le=16, description=(
        "replicas that must confirm each write (Redis `WAIT`) before it is acknowledged; fewer within "
        "REDIS_WAIT_TIMEOUT_MS: 503. 0: acknowledged once the master has it (docs/scaling.md)"))
    redis_wait_timeout_ms: int = Field(default=250, ge=1, le=450, description=(
        "how long a write waits for those replicas; below the 500 ms command timeout, so a slow replica "
        "is a 503, never a hung request"))
    session_ttl: int = Field(default=86_400, ge=1, le=365 * 86_400, description=(
        "seconds a session lives after its last read or write (instances: twice that after last use)"))
    # 80 MiB: an instance at MAX_CELLS fits in the compact form (base64 of one byte per cell: 4/3 ×
    # 50 M ≈ 67 MB, plus labels); docs/instances.md gives the size of each form.
    max_body_bytes: int = Field(default=80 * 1024 * 1024, ge=1024, description=(
        "larger request bodies (on the wire, and once gzip-inflated) are 413 `body-too-large` before they "
        "are parsed; the default fits an instance at MAX_CELLS in the compact form (docs/instances.md)"))
    # Requests are buffered by the worker's event loop (service/worker/), so a slow client holds
    # memory and a connection, never a thread.
    request_read_timeout: float = Field(default=30.0, gt=0, le=3600, description=(
        "seconds a client has to send a whole request, headers and body, once its connection is accepted "
        "(408 `request-timeout`)"))
    request_buffer_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description=(
        "bytes of unfinished requests one worker buffers at once (503 `server-busy` past it)"))
    max_cells: int = Field(default=50_000_000, ge=1, description=(
        "numbers in the compiled tensor: n·N outcomes, n·N·ℓ likelihoods (given, or made by `noise`), "
        "copies·N after `max_flips`; counted before any array is built (413 `instance-too-large`)"))
    max_compiled_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description=(
        "bytes of the compiled instance, its arrays and labels, counted before any array is built "
        "(413 `instance-too-large`); compiling holds about twice this for a moment"))
    item_bank_grid_points: int = Field(default=61, ge=2, le=2001, description=(
        "θ points an item bank with a normal prior is compiled on, evenly over the prior's mean ± 4 sd; each is "
        "a hypothesis, so steps cost in proportion (docs/item-banks.md)"))
    big_request_bytes: int = Field(default=1024 * 1024, ge=1024, description=(
        "a request body at least this big (once inflated), or a JSON body estimated (as MAX_PARSE_BYTES counts) to "
        "hold this much once parsed, is a big request: a worker serves one at a time and answers another that "
        "arrives meanwhile 503 `server-busy` with `Retry-After` at once, so what big requests allocate never adds "
        "up in one worker; its instance cache makes room first (INSTANCE_CACHE_BYTES)"))
    max_hypotheses: int = Field(default=1_000_000, ge=1, description=(
        "rows of the compiled instance: its hypotheses, or all their noisy copies after `max_flips`; each costs "
        "its id, prior and class index, ~1.6 µs and ~250 bytes to compile and store (413 `instance-too-large`)"))
    # The weights (service/api/limits.py) are what each item of a parsed body was measured to hold,
    # raised where its CPU time is the larger cost, so the estimate bounds both (docs/reliability.md).
    # 16 MiB: parsing, validating and compiling what a JSON body holds are single calls (orjson,
    # pydantic-core, numpy on lists and labels) that keep the worker's other requests waiting; at
    # this size no JSON body, nor the label list of a compact or binary one, keeps them waiting
    # longer than the 80 MiB compact and binary arrays do (docs/reliability.md: 10⁶ class labels,
    # counted 32 MB, kept them 0.27 s). Bigger arrays travel compact or as .npy.
    max_parse_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description=(
        "estimated bytes a JSON body's values hold once parsed and validated, counted on its bytes before "
        "it is parsed: 32 per value (each comma), 128 per object member (each colon), 384 per array, 1 500 per "
        "object (413 `limit-exceeded`); bounds the nested-list and per-hypothesis forms: bigger arrays go in the "
        "compact base64 form or as a binary `.npy` part (docs/instances.md)"))
    log_level: LogLevel = Field(default="INFO", description="`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL`")
    log_format: LogFormat = Field(default="json", description=(
        "`json`: one JSON object per line on stderr (time, level, logger, message, request id, method, path, "
        "status, duration_ms, tenant); `text` for a person at a terminal. Unset, `edgecut serve` writes `text` "
        "when its stderr is a terminal"))
    access_log: bool = Field(default=True, description="one log line per request")
    web_concurrency: int | None = Field(default=None, ge=1, le=64, description=(
        "gunicorn worker processes (default 2 per core, at most 8); always 1 with the in-memory store"))
    web_threads: int = Field(default=8, ge=1, le=256, description="threads per worker (gthread)")
    key_prefix: str = Field(default="edgecut", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description=(
        "prefix of every Redis key (several deployments can share one Redis)"))
    instance_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0, description=(
        "per-worker LRU of compiled instances, bytes (arrays and labels)"))
    worker_heap_reserve_bytes: int = Field(default=128 * 1024 * 1024, ge=0, le=2**31 - 1, description=(
        "heap each worker faults in when it boots and keeps (glibc's malloc), and each of its isolated "
        "processes as it starts, so that big requests, a fresh worker's first included, do not pay the "
        "kernel for fresh pages; 0: malloc's defaults "
        "(docs/scaling.md)"))
    step_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0, description=(
        "per-worker LRU of computed steps and the beliefs carried to the next, bytes (estimated from "
        "the objects held)"))
    # What one tenant may keep stored at once, counted by the store with the write.
    tenant_max_instances: int = Field(default=1_000, ge=0, description=(
        "instances one tenant may have stored (429 `quota-exceeded`); 0: no limit"))
    tenant_max_stored_bytes: int = Field(default=1024 * 1024 * 1024, ge=0, description=(
        "bytes of one tenant's stored instances, as encoded (507 `storage-quota-exceeded`); 0: no limit"))
    tenant_max_sessions: int = Field(default=100_000, ge=0, description=(
        "live sessions one tenant may have (429 `quota-exceeded`); 0: no limit"))
    retry_after_seconds: int = Field(default=1, ge=1, le=3600, description=(
        "the `Retry-After` of a 503 (the store is unavailable)"))
    # --- Security and worker-protecting limits (docs/reliability.md) -------------------------
    api_keys: str | None = Field(default=None, description=(
        "API keys, comma-separated `tenant:key` (a bare key: tenant `public`); `sha256:<hex>` configures "
        "only a key's hash. Neither this nor API_KEYS_FILE: no authentication"))
    api_keys_file: str | None = Field(default=None, description="the same entries, one per line (`#` comments)")
    rate_limit: str | None = Field(
        default=None, pattern=r"^\s*[1-9][0-9]*\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$", description=(
            "per-tenant request rate, `<count>/<second|minute|hour>` (e.g. `50/second`); unset: none (429)"))
    rate_limit_burst: int | None = Field(default=None, ge=1, description=(
        "requests a tenant may send at once before the rate applies (default: RATE_LIMIT's count)"))
    auth_failure_limit: str | None = Field(
        default="20/minute", pattern=r"^(\s*[1-9][0-9]*\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*)?$",
        description=("with API keys on: failed authentications one client address may make (as many at once "
                     "as the count), then 429 for every `/v1` request from it until the rate allows another; "
                     "empty: off"))
    trusted_proxies: int = Field(default=0, ge=0, le=8, description=(
        "reverse proxies in front that each append the address they saw to `X-Forwarded-For` (nginx in "
        "docker-compose.yml: 1); the client's address (AUTH_FAILURE_LIMIT counts per address) is then the one "
        "the outermost of them saw. 0: the connection's own address, `X-Forwarded-For` ignored (any client "
        "can write one)"))
    cors_origins: str | None = Field(default=None, description=(
        "browser origins allowed by CORS, comma-separated, or `*`; unset: no CORS headers"))
    # Each limit below is answered 413 limit-exceeded, naming the variable.
    max_json_depth: int = Field(default=32, ge=4, le=512, description="deepest JSON nesting (413 `limit-exceeded`)")
    max_classes: int = Field(default=10_000, ge=2, description="most classes in an instance (413 `limit-exceeded`)")
    max_outcomes_per_test: int = Field(default=256, ge=2, description=(
        "most outcome labels of one test (413 `limit-exceeded`)"))
    max_label_length: int = Field(default=200, ge=1, le=200, description=(
        "longest id or label, characters (413 `limit-exceeded`; the wire schema's own cap is 200)"))
    max_observations_per_request: int = Field(default=10_000, ge=1, le=10_000, description=(
        "most observations in one request (413 `limit-exceeded`; the wire schema's own cap is 10 000)"))
    session_max_observations: int = Field(default=10_000, ge=1, description=(
        "observations one session may hold, answers, repeated answers and skips (413 `limit-exceeded`, with "
        "the path of the first observation past it)"))
    session_time_limit: float = Field(default=5.0, gt=0, description=(
        "seconds of work one request to a session (a batch of observations) may take; past it 422 `infeasible` "
        "and nothing is stored"))
    # --- Evaluation and tree export over HTTP (docs/evaluation.md) ----------------------------
    # Past each limit the request is refused 422 naming it, so a worker is never held long.
    evaluation_time_limit: float = Field(default=10.0, ge=0, description=(
        "seconds of work per evaluation or tree request, well under gunicorn's 30 s worker timeout (422)"))
    evaluation_max_samples: int = Field(default=20_000, ge=1, description="most Monte Carlo samples (422)")
    evaluation_max_dp_states: int = Field(default=20_000, ge=0, description=(
        "most version spaces the exact optimum may visit (422)"))
    evaluation_max_policy_cells: int = Field(default=1_000_000, ge=1, description=(
        "hypotheses × tests × policies per evaluation request (422)"))
    # --- auto: the policy that does best on sessions simulated from the instance (docs/api.md) --
    auto_respondents: int = Field(default=100, ge=0, le=100_000, description=(
        "simulated respondents `auto` plays every candidate policy against, once per instance and stop rules "
        "(then shared through the store); fewer when AUTO_CPU_SECONDS runs out first"))
    auto_cpu_seconds: float = Field(default=2.0, ge=0, le=60, description=(
        "CPU seconds one `auto` simulation may spend inside the request that needs it; past it the candidates "
        "are ranked on the respondents finished, and the evidence says so"))
    tree_max_nodes: int = Field(default=2_000, ge=1, description="most nodes of an exported tree (422)")
    tree_max_depth: int = Field(default=6, ge=1, description="deepest exported tree (422)")

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("redis_url", mode="before")
    @classmethod
    def _redis_url(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip() or None
        if value is not None and not str(value).startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _cluster_needs_a_url(self) -> Settings:
        if (self.redis_cluster or self.redis_wait_replicas) and self.redis_url is None:
            raise ValueError("REDIS_CLUSTER and REDIS_WAIT_REPLICAS need REDIS_URL")
        return self

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
