"""The bulk of a big request body, lifted out before the body is parsed.

A 10⁴ × 10³ instance in the compact form is one JSON string of 13 MB (``matrix.data``) beside a
few hundred kB of everything else. Turning that string into a Python str costs orjson more than
the rest of the body together, and every check on the JSON text (depth, repeated keys) would read
it again. :func:`lift_long_strings` cuts each long string literal out of the body before anything
parses it and leaves a short placeholder; a compact array's ``data`` takes the string's bytes back
from the validation context (schemas/arrays.py :class:`LiftedStrings`), and they are base64-decoded
straight from the body.

Only what cannot change the meaning of the body is lifted: string literals of at least
``LIFT_MIN_BYTES`` printable ASCII characters without escapes. The body without them tokenizes
like the body itself — the bytes before a lifted string are the same, so it opens at the same
quote, and with no quote or backslash inside it closes at the same quote — so one is valid JSON
exactly when the other is, and they differ only in those strings' values. Whatever the lifted body
leaves unexplained (a placeholder no compact array took back, a placeholder the client wrote
itself, any refusal) is answered by parsing the whole body as it came (service/api/encoding.py).
"""

from __future__ import annotations

import re

import numpy as np

from schemas.arrays import LiftedStrings

LIFT_MIN_BYTES = 1 << 16
# Every quote-free stretch of 2·_WINDOW bytes holds a whole window, so probing one window in each
# _WINDOW bytes (a memchr each) finds every string worth lifting without reading the body twice.
_WINDOW = LIFT_MIN_BYTES // 2
# A quote preceded by an odd run of backslashes is escaped: it neither opens nor closes a string.
_BACKSLASHES_BEFORE_QUOTE = re.compile(rb'(\\+)"')
PLACEHOLDER = b"\\u0000lifted-"  # a NUL, then the string's number


def lift_long_strings(raw: bytes) -> tuple[bytes, LiftedStrings] | None:
    """``raw`` with its long string literals replaced by placeholders, and the strings by
    placeholder; None when there is nothing to lift (or a placeholder is already in the body)."""
    if len(raw) < LIFT_MIN_BYTES:
        return None
    spans: list[tuple[int, int]] = []  # contents of the lifted strings, quotes excluded
    quotes, counted = 0, 0  # unescaped quotes in raw[:counted]
    probe = 0
    while probe + _WINDOW <= len(raw):
        if raw.find(b'"', probe, probe + _WINDOW) != -1:
            probe += _WINDOW
            continue
        opening = raw.rfind(b'"', counted, probe)
        closing = raw.find(b'"', probe + _WINDOW)
        if closing == -1:
            break
        probe = closing + 1
        if opening == -1:
            continue  # the stretch began before the last string lifted: it is outside strings
        quotes += _unescaped_quotes(raw, counted, opening + 1)
        counted = opening + 1
        if quotes % 2 == 1 and not _escaped(raw, opening) and _liftable(raw, opening + 1, closing):
            spans.append((opening + 1, closing))
            quotes += 1  # the closing quote
            counted = closing + 1
    if not spans:
        return None
    kept, values, start = [], {}, 0
    view = memoryview(raw)
    for number, (begin, end) in enumerate(spans):
        if raw.find(PLACEHOLDER, start, begin) != -1:
            return None  # the client wrote a placeholder: it would be taken for a lifted string
        placeholder = PLACEHOLDER + str(number).encode()
        kept += [view[start:begin], placeholder]
        values["\x00lifted-" + str(number)] = view[begin:end]
        start = end
    if raw.find(PLACEHOLDER, start) != -1:
        return None
    kept.append(view[start:])
    return b"".join(kept), LiftedStrings(values)


def _unescaped_quotes(raw: bytes, start: int, end: int) -> int:
    count = raw.count(b'"', start, end)
    if count and raw.find(b"\\", start, end) != -1:
        count -= sum(len(m.group(1)) % 2 for m in _BACKSLASHES_BEFORE_QUOTE.finditer(raw, start, end))
    return count


def _escaped(raw: bytes, quote: int) -> bool:
    run = quote
    while run > 0 and raw[run - 1] == 0x5C:
        run -= 1
    return (quote - run) % 2 == 1


def _liftable(raw: bytes, begin: int, end: int) -> bool:
    """Long enough, and JSON string content whose value is its bytes: printable ASCII (a control
    character would make the body invalid JSON), no escapes."""
    if end - begin < LIFT_MIN_BYTES or raw.find(b"\\", begin, end) != -1:
        return False
    content = np.frombuffer(raw, dtype=np.uint8, count=end - begin, offset=begin)
    return bool(content.min() >= 0x20 and content.max() < 0x80)
