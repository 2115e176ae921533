"""The bulk of a big request body, lifted out before the body is parsed.

A 10⁴ × 10³ instance is one big JSON value — the compact form's base64 string (13 MB), or the
nested lists of one-digit outcome indices (20 MB) — beside a few hundred kB of everything else.
orjson turns the string into a 13 MB Python str, or the lists into 10⁷ Python ints that pydantic
then checks one by one and numpy converts again; every check on the JSON text (depth, repeated
keys) reads them once more. :func:`lift_bulk` cuts such values out of the body before anything
parses it and leaves a short placeholder; the wire model takes each value back from the validation
context where it belongs (schemas/arrays.py :class:`Lifted`): a compact array's ``data`` takes the
string's bytes, base64-decoded straight from the body, and ``matrix`` takes the lists, read by
numpy straight from the body's digits.

Only what cannot change the meaning of the body is lifted:

* string literals of at least ``LIFT_MIN_BYTES`` printable ASCII characters without escapes. The
  body without them tokenizes like the body itself — the bytes before a lifted string are the
  same, so it opens at the same quote, and with no quote or backslash inside it closes at the same
  quote — so one is valid JSON exactly when the other is;
* an object member's value that is a rectangular array of one-digit non-negative integers
  (``[[0,1,1],[1,0,2]]``, with or without whitespace) of at least ``LIFT_MIN_BYTES``, replaced by
  ``[["<placeholder>"]]`` so that the nesting depth the limits see is the same.

Whatever the lifted body leaves unexplained (a placeholder nothing took back, a placeholder the
client wrote itself, any refusal) is answered by parsing the whole body as it came
(service/api/encoding.py), so a refusal reads exactly as it always did.
"""

from __future__ import annotations

import re

import numpy as np

from schemas.arrays import Lifted

LIFT_MIN_BYTES = 1 << 16
# Every quote-free stretch of 2·_WINDOW bytes holds a whole window, so probing one window in each
# _WINDOW bytes (a memchr each) finds every value worth lifting without reading the body twice.
_WINDOW = LIFT_MIN_BYTES // 2
# A quote preceded by an odd run of backslashes is escaped: it neither opens nor closes a string.
_BACKSLASHES_BEFORE_QUOTE = re.compile(rb'(\\+)"')
PLACEHOLDER = b"\\u0000lifted-"  # a NUL, then the value's number
_WHITESPACE = b" \t\n\r"
_COMMA, _OPEN, _CLOSE, _ZERO = ord(","), ord("["), ord("]"), ord("0")


def lift_bulk(raw: bytes) -> tuple[bytes, Lifted] | None:
    """``raw`` with its long strings and digit matrices replaced by placeholders, and the values by
    placeholder; None when there is nothing to lift (or a placeholder is already in the body)."""
    if len(raw) < LIFT_MIN_BYTES:
        return None
    # (begin, end, value, text around it): raw[begin:end] becomes the text around the placeholder
    lifts: list[tuple[int, int, memoryview | np.ndarray, tuple[bytes, bytes] | None]] = []
    quotes, counted = 0, 0  # unescaped quotes in raw[:counted]
    probe = 0
    while probe + _WINDOW <= len(raw):
        if raw.find(b'"', probe, probe + _WINDOW) != -1:
            probe += _WINDOW
            continue
        before = raw.rfind(b'"', counted, probe)
        after = raw.find(b'"', probe + _WINDOW)
        if after == -1:  # the stretch runs to the end of the body (a matrix given last)
            after = len(raw)
        probe = after + 1
        if before == -1:
            continue  # the stretch began before the last value lifted: nothing new to see
        quotes += _unescaped_quotes(raw, counted, before + 1)
        counted = before + 1
        if _escaped(raw, before):
            continue  # inside a string that began earlier
        if quotes % 2 == 1:  # `before` opens a string, `after` closes it (if it holds no escape)
            if after < len(raw) and _liftable_string(raw, before + 1, after):
                lifts.append((before + 1, after, memoryview(raw)[before + 1:after], None))
                quotes += 1
                counted = after + 1
        else:  # between strings: `: [[0,1],[1,0]], ` after a member's name
            found = _digit_matrix(raw, before + 1, after)
            if found is not None:
                lifts.append((before + 1, after, *found))
    if not lifts:
        return None
    kept, values, start = [], {}, 0
    view = memoryview(raw)
    for number, (begin, end, value, around) in enumerate(lifts):
        if raw.find(PLACEHOLDER, start, begin) != -1:
            return None  # the client wrote a placeholder: it would be taken for a lifted value
        placeholder = PLACEHOLDER + str(number).encode()
        # A matrix keeps its two levels of brackets, so the depth the limits see is the same.
        replacement = placeholder if around is None else around[0] + b'[["' + placeholder + b'"]]' + around[1]
        kept += [view[start:begin], replacement]
        values["\x00lifted-" + str(number)] = value
        start = end
    if raw.find(PLACEHOLDER, start) != -1:
        return None
    kept.append(view[start:])
    return b"".join(kept), Lifted(values)


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


def _liftable_string(raw: bytes, begin: int, end: int) -> bool:
    """Long enough, and JSON string content whose value is its bytes: printable ASCII (a control
    character would make the body invalid JSON), no escapes."""
    if end - begin < LIFT_MIN_BYTES or raw.find(b"\\", begin, end) != -1:
        return False
    content = np.frombuffer(raw, dtype=np.uint8, count=end - begin, offset=begin)
    return bool(content.min() >= 0x20 and content.max() < 0x80)


def _digit_matrix(raw: bytes, begin: int, end: int) -> tuple[np.ndarray, tuple[bytes, bytes]] | None:
    """When raw[begin:end] — the text between two strings — is ``:``, a rectangular array of
    one-digit integers, then only closing brackets and commas: the (n, m) uint8 matrix, and the
    text before and after the array (whitespace dropped: it means nothing between strings).
    Checked on strided views of the text, with no Python loop over rows or cells: every row is
    ``[d,d,…,d]`` of the first row's length, and rows are joined by single commas."""
    if end - begin < LIFT_MIN_BYTES:
        return None
    text = raw[begin:end]
    if any(space in text for space in (b" ", b"\n", b"\t", b"\r")):
        text = text.translate(None, _WHITESPACE)
    if not text.startswith(b":[["):
        return None
    array_start = 1
    row_length = text.find(b"]", array_start) - array_start  # the first row, brackets included
    array_end = text.find(b"]]", array_start) + 2
    if row_length < 3 or row_length % 2 == 0 or array_end < 2 or text[array_end:].strip(b",]}"):
        return None
    stride = row_length + 1  # a row and the comma after it
    if (array_end - array_start - 1) % stride:
        return None
    n = (array_end - array_start - 1) // stride
    cells = np.frombuffer(text, dtype=np.uint8, count=n * stride - 1, offset=array_start + 1)
    rows = np.lib.stride_tricks.as_strided(cells, shape=(n, row_length), strides=(stride, 1), writeable=False)
    digits = rows[:, 1::2] - np.uint8(_ZERO)  # wraps below '0': a non-digit is then > 9
    if not ((rows[:, 0] == _OPEN).all() and (rows[:, -1] == _CLOSE).all()
            and (cells[row_length::stride] == _COMMA).all() and (rows[:, 2:-1:2] == _COMMA).all()
            and digits.max(initial=0) <= 9):
        return None
    return digits, (text[:array_start], text[array_end:])
