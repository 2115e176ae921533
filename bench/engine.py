"""Engine benchmark: median time of one selection step, against a floor, with peak memory.

    python3 bench/engine.py            # the table in docs/engine.md
    python3 bench/engine.py --quick    # the small sizes only
    python3 bench/engine.py --all      # also effecxtive at (1e5, 1e3, 4-ary): 3.2 GB of likelihoods

A step is ``engine.next_step(inst, [], policy)`` with every hypothesis alive: the belief, the
statistics of the masses α(class, test, outcome) the policy reads (Belief.outcome_stats) and the
gains of all N tests, then the choice. Instances have 20 classes, or at (1e4, 1e3) also C = n
(every hypothesis its own class, the wire form's default), a random prior and random answers;
they are built as arrays directly (as ``compile_instance`` lays them out: rows grouped by class,
likelihoods outcome-major), because the wire form of 10⁸ cells is not what is being measured.

The floor is one vectorised pass over the same cells, ``(X == k).sum(0)`` for every outcome k
(deterministic) or one ``sum(0)`` over the likelihood tensor: no step can read its input in less.
The machine is shared: every number is a median over repeats, and the whole run is worth doing
twice before quoting.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import engine  # noqa: E402

N_CLASSES = 20
SIZES = [(1_000, 100), (10_000, 1_000), (100_000, 1_000)]
SINGLETON_SIZES = [(10_000, 1_000)]  # also run with C = n classes
GOALS = {  # (policy, n, N, ℓ, classes) -> milliseconds (issue 2; C = n: every hypothesis its class)
    ("ec2", 10_000, 1_000, 2, N_CLASSES): 5.0,
    ("ec2", 10_000, 1_000, 4, N_CLASSES): 30.0,
    ("ec2", 10_000, 1_000, 2, "n"): 30.0,
    ("ec2", 10_000, 1_000, 4, "n"): 30.0,
    ("ec2", 100_000, 1_000, 2, N_CLASSES): 60.0,
    ("ec2", 100_000, 1_000, 4, N_CLASSES): 60.0,
    ("effecxtive", 10_000, 1_000, 2, N_CLASSES): 30.0,
    ("effecxtive", 10_000, 1_000, 4, N_CLASSES): 30.0,
    ("effecxtive", 10_000, 1_000, 2, "n"): 30.0,
    ("effecxtive", 10_000, 1_000, 4, "n"): 30.0,
}


def make_instance(n: int, n_tests: int, arity: int, kind: str, seed: int = 0,
                  n_classes: int = N_CLASSES) -> engine.CompiledInstance:
    """Random answers and prior; ``n_classes = n`` gives every hypothesis its own class."""
    rng = np.random.default_rng(seed)
    if n_classes == n:
        class_index = np.arange(n, dtype=np.intp)
    else:
        class_index = np.sort(rng.integers(0, n_classes, size=n)).astype(np.intp)
    prior = rng.random(n) + 0.05
    prior /= prior.sum()
    common = dict(
        test_ids=tuple(f"t{j}" for j in range(n_tests)),
        outcome_labels=tuple(tuple(str(k) for k in range(arity)) for _ in range(n_tests)),
        costs=rng.choice([1.0, 2.0, 3.0], size=n_tests),
        hypothesis_ids=tuple(f"h{i}" for i in range(n)),
        class_labels=tuple(f"c{i}" for i in range(n_classes)),
        class_index=class_index,
        prior=prior,
    )
    if kind == "deterministic":
        return engine.CompiledInstance(**common, outcomes=rng.integers(0, arity, size=(n, n_tests), dtype=np.uint8))
    by_outcome = np.empty((n, arity, n_tests))
    for start in range(0, n, 4096):  # in blocks: no second full-size temporary
        block = rng.random((min(4096, n - start), arity, n_tests)) + 0.05
        by_outcome[start:start + len(block)] = block / block.sum(axis=1, keepdims=True)
    return engine.CompiledInstance(**common, likelihood=by_outcome.transpose(0, 2, 1))


def median_ms(fn, repeats: int) -> float:
    fn()  # warm: first-touch page faults and cached properties are not a step's cost
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def floor_pass(inst: engine.CompiledInstance):
    if inst.outcomes is not None:
        cells = inst.outcomes
        return lambda: [(cells == k).sum(0) for k in range(inst.max_outcomes)]
    tensor = inst.likelihood_by_outcome
    return lambda: tensor.sum(0)


def step_peak_mb(inst: engine.CompiledInstance, policy: str) -> float:
    tracemalloc.start()
    engine.next_step(inst, [], policy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def reference_speedup(repeats: int) -> tuple[float, float, int]:
    """EC² on (500, 50): the naive edge-list reference (tests/reference.py) against the engine.
    The reference is timed on a few tests and scaled to all 50 (it is linear in the tests)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import reference as ref

    inst = make_instance(500, 50, 2, "deterministic", seed=1)
    model = ref.Model(
        arity=[2] * 50, costs=list(map(float, inst.costs)),
        classes=[inst.class_labels[c] for c in inst.class_index], prior=list(map(float, inst.prior)),
        outcomes=inst.outcomes.astype(int).tolist(),
    )
    sampled = 3
    start = time.perf_counter()
    for t in range(sampled):
        ref.ec2_gain(model, [], t)
    reference_ms = 1e3 * (time.perf_counter() - start) * 50 / sampled
    engine_ms = median_ms(lambda: engine.next_step(inst, [], "ec2"), repeats)
    return reference_ms, engine_ms, sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two small sizes only")
    parser.add_argument("--all", action="store_true", help="also the 3.2 GB 4-ary likelihood instance")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    sizes = SIZES[:2] if args.quick else SIZES
    rows = []
    print(f"{'policy':<11} {'form':<13} {'n':>7} {'N':>5} {'ℓ':>2} {'C':>6} {'step ms':>8} {'floor ms':>9} "
          f"{'×floor':>7} {'goal ms':>8} {'step peak MB':>13} {'instance MB':>12}")
    for policy, kind in (("ec2", "deterministic"), ("effecxtive", "likelihood")):
        for n, n_tests in sizes:
            for arity in (2, 4):
                for classes in (N_CLASSES, "n") if (n, n_tests) in SINGLETON_SIZES else (N_CLASSES,):
                    if kind == "likelihood" and n >= 100_000 and arity == 4 and not args.all:
                        continue
                    inst = make_instance(n, n_tests, arity, kind, n_classes=n if classes == "n" else classes)
                    repeats = args.repeats if n * n_tests <= 10**7 else max(5, args.repeats // 3)
                    step = median_ms(lambda: engine.next_step(inst, [], policy), repeats)
                    floor = median_ms(floor_pass(inst), repeats)
                    peak = step_peak_mb(inst, policy)
                    goal = GOALS.get((policy, n, n_tests, arity, classes))
                    goal_text = "" if goal is None else f"{goal:.0f}{' ok' if step <= goal else ' MISS'}"
                    rows.append((policy, kind, n, n_tests, arity, classes, step, floor))
                    print(f"{policy:<11} {kind:<13} {n:>7} {n_tests:>5} {arity:>2} {classes:>6} {step:>8.2f} "
                          f"{floor:>9.2f} {step / floor:>7.2f} {goal_text:>8} {peak:>13.1f} "
                          f"{inst.nbytes / 2**20:>12.1f}", flush=True)
                    del inst

    reference_ms, engine_ms, sampled = reference_speedup(args.repeats)
    print(f"\nEC² on (500, 50), binary: naive reference {reference_ms:.0f} ms per step "
          f"(timed on {sampled} tests, scaled to 50), engine {engine_ms:.2f} ms: "
          f"speed-up ×{reference_ms / engine_ms:,.0f}")
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MB")
    print("goal for EC² at (1e4, 1e3, binary): within 3× of the floor -> "
          + next(f"{s / f:.2f}×" for p, k, n, N, a, c, s, f in rows
                 if (p, n, N, a, c) == ("ec2", 10_000, 1_000, 2, N_CLASSES)))


if __name__ == "__main__":
    main()
