"""``Content-Encoding`` of a request body: gzip or none, inflated within ``MAX_BODY_BYTES``."""

from __future__ import annotations

import zlib

from flask import Request

from service.settings import Settings

from .errors import BodyTooLarge, UnreadableBody, UnsupportedMediaType
from .limits import hold_big_request

GZIP_CODINGS = ("gzip", "x-gzip")
GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip framing only


def inflated(served: Request, raw: bytes, settings: Settings) -> bytes:
    """``raw`` inflated per its ``Content-Encoding`` (gzip or none). The inflated size is held to
    MAX_BODY_BYTES *while* inflating, so a gzip bomb is refused after at most that many bytes of
    output, never expanded in full; and a body that inflates past BIG_REQUEST_BYTES takes the
    worker's slot for a big request (or is refused 503) once that much is inflated, not after
    the whole: the event loop saw only its small compressed length."""
    coding = served.environ.get("HTTP_CONTENT_ENCODING")
    if coding is None:
        return raw
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding not in GZIP_CODINGS:
        raise UnsupportedMediaType(f"Content-Encoding {coding!r} is not supported; send gzip or nothing")
    limit, big = settings.max_body_bytes, settings.big_request_bytes
    if big <= limit:
        head = _inflate(raw, big)
        if len(head) < big:
            return head  # the whole body
        hold_big_request(len(head), settings)
        # Inflated again from the start rather than continued: joining two pieces would copy the
        # whole body once more; re-inflating the first costs ~2 ms per MiB.
        del head
    body = _inflate(raw, limit + 1)
    if len(body) > limit:
        raise BodyTooLarge(f"the body inflates to more than the limit of {limit} bytes (MAX_BODY_BYTES)")
    return body


def _inflate(raw: bytes, most: int) -> bytes:
    """The first ``most`` bytes ``raw`` inflates to (all of them when it ends before)."""
    inflater = zlib.decompressobj(wbits=GZIP_WBITS)
    try:
        body = inflater.decompress(raw, most)  # stops after ``most`` bytes of output
    except zlib.error as error:
        raise UnreadableBody(f"the body is not valid gzip: {error}") from None
    if len(body) < most and (not inflater.eof or inflater.unused_data):
        raise UnreadableBody("the body is not one complete gzip stream")
    return body
