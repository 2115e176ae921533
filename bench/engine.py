"""Engine benchmark: one selection step against the least work that could produce it, measured
side by side in paired rounds, single-threaded.

    python3 bench/engine.py            # the tables in docs/engine.md
    python3 bench/engine.py --quick    # fair floors, the bit planes' one-off cost, the late-session step
    python3 bench/engine.py --all      # also effecxtive at (1e5, 1e3, 4-ary): 3.2 GB of likelihoods
    python3 bench/engine.py --policies # every likelihood policy's step against effecxtive's

Everything runs on one thread: BLAS is limited to one thread (``OPENBLAS_NUM_THREADS`` and
friends, set here before numpy loads) and the engine's own two-thread split of big batches is
switched off, except in the table that reports the split against one thread.

A step is ``engine.next_step(inst, observations, policy)``: the belief, the statistics of the masses
α(class, test, outcome) the policy reads (Belief.outcome_stats), the gains of all N tests, the
choice. Instances are random (answers, prior) and built as arrays directly, laid out as
``compile_instance`` lays them out (rows grouped by class, likelihoods outcome-major): the wire
form of 10⁸ cells is not what is being measured.

Fair floors (no step can do less with the same data):

* EC², every hypothesis its own class (C = n): ``X.sum(0)``, one plain pass over the answers;
* EffECXtive, C = n: the two GEMVs ``w @ L`` and ``w² @ L²`` (L² computed beforehand, so the
  floor does not pay for the squares the step must compute);
* a small instance (n = 200, N = 50): a dense GEMM EC² / EffECXtive, α = (class-weight matrix,
  C × n) @ (one-hot answers or likelihoods, n × N·ℓ, built beforehand), then the gains from α and
  the argmax: four numpy calls, no per-step Python beyond that;
* other rows: ``X.sum(0)`` (deterministic) or ``w @ L`` (likelihoods): reading every cell once.

Each round times the step and its floor back to back (in alternating order) and the table quotes
the median of each and the median of the per-round ratios, so background load on a shared machine
hits both alike. Absolute times on a loaded machine are worth little; the ratios travel.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service import engine  # noqa: E402
from service.engine import alpha as alpha_module  # noqa: E402

N_CLASSES = 20
SIZES = [(1_000, 100), (10_000, 1_000), (100_000, 1_000)]
SINGLETON_SIZES = [(10_000, 1_000)]  # also run with C = n classes
GOALS = {  # (policy, n, N, ℓ, classes) -> milliseconds (C = n: every hypothesis its own class)
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
RATIO_GOAL = 1.5  # × the fair floor
# Every likelihood policy's step against effecxtive's on a many-class phenotype-sized instance.
POLICY_SHAPE = (1_500, 1_000, 2)
POLICY_RATIO_GOAL = 1.5
LATE_GOAL_MS = 1.0


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


# --- timing ------------------------------------------------------------------------------


def paired(step, floor, rounds: int) -> tuple[float, float, float]:
    """(median step ms, median floor ms, median of the per-round ratios step/floor)."""
    step(), floor()  # warm: first-touch page faults and cached properties are not a step's cost
    steps, floors = [], []
    for i in range(rounds):
        for fn, times in ((step, steps), (floor, floors)) if i % 2 == 0 else ((floor, floors), (step, steps)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratios = [s / f for s, f in zip(steps, floors)]
    return 1e3 * statistics.median(steps), 1e3 * statistics.median(floors), statistics.median(ratios)


def median_ms(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@contextmanager
def engine_split(enabled: bool):
    """The engine's two-thread split of big batches on (its default) or off."""
    saved = alpha_module._PARALLEL_CELLS
    if not enabled:
        alpha_module._PARALLEL_CELLS = 1 << 62
    try:
        yield
    finally:
        alpha_module._PARALLEL_CELLS = saved


# --- floors ------------------------------------------------------------------------------


def plain_pass(inst: engine.CompiledInstance):
    """Reading every cell once: ``X.sum(0)``, or one GEMV ``w @ L`` over the likelihoods."""
    if inst.outcomes is not None:
        cells = inst.outcomes
        return lambda: cells.sum(0)
    tensor = inst.likelihood_by_outcome.reshape(inst.n_hypotheses, -1)
    weight = inst.prior
    return lambda: weight @ tensor


def two_gemvs(inst: engine.CompiledInstance):
    """EffECXtive with C = n needs p = w·L and Σ_h a² = w²·L²: two GEMVs, L² precomputed."""
    tensor = inst.likelihood_by_outcome.reshape(inst.n_hypotheses, -1)
    squares = tensor * tensor
    weight = inst.prior
    weight_sq = weight * weight
    return lambda: (weight @ tensor, weight_sq @ squares)


def dense_gemm(inst: engine.CompiledInstance, policy: str):
    """A dense EC² / EffECXtive step: α by one GEMM, then p, Σ_i a², the gain and the argmax."""
    n, n_tests, width = inst.n_hypotheses, inst.n_tests, inst.max_outcomes
    if inst.outcomes is not None:
        cells = (inst.outcomes[:, None, :] == np.arange(width)[None, :, None]).astype(float)  # (n, ℓ, N)
    else:
        cells = np.ascontiguousarray(inst.likelihood_by_outcome)
    cells = cells.reshape(n, width * n_tests)
    rows = np.arange(n)
    costs = inst.costs

    def step():
        class_weights = np.zeros((inst.n_classes, n))
        class_weights[inst.class_index, rows] = inst.prior
        alpha = (class_weights @ cells).reshape(inst.n_classes, width, n_tests)
        p = alpha.sum(0)
        sum_sq = np.einsum("ckn,ckn->kn", alpha, alpha)
        b = class_weights.sum(1)
        if policy == "ec2":
            gain = 0.5 * (1.0 - b @ b) - (p * 0.5 * (p * p - sum_sq)).sum(0)
        else:
            gain = (sum_sq / p).sum(0) - b @ b
        return int(np.argmax(gain / costs))

    return step


# --- tables ------------------------------------------------------------------------------


def fair_floor_rows(rounds: int) -> None:
    print("Fair floors, single-threaded (BLAS on one thread, no split): median of paired rounds\n")
    print(f"| {'step':<44} | {'floor':<28} | {'step ms':>8} | {'floor ms':>8} | {'×floor':>6} | goal |")
    print(f"|{'-' * 46}|{'-' * 30}|{'-' * 10}|{'-' * 10}|{'-' * 8}|------|")
    cases = [
        ("ec2", "deterministic", 10_000, 1_000, 2, "n", "X.sum(0)", plain_pass, True),
        ("ec2", "deterministic", 10_000, 1_000, 4, "n", "X.sum(0)", plain_pass, False),
        ("effecxtive", "likelihood", 10_000, 1_000, 2, "n", "w @ L, w² @ L²", two_gemvs, True),
        ("effecxtive", "likelihood", 10_000, 1_000, 4, "n", "w @ L, w² @ L²", two_gemvs, False),
        ("ec2", "deterministic", 200, 50, 2, 50, "dense GEMM EC²", None, True),
        ("effecxtive", "likelihood", 200, 50, 2, 50, "dense GEMM EffECXtive", None, True),
    ]
    with engine_split(False):
        for policy, kind, n, n_tests, arity, classes, floor_name, floor_of, has_goal in cases:
            inst = make_instance(n, n_tests, arity, kind, n_classes=n if classes == "n" else classes)
            floor = floor_of(inst) if floor_of is not None else dense_gemm(inst, policy)
            small = n * n_tests <= 10**5
            step, floor_ms, ratio = paired(lambda: engine.next_step(inst, [], policy), floor,
                                           rounds * (20 if small else 1))
            goal = (f"≤ {RATIO_GOAL}: " + ("ok" if ratio <= RATIO_GOAL else "MISS")) if has_goal else ""
            name = f"{policy} {n}×{n_tests}, ℓ={arity}, C={classes}"
            print(f"| {name:<44} | {floor_name:<28} | {step:>8.3f} | {floor_ms:>8.3f} | {ratio:>6.2f} | {goal} |",
                  flush=True)


def first_use_rows() -> None:
    """What a deterministic instance builds on its first big singleton step and keeps: the bit
    planes of its answers (CompiledInstance.outcome_bits), counted by the instance cache."""
    print("\nBuilt on first use and kept on the instance (the answers' bit planes)\n")
    print("| instance | build ms | MB | the answers' MB |\n|---|---:|---:|---:|")
    for n, n_tests, arity in ((10_000, 1_000, 2), (10_000, 1_000, 4)):
        inst = make_instance(n, n_tests, arity, "deterministic", n_classes=n)
        start = time.perf_counter()
        planes = inst.outcome_bits
        build_ms = 1e3 * (time.perf_counter() - start)
        print(f"| {n}×{n_tests}, ℓ={arity} | {build_ms:.1f} | {planes.nbytes / 2**20:.2f} | "
              f"{inst.outcomes.nbytes / 2**20:.2f} |")


def late_session_rows(rounds: int) -> None:
    """EC² at 5·10⁴ × 10³ after 10 answers of a hidden hypothesis (≈ 50 alive of 5·10⁴)."""
    inst = make_instance(50_000, 1_000, 2, "deterministic", seed=3)
    truth = 0
    observations = []
    with engine_split(False):
        for _ in range(10):
            t = engine.next_step(inst, observations, "ec2").next_test
            observations.append((t, int(inst.outcomes[truth, t])))
        policy = engine.resolve_policy(inst, "ec2")
        before = engine.observe(inst, observations[:-1])
        scratch = median_ms(lambda: engine.next_step(inst, observations, "ec2"), rounds * 5)
        carried = median_ms(lambda: engine.decide(engine.observe(inst, observations, previous=before), policy),
                            rounds * 5)
        belief = engine.observe(inst, observations)
    print(f"\nLate in a session: EC² on 50 000 × 1 000 (binary, {N_CLASSES} classes) after 10 answers, "
          f"{belief.alive.size} of 50 000 alive (goal ≤ {LATE_GOAL_MS:g} ms)\n")
    print("| step | ms |\n|---|---:|")
    print(f"| from the 10 observations (`next_step`) | {scratch:.3f} |")
    print(f"| from the belief after 9 (`observe(inst, all 10, previous=before)` + `decide`) | {carried:.3f} |")


def split_rows(rounds: int, include_large_likelihood: bool) -> None:
    print("\nThe engine's two-thread split (BLAS still on one thread): one thread against the split\n")
    print(f"| {'step':<44} | {'one thread ms':>13} | {'split ms':>8} | {'split/one':>9} |")
    print(f"|{'-' * 46}|{'-' * 15}|{'-' * 10}|{'-' * 11}|")
    cases = [("ec2", "deterministic", 100_000, 1_000, 2), ("ec2", "deterministic", 100_000, 1_000, 4),
             ("effecxtive", "likelihood", 100_000, 1_000, 2)]
    if include_large_likelihood:
        cases.append(("effecxtive", "likelihood", 100_000, 1_000, 4))
    for policy, kind, n, n_tests, arity in cases:
        inst = make_instance(n, n_tests, arity, kind)

        def one_thread():
            with engine_split(False):
                engine.next_step(inst, [], policy)

        split, single, ratio = paired(lambda: engine.next_step(inst, [], policy), one_thread, max(3, rounds // 3))
        name = f"{policy} {n}×{n_tests}, ℓ={arity}, C={N_CLASSES}"
        print(f"| {name:<44} | {single:>13.2f} | {split:>8.2f} | {ratio:>9.2f} |", flush=True)
        del inst


def step_peak_mb(inst: engine.CompiledInstance, policy: str) -> float:
    tracemalloc.start()
    engine.next_step(inst, [], policy)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def size_rows(rounds: int, include_large_likelihood: bool) -> None:
    print("\nEvery size, single-threaded; floor = X.sum(0) or w @ L (two GEMVs for effecxtive with C = n)\n")
    print(f"{'policy':<11} {'form':<13} {'n':>7} {'N':>5} {'ℓ':>2} {'C':>6} {'step ms':>8} {'floor ms':>9} "
          f"{'×floor':>7} {'goal ms':>8} {'step peak MB':>13} {'instance MB':>12}")
    with engine_split(False):
        for policy, kind in (("ec2", "deterministic"), ("effecxtive", "likelihood")):
            for n, n_tests in SIZES:
                for arity in (2, 4):
                    for classes in (N_CLASSES, "n") if (n, n_tests) in SINGLETON_SIZES else (N_CLASSES,):
                        if kind == "likelihood" and n >= 100_000 and arity == 4 and not include_large_likelihood:
                            continue
                        inst = make_instance(n, n_tests, arity, kind, n_classes=n if classes == "n" else classes)
                        repeats = rounds if n * n_tests <= 10**7 else max(5, rounds // 3)
                        floor_of = two_gemvs if (kind == "likelihood" and classes == "n") else plain_pass
                        step, floor, ratio = paired(lambda: engine.next_step(inst, [], policy), floor_of(inst),
                                                    repeats)
                        peak = step_peak_mb(inst, policy)
                        goal = GOALS.get((policy, n, n_tests, arity, classes))
                        goal_text = "" if goal is None else f"{goal:.0f}{' ok' if step <= goal else ' MISS'}"
                        print(f"{policy:<11} {kind:<13} {n:>7} {n_tests:>5} {arity:>2} {classes:>6} {step:>8.2f} "
                              f"{floor:>9.2f} {ratio:>7.2f} {goal_text:>8} {peak:>13.1f} "
                              f"{inst.nbytes / 2**20:>12.1f}", flush=True)
                        del inst


def reference_speedup(rounds: int) -> None:
    """EC² on (500, 50): the naive edge-list reference (tests/reference.py) against the engine.
    The reference is timed on a few tests and scaled to all 50 (it is linear in the tests)."""
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
    engine_ms = median_ms(lambda: engine.next_step(inst, [], "ec2"), rounds)
    print(f"\nEC² on (500, 50), binary: naive reference {reference_ms:.0f} ms per step "
          f"(timed on {sampled} tests, scaled to 50), engine {engine_ms:.3f} ms: "
          f"speed-up ×{reference_ms / engine_ms:,.0f}")


def phenotype_like(n_classes: int, seed: int = 0) -> engine.CompiledInstance:
    """n × N binary likelihoods shaped like a rare-disease phenotype table (most cells at a 0.01
    background, a few per row between 0.1 and 0.99), uniform prior; ``n_classes`` nonempty
    classes of one or a few hypotheses each (C = n: every hypothesis its own class)."""
    n, n_tests, _ = POLICY_SHAPE
    rng = np.random.default_rng(seed)
    present = np.full((n, n_tests), 0.01)
    hits = rng.random((n, n_tests)) < 0.02
    present[hits] = rng.uniform(0.1, 0.99, size=int(hits.sum()))
    by_outcome = np.stack((1.0 - present, present), axis=1)  # (n, ℓ, N)
    class_index = np.sort(np.concatenate((np.arange(n_classes), rng.integers(0, n_classes, n - n_classes))))
    return engine.CompiledInstance(
        test_ids=tuple(f"t{j}" for j in range(n_tests)),
        outcome_labels=(("no", "yes"),) * n_tests,
        costs=np.ones(n_tests),
        hypothesis_ids=tuple(f"h{i}" for i in range(n)),
        class_labels=tuple(f"c{i}" for i in range(n_classes)),
        class_index=class_index.astype(np.intp),
        prior=np.full(n, 1.0 / n),
        likelihood=by_outcome.transpose(0, 2, 1),
    )


def likelihood_policy_rows(rounds: int) -> None:
    """Every policy that runs on likelihood instances, one step each in every round (the order
    rotating), after three answers; the ratio is the median of the per-round ratios to the
    effecxtive step of the same round."""
    policies = sorted(name for name, policy in engine.POLICIES.items()
                      if not (policy.deterministic_only or policy.decision or policy.seeded))
    n, n_tests, arity = POLICY_SHAPE
    print(f"\nEvery likelihood policy's step against effecxtive's, {n} × {n_tests} × {arity} "
          f"(single-threaded; goal ≤ {POLICY_RATIO_GOAL}×)\n")
    print("| classes | " + " | ".join(policies) + " |")
    print("|---|" + "---:|" * len(policies))
    with engine_split(False):
        for n_classes in (n, 1_190):
            inst = phenotype_like(n_classes)
            observations = [(0, 1), (1, 0), (2, 0)]
            times = {name: [] for name in policies}
            for name in policies:  # warm: the instance's kept tables are not a step's cost
                engine.next_step(inst, observations, name)
            for i in range(rounds):
                order = policies[i % len(policies):] + policies[:i % len(policies)]
                for name in order:
                    start = time.perf_counter()
                    engine.next_step(inst, observations, name)
                    times[name].append(time.perf_counter() - start)
            cells = []
            for name in policies:
                ratio = statistics.median(a / b for a, b in zip(times[name], times["effecxtive"]))
                mark = "" if ratio <= POLICY_RATIO_GOAL else " MISS"
                cells.append(f"{1e3 * statistics.median(times[name]):.2f} ms, {ratio:.2f}×{mark}")
            label = "C = n" if n_classes == n else f"C = {n_classes}"
            print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fair floors, the bit planes' one-off cost and the late-session step only")
    parser.add_argument("--all", action="store_true", help="also the 3.2 GB 4-ary likelihood instance")
    parser.add_argument("--policies", action="store_true",
                        help="only every likelihood policy's step against effecxtive's")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.policies:
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, numpy {np.__version__}")
        likelihood_policy_rows(3 * args.rounds)
        return

    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, numpy {np.__version__}\n")
    fair_floor_rows(args.rounds)
    first_use_rows()
    late_session_rows(args.rounds)
    likelihood_policy_rows(3 * args.rounds)
    if not args.quick:
        split_rows(args.rounds, args.all)
        size_rows(args.rounds, args.all)
        reference_speedup(args.rounds)
    print(f"\nprocess peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MB, "
          f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
