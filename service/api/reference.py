"""Generates docs/api.md's configuration and problem-type tables and docs/reliability.md's
limits table from the settings object, the problem table and docker-compose.yml, so the docs
cannot drift from what the service reads and answers. tests/test_docs.py fails when a committed
file is stale; regenerate with::

    python3 -m service.api.reference docs/api.md docs/reliability.md
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

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


@dataclass(frozen=True)
class Limit:
    """A row of docs/reliability.md's limits table. ``default``'s ``{name}`` placeholders are
    settings' defaults (and ``{redis_maxmemory}`` compose's), formatted by :func:`_amount`."""

    limit: str
    default: str
    counts: str
    past: str


def setting(name: str, counts: str, past: str, note: str = "") -> Limit:
    return Limit(f"`{name.upper()}`", "{" + name + "}" + note, counts, past)


LIMITS = [
    setting('request_read_timeout',
            'time from accepting a connection (or the next request on a kept-alive one) until the whole request, headers and body, has arrived',
            '408 `request-timeout`, connection closed (a connection that sent nothing is just closed)'),
    setting('request_buffer_bytes',
            "bytes of requests still arriving, buffered by the worker's event loop (service/worker/)",
            '503 `server-busy` with `Retry-After`', note=' per worker'),
    setting('max_body_bytes',
            "body bytes, from `Content-Length` or as chunks arrive (and by nginx's `client_max_body_size` in docker-compose.yml, set from the same value)",
            '413 `body-too-large`, before the body is read further'),
    Limit('request line (gunicorn `limit_request_line`, *fixed*)', '4 094 bytes',
          'method, path and query',
          '414 `uri-too-long`'),
    Limit('header fields (gunicorn `limit_request_fields` / `limit_request_field_size`, *fixed*)', '100 fields of 8 190 bytes',
          "the request's header section",
          '431 `headers-too-large`'),
    Limit('HTTP framing (*fixed*)', '—',
          'read by llhttp, strict: one valid `Content-Length` (a repeated one too is refused), or `Transfer-Encoding: chunked` alone, well-formed chunks, CRLF line ends; no control characters in headers',
          '400 `bad-request`'),
    Limit('connections (gunicorn `worker_connections`, *fixed*)', '1 000 per worker',
          'open connections, idle or not',
          'the connection idle longest (kept alive, or silent since it was accepted) is closed to make room; while every one is in the middle of a request, a new one is answered 503 `server-busy` with `Retry-After` at once'),
    setting('max_parse_bytes',
            "bytes a JSON body (an instance part of a binary body too) is estimated to hold once parsed and validated, counted on its bytes before it is parsed: 32 per value (each comma), 128 per object member (each colon), 384 per array, 1 500 per object, inside strings too (an upper bound). The weights are each item's measured memory, raised where its CPU time costs more; at the default the largest body of each form peaks below 1 GB and 5 s of CPU, the worker and its isolated process together (the figures below)",
            '413 `limit-exceeded`, before the body is parsed'),
    setting('big_request_bytes',
            'a request body at least this big once read and inflated, or a JSON body (an instance part too) that `MAX_PARSE_BYTES`\'s count estimates to hold at least this much once parsed: a big request. A worker serves one at a time, so two big requests never add up in one worker nor share its GIL; before it is parsed, the worker\'s instance cache makes room for what it will hold (`INSTANCE_CACHE_BYTES`). One that carries an instance (`POST /v1/instances`, a session or select with an inline `instance`) is parsed, validated, compiled and encoded by the worker\'s isolated process, a fresh process beside it at nice 5 (service/api/isolation.py), with the same refusals: its CPU time shares neither the worker\'s GIL nor, when the cores are busy, their time with the worker\'s other requests',
            '503 `server-busy` with `Retry-After` at once, while the worker serves another: before its body is received when its `Content-Length` says it is big (the worker\'s event loop asks), else once it is read; a gzip body as soon as what it inflates to reaches the size, before the rest is inflated', note=' per worker'),
    setting('max_json_depth',
            'nesting of the JSON body',
            '413 `limit-exceeded`'),
    setting('max_cells',
            'numbers in the compiled tensor: n·N outcomes; n·N·ℓ likelihoods, given or made by `noise` (ℓ = the most outcomes of any test); n·(copies)·N after `max_flips`, the copies counted before one is built and the count stopped once past the limit',
            '413 `instance-too-large`'),
    setting('max_compiled_bytes',
            'bytes of the compiled instance: the tensor (1 byte per outcome, 8 per likelihood), prior and class index (16 bytes a row) and labels (about 64 bytes plus the text per hypothesis id, including the names of noisy copies); compiling holds about twice this for a moment',
            '413 `instance-too-large`', note=" (= `INSTANCE_CACHE_BYTES`, so any accepted instance fits a worker's cache)"),
    Limit('`max_flips` ≤ N', 'the number of tests',
          'a copy cannot change more tests than there are',
          '422 `validation-error` at `max_flips`'),
    setting('item_bank_grid_points',
            "θ points an item bank with a normal prior is compiled on (its hypotheses); a given grid brings its own points, counted by `MAX_CELLS` and, without cut scores, `MAX_CLASSES`",
            'never refused: the grid is this fine (docs/item-banks.md)'),
    setting('max_classes',
            'classes of an instance',
            '413 `limit-exceeded`'),
    setting('max_hypotheses',
            'rows of the compiled instance: hypotheses, or all their noisy copies after `max_flips` (counted before one is built); each costs ~1.6 µs and ~250 bytes to compile and store, whatever its width',
            '413 `instance-too-large`'),
    setting('max_outcomes_per_test',
            'outcome labels of one test',
            '413 `limit-exceeded`'),
    setting('max_label_length',
            'characters of any label',
            '413 `limit-exceeded`'),
    setting('max_observations_per_request',
            'observations in one request',
            '413 `limit-exceeded`'),
    setting('session_max_observations',
            'observations one session holds (answers, each answer to a repeatable test, skips; replays are not new)',
            '413 `limit-exceeded`, `errors[0].path` the first observation posted past it; nothing stored'),
    setting('session_time_limit',
            'CPU time of the thread applying one batch of observations, checked before each observation after the first (a batch costs an engine step per observation)',
            '422 `infeasible`; nothing stored'),
    Limit('problems per refusal', '50 (fixed)',
          'a 422 lists the first 50 problems; every instance rule is linear in the body',
          '—'),
    Limit('prior share', '≥ 10⁻⁹ of the total (fixed; docs/engine.md)',
          "a positive prior the engine's zero tolerance could not see",
          "422 at the prior's path"),
    setting('evaluation_time_limit',
            'wall clock of one evaluate or tree request, checked at every run step, tree node and version space of the optimum',
            '422 `evaluation-limit` (the optimum alone: a note, the report still answered)'),
    setting('auto_cpu_seconds',
            "CPU time of the thread simulating what `auto` chooses for an instance and stop rules (once; then shared through the store), checked before each simulated step",
            'never refused: the candidates are ranked on the respondents finished, and the evidence says so (`complete: false`)'),
    setting('auto_respondents',
            'simulated respondents of that simulation, each played by every applicable policy',
            'the simulation ends there (`complete: true`)'),
    setting('evaluation_max_policy_cells',
            'n·N·(policies) of one evaluate request, before any work',
            '422 `evaluation-limit`'),
    setting('evaluation_max_samples',
            'Monte Carlo runs per policy',
            '422 `evaluation-limit`'),
    setting('evaluation_max_dp_states',
            "version spaces of the optimum's DP",
            'the optimum omitted with a note'),
    Limit('`TREE_MAX_NODES` / `TREE_MAX_DEPTH`', '{tree_max_nodes} / {tree_max_depth}',
          'nodes of a tree request; depth of a likelihood tree',
          '422 `tree-too-large` / `infeasible`'),
    Limit('`RATE_LIMIT` (`RATE_LIMIT_BURST`)', '{rate_limit}',
          'requests per tenant (GCRA, shared by all workers through Redis)',
          '429 `rate-limited` with `Retry-After`'),
    setting('auth_failure_limit',
            'failed authentications per client address, with API keys on',
            '429 `rate-limited` with `Retry-After` for every `/v1` (or façade) request from that address, a valid key included, until the rate allows one more', note=' (bursts of 20)'),
    setting('tenant_max_instances',
            'instances a tenant has stored (unused ones expire after 2 × `SESSION_TTL`)',
            '429 `quota-exceeded`'),
    setting('tenant_max_stored_bytes',
            "bytes of a tenant's stored instances, as encoded in the store",
            '507 `storage-quota-exceeded`'),
    setting('tenant_max_sessions',
            "a tenant's live sessions (not expired, not deleted)",
            '429 `quota-exceeded`'),
    setting('instance_cache_bytes',
            "compiled instances held by a worker: arrays, what the engine keeps beside them (a deterministic instance's answers as bit planes, (ℓ − 1)/8 bytes per answer for ℓ ≤ 4, at most 19 MB at `MAX_CELLS`; a few numbers per hypothesis; the padded table of a whole version space where the dense pass reads one), labels and their indexes (no table of log-likelihoods: an observation takes the log of its one column)",
            "least recently used dropped (re-read from Redis); never refused. A big request (`BIG_REQUEST_BYTES`) first drops the least recently used until the cache and what the request will hold fit this budget together: 6 bytes per byte of its body (its peak above the worker's size before it measured 4.2× on the compact and up to 4.7× on the binary 80 MiB `float64` bodies, `python3 bench/hostile.py --heavy`), or its JSON\'s `MAX_PARSE_BYTES` estimate where larger; so a full cache and a big request never add up. An instance near `MAX_COMPILED_BYTES` fits only if this leaves room for what the engine keeps beside it (a deterministic one's bit planes, a padded table)", note=' per worker'),
    setting('step_cache_bytes',
            'computed steps held by a worker (keys and states, histories included, and the beliefs carried to the next step)',
            'least recently used dropped (recomputed); never refused', note=' per worker'),
    setting('worker_heap_reserve_bytes',
            "heap a worker faults in when it boots and keeps (service/heap.py; glibc's malloc), and each of its isolated processes as it starts, before its big request arrives: blocks up to this size come from one heap for every thread and go back to it, so a big request, a fresh worker's first included, does not pay ~3 µs per fresh page",
            "never refused: larger blocks are mapped and unmapped as malloc does by default. Resident from boot, used or not, in the worker and in the isolated process waiting for its request; 0: malloc's defaults. A worker idle more than 64 MiB above its boot size gives the heap's free pages back (`malloc_trim`, keeping this much at the top; checked when a request ends, at most once a second): two refused 75 MB bodies left one 174 MB above boot, 23 MB with the trim (`python3 -m pytest tests/test_heap.py -k idle`). Memory Python's own allocator holds for objects still alive (the labels of a big instance the embedded store keeps) is not the heap's and stays. After the largest body of every instance form, three times each (`python3 bench/hostile.py --heavy`), a worker was 177 MB idle against 205 MB at boot", note=' per worker'),
    setting('session_ttl',
            'time since a session was last read or written',
            '404 `session-not-found`; 410 `instance-expired` for a session whose instance is gone'),
    Limit('gunicorn `timeout` (*fixed*)', '30 s',
          "a worker's silence to its master",
          'the worker is restarted (every limit above keeps requests well under it)'),
    Limit("Redis `maxmemory` (operator's)", '{redis_maxmemory} in docker-compose.yml',
          'Redis memory',
          '507 `store-full` with `Retry-After` on writes; reads go on (below)'),
    Limit('Redis availability', '0.5 s per command',
          'connect and reply time',
          '503 `store-unavailable` with `Retry-After`'),
]


def _grouped(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}".replace(",", " ") if isinstance(value, int) else str(value)


def _amount(name: str, value: object) -> str:
    """A setting's default as the table shows it: sizes in binary units, times in seconds."""
    if value is None:
        return "off"
    if isinstance(value, int) and name.endswith("_bytes"):
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
        return f"{_grouped(value)} bytes"
    if isinstance(value, (int, float)) and name.endswith(("_timeout", "_time_limit", "_ttl", "_seconds")):
        return f"{_grouped(value)} s"
    return _grouped(value) if isinstance(value, (int, float)) else str(value)


REDIS_UNITS = {"": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}


def compose_maxmemory(root: Path = Path(__file__).resolve().parents[2]) -> int:
    """Redis's ``--maxmemory`` in docker-compose.yml, in bytes (as redis.conf reads "2gb": 2·1024³)."""
    command = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    size = command[command.index("--maxmemory") + 1].lower()
    number = size.rstrip("kmgb")
    return int(number) * REDIS_UNITS[size[len(number):]]


def limits_table() -> str:
    values = {name: _amount(name, field.default) for name, field in Settings.model_fields.items()}
    values["redis_maxmemory"] = _amount("redis_maxmemory_bytes", compose_maxmemory())
    rows = ["| limit | default | what it counts | past it, a client gets |", "|---|---|---|---|"]
    rows += [f"| {row.limit} | {row.default.format(**values)} | {row.counts} | {row.past} |" for row in LIMITS]
    return "\n".join(rows) + "\n"


TABLES = {"settings": settings_table, "problems": problems_table, "limits": limits_table}


def render(text: str) -> str:
    """``text`` with every ``<!-- generated:NAME -->`` block rewritten from the code."""
    return _BLOCK.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(3), text)


if __name__ == "__main__":
    for path in map(Path, sys.argv[1:] or ["docs/api.md", "docs/reliability.md"]):
        path.write_text(render(path.read_text()))
