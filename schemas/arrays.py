"""The columnar instance's big arrays — ``matrix`` (n×N outcome indices) and
``likelihood_matrix`` (n×N×ℓ probabilities) — as numpy arrays, from any of their forms:

* nested JSON lists (pydantic has checked each cell's type, in Rust);
* the compact form, ``{"encoding": "base64", "dtype": "uint8", "shape": [n, N], "data": "..."}``:
  the base64 of the array's little-endian, C-order bytes, decoded straight into a numpy array
  (docs/instances.md);
* a numpy array, as a Python caller builds one or as the binary body's ``.npy`` part carries it
  (service/api/multipart.py): never from a JSON document.

Either way the rules are checked on the whole array at once (ranges, finiteness, rows summing to
1) — never a Python loop over cells — and each problem still names its cell, e.g.
``matrix[2][1]``. Only a ragged nested list is walked, row by row, to say which row is short.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Literal

import numpy as np
import pybase64
from pydantic import BaseModel, ConfigDict, Field, StrictInt

# Wire dtype → numpy dtype, little-endian whatever the host.
DTYPES = {"uint8": np.dtype("<u1"), "uint16": np.dtype("<u2"), "int32": np.dtype("<i4"),
          "float32": np.dtype("<f4"), "float64": np.dtype("<f8")}
WIRE_DTYPES = {dtype.str: wire for wire, dtype in DTYPES.items()}
# Cells of the first problems reported; the rest would only make a megabyte of errors.
MAX_REPORTED = 50

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]


class EncodedArray(BaseModel):
    """An array as the base64 of its little-endian C-order bytes: 4/3 of the raw size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    encoding: Literal["base64"]
    dtype: Literal["uint8", "uint16", "int32", "float32", "float64"]
    shape: list[StrictInt] = Field(min_length=1, max_length=3)
    data: str


class ArrayProblems(ValueError):
    """The wire array is malformed; ``problems`` are (location, message) pairs."""

    def __init__(self, problems: list[Problem]):
        super().__init__(problems[0][1])
        self.problems = problems


def to_array(value: list | EncodedArray | np.ndarray, name: str, ndim: int, kind: Literal["int", "float"],
             n_columns: int) -> np.ndarray:
    """The array ``value`` stands for: ``ndim`` dimensions, rows of ``n_columns`` (one per test),
    else :class:`ArrayProblems`. Nested lists become int64 / float64; the compact form and a numpy
    array keep their dtype (the compact form as a read-only view of the decoded bytes)."""
    if isinstance(value, EncodedArray):
        return _decode(value, name, ndim, kind, n_columns)
    if isinstance(value, np.ndarray):
        wire = WIRE_DTYPES.get(value.dtype.newbyteorder("<").str)
        if wire is None:
            raise ArrayProblems([((name, "dtype"), f"dtype {value.dtype} is not one of {sorted(DTYPES)}")])
        _check_form(name, ndim, kind, n_columns, wire, value.shape)
        return value.astype(DTYPES[wire], copy=False)  # a copy only when it came big-endian
    if not value:
        raise ArrayProblems([((name,), "at least one hypothesis (row) is required")])
    dtype = np.int64 if kind == "int" else np.float64
    try:
        array = np.array(value, dtype=dtype)
    except (ValueError, TypeError):  # ragged (a mixed type cannot pass the wire model)
        raise ArrayProblems(_ragged(value, name, ndim, n_columns)) from None
    except OverflowError:  # an integer beyond 64 bits: no test has that many outcomes
        raise ArrayProblems([((name,), "an outcome index is beyond 64 bits")]) from None
    if array.ndim != ndim or array.shape[1] != n_columns:
        raise ArrayProblems(_ragged(value, name, ndim, n_columns))
    return array


def _check_form(name: str, ndim: int, kind: str, n_columns: int, wire_dtype: str, shape: tuple[int, ...]) -> None:
    """The rules on a sized array's dtype and shape, whether it came compact or as numpy."""
    if len(shape) != ndim or any(s < 1 for s in shape):
        raise ArrayProblems([((name, "shape"), f"shape must be {ndim} positive lengths, got {list(shape)}")])
    if shape[1] != n_columns:
        raise ArrayProblems([((name, "shape"), f"shape {list(shape)} has {shape[1]} columns, expected one per "
                              f"test ({n_columns})")])
    if kind == "int" and DTYPES[wire_dtype].kind == "f":
        raise ArrayProblems([((name, "dtype"), f"outcome indices need an integer dtype, not {wire_dtype}")])


def _decode(value: EncodedArray, name: str, ndim: int, kind: str, n_columns: int) -> np.ndarray:
    dtype = DTYPES[value.dtype]
    shape = tuple(value.shape)
    _check_form(name, ndim, kind, n_columns, value.dtype, shape)
    expected = math.prod(shape) * dtype.itemsize
    # Base64 carries 3 bytes per 4 characters: compare lengths before decoding anything.
    if len(value.data) != 4 * math.ceil(expected / 3):
        raise ArrayProblems([((name, "data"), f"{len(value.data)} base64 characters cannot hold shape "
                              f"{list(shape)} of {value.dtype} ({expected} bytes, "
                              f"{4 * math.ceil(expected / 3)} characters)")])
    try:
        # Strict: only the alphabet and final padding, decoded with SIMD (~20× binascii here).
        raw = pybase64.b64decode(value.data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ArrayProblems([((name, "data"), f"not valid base64: {error}")]) from None
    if len(raw) != expected:
        raise ArrayProblems([((name, "data"), f"decodes to {len(raw)} bytes, expected {expected}")])
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _ragged(rows: list, name: str, ndim: int, n_columns: int) -> list[Problem]:
    """Where nested lists stop being rectangular (a loop over rows, never over cells)."""
    problems = [((name, i), f"row has {len(row)} entries, expected one per test ({n_columns})")
                for i, row in enumerate(rows) if len(row) != n_columns][:MAX_REPORTED]
    if problems or ndim < 3:
        return problems or [((name,), "rows must be lists of the same length")]
    depth = len(rows[0][0]) if n_columns else 0
    for i, row in enumerate(rows):
        widths = np.fromiter(map(len, row), dtype=np.int64, count=len(row))
        for j in np.flatnonzero(widths != depth)[:MAX_REPORTED - len(problems)]:
            problems.append(((name, i, int(j)), f"has {widths[j]} outcome probabilities, expected {depth}"))
        if len(problems) >= MAX_REPORTED:
            break
    return problems or [((name,), "cells must be lists of the same length")]


def outcome_index_problems(matrix: np.ndarray, outcome_counts: np.ndarray, test_ids: list[str]) -> list[Problem]:
    """Cells outside 0..ℓ_t−1 (``outcome_counts[t]`` = ℓ_t, or −1 when the test lists none)."""
    limits = np.where(outcome_counts >= 0, outcome_counts, np.iinfo(np.int64).max)
    # Column minima and maxima first (in the array's own dtype, no widened copy); cells are
    # located only in the columns that hold a bad one.
    bad_columns = np.flatnonzero((matrix.min(axis=0) < 0) | (matrix.max(axis=0) >= limits))
    if not bad_columns.size:
        return []
    columns = matrix[:, bad_columns].astype(np.int64)
    bad = np.argwhere((columns < 0) | (columns >= limits[bad_columns][None, :]))[:MAX_REPORTED]
    problems = []
    for i, c in bad.tolist():
        j = int(bad_columns[c])
        size = int(outcome_counts[j])
        bound = f"0..{size - 1}" if size >= 0 else ">= 0"
        problems.append((("matrix", i, j), f"outcome index {matrix[i, j]} out of range {bound} for test '{test_ids[j]}'"))
    return problems


def likelihood_problems(likelihood: np.ndarray, outcome_counts: np.ndarray, test_ids: list[str],
                        tolerance: float) -> list[Problem]:
    """Probabilities that are negative or not finite; mass on outcomes a test does not have;
    rows P(· | h, t) not summing to 1 within ``tolerance``."""
    name = "likelihood_matrix"
    problems: list[Problem] = []
    invalid = ~np.isfinite(likelihood) | (likelihood < 0)
    for i, j, k in np.argwhere(invalid)[:MAX_REPORTED].tolist():
        problems.append(((name, i, j, k), "a likelihood must be a finite number >= 0"))
    width = likelihood.shape[2]
    counts = np.where(outcome_counts >= 0, outcome_counts, width)
    beyond = (np.arange(width)[None, :] >= counts[:, None])  # (N, ℓ): outcomes a test lacks
    stray = ((likelihood != 0) & beyond[None]).any(axis=2)
    for i, j in np.argwhere(stray)[:MAX_REPORTED].tolist():
        problems.append(((name, i, j), f"test '{test_ids[j]}' has only {counts[j]} outcomes; the rest must be 0"))
    with np.errstate(invalid="ignore", over="ignore"):
        sums = likelihood.sum(axis=2, dtype=np.float64)
    off = (np.abs(sums - 1.0) > tolerance) & ~invalid.any(axis=2)
    for i, j in np.argwhere(off)[:MAX_REPORTED].tolist():
        problems.append(((name, i, j), f"likelihoods sum to {sums[i, j]:.9g}, not 1"))
    return problems[:MAX_REPORTED]


def encode(array: Any) -> dict[str, Any]:
    """The compact wire form of ``array`` (for clients, tests and benchmarks)."""
    array = np.asarray(array)
    canonical = array.astype(array.dtype.newbyteorder("<"), copy=False)
    if canonical.dtype.str not in WIRE_DTYPES:
        raise ValueError(f"dtype {array.dtype} has no compact form; use one of {sorted(DTYPES)}")
    return {"encoding": "base64", "dtype": WIRE_DTYPES[canonical.dtype.str], "shape": list(array.shape),
            "data": base64.b64encode(np.ascontiguousarray(canonical).tobytes()).decode("ascii")}
