"""CompiledInstance ⇄ (JSON header, raw array bytes). Never pickle.

The header (orjson) holds the labels, the content hash and one descriptor per array
(``name``, ``dtype``, ``shape``, ``offset``, ``nbytes``; the likelihood tensor is stored as
``likelihood_by_outcome``, shape (n, ℓ, N)); the body is the arrays' little-endian
bytes back to back, 8-byte-aligned ones first so every float64 view starts on an 8-byte
boundary (the outcomes of an instance with at most two outcomes per test: one bit per cell). Decoding trusts nothing it reads: each dtype must be the one that field may have, each
shape must agree with the label counts, each byte range must be exactly where the header says,
the header's ``checksum`` (CRC-32 of the header without it, then the body) must match, and the
content hash must be the id the caller asked for. Any mismatch raises :class:`CorruptInstance`:
corrupt bytes must never become a wrong answer.

Why a CRC and not the content hash again: a cold worker's first step on a 10⁴ × 10³ instance
would spend as long re-hashing its 10 MB (sha256) as computing the step; CRC-32 finds every
burst of corruption up to 32 bits and any other with probability 1 − 2⁻³², at a sixth of the
cost. Headers written without a checksum (older versions) are still verified by recomputing the
content hash.
"""

from __future__ import annotations

import itertools
import math
import zlib
from typing import NamedTuple

import numpy as np
import orjson

from service.engine import CompiledInstance

FORMAT = "edgecut.compiled-instance/1"

# Outcomes of an instance whose every test has at most two outcomes are stored one bit per cell
# (np.packbits, each row padded to whole bytes): a 10⁴ × 10³ binary instance is 1.25 MB in Redis
# instead of 10 MB, and a cold worker downloads an eighth of it.
BITS = "bits"

# Field → dtypes it may be stored with. Little-endian on the wire whatever the host.
_ALLOWED_DTYPES = {
    "costs": {"<f8"},
    "class_index": {"<i8"},
    "prior": {"<f8"},
    "likelihood_by_outcome": {"<f8"},
    "outcomes": {"|u1", "<u2", "<u4", "<u8", BITS},
    "loss": {"<f8"},
    "acceptable": {"|u1"},
}
# Encoding order: 8-byte items first, so offsets of float64 arrays stay multiples of 8.
_ORDER = ("costs", "class_index", "prior", "likelihood_by_outcome", "loss", "outcomes", "acceptable")


class CorruptInstance(ValueError):
    """Stored instance bytes disagree with their header or their hash."""


def encode(instance: CompiledInstance) -> tuple[bytes, bytes]:
    """The (header, body) pair for ``instance``."""
    parts = _stored_arrays(instance)
    # Each array copied once, by the join.
    body = b"".join(memoryview(np.ascontiguousarray(array)).cast("B") for _, _, _, array in parts)
    header = orjson.dumps(_header(instance, parts))
    # The checksum is the header's last key: written onto the one dump rather than dumping the
    # labels again (a million ids take ~25 ms, holding the GIL), the same bytes as a second dump.
    return header[:-1] + b',"checksum":' + orjson.dumps(_checksum(header, body)) + b"}", body


def encoded_size(instance: CompiledInstance) -> int:
    """``len(header) + len(body)`` of :func:`encode`, without copying the arrays: what the
    instance takes in the store (outcomes packed to bits where they are), and what the
    per-tenant byte quota counts."""
    parts = _stored_arrays(instance)
    header = _header(instance, parts)
    header["checksum"] = _checksum(b"", b"")  # the same length whatever it covers
    return len(orjson.dumps(header)) + sum(array.nbytes for _, _, _, array in parts)


def _stored_arrays(instance: CompiledInstance) -> list[tuple[str, str, list[int], np.ndarray]]:
    """(name, stored dtype, logical shape, the array whose bytes are stored), in :data:`_ORDER`."""
    arrays = {
        "costs": instance.costs.astype("<f8", copy=False),
        "class_index": instance.class_index.astype("<i8", copy=False),
        "prior": instance.prior.astype("<f8", copy=False),
        # Stored outcome-major, (n, ℓ, N), the layout compile_instance keeps in memory: encoding
        # is then a straight copy and the decoded tensor needs no re-layout for the α pass.
        "likelihood_by_outcome": None if instance.likelihood is None
        else instance.likelihood.transpose(0, 2, 1).astype("<f8", copy=False),
        "outcomes": None if instance.outcomes is None
        else instance.outcomes.astype(instance.outcomes.dtype.newbyteorder("<"), copy=False),
        "loss": None if instance.loss is None else instance.loss.astype("<f8", copy=False),
        "acceptable": None if instance.acceptable is None else instance.acceptable.astype("|u1"),
    }
    parts = []
    for name in _ORDER:
        array = arrays[name]
        if array is None:
            continue
        shape, dtype = list(array.shape), array.dtype.str
        if name == "outcomes" and instance.packed_outcomes is not None:
            array, dtype = instance.packed_outcomes, BITS  # packed rows keep the (n, N) shape
        parts.append((name, dtype, shape, array))
    return parts


def _header(instance: CompiledInstance, parts: list[tuple[str, str, list[int], np.ndarray]]) -> dict:
    """The header without its checksum."""
    descriptors, offset = [], 0
    for name, dtype, shape, array in parts:
        descriptors.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset, "nbytes": array.nbytes})
        offset += array.nbytes
    header = {
        "format": FORMAT,
        "content_hash": instance.content_hash,
        "kind": instance.kind,
        "test_ids": instance.test_ids,
        "outcome_labels": instance.outcome_labels,
        "hypothesis_ids": instance.hypothesis_ids,
        "class_labels": instance.class_labels,
        "warnings": instance.warnings,
        "arrays": descriptors,
    }
    if instance.is_decision:  # class instances keep the header they always had
        header["decision_labels"] = instance.decision_labels
    # Written only when set, so instances without them encode as they always did.
    if instance.repeatable_tests.any():
        header["repeatable"] = np.flatnonzero(instance.repeatable_tests).tolist()
    if instance.skip_charged:
        header["skip_cost"] = "charged"
    if instance.test_text is not None:
        header["test_text"], header["outcome_text"] = instance.test_text, instance.outcome_text
    # An item bank's: a few numbers, exact in JSON.
    for name in ("theta", "exposure_parameters", "enemies", "content_area", "content_balance"):
        if getattr(instance, name) is not None:
            header[name] = getattr(instance, name).tolist()
    return header


def _checksum(header_without_checksum: bytes, body: bytes) -> str:
    return f"crc32:{zlib.crc32(body, zlib.crc32(header_without_checksum)):08x}"


class _Header(NamedTuple):
    """The header's fields, each of the type it must have."""

    kind: str
    content_hash: str
    descriptors: list
    test_ids: tuple[str, ...]
    hypothesis_ids: tuple[str, ...]
    class_labels: tuple[str, ...]
    outcome_labels: tuple[tuple[str, ...], ...]
    warnings: tuple[str, ...]
    decision_labels: tuple[str, ...]
    repeatable: list
    skip_cost: str
    test_text: tuple | None
    outcome_text: tuple | None
    theta: list | None
    exposure_parameters: list | None
    enemies: list | None
    content_area: list | None
    content_balance: list | None


def decode(header_bytes: bytes, body: bytes, expected_hash: str | None = None) -> CompiledInstance:
    """The instance (arrays are read-only views of ``body``), or :class:`CorruptInstance`."""
    header, checksum = _verified_header(header_bytes, body)
    fields = _fields(header)
    if expected_hash is not None and fields.content_hash != expected_hash:
        raise CorruptInstance(f"stored header is for instance {fields.content_hash!r}, not {expected_hash!r}")
    n, n_tests = len(fields.hypothesis_ids), len(fields.test_ids)
    if len(fields.outcome_labels) != n_tests or n == 0 or n_tests == 0:
        raise CorruptInstance("instance header label counts are inconsistent")
    if fields.kind not in ("deterministic", "likelihood"):
        raise CorruptInstance(f"unknown instance kind {fields.kind!r}")
    arity = np.fromiter(map(len, fields.outcome_labels), dtype=np.int64, count=n_tests)
    arrays, unpacked = _arrays(fields, body, int(arity.max()))
    _check_indices(arrays, unpacked, arity, len(fields.class_labels))
    instance = _instance(fields, arrays)
    if checksum is not None:
        instance.__dict__["content_hash"] = fields.content_hash  # vouched for by the checksum
    elif instance.content_hash != fields.content_hash:
        raise CorruptInstance(f"instance bytes hash to {instance.content_hash}, the header says {fields.content_hash}")
    return instance


def _verified_header(header_bytes: bytes, body: bytes) -> tuple[dict, str | None]:
    """The header as JSON of this format, and its checksum (None in headers written before it),
    which must match the header and the body."""
    try:
        header = orjson.loads(header_bytes)
    except orjson.JSONDecodeError as exc:
        raise CorruptInstance(f"instance header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CorruptInstance(f"instance header is not {FORMAT}")
    checksum = header.pop("checksum", None)  # the last key: the rest re-encodes byte for byte
    if checksum is not None and checksum != _checksum(orjson.dumps(header), body):
        raise CorruptInstance("instance header or body does not match its checksum")
    return header, checksum


def _fields(header: dict) -> _Header:
    try:
        outcome_labels = _label_lists(header["outcome_labels"])
        test_text, outcome_text = _display_text(header, outcome_labels)
        return _Header(
            kind=header["kind"], content_hash=header["content_hash"], descriptors=header["arrays"],
            test_ids=_labels(header["test_ids"]), hypothesis_ids=_labels(header["hypothesis_ids"]),
            class_labels=_labels(header["class_labels"]), outcome_labels=outcome_labels,
            warnings=_labels(header["warnings"]),
            decision_labels=_labels(header["decision_labels"]) if "decision_labels" in header else (),
            repeatable=header.get("repeatable", []), skip_cost=header.get("skip_cost", "free"),
            test_text=test_text, outcome_text=outcome_text, theta=header.get("theta"),
            exposure_parameters=header.get("exposure_parameters"), enemies=header.get("enemies"),
            content_area=header.get("content_area"), content_balance=header.get("content_balance"))
    except (KeyError, TypeError) as exc:
        raise CorruptInstance(f"instance header lacks or mistypes a field: {exc}") from None


def _arrays(fields: _Header, body: bytes, width: int) -> tuple[dict[str, np.ndarray], set[str]]:
    """The arrays the header describes, as views of ``body`` (bit arrays unpacked, and named in
    the set returned: every cell 0 or 1 by construction); exactly those the kind needs, each of
    its dtype and shape, back to back and covering the body."""
    n, n_tests, n_decisions = len(fields.hypothesis_ids), len(fields.test_ids), len(fields.decision_labels)
    expected_shapes = {"costs": (n_tests,), "class_index": (n,), "prior": (n,),
                       "outcomes": (n, n_tests), "likelihood_by_outcome": (n, None, n_tests),
                       "acceptable": (n, n_decisions), "loss": (n, n_decisions)}
    descriptors = fields.descriptors if isinstance(fields.descriptors, list) else []
    wanted = {"costs", "class_index", "prior",
              "outcomes" if fields.kind == "deterministic" else "likelihood_by_outcome"}
    if n_decisions:
        wanted.add("acceptable")
        if any(isinstance(d, dict) and d.get("name") == "loss" for d in descriptors):
            wanted.add("loss")
    arrays: dict[str, np.ndarray] = {}
    unpacked: set[str] = set()
    end = 0
    for d in descriptors:
        try:
            name, dtype, shape = d["name"], d["dtype"], tuple(d["shape"])
            offset, nbytes = d["offset"], d["nbytes"]
        except (KeyError, TypeError) as exc:
            raise CorruptInstance(f"array descriptor lacks a field: {exc}") from None
        if name not in wanted or name in arrays:
            raise CorruptInstance(f"unexpected or repeated array {name!r} in a {fields.kind} instance")
        _check_descriptor(name, dtype, shape, expected_shapes[name], width)
        stored_shape = (shape[0], -(-shape[1] // 8)) if dtype == BITS else shape
        itemsize = 1 if dtype == BITS else np.dtype(dtype).itemsize
        if offset != end or nbytes != math.prod(stored_shape) * itemsize or offset + nbytes > len(body):
            raise CorruptInstance(f"array {name!r}: byte range {offset}+{nbytes} does not match its "
                                  f"shape {shape} as {dtype} in a {len(body)} B body")
        array = np.frombuffer(body, dtype=np.uint8 if dtype == BITS else np.dtype(dtype),
                              count=math.prod(stored_shape), offset=offset).reshape(stored_shape)
        if dtype == BITS:
            array = np.unpackbits(array, axis=1, count=shape[1])
            unpacked.add(name)
        arrays[name] = array
        end = offset + nbytes
    if set(arrays) != wanted:
        raise CorruptInstance(f"instance arrays {sorted(arrays)} are not {sorted(wanted)}")
    if end != len(body):
        raise CorruptInstance(f"instance body is {len(body)} B, its arrays cover {end} B")
    return arrays, unpacked


def _check_descriptor(name: str, dtype: str, shape: tuple, want: tuple, width: int) -> None:
    if dtype not in _ALLOWED_DTYPES[name]:
        raise CorruptInstance(f"array {name!r} has dtype {dtype!r}; allowed: {sorted(_ALLOWED_DTYPES[name])}")
    if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
        raise CorruptInstance(f"array {name!r} has shape {shape}, expected {want}")
    if name == "likelihood_by_outcome" and shape[1] < width:
        raise CorruptInstance(f"likelihood has {shape[1]} outcome columns, fewer than {width}")
    if not all(isinstance(s, int) and s >= 0 for s in shape):
        raise CorruptInstance(f"array {name!r} has shape {shape}")


def _check_indices(arrays: dict[str, np.ndarray], unpacked: set[str], arity: np.ndarray, n_classes: int) -> None:
    """Every index array points inside what it indexes; the acceptance matrix is 0/1, no row empty."""
    class_index = arrays["class_index"]
    if class_index.size and (class_index.min() < 0 or class_index.max() >= n_classes):
        raise CorruptInstance("class_index points outside class_labels")
    if "outcomes" in arrays and arrays["outcomes"].size:
        outcomes = arrays["outcomes"]
        # Bits are 0 or 1: only a test with fewer than two labels can be pointed past its end,
        # so a cold worker does not read 10⁷ unpacked cells again to find nothing.
        tests = np.flatnonzero(arity < 2) if "outcomes" in unpacked else slice(None)
        if (outcomes[:, tests].max(axis=0, initial=0) >= arity[tests]).any():  # column maxima: no widened copy
            raise CorruptInstance("an outcome index points outside its test's outcome labels")
    acceptable = arrays.get("acceptable")
    if acceptable is not None and ((acceptable > 1).any() or not acceptable.any(axis=1).all()):
        raise CorruptInstance("the acceptance matrix must be 0/1 with a 1 in every row")


def _instance(fields: _Header, arrays: dict[str, np.ndarray]) -> CompiledInstance:
    """The instance of checked ``fields`` and ``arrays``, its optional parts checked first."""
    n, n_tests = len(fields.hypothesis_ids), len(fields.test_ids)
    if (not isinstance(fields.repeatable, list)
            or not all(type(t) is int and 0 <= t < n_tests for t in fields.repeatable)):
        raise CorruptInstance("instance header's repeatable tests are not test indices")
    if fields.skip_cost not in ("free", "charged"):
        raise CorruptInstance(f"unknown skip_cost {fields.skip_cost!r}")
    theta, exposure = (_numbers(given, size, name) for given, size, name in (
        (fields.theta, n, "theta"), (fields.exposure_parameters, n_tests, "exposure_parameters")))
    repeatable = None
    if fields.repeatable:
        repeatable = np.zeros(n_tests, dtype=bool)
        repeatable[fields.repeatable] = True
    acceptable = arrays.get("acceptable")
    return CompiledInstance(
        test_ids=fields.test_ids,
        outcome_labels=fields.outcome_labels,
        costs=arrays["costs"],
        hypothesis_ids=fields.hypothesis_ids,
        class_labels=fields.class_labels,
        class_index=arrays["class_index"].astype(np.intp, copy=False),
        prior=arrays["prior"],
        outcomes=arrays.get("outcomes"),
        likelihood=None if "likelihood_by_outcome" not in arrays
        else arrays["likelihood_by_outcome"].transpose(0, 2, 1),
        warnings=fields.warnings,
        decision_labels=fields.decision_labels,
        acceptable=None if acceptable is None else acceptable.astype(bool),
        loss=arrays.get("loss"),
        repeatable=repeatable,
        skip_charged=fields.skip_cost == "charged",
        test_text=fields.test_text,
        outcome_text=fields.outcome_text,
        theta=theta,
        exposure_parameters=exposure,
        enemies=_enemies(fields.enemies, n_tests),
        **_content(fields.content_area, fields.content_balance, n_tests),
    )


def _content(area, balance, n_tests: int) -> dict:
    """An item bank's content balancing: each test's area index, each area's (share, least, most)."""
    if area is None and balance is None:
        return {}
    if (not isinstance(balance, list) or not all(isinstance(row, list) and len(row) == 3
                                                 and all(type(x) is float for x in row) for row in balance)
            or not isinstance(area, list) or len(area) != n_tests
            or not all(type(a) is int and 0 <= a < len(balance) for a in area)):
        raise CorruptInstance("instance header's content balancing is not an area per test and 3 numbers per area")
    arrays = {"content_area": np.array(area, dtype=np.intp), "content_balance": np.array(balance).reshape(-1, 3)}
    for array in arrays.values():
        array.setflags(write=False)
    return arrays


def _enemies(given, n_tests: int) -> np.ndarray | None:
    """An item bank's enemy pairs: [[i, j], …] of distinct test indices, as a read-only array."""
    if given is None:
        return None
    if not isinstance(given, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(type(t) is int and 0 <= t < n_tests for t in p) and p[0] != p[1]
            for p in given):
        raise CorruptInstance("instance header's enemies are not pairs of test indices")
    pairs = np.array(given, dtype=np.intp).reshape(-1, 2)
    pairs.setflags(write=False)
    return pairs


def _numbers(given, size: int, name: str) -> np.ndarray | None:
    """An optional header list of ``size`` floats as a read-only array."""
    if given is None:
        return None
    if not isinstance(given, list) or len(given) != size or not all(type(x) is float for x in given):
        raise CorruptInstance(f"instance header's {name} is not {size} numbers")
    array = np.array(given)
    array.setflags(write=False)
    return array


def _display_text(header: dict, outcome_labels: tuple[tuple[str, ...], ...]):
    """The header's display text (absent: None, None), each list as long as what it names."""
    if "test_text" not in header:
        return None, None
    tests, outcomes = header["test_text"], header["outcome_text"]
    texts = (str, type(None))
    if (not isinstance(tests, list) or len(tests) != len(outcome_labels) or not set(map(type, tests)) <= set(texts)
            or not isinstance(outcomes, list) or len(outcomes) != len(outcome_labels)
            or not all(isinstance(o, list) and len(o) == len(labels) and set(map(type, o)) <= set(texts)
                       for o, labels in zip(outcomes, outcome_labels))):
        raise TypeError("display text does not match the tests and their outcomes")
    return tuple(tests), tuple(map(tuple, outcomes))


def _label_lists(value) -> tuple[tuple[str, ...], ...]:
    """A list of lists of labels (each test's outcomes), checked in C passes as :func:`_labels`."""
    if not isinstance(value, list) or not set(map(type, value)) <= {list}:
        raise TypeError("expected a list of lists of strings")
    if not set(map(type, itertools.chain.from_iterable(value))) <= {str}:
        raise TypeError("expected a list of lists of strings")
    # Equal lists share one tuple (a binary instance's 10³ tests all have ("0", "1")): the
    # tuples made for the others are freed at once, and never count towards a collection.
    shared: dict[tuple[str, ...], tuple[str, ...]] = {}
    return tuple(shared.setdefault(labels, labels) for labels in map(tuple, value))


def _labels(value) -> tuple[str, ...]:
    # The types of 10⁴ hypothesis ids in one C pass (map), not a Python frame per label.
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:
        raise TypeError("expected a list of strings")
    return tuple(value)
