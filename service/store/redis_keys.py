"""Where the Redis store keeps what: every key it writes, named here.

Key layout (``P`` is the configurable ``key_prefix``; tenant, session id and idempotency key are
percent-encoded, so none of them can contain ``{``, ``}`` or ``:``)::

    P:{i:<tenant>:<content hash>}:instance  hash  header → JSON (codec.encode), body → raw arrays
    P:{s:<tenant>:<session id>}:state       hash  version → "<n>", record → JSON SessionRecord (records.py)
    P:{k:<tenant>:<idempotency key>}:idem   string  the session id the key is bound to
    P:{q:<tenant>}:<counted>:quota          zset / hash  the tenant's quota counters (one slot per tenant)
    P:{i:<tenant>:<content hash>}:gone      string  the instance was deleted (TTL: the instance's)
    P:{i:<tenant>:<content hash>}:exposure  hash    sessions → how many sessions were counted,
                                                    t:<test id> → how many were given that test
                                                    (redis_exposure.py; TTL: the instance's)
    P:{l:<tenant>}:instances                zset    listing positions "<created ms>:<hash>", all
                                                    score 0 (ordered as text: creation order)
    P:{v:<tenant>:<name>}:value             string  a value stored once (put_value)
    P:{r:<tenant>}:rate                     string  the tenant's rate limit (GCRA TAT, ratelimit.py)
    P:{a:<client address>}:rate             string  failed authentications from one address

The ``{…}`` part is the Redis Cluster hash tag: every key belonging to one session (the state
today; anything later added for it must reuse ``{s:<tenant>:<sid>}``) lands in one slot, so the
compare-and-set script only ever touches one slot. Tenants are part of every key, so another
tenant's data is simply not found.
"""

from __future__ import annotations

from urllib.parse import quote

from .base import DEFAULT_TENANT


class RedisKeys:
    def __init__(self, key_prefix: str):
        if not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ValueError(f"key_prefix must be non-empty and free of braces, got {key_prefix!r}")
        self.key_prefix = key_prefix

    def instance_key(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{i:{_part(tenant)}:{_part(instance_id)}}}:instance"

    def session_key(self, session_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{s:{_part(tenant)}:{_part(session_id)}}}:state"

    def idempotency_key(self, key: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{k:{_part(tenant)}:{_part(key)}}}:idem"

    def quota_key(self, counted: str, tenant: str = DEFAULT_TENANT) -> str:
        """``counted``: instances, instance-bytes or sessions (one slot per tenant)."""
        return f"{self.key_prefix}:{{q:{_part(tenant)}}}:{counted}:quota"

    def deleted_key(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{i:{_part(tenant)}:{_part(instance_id)}}}:gone"

    def exposure_key(self, instance_id: str, tenant: str = DEFAULT_TENANT) -> str:
        """The instance's exposure counts: its slot, so deleting the instance deletes them too."""
        return f"{self.key_prefix}:{{i:{_part(tenant)}:{_part(instance_id)}}}:exposure"

    def value_key(self, name: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{v:{_part(tenant)}:{_part(name)}}}:value"

    def listing_key(self, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self.key_prefix}:{{l:{_part(tenant)}}}:instances"


def _part(text: str) -> str:
    # Percent-encoded so a tenant or id can never open/close a hash tag or fake a separator.
    return quote(text, safe="-_.~@")
