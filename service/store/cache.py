"""Per-process, byte-bounded LRUs (:class:`ByteBoundedLRU`): compiled instances
(:class:`InstanceCache`) and session records as last read or written (:class:`RecordCache`); the
session domain keeps its computed steps in one too.

A step needs the whole matrix; downloading and re-hashing it from Redis on every observation
would dominate the request. Instances are immutable and content-addressed, so a cached copy is
never stale in content; the Redis store only re-checks now and then that it still *exists*
(``checked_at``), so expiry there is seen here too.

The budget counts what an instance holds in this process (:func:`resident_bytes`): its arrays,
what the engine derives from them and keeps on the instance (the answers' bit planes, the padded
table of a whole version space), and its labels with their indexes — an instance with thousands
of long outcome labels holds far more in strings than in arrays. An instance larger than the
whole budget is not cached at all rather than flushing everything.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

from service.engine import CompiledInstance

from .base import SessionRecord


# A label's slot in its tuple, and its entry in test_index / outcome_index (key, value, hash).
LABEL_SLOT_BYTES = 8
LABEL_INDEX_BYTES = 100
# A str's header and terminator at its widest (4 bytes per character; an ASCII one has 49 bytes).
STR_HEADER_BYTES = sys.getsizeof("\U0001F600") - 4


def resident_bytes(instance: CompiledInstance) -> int:
    """Bytes ``instance`` keeps alive in this process (an estimate from above for the labels)."""
    arrays = instance.nbytes + instance.derived_nbytes
    indexed = list(itertools.chain(instance.test_ids, *instance.outcome_labels))
    other = list(itertools.chain(instance.hypothesis_ids, instance.class_labels, instance.warnings))
    labels = _str_bytes(indexed) + _str_bytes(other)
    return arrays + labels + LABEL_SLOT_BYTES * (len(indexed) + len(other)) + LABEL_INDEX_BYTES * len(indexed)


def _str_bytes(labels: list[str]) -> int:
    """At least Σ sys.getsizeof(label), in two C calls rather than one Python call per label (10⁴
    hypothesis ids): every label's characters at the widest width any of them has, plus the
    largest header a str has."""
    return sys.getsizeof("".join(labels)) + STR_HEADER_BYTES * len(labels)


@dataclass
class CachedInstance:
    instance: CompiledInstance
    checked_at: float  # time.monotonic() when the backing store last confirmed it exists
    nbytes: int = 0  # resident_bytes(instance), counted once


class ByteBoundedLRU:
    """An LRU of entries that carry their own ``nbytes``, evicting the least recently used until
    the sum fits ``max_bytes``; an entry bigger than the whole budget is not kept."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be ≥ 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def _lookup(self, key):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def _peek(self, key):
        """The entry, leaving the order of eviction as it is."""
        with self._lock:
            return self._entries.get(key)

    def _keep(self, key, entry) -> bool:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if entry.nbytes > self.max_bytes:
                return False
            self._entries[key] = entry
            self._bytes += entry.nbytes
            self._evict_until_fits(0)
            return True

    def make_room(self, nbytes: int) -> None:
        """Evict the least recently used until ``nbytes`` more fit the budget (or nothing is left)."""
        with self._lock:
            self._evict_until_fits(nbytes)

    def _evict_until_fits(self, nbytes: int) -> None:
        # Called with the lock held.
        while self._entries and self._bytes + nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self.evictions += 1

    def discard(self, key) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries


class InstanceCache(ByteBoundedLRU):
    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.hits = self.misses = 0

    def get(self, key: tuple[str, str]) -> CachedInstance | None:
        entry = self._lookup(key)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def put(self, key: tuple[str, str], instance: CompiledInstance, checked_at: float) -> bool:
        """Cache ``instance``; False when it alone exceeds the budget."""
        size = resident_bytes(instance)
        if size > self.max_bytes:
            return False
        return self._keep(key, CachedInstance(instance, checked_at, size))


# What a remembered record costs beyond its raw bytes: the decoded SessionRecord (its strings and
# tuples, about twice the JSON), the key and the LRU's own entry.
RECORD_OVERHEAD_FACTOR = 3
RECORD_ENTRY_BYTES = 400


@dataclass(frozen=True)
class RememberedRecord:
    record: SessionRecord
    raw: bytes  # exactly as stored
    quota_slid_at: float  # time.monotonic() when this process last slid its quota entry (0: unknown)
    nbytes: int = 0


class RecordCache(ByteBoundedLRU):
    """A per-process, byte-bounded LRU of session records as this process last read or wrote
    them: the record and the exact bytes stored for it. A write that starts from a remembered
    record needs no read first; the compare-and-set then checks those bytes against what is
    stored, so a remembered record that went stale (another worker wrote, the session expired or
    was deleted, someone damaged it) is never written over."""

    def get(self, key: str) -> RememberedRecord | None:
        return self._lookup(key)

    def put(self, key: str, record: SessionRecord, raw: bytes, quota_slid_at: float) -> None:
        self._keep(key, RememberedRecord(record, raw, quota_slid_at,
                                         RECORD_OVERHEAD_FACTOR * len(raw) + RECORD_ENTRY_BYTES))
