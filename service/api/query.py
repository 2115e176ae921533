"""Query parameters shared by several views."""

from __future__ import annotations

from flask import request

from .errors import InvalidParameter


def flag(name: str) -> bool:
    """A boolean query parameter (``?explain=true``; also 1/yes and false/0/no); else 400."""
    raw = request.args.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidParameter(f"{name} must be true or false, got {raw!r}")
