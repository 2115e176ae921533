"""Restricted exposure control's counts in Redis (the store's :class:`~.base.ExposureCounts`
part): one hash per (tenant, instance), ``P:{i:<tenant>:<content hash>}:exposure``
(redis_keys.py), in the instance's slot, so that ``delete_instance``'s transaction removes it
with the instance.

Fields: ``sessions`` holds the session count and ``t:<test id>`` each test's, so no test id,
whatever it is, names the session count's field. Counting is one script (``EXPOSURE_SCRIPT``,
redis_scripts.py): every increment, then the TTL reset to the instance TTL, atomically and in
one round trip, so workers counting at once never lose an increment. Reading is one script too
(``EXPOSURE_READ_SCRIPT``), which leaves out the tests below the share of sessions asked for.

A damaged count (a value HINCRBY could not have written: a hand edit or a bug) reads as absent,
as if never counted, and is logged; the next count of that field starts it again from its
increment. Refusing it would fail every step of the instance's sessions (a 500) until the counts
expired; reading it as absent under-counts one test for a while and repairs itself.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence

from .base import DEFAULT_TENANT
from .redis_client import redis_errors
from .redis_connection import RedisConnection
from .redis_scripts import EXPOSURE_READ_SCRIPT, EXPOSURE_SCRIPT

log = logging.getLogger(__name__)

SESSIONS_FIELD = b"sessions"
TEST_FIELD = b"t:"  # a test's field is this, then its id (UTF-8)
# What HINCRBY writes: no sign, no leading zero, and within a 64-bit integer.
_COUNT = re.compile(rb"\A(?:0|[1-9][0-9]{0,17})\Z")


class RedisExposure:
    """Mixed into :class:`~.redis_store.RedisStore`: its connection, keys and instance TTL."""

    connection: RedisConnection
    _instance_ttl_ms: int
    exposure_key: Callable[[str, str], str]  # redis_keys.RedisKeys's

    def exposure_counts(self, instance_id: str, tenant: str = DEFAULT_TENANT,
                        at_least: float = 0.0) -> tuple[int, dict[str, int]]:
        key = self.exposure_key(instance_id, tenant)
        with redis_errors():
            self.connection.round_trips += 1
            reply = self.connection.redis.own().execute_command("EVAL", EXPOSURE_READ_SCRIPT, 1, key, repr(at_least))
        return decode_counts(dict(zip(reply[::2], reply[1::2])), key)

    def count_exposure(self, instance_id: str, tenant: str = DEFAULT_TENANT, *, sessions: int = 0,
                       tests: Sequence[str] = ()) -> None:
        key = self.exposure_key(instance_id, tenant)
        # A test named twice in one call is counted twice, as two calls would count it.
        increments = Counter(TEST_FIELD + test.encode() for test in tests)
        if sessions:
            increments[SESSIONS_FIELD] = sessions
        pairs = [part for field, added in increments.items() for part in (field, added)]
        with redis_errors():
            self.connection.write(key, [("EVAL", EXPOSURE_SCRIPT, 1, key, self._instance_ttl_ms, *pairs)])


def decode_counts(fields: dict[bytes, bytes], key: str) -> tuple[int, dict[str, int]]:
    """The hash's fields as (sessions, {test id: given}); a damaged field is left out (logged)."""
    sessions, given, damaged = 0, {}, []
    for field, value in fields.items():
        if not _COUNT.match(value):
            damaged.append(field)
        elif field == SESSIONS_FIELD:
            sessions = int(value)
        elif field.startswith(TEST_FIELD):
            try:
                given[field[len(TEST_FIELD):].decode()] = int(value)
            except UnicodeDecodeError:
                damaged.append(field)
        else:
            damaged.append(field)
    if damaged:
        log.warning("exposure counts %s: ignoring %d damaged field(s), e.g. %r", key, len(damaged), damaged[0])
    return sessions, given
