"""The duplicate-key check's cost: ``python3 -m bench.duplicate_keys [--rounds 5] [--sizes 16,80]``.

For bodies of each size (MB), three kinds:

* **numbers**: a matrix of floats as nested JSON lists (valid);
* **u003a text**: strings holding a backslash and the text ``u003a`` (written ``\\\\u003a``, not an
  escaped colon; valid);
* **repeated key**: the numbers with one object deep inside repeating a key (refused as 422);
  and, as "floats made", the same check had its second parse made a float of each number (what
  ``parse_float=len`` spares: service/api/duplicate_keys.py cites this pair of rows).

Prints the median CPU time (``time.process_time``) of ``refuse_duplicate_keys`` (the check, given
the data orjson parsed) and of a bare ``orjson.loads`` of the same body, measured alternately in
the same run, and the ratio check / parse (each round's own ratio, median). The goal: a small
constant whatever the body holds.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.api import duplicate_keys  # noqa: E402
from service.api.duplicate_keys import refuse_duplicate_keys  # noqa: E402
from service.api.errors import RequestValidationFailed  # noqa: E402

MB = 1_000_000


def numbers(size: int) -> bytes:
    rows = max(1, size // 17_500)  # about 17.5 bytes a float, 1000 a row
    matrix = np.random.default_rng(0).random((rows, 1000)).round(15)
    return orjson.dumps({"matrix": matrix.tolist()})


def u003a_text(size: int) -> bytes:
    text = "C:\\u003a\\\\u003A folder %d"
    return orjson.dumps({"labels": [text % i for i in range(size // 33)]})


def repeated_key(size: int) -> bytes:
    body = numbers(size)
    deep = b'"meta": {"a": {"b": [{"k": 1}, {"k": 2, "j": 3, "k": 4}]}}'
    return body[:-1] + b", " + deep + b"}"


def check(raw: bytes, data: object) -> bool:
    try:
        refuse_duplicate_keys(raw, data)
    except RequestValidationFailed:
        return False
    return True


def floats_made(raw: bytes, data: object) -> bool:
    """The check as it would be with its second parse making floats (the count, then the parse)."""
    assert duplicate_keys._colons(raw) != orjson.dumps(data).count(b":")  # a repeat: the second parse runs
    return duplicate_keys._first_repeat(json.loads(raw, object_pairs_hook=duplicate_keys._keep_repeats)) is None


def cpu(call) -> float:
    gc.collect()
    start = time.process_time()
    call()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="16,80", help="body sizes in MB, comma-separated")
    args = parser.parse_args()
    print(f"{'body':<36} {'check s':>9} {'orjson.loads s':>15} {'check/parse':>12}  outcome")
    for size in (int(s) for s in args.sizes.split(",")):
        for name, make, checker in (("numbers", numbers, check), ("u003a text", u003a_text, check),
                                    ("repeated key", repeated_key, check),
                                    ("repeated key, floats made", repeated_key, floats_made)):
            raw = make(size * MB)
            data = orjson.loads(raw)
            checks, parses, ratios = [], [], []
            for _ in range(args.rounds):
                parses.append(cpu(lambda: orjson.loads(raw)))
                checks.append(cpu(lambda: checker(raw, data)))
                ratios.append(checks[-1] / parses[-1])
            outcome = "accepted" if checker(raw, data) else "refused"
            label = f"{name}, {len(raw) / MB:.0f} MB"
            print(f"{label:<36} {statistics.median(checks):9.3f} {statistics.median(parses):15.3f} "
                  f"{statistics.median(ratios):12.2f}  {outcome}", flush=True)


if __name__ == "__main__":
    main()
