"""SessionRecord ⇄ JSON bytes, as the Redis store keeps a session's ``record`` field. Decoding
trusts nothing it reads: every field present with its JSON type, observations as
``[test, outcome]`` pairs (outcome null for a skip), so a damaged record is refused as
:class:`~.base.CorruptRecord` here rather than failing somewhere in a step. Never pickle."""

from __future__ import annotations

import orjson

from .base import CorruptRecord, SessionRecord

_RECORD_FIELDS = ("session_id", "instance_id", "policy", "max_tests", "max_cost", "confidence", "seed",
                  "observations", "version", "created_at", "tenant", "max_expected_loss", "exclude_tests",
                  "batch_size", "max_se", "randomesque", "sympson_hetter", "progressive", "max_rate", "held_back", "reserved")
# Written only when set, so records without them encode as they always did.
_SPARSE_FIELDS = {"max_se", "randomesque", "sympson_hetter", "progressive", "max_rate", "held_back", "reserved"}


def encode_record(record: SessionRecord) -> bytes:
    # expires_at is not stored: the key's TTL is the truth, and leaving it out keeps a retried
    # create byte-identical to the first.
    fields = {name: getattr(record, name) for name in _RECORD_FIELDS
              if name not in _SPARSE_FIELDS or getattr(record, name) not in (None, ())}
    return orjson.dumps(fields)


_TEXT, _COUNT, _NUMBER = (str,), (int,), (int, float)
# Field → the JSON types it may have (bool is an int in Python: refused separately).
_RECORD_TYPES = {"session_id": _TEXT, "instance_id": _TEXT, "policy": _TEXT, "max_tests": _COUNT,
                 "max_cost": _NUMBER, "confidence": _NUMBER, "seed": _COUNT, "observations": (list,),
                 "version": _COUNT, "created_at": _NUMBER, "tenant": _TEXT, "max_expected_loss": _NUMBER,
                 "exclude_tests": (list,), "batch_size": _COUNT, "max_se": _NUMBER,
                 "randomesque": _COUNT, "sympson_hetter": (bool,), "progressive": (bool,),
                 "max_rate": _NUMBER, "held_back": (list,), "reserved": (list,)}
# May be null, or absent from records written before the field existed.
_OPTIONAL_FIELDS = {"max_tests", "max_cost", "confidence", "max_expected_loss", "max_se", "randomesque",
                    "sympson_hetter", "progressive", "max_rate"}
# Absent from records written before the field existed: read as these.
_FIELD_DEFAULTS = {"exclude_tests": [], "batch_size": 1, "held_back": [], "reserved": []}


def decode_record(raw: bytes, expires_at: float) -> SessionRecord:
    """The record, or :class:`CorruptRecord`: every field present with its type, so a damaged
    record is refused here rather than failing somewhere in the step."""
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise CorruptRecord(f"session record is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise CorruptRecord("session record is not a JSON object")
    decoded = {}
    for name in _RECORD_FIELDS:
        value = fields.get(name, _FIELD_DEFAULTS.get(name))
        if value is None and name in _OPTIONAL_FIELDS:
            decoded[name] = None
            continue
        if (isinstance(value, bool) and bool not in _RECORD_TYPES[name]) or not isinstance(value, _RECORD_TYPES[name]):
            raise CorruptRecord(f"session record field {name!r} is missing or mistyped")
        decoded[name] = value
    observations = decoded["observations"]
    # The outcome of a skipped test is null.
    if not all(isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) and (o[1] is None or isinstance(o[1], str))
               for o in observations):
        raise CorruptRecord("session record observations are not [test, outcome] pairs")
    if decoded["version"] < 1:
        raise CorruptRecord("session record version is below 1")
    labels = decoded["exclude_tests"] + decoded["held_back"] + decoded["reserved"]
    if not all(isinstance(t, str) for t in labels) or decoded["batch_size"] < 1:
        raise CorruptRecord("session record exclude_tests / held_back / reserved / batch_size are mistyped")
    decoded["observations"] = tuple((t, o) for t, o in observations)
    decoded["exclude_tests"] = tuple(decoded["exclude_tests"])
    decoded["held_back"] = tuple(decoded["held_back"])
    decoded["reserved"] = tuple(decoded["reserved"])
    return SessionRecord(**decoded, expires_at=expires_at)
