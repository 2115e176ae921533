"""Writes the appendix's bad instance for information gain (and every posterior-based policy)
with parameter q (default 4) as wire JSON: 2^q classes H_a = {h_(a,0), h_(a,1)}, uniform prior,
unit-cost binary tests
  t0: X = v;   bit_k (1 <= k <= q): X = [k-th least significant bit of a = v];
  seq_k (1 <= k <= 2^q): X = [a = k];   dumb: X = 0 always (the paper has infinitely many).
    python3 examples/infogain_bad/make.py 4 > examples/infogain_bad/instance.json"""

import json
import sys


def infogain_bad(q: int) -> dict:
    classes = 2**q
    tests = (["t0"] + [f"bit{k}" for k in range(1, q + 1)]
             + [f"seq{k}" for k in range(1, classes + 1)] + ["dumb"])
    rows, labels, ids = [], [], []
    for a in range(1, classes + 1):
        for v in (0, 1):
            bits = [int(((a >> (k - 1)) & 1) == v) for k in range(1, q + 1)]
            rows.append([v, *bits, *(int(a == k) for k in range(1, classes + 1)), 0])
            labels.append(f"H{a}")
            ids.append(f"h{a},{v}")
    return {
        "tests": [{"id": t, "cost": 1, "outcomes": ["0", "1"]} for t in tests],
        "matrix": rows,
        "classes": labels,
        "hypothesis_ids": ids,
    }


if __name__ == "__main__":
    json.dump(infogain_bad(int(sys.argv[1]) if len(sys.argv) > 1 else 4), sys.stdout)
    sys.stdout.write("\n")
