"""Label work over a million hypotheses done a block at a time. One C call over every label —
``tuple(map(...))``, ``str.join``, ``str.encode`` — holds the GIL for its whole length (0.05–0.1 s
at 10⁶ labels), and a worker's other threads (another tenant's observations) wait for all of it;
between blocks the interpreter's switch interval lets them run. Results are the same objects and
bytes as the single call's."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

# Labels per block: ~3–5 ms of C work per call (a str made, looked up or copied in ~50 ns),
# within the interpreter's 5 ms switch interval, so no single call keeps other threads waiting.
LABELS_PER_BLOCK = 1 << 16


def mapped(function: Callable[[Any], Any], items: Sequence) -> tuple:
    """``tuple(map(function, items))``, a block of items per C call (a numpy array's items as
    Python ints, as ``tolist`` gives them)."""
    out: list = []
    for start in range(0, len(items), LABELS_PER_BLOCK):
        block = items[start:start + LABELS_PER_BLOCK]
        out.extend(map(function, block.tolist() if isinstance(block, np.ndarray) else block))
    return tuple(out)


def joined_utf8(separator: str, labels: Sequence[str]) -> list[bytes]:
    """``separator.join(labels).encode()`` as consecutive pieces, a block of labels per piece:
    UTF-8 encodes each character on its own, so the pieces joined are the same bytes."""
    pieces = []
    for start in range(0, len(labels), LABELS_PER_BLOCK):
        head = separator if start else ""
        pieces.append((head + separator.join(labels[start:start + LABELS_PER_BLOCK])).encode())
    return pieces or [b""]


def first_appearances(labels: Iterable[str]) -> tuple[str, ...]:
    """``tuple(dict.fromkeys(labels))``, a block of labels per C call."""
    seen: dict[str, None] = {}
    labels = list(labels) if not isinstance(labels, Sequence) else labels
    for start in range(0, len(labels), LABELS_PER_BLOCK):
        seen.update(dict.fromkeys(labels[start:start + LABELS_PER_BLOCK]))
    return tuple(seen)


def update_joined(digest: Any, separator: str, labels: Sequence[str]) -> None:
    """``digest`` (hashlib) given the byte length of ``separator.join(labels).encode()`` (8 bytes,
    little-endian), then those bytes, a block of labels at a time."""
    pieces = joined_utf8(separator, labels)
    digest.update(sum(map(len, pieces)).to_bytes(8, "little"))
    for piece in pieces:
        digest.update(piece)
