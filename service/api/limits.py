"""Limits that protect the workers, checked at the boundary before any array is built.

Each is a setting and each is answered 413 ``limit-exceeded`` with the variable's name in the
detail, so a client (or an operator reading logs) knows which knob refused it:

====================================  =========================================================
``MAX_BODY_BYTES``                    werkzeug refuses the body before reading it (413
                                      body-too-large; service/api/problems.py)
``MAX_CELLS``                         n·N, refused by compilation (413 instance-too-large)
``MAX_PARSE_BYTES``                   :func:`check_parse_cost`, on the raw bytes, before parsing
``BIG_REQUEST_BYTES``                 :func:`hold_big_request`: one big request per worker at a time
                                      (503 server-busy with Retry-After for another meanwhile): big
                                      in bytes, or in what its JSON will hold once parsed
``MAX_JSON_DEPTH``                    :func:`check_depth`, on the raw bytes, before validation
``MAX_CLASSES``                       :func:`check_request`
``MAX_HYPOTHESES``                    :func:`check_request`: rows, noisy copies counted (413
                                      instance-too-large, as MAX_CELLS)
``MAX_OUTCOMES_PER_TEST``             :func:`check_request`: EC²'s α pass costs n·N·ℓ
``MAX_LABEL_LENGTH``                  :func:`check_request` (the schema caps labels at 200)
``MAX_OBSERVATIONS_PER_REQUEST``      :func:`check_request` (the schema caps lists at 10 000)
====================================  =========================================================

Parse cost: a JSON body becomes Python objects (orjson's, then pydantic's copies, then numpy's
arrays), tens to thousands of bytes per item of the body: unbounded, an 80 MiB per-hypothesis
body would hold ~2.4 GB and take ~27 s of CPU before it was stored. The items are counted on
the bytes before orjson runs (one C pass per character: ~0.15 s for 80 MB), each weighted by
what it was measured to cost; brackets, commas and colons inside strings are counted too, so
the estimate is an upper bound (no valid body is short-changed by more than its own
punctuation).

Depth: orjson parses first (Rust, with its own fixed recursion limit of 1024, so no body can
blow the Python stack there); the depth of the valid JSON is then measured on its bytes, before
pydantic walks it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable

import numpy as np
from flask import Flask, Response, current_app, g
from pydantic import BaseModel

from schemas.api import ObservationCorrection, ObservationsRequest, SelectRequest, StepConfig
from schemas.instance import Instance
from schemas.item_bank import ItemBank
from service.engine import InstanceTooLarge, count_noisy_copies
from service.errors import LimitExceeded, ServiceError
from service.settings import Settings
from service.store import SessionStore

# A JSON string: quote, then runs of plain characters or escapes (unrolled: linear time).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# +1 for an opening bracket, −1 for a closing one, 0 for every other byte.
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


# Bytes one item of a JSON body holds from its parse to its compiled instance, measured on the
# heaviest body of each form under gunicorn (bench/hostile.py --heavy, docs/reliability.md), then
# raised where the item's CPU time is the larger cost (~6 ns per weighted byte, the nested
# matrix's ratio): a value 31 B and 0.17 µs, an array (a nested row or likelihood cell) ~350 B
# and 2.1 µs, an object member (a per-hypothesis outcome) ~128 B and 0.6 µs, an object (a
# hypothesis: its pydantic model, rules and labels) ~570 B and 8.4 µs.
VALUE_BYTES, MEMBER_BYTES, ARRAY_BYTES, OBJECT_BYTES = 32, 128, 384, 1500


def parse_cost(raw: bytes) -> tuple[int, dict[str, int]]:
    """The bytes ``raw`` is estimated to hold once parsed, and the counts behind the estimate."""
    counts = {"values": raw.count(b",") + 1, "members": raw.count(b":"), "arrays": raw.count(b"["),
              "objects": raw.count(b"{")}
    cost = (VALUE_BYTES * counts["values"] + MEMBER_BYTES * counts["members"] + ARRAY_BYTES * counts["arrays"]
            + OBJECT_BYTES * counts["objects"])
    return cost, counts


def check_parse_cost(raw: bytes, settings: Settings) -> None:
    """Called by parse_body on every JSON body (an instance part of a binary body included)
    before it is parsed: 413 past MAX_PARSE_BYTES; and a body estimated to hold at least
    BIG_REQUEST_BYTES once parsed is a big request (:func:`hold_big_request`) however few bytes
    it has: a 0.5 MB per-hypothesis body holds ~32 MB and takes ~0.1 s of CPU."""
    cost = refuse_parse_cost(raw, settings)
    if cost is not None:
        hold_big_request(cost, settings, holds=cost)


def refuse_parse_cost(raw: bytes, settings: Settings) -> int | None:
    """413 past MAX_PARSE_BYTES; else the estimate, or None when it is surely below
    BIG_REQUEST_BYTES (no request context needed: the isolated process calls it too)."""
    limit = settings.max_parse_bytes
    if len(raw) * OBJECT_BYTES + VALUE_BYTES < min(limit, settings.big_request_bytes):  # every item ≥ a byte
        return None
    cost, counts = parse_cost(raw)
    if cost > limit:
        shown = ", ".join(f"{count} {name}" for name, count in counts.items())
        raise LimitExceeded("MAX_PARSE_BYTES", limit,
                            f"the JSON body would hold about {cost} bytes once parsed ({shown}); send a big "
                            f"matrix or likelihood_matrix in the compact base64 form or as a binary .npy part "
                            f"(multipart/form-data), which are not parsed as JSON (docs/instances.md)")
    return cost


_BIG_SLOT = "edgecut.big-request"  # app.extensions: the worker's one slot for a big request
# What a big request holds at its peak per byte of its body, beyond what the worker held before:
# measured 4.2 (compact base64) and up to 4.7 (binary .npy) on the 80 MiB float64 likelihood
# bodies (the body as received, its parts or decoded array, validation's temporaries, the
# compiled copy and the copy encoded for Redis; bench/hostile.py --heavy), with room for a heap
# that a busier worker left less tidy. A JSON body's own estimate (MAX_PARSE_BYTES's count) is
# used where it is larger.
HELD_PER_BODY_BYTE = 6


class WorkerBusy(ServiceError):
    code = "server-busy"


class BigRequestSlot:
    """Taken by the request thread serving a big request; ``busy`` is read by the worker's event
    loop without taking anything, so looking never makes a request thread miss the slot.
    ``make_room(nbytes)``: the store's, giving up cached instances for what the request will hold."""

    def __init__(self, make_room: Callable[[int], None] = lambda nbytes: None) -> None:
        self._lock = threading.Lock()
        self.busy = False
        self.make_room = make_room

    def take(self) -> bool:
        with self._lock:
            if self.busy:
                return False
            self.busy = True
            return True

    def give_back(self) -> None:
        with self._lock:
            self.busy = False


def install(app: Flask, settings: Settings, store: SessionStore) -> None:
    """One slot per app (a gunicorn worker serves one app) for a big request, given back once the
    request that holds it is answered, however it ends."""
    app.extensions[_BIG_SLOT] = BigRequestSlot(store.make_room)

    def release() -> None:
        if g.pop(_BIG_SLOT, False):
            app.extensions[_BIG_SLOT].give_back()

    @app.teardown_request
    def _release(_error: BaseException | None) -> None:
        release()  # an unhandled error skips after_request

    @app.after_request
    def _answered(response: Response) -> Response:
        # Given back before the answer is sent: a client that sends its next big request as soon
        # as it has the answer to the last must find the slot free.
        release()
        if g.get("big_request_refused"):
            response.headers["Retry-After"] = str(settings.retry_after_seconds)
        return response


def big_request_in_flight(app: object) -> bool:
    """Whether ``app`` is serving a big request now (the worker's event loop asks, to refuse
    another before receiving its body)."""
    slot = getattr(app, "extensions", {}).get(_BIG_SLOT)
    return slot is not None and slot.busy


def holding_big_request() -> bool:
    """Whether the request being served holds its worker's big-request slot."""
    return bool(g.get(_BIG_SLOT))


def hold_big_request(size: int, settings: Settings, holds: int | None = None) -> None:
    """Called by parse_body with the body's size once read (and inflated), and with what a JSON
    body is estimated to hold once parsed (:func:`check_parse_cost`); ``holds``: what the request
    is expected to hold at its peak (default: HELD_PER_BODY_BYTE per byte of a body of ``size``).
    The per-request limits bound one request; this keeps a
    worker's threads from running several big ones at once, whose objects would add up (and
    whose parsing would share one GIL with every other request), and makes room for the one it
    runs: the worker's instance cache gives up its least recently used instances until it and
    ``holds`` fit INSTANCE_CACHE_BYTES, so a full cache and a big request never add up either."""
    if size < settings.big_request_bytes:
        return
    slot = current_app.extensions.get(_BIG_SLOT)
    if slot is None:  # an app made without install(): nothing to hold
        return
    if not g.get(_BIG_SLOT):
        if not slot.take():
            g.big_request_refused = True
            raise WorkerBusy(f"this worker is serving another request of at least {settings.big_request_bytes} "
                             f"bytes (BIG_REQUEST_BYTES); retry after Retry-After seconds")
        g.setdefault(_BIG_SLOT, True)
    slot.make_room(HELD_PER_BODY_BYTE * size if holds is None else holds)


def _bracket_depth(raw: bytes) -> int:
    """The deepest bracket nesting, brackets inside strings counted too: ≥ the JSON depth."""
    brackets = raw.translate(None, _NOT_BRACKETS)  # one C pass; the rest works on brackets only
    steps = _BRACKET_STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def json_depth(raw: bytes) -> int:
    """The nesting depth of valid JSON (``{}`` is 1, ``[[1]]`` is 2), brackets in strings aside."""
    if raw.count(b"[") + raw.count(b"{") == 0:
        return 0
    bound = _bracket_depth(raw)
    if bound <= 1 or (b'"' not in raw):
        return bound
    return _bracket_depth(_JSON_STRING.sub(b'""', raw))


def check_depth(raw: bytes, limit: int) -> None:
    """Called by parse_body on JSON that orjson accepted, before the wire model sees it, with
    MAX_JSON_DEPTH. A cheap bound first (one pass: the bracket nesting, brackets inside strings
    counted too); the exact depth only when that bound is over the limit."""
    if len(raw) <= 2 * limit or _bracket_depth(raw) <= limit:
        return
    depth = json_depth(raw)
    if depth > limit:
        raise LimitExceeded("MAX_JSON_DEPTH", limit, f"the body nests {depth} levels deep")


def check_request(model: BaseModel, settings: Settings) -> None:
    """Called by parse_body on every validated request body."""
    labelled = None
    if isinstance(model, Instance):
        _check_instance(model, settings)
    elif isinstance(model, StepConfig) and model.instance is not None:
        _check_instance(model.instance, settings, path="instance.")
    if isinstance(model, (ObservationsRequest, SelectRequest)):
        labelled = model.labelled()
    if labelled is not None:
        if len(labelled) > settings.max_observations_per_request:
            raise LimitExceeded("MAX_OBSERVATIONS_PER_REQUEST", settings.max_observations_per_request,
                                f"the request carries {len(labelled)} observations")
        _check_labels((label for pair in labelled for label in pair if label is not None), settings.max_label_length,
                      "observations")
    if isinstance(model, StepConfig):
        _check_labels(model.exclude_tests, settings.max_label_length, "exclude_tests")
    if isinstance(model, ObservationCorrection) and model.outcome is not None:
        _check_labels([model.outcome], settings.max_label_length, "outcome")


def _check_labels(labels: Iterable[str], limit: int, where: str) -> None:
    longest = max(map(len, labels), default=0)
    if longest > limit:
        raise LimitExceeded("MAX_LABEL_LENGTH", limit, f"a label in {where} is {longest} characters long")


def _check_item_bank(bank: ItemBank, settings, path: str) -> None:
    """An item bank's labels, outcomes per item, and classes (its levels; without cut scores, the
    points of a given grid)."""
    limit = settings.max_label_length
    _check_labels((label for item in bank.items for label in (item.id, item.content_area or "")), limit,
                  f"{path}item_bank.items")
    _check_labels(bank.levels or (), limit, f"{path}item_bank.levels")
    widest = max(bank.items, key=lambda item: item.n_outcomes)
    if widest.n_outcomes > settings.max_outcomes_per_test:
        raise LimitExceeded("MAX_OUTCOMES_PER_TEST", settings.max_outcomes_per_test,
                            f"item {widest.id} of the {path}item bank has {widest.n_outcomes} outcomes")
    classes = len(bank.cut_scores) + 1 if bank.cut_scores else len(bank.prior.grid or ())
    if classes > settings.max_classes:
        raise LimitExceeded("MAX_CLASSES", settings.max_classes, f"the {path}item bank has {classes} classes")


def _check_instance(inst: Instance, settings, path: str = "") -> None:
    if inst.item_bank is not None:
        _check_item_bank(inst.item_bank, settings, path)
        return
    hyps = inst.hypotheses or []
    tests = inst.tests

    # Labels: ids, outcome labels, class labels, and the keys and values of per-hypothesis maps.
    limit = settings.max_label_length
    _check_labels((t.id for t in tests), limit, f"{path}tests")
    _check_labels((o for t in tests for o in t.outcomes or ()), limit, f"{path}tests")
    _check_labels(inst.classes or (), limit, f"{path}classes")
    _check_labels(inst.hypothesis_ids or (), limit, f"{path}hypothesis_ids")
    _check_labels((label for h in hyps for label in (h.id, h.class_ or "")), limit, f"{path}hypotheses")
    _check_labels((o for h in hyps for o in (h.outcomes or {}).values()), limit, f"{path}hypotheses")
    _check_labels((o for h in hyps for row in (h.likelihoods or {}).values() for o in row), limit,
                  f"{path}hypotheses")

    # Classes: at most one per hypothesis, so only counted when there could be too many.
    n = inst.n_hypotheses
    if n > settings.max_classes:
        classes = set(inst.classes or ()) if inst.hypotheses is None else {h.class_ or h.id for h in hyps}
        if len(classes) > settings.max_classes:
            raise LimitExceeded("MAX_CLASSES", settings.max_classes, f"the {path}instance has {len(classes)} classes")

    # Outcomes per test: listed, or derived from the hypotheses / the matrix.
    most, worst = 0, ""
    for test in tests:
        if test.outcomes is not None and len(test.outcomes) > most:
            most, worst = len(test.outcomes), test.id
    unlisted = {t.id: set() for t in tests if t.outcomes is None}
    if unlisted and hyps:
        for h in hyps:
            for test_id, outcome in (h.outcomes or {}).items():
                if test_id in unlisted:
                    unlisted[test_id].add(outcome)
            for test_id, row in (h.likelihoods or {}).items():
                if test_id in unlisted:
                    unlisted[test_id].update(row)
        for test_id, seen in unlisted.items():
            if len(seen) > most:
                most, worst = len(seen), test_id
    matrix, likelihood = inst.matrix_array(), inst.likelihood_array()
    if unlisted and matrix is not None and matrix.size:
        width = int(matrix.max()) + 1
        if width > most:
            most, worst = width, "(a matrix column)"
    if likelihood is not None and likelihood.size:
        width = likelihood.shape[2]
        if width > most:
            most, worst = width, "(likelihood_matrix)"
    if most > settings.max_outcomes_per_test:
        raise LimitExceeded("MAX_OUTCOMES_PER_TEST", settings.max_outcomes_per_test,
                            f"test {worst} of the {path}instance has {most} outcomes")
    _check_rows(inst, settings.max_hypotheses, path, unlisted, matrix)


def _check_rows(inst: Instance, limit: int, path: str, unlisted: dict[str, set], matrix: np.ndarray | None) -> None:
    """The compiled instance's rows, noisy copies counted (as compilation counts them, with
    each test's outcomes: listed, else seen) before any is built: each costs ~1.6 µs and ~250
    bytes to compile and store, whatever the size of its row."""
    n = inst.n_hypotheses
    copies = 1
    if inst.max_flips:
        seen = matrix.max(axis=0) + 1 if matrix is not None and matrix.size else None
        widths = [len(t.outcomes) if t.outcomes is not None else int(seen[j]) if seen is not None
                  else len(unlisted.get(t.id, ())) for j, t in enumerate(inst.tests)]
        copies = count_noisy_copies(np.array(widths), inst.max_flips, cap=limit // max(n, 1))
    if n * copies > limit:
        made = f" ({n} hypotheses and at least {copies - 1} noisy copies of each)" if copies > 1 else ""
        raise InstanceTooLarge(f"the {path}instance compiles to {n * copies} rows{made}; the limit is {limit} "
                               f"(MAX_HYPOTHESES)")
