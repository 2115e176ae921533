"""Per-tenant rate limits: GCRA (the generic cell rate algorithm, as in ATM traffic shaping).

A tenant may send ``rate`` requests per period, with bursts of up to ``burst`` at once. GCRA keeps
one number per tenant, the theoretical arrival time (TAT) of its next request: a request at time
``now`` conforms when ``TAT − now ≤ τ`` (τ = (burst − 1)·T, T = period / rate), and then moves
TAT to ``max(TAT, now) + T``. A refused request learns exactly when it would conform
(``TAT − τ − now``), which becomes ``Retry-After``.

The store decides where the TATs live (``SessionStore.rate_limiter``), so one place picks memory,
Redis or a cluster. With Redis (``REDIS_URL``) the TAT lives in Redis, beside the sessions, and one
Lua script reads and moves it using the server's clock, so every worker of every host shares one
budget per tenant; it goes through the store's own client. In memory it lives in this process
(the in-memory store is one process anyway), timed by the store's clock. Redis failures are
mapped like every other store call (service/store/redis_client.py ``redis_errors``): a Redis that
does not answer, is loading or busy is a 503, after at most one 0.5 s timeout. A full Redis (OOM)
lets the request through: the limiter cannot record it, and refusing every request for that would
turn a full store into an outage of reads too.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

from .base import StoreFull
from .redis_client import LazyClient, redis_errors

log = logging.getLogger(__name__)

PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
_RATE = re.compile(r"^\s*([1-9][0-9]*)\s*/\s*([a-z]+)\s*$")

# KEYS[1]: the TAT of whoever is limited. ARGV: T and τ in µs, and "1" to count a conforming
# request ("0": only ask). Returns 0 (conforms) or µs until a request would.
# TIME in a script is allowed since Redis 5 (effects replication); µs since the epoch fit
# exactly in a Lua double (< 2^53).
_GCRA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
if tat - now > tolerance then
  return tat - tolerance - now
end
if ARGV[3] == '0' then return 0 end
local next_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', next_tat), 'PX', math.ceil((next_tat - now) / 1000) + 1)
return 0
"""


@dataclass(frozen=True)
class Rate:
    count: int
    period_seconds: int
    burst: int

    @property
    def interval_us(self) -> int:
        return max(1, math.ceil(self.period_seconds * 1_000_000 / self.count))

    @property
    def tolerance_us(self) -> int:
        return self.interval_us * (self.burst - 1)


def parse_rate(text: str, burst: int | None = None) -> Rate:
    """``"50/second"`` → Rate(50, 1, burst or 50)."""
    match = _RATE.match(text.lower())
    if match is None or match.group(2) not in PERIODS:
        raise ValueError(f"rate {text!r} is not '<count>/<second|minute|hour>'")
    count = int(match.group(1))
    return Rate(count, PERIODS[match.group(2)], burst or count)


class RateLimiter(Protocol):
    rate: Rate

    def wait_seconds(self, tenant: str, count: bool = True) -> float:
        """0 when the request conforms (and is counted, unless ``count`` is false), else
        seconds until one would."""


# Who a limiter counts: tenants' requests, or failed authentications by client address.
REQUESTS = "r"
AUTH_FAILURES = "a"


class MemoryLimiter:
    def __init__(self, rate: Rate, clock: Callable[[], float]):
        self.rate = rate
        self._clock = clock
        self._tat: dict[str, float] = {}
        self._lock = threading.Lock()

    def wait_seconds(self, tenant: str, count: bool = True) -> float:
        interval, tolerance = self.rate.interval_us / 1e6, self.rate.tolerance_us / 1e6
        with self._lock:
            now = self._clock()
            tat = max(self._tat.get(tenant, now), now)
            if tat - now > tolerance:
                return tat - tolerance - now
            if not count:
                return 0.0
            self._tat[tenant] = tat + interval
            if len(self._tat) > 100_000:  # forget tenants whose TAT has passed
                self._tat = {t: v for t, v in self._tat.items() if v > now}
            return 0.0


class RedisLimiter:
    def __init__(self, rate: Rate, redis: LazyClient, key_prefix: str, scope: str):
        self.rate = rate
        self.key_prefix = key_prefix
        self.scope = scope  # REQUESTS or AUTH_FAILURES
        self._redis = redis  # the store's client

    def key(self, tenant: str) -> str:
        # Percent-encoded: an IPv6 address's colons (or a brace) cannot fake the key's structure;
        # the script's one key is in the tenant's (or address's) own slot of a cluster.
        return f"{self.key_prefix}:{{{self.scope}:{quote(tenant, safe='')}}}:rate"

    def wait_seconds(self, tenant: str, count: bool = True) -> float:
        try:
            with redis_errors():
                # EVAL with the text (cached by Redis under its hash): no NOSCRIPT after a failover.
                waited = self._redis.get().execute_command(
                    "EVAL", _GCRA, 1, self.key(tenant), self.rate.interval_us, self.rate.tolerance_us,
                    "1" if count else "0")
        except StoreFull as error:
            log.warning("rate limit not applied: %s", error)
            return 0.0
        return int(waited) / 1e6

