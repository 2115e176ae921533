"""Optional API keys, and the tenant each key belongs to.

Off unless ``API_KEYS`` or ``API_KEYS_FILE`` is configured (the quick start needs none). Entries
are ``tenant:key`` or a bare ``key`` (tenant ``public``, so switching keys on in a single-tenant
deployment keeps its data); the key part may be ``sha256:<64 hex>`` so that only a hash is ever
written in configuration. Only SHA-256 digests are kept in memory, and a presented key is
compared with every digest by :func:`hmac.compare_digest`, so the time taken says nothing about
which key (if any) was close.

With keys on, every ``/v1`` route needs ``Authorization: Bearer <key>``; anything else is a 401
problem with ``WWW-Authenticate`` (RFC 6750 §3). The key's tenant scopes every store call
(service/api/context.py), so another tenant's instance or session is simply not found: 404,
never 403, and no existence oracle.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from service.settings import ConfigurationError, Settings
from service.store import DEFAULT_TENANT

TENANT_PATTERN = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")
HASHED = re.compile(r"\Asha256:([0-9a-fA-F]{64})\Z")
# Plain keys shorter than this are refused at start: a guessable key is no key.
MIN_KEY_LENGTH = 16
REALM = "edgecut"


@dataclass(frozen=True)
class KeyRing:
    """(sha256 digest, tenant) pairs."""

    entries: tuple[tuple[bytes, str], ...]

    def tenant_of(self, presented: str) -> str | None:
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        tenant = None
        for stored, owner in self.entries:
            # No early exit: every digest is compared whichever matches.
            if hmac.compare_digest(stored, digest):
                tenant = owner
        return tenant


def digest_of(key: str) -> str:
    """The ``sha256:<hex>`` form of a key, for configuration that must not hold the key."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _entry(text: str, where: str) -> tuple[bytes, str]:
    tenant, sep, key = text.partition(":")
    if not sep or HASHED.match(text):
        tenant, key = DEFAULT_TENANT, text
    if not TENANT_PATTERN.match(tenant):
        raise ConfigurationError(f"{where}: tenant {tenant!r} must be 1-64 of A-Z a-z 0-9 _ . -")
    hashed = HASHED.match(key)
    if hashed:
        return bytes.fromhex(hashed.group(1)), tenant
    if len(key) < MIN_KEY_LENGTH or not key.isascii() or not key.isprintable() or " " in key:
        raise ConfigurationError(
            f"{where}: keys must be at least {MIN_KEY_LENGTH} printable ASCII characters without spaces "
            "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return hashlib.sha256(key.encode()).digest(), tenant


def load_keyring(settings: Settings) -> KeyRing | None:
    """The configured keys, or None when authentication is off. Bad entries fail at start."""
    entries: list[tuple[bytes, str]] = []
    if settings.api_keys:
        for i, item in enumerate(settings.api_keys.split(",")):
            if item.strip():
                entries.append(_entry(item.strip(), f"API_KEYS entry {i + 1}"))
    if settings.api_keys_file:
        path = Path(settings.api_keys_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as error:
            raise ConfigurationError(f"API_KEYS_FILE: cannot read {path}: {error.strerror}") from None
        for number, line in enumerate(lines, 1):
            line = line.split("#", 1)[0].strip()
            if line:
                entries.append(_entry(line, f"API_KEYS_FILE {path}:{number}"))
    if not entries:
        if settings.api_keys is not None or settings.api_keys_file is not None:
            raise ConfigurationError("API_KEYS / API_KEYS_FILE is set but holds no key")
        return None
    digests = [digest for digest, _ in entries]
    if len(set(digests)) != len(digests):
        raise ConfigurationError("API_KEYS: the same key is configured more than once")
    return KeyRing(tuple(entries))


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def challenge(invalid: bool) -> str:
    """The WWW-Authenticate value: just the realm when no key was sent (RFC 6750 §3.1)."""
    return f'Bearer realm="{REALM}", error="invalid_token"' if invalid else f'Bearer realm="{REALM}"'
