"""``Content-Encoding`` of a request body: gzip or none, inflated within ``MAX_BODY_BYTES``."""

from __future__ import annotations

import zlib

from flask import Request

from .errors import BodyTooLarge, UnreadableBody, UnsupportedMediaType

GZIP_CODINGS = ("gzip", "x-gzip")


def inflated(served: Request, raw: bytes, limit: int) -> bytes:
    """``raw`` inflated per its ``Content-Encoding`` (gzip or none). The inflated size is held to
    ``limit`` (MAX_BODY_BYTES) *while* inflating, so a gzip bomb is refused after at most that many
    bytes of output, never expanded in full."""
    coding = served.environ.get("HTTP_CONTENT_ENCODING")
    if coding is None:
        return raw
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding not in GZIP_CODINGS:
        raise UnsupportedMediaType(f"Content-Encoding {coding!r} is not supported; send gzip or nothing")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
    try:
        body = inflater.decompress(raw, limit + 1)  # stops after limit + 1 bytes of output
    except zlib.error as error:
        raise UnreadableBody(f"the body is not valid gzip: {error}") from None
    if len(body) > limit:
        raise BodyTooLarge(f"the body inflates to more than the limit of {limit} bytes (MAX_BODY_BYTES)")
    if not inflater.eof or inflater.unused_data:
        raise UnreadableBody("the body is not one complete gzip stream")
    return body
