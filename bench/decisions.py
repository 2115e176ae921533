"""Decision-region benchmark: median time of one selection step of ``hec`` and ``direct``.

    python3 bench/decisions.py                 # n = 10⁴, N = 10³, D = 5: the table in docs/decisions.md
    python3 bench/decisions.py --n 2000 --tests 200 --repeats 3

A step is ``engine.next_step(inst, [], policy)`` with every hypothesis alive: the decided check,
the power sums over the decision sets (service/engine/regions.py) and the gains of all N tests.
Each hypothesis accepts 1 to 3 of the D decisions, drawn at random (so up to 2^D − 1 acceptance
patterns, k = 4); answers and the prior are random. The instance is built as arrays directly
(the wire form is not what is measured). ``ec2`` on the section 4 reduction (D classes) runs
beside them for scale. The machine is shared: every number is a median over repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import engine  # noqa: E402


def make_instance(n: int, n_tests: int, n_decisions: int, arity: int, kind: str,
                  seed: int = 0) -> engine.CompiledInstance:
    rng = np.random.default_rng(seed)
    acceptable = np.zeros((n, n_decisions), dtype=bool)
    for i, size in enumerate(rng.integers(1, 4, size=n)):
        acceptable[i, rng.choice(n_decisions, size=min(int(size), n_decisions), replace=False)] = True
    first = acceptable.argmax(axis=1)
    _, pattern = np.unique(acceptable, axis=0, return_inverse=True)
    order = np.lexsort((pattern.reshape(-1), first))  # by class, then acceptance row, as compiled
    acceptable, first = acceptable[order], first[order]
    prior = rng.random(n) + 0.05
    common = dict(
        test_ids=tuple(f"t{j}" for j in range(n_tests)),
        outcome_labels=tuple(tuple(str(k) for k in range(arity)) for _ in range(n_tests)),
        costs=rng.choice([1.0, 2.0, 3.0], size=n_tests),
        hypothesis_ids=tuple(f"h{i}" for i in range(n)),
        class_labels=tuple(f"d{j}" for j in range(n_decisions)),
        class_index=first.astype(np.intp),
        prior=prior / prior.sum(),
        decision_labels=tuple(f"d{j}" for j in range(n_decisions)),
        acceptable=acceptable,
    )
    if kind == "deterministic":
        return engine.CompiledInstance(**common, outcomes=rng.integers(0, arity, size=(n, n_tests), dtype=np.uint8))
    by_outcome = rng.random((n, arity, n_tests)) + 0.05
    by_outcome /= by_outcome.sum(axis=1, keepdims=True)
    return engine.CompiledInstance(**common, likelihood=by_outcome.transpose(0, 2, 1))


def median_ms(inst: engine.CompiledInstance, policies: list[str], repeats: int) -> list[float]:
    """Median ms of one step per policy; the policies take turns, so a burst of load on the
    shared machine falls on all of them alike."""
    for policy in policies:
        engine.next_step(inst, [], policy)  # warm the caches (patterns, decision sets)
    times: dict[str, list[float]] = {policy: [] for policy in policies}
    for _ in range(repeats):
        for policy in policies:
            started = time.perf_counter()
            engine.next_step(inst, [], policy)
            times[policy].append((time.perf_counter() - started) * 1e3)
    return [statistics.median(times[policy]) for policy in policies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--tests", type=int, default=1_000)
    parser.add_argument("--decisions", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"n = {args.n}, N = {args.tests}, D = {args.decisions}; median of {args.repeats} steps (ms)")
    print("| kind | ℓ | patterns | decision sets | k | hec | direct | ec2 / effecxtive on the reduction |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, arity in (("deterministic", 2), ("deterministic", 4), ("likelihood", 2)):
        inst = make_instance(args.n, args.tests, args.decisions, arity, kind)
        patterns = len(inst.acceptance_patterns[0])
        sets = len(inst.decision_intersections[0])
        policies = ["hec", "direct", "ec2" if kind == "deterministic" else "effecxtive"]
        cells = [f"{ms:.1f}" for ms in median_ms(inst, policies, args.repeats)]
        print(f"| {kind} | {arity} | {patterns} | {sets} | {inst.hyperedge_order} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
