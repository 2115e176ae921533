"""Writes section 3's bad instance for GBS with n hypotheses (default 12) as wire JSON:
uniform prior, classes H1 = {h_1..h_(n-1)} and H2 = {h_n}, unit-cost tests t_1..t_n with
h_i(t) = 1 if i = t else 0.   python3 examples/gbs_bad/make.py 12 > examples/gbs_bad/instance.json"""

import json
import sys


def gbs_bad(n: int) -> dict:
    return {
        "tests": [{"id": f"t{t}", "cost": 1, "outcomes": ["0", "1"]} for t in range(1, n + 1)],
        "matrix": [[int(i == t) for t in range(1, n + 1)] for i in range(1, n + 1)],
        "classes": ["H1"] * (n - 1) + ["H2"],
        "hypothesis_ids": [f"h{i}" for i in range(1, n + 1)],
    }


if __name__ == "__main__":
    json.dump(gbs_bad(int(sys.argv[1]) if len(sys.argv) > 1 else 12), sys.stdout)
    sys.stdout.write("\n")
