"""The binary instance body: ``multipart/form-data`` (RFC 7578) whose ``instance`` part is the
instance as JSON without its big array, and whose ``matrix`` or ``likelihood_matrix`` part is
that array as a ``.npy`` file (NumPy's own format: a short header giving dtype, shape and order,
then the raw bytes). docs/instances.md says when to use it.

The framing is werkzeug's multipart decoder; the ``.npy`` header is read by numpy's
``numpy.lib.format`` (a Python literal, never a pickle), its size checked against the bytes that
follow before anything is allocated, and the array is a read-only view of the part's bytes.
"""

from __future__ import annotations

import io
import math

import numpy as np
from numpy.lib import format as npy
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from .errors import BodyTooLarge, RequestValidationFailed, UnreadableBody

INSTANCE_PART = "instance"
# Parts a body may have: the instance and one array. More would only be refused one by one.
MAX_PARTS = 8
FEED_BYTES = 1 << 16


def split_parts(raw: bytes, boundary: str) -> dict[str, bytes]:
    """Each part's bytes by its name; 400 when the framing is broken or a name repeats."""
    decoder = MultipartDecoder(boundary.encode("latin-1"), max_parts=MAX_PARTS)
    parts: dict[str, bytes] = {}
    name, chunks = "", []
    body = memoryview(raw)
    try:
        # Fed a piece at a time, as werkzeug's own parser feeds it: the decoder looks for the
        # boundary with a plain find and runs its (byte-at-a-time) regular expression only on a
        # piece that holds one; given the whole body it would run it over megabytes.
        for start in range(0, len(raw) + FEED_BYTES, FEED_BYTES):
            decoder.receive_data(body[start:start + FEED_BYTES] if start < len(raw) else None)
            while not isinstance(event := decoder.next_event(), NeedData | Epilogue):
                if isinstance(event, Field | File):
                    name, chunks = event.name, []
                elif isinstance(event, Data):
                    chunks.append(event.data)
                    if not event.more_data:
                        if name in parts:
                            raise UnreadableBody(f"the multipart body has two parts named {name!r}")
                        parts[name] = b"".join(chunks)
            if isinstance(event, Epilogue):
                return parts
    except RequestEntityTooLarge:
        raise BodyTooLarge(f"a multipart instance body has at most {MAX_PARTS} parts") from None
    except ValueError as error:  # the decoder's word for malformed framing
        raise UnreadableBody(f"the multipart body cannot be read: {error}") from None
    raise UnreadableBody("the multipart body ends before its closing boundary")


def instance_parts(raw: bytes, boundary: str, array_fields: tuple[str, ...]) -> tuple[bytes, dict[str, np.ndarray]]:
    """The ``instance`` part's JSON, and each array part read from its ``.npy`` bytes."""
    parts = split_parts(raw, boundary)
    unknown = [name for name in parts if name != INSTANCE_PART and name not in array_fields]
    if unknown or INSTANCE_PART not in parts:
        expected = ", ".join(repr(name) for name in (INSTANCE_PART, *array_fields))
        problems = [{"path": name, "message": f"not a part of an instance body (parts: {expected})"}
                    for name in unknown]
        if INSTANCE_PART not in parts:
            problems.append({"path": INSTANCE_PART, "message": "the instance as JSON is missing"})
        raise RequestValidationFailed(f"the request body has {len(problems)} problem(s)", problems)
    return parts.pop(INSTANCE_PART), {name: read_npy(data, name) for name, data in parts.items()}


def read_npy(data: bytes, name: str) -> np.ndarray:
    """A ``.npy`` file's array, viewing ``data``; 422 at ``name`` when it is not one."""
    stream = io.BytesIO(data)  # shares the bytes object's buffer
    try:
        version = npy.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = npy.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy.read_array_header_2_0(stream)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} (1.0 or 2.0 are read)")
    except ValueError as error:
        raise _not_npy(name, str(error)) from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise _not_npy(name, f"dtype {dtype} is not a plain number type")
    count = math.prod(shape)
    offset = stream.tell()
    if len(data) - offset != count * dtype.itemsize:
        raise _not_npy(name, f"{len(data) - offset} bytes of data cannot hold shape {list(shape)} of {dtype} "
                             f"({count * dtype.itemsize} bytes)")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(
        shape, order="F" if fortran_order else "C")


def _not_npy(name: str, why: str) -> RequestValidationFailed:
    return RequestValidationFailed("the request body has 1 problem(s)",
                                   [{"path": name, "message": f"not a .npy array: {why}"}])
