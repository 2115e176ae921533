"""The two opaque strings of the CAT façade: a section's identifier and a session's
``sessionState``. Neither is a key into anything stored: each carries what it names, compact JSON
deflated and written in base64url (no padding), so a section costs no storage of its own and a
stateless session none at all.

Nothing in them is trusted more than a request body: a decoded section is validated as the
section configuration was, and a session state's answers are replayed through the engine like
``/v1/select``'s observations. A string that does not decode names nothing (404 for a section,
422 for a session state).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from schemas.cat import CatSectionConfig
from service.errors import ServiceError, SessionNotFound

# A section identifier travels in every URL of the section: kept well inside the request line's
# 4 094 bytes (a long exclude_tests list is what could pass it).
MAX_SECTION_ID_CHARS = 2048
# Inflated size of a token, at most: a session's answers at their limit fit far below it.
MAX_INFLATED_BYTES = 16 << 20
# A stateless session's state names its section by this many hex digits of the section's SHA-256:
# enough to tell a section's states from another's (the state is a check, not a secret).
SECTION_DIGEST_CHARS = 16


class SectionNotFound(ServiceError):
    code = "section-not-found"


class BadSessionState(ServiceError):
    code = "invalid-session-state"


def encode(data: Any) -> str:
    return base64.urlsafe_b64encode(zlib.compress(orjson.dumps(data), 6)).rstrip(b"=").decode("ascii")


def decode(token: str) -> Any:
    """The data ``token`` carries; ValueError when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        inflater = zlib.decompressobj()
        data = inflater.decompress(raw, MAX_INFLATED_BYTES)
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("not one complete deflate stream within the size limit")
        return orjson.loads(data)
    except (binascii.Error, zlib.error, orjson.JSONDecodeError, UnicodeError) as error:
        raise ValueError(str(error)) from None


@dataclass(frozen=True)
class Section:
    config: CatSectionConfig  # with instance_id, never an inline instance
    inline: bool  # its instance came inline with the section (a DELETE of the section deletes it)

    def identifier(self) -> str:
        config = self.config.model_dump(mode="json", exclude_defaults=True, exclude={"instance"})
        return encode({"c": config, "i": self.inline})

    def digest(self) -> str:
        """The section, named in a stateless session's state (of its canonical identifier)."""
        return hashlib.sha256(self.identifier().encode("ascii")).hexdigest()[:SECTION_DIGEST_CHARS]


def section_of(identifier: str) -> Section:
    try:
        data = decode(identifier)
        if not isinstance(data, dict) or not isinstance(data.get("i"), bool):
            raise ValueError("not a section")
        config = CatSectionConfig.model_validate(data.get("c"))
        if config.instance_id is None:
            raise ValueError("a section names its instance by id")
    except (ValueError, ValidationError):
        raise SectionNotFound(f"no section '{identifier[:80]}'") from None
    return Section(config, data["i"])


@dataclass(frozen=True)
class SessionState:
    """A stored session's state names its version (a retried results post is then answered as a
    replay, and a stale one refused); a stateless one carries the answers so far and its section's
    digest (a stored session's section is checked against the store instead)."""

    session_id: str
    version: int | None = None  # stored sessions
    answers: tuple[tuple[str, str | None], ...] = ()  # stateless sessions: (test, outcome or None)
    section: str | None = None  # stateless sessions: Section.digest()

    def token(self) -> str:
        if self.version is not None:
            return encode({"s": self.session_id, "v": self.version})
        return encode({"s": self.session_id, "o": [list(pair) for pair in self.answers], "x": self.section})


def session_state_of(token: str, section: Section, session_id: str) -> SessionState:
    """The state ``token`` carries, of the session named in the path. A stateless state of
    another section names no session of this one (404, as a stored session of another section)."""
    stateless = section.config.stateless
    try:
        data = decode(token)
        if not isinstance(data, dict) or data.get("s") != session_id:
            raise ValueError("not the CAT session's state")
        if stateless:
            if data.get("x") != section.digest():
                raise SessionNotFound(f"no session '{session_id}' in this section (its state is another section's)")
            answers = data.get("o")
            if not isinstance(answers, list) or not all(
                    isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], (str, type(None)))
                    for a in answers):
                raise ValueError("no answers")
            return SessionState(session_id, answers=tuple((a[0], a[1]) for a in answers), section=data["x"])
        version = data.get("v")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError("no version")
        return SessionState(session_id, version=version)
    except ValueError:
        raise BadSessionState("sessionState is not the one the CAT session's last results post returned") from None
