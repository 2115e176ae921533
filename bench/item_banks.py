"""edgecut against catsim on a simulated 3PL item bank (the tables in docs/item-banks.md).

    pip install -c constraints.txt -e '.[bench]'        # catsim 0.21
    python3 -m bench.item_banks                          # 300 items, 2,000 examinees
    python3 -m bench.item_banks --examinees 200          # a quick look
    python3 -m bench.item_banks --only times             # the time per selection alone (~10 s)
    python3 -m bench.item_banks --only variants          # fixed length under each grid, policy, level read

The bank is drawn as the CAT literature does: a ~ lognormal(0, 0.25), b ~ N(0, 1),
c ~ U(0, 0.25), scaling D = 1; examinees' θ ~ N(0, 1), continuous (not grid points). Both sides
answer with the same coins: examinee e answers item j right when coin[e, j] < P_j(θ_e), one
uniform coin per (examinee, item) drawn in advance, so an item given to the same examinee by both
gets the same answer.

* edgecut: the item bank compiled on 61 θ points (ITEM_BANK_GRID_POINTS' default), the likelihood default
  policy (infogain), run in process through the engine (no HTTP): the class at the stop is the
  MAP level, θ̂ the EAP.
* catsim 0.21: ``MaxInfoSelector`` (maximum information at θ̂), ``NumericalSearchEstimator``
  (maximum likelihood, Dodd's heuristic while every answer is the same), θ̂ starting at 0; its
  level is the one holding θ̂. Run item by item with the same coins (not ``Simulator``, whose
  own generator draws the answers).

Classification: two cut scores (−0.5, 0.8; three levels), fixed length 10 and 20, accuracy
with Wilson 95 % intervals and the paired difference (edgecut − catsim) with a normal 95 %
interval. Variable length: edgecut stops at class confidence 0.95; catsim with its standard-error
stop (``MinErrorStopper``: SE(θ̂) = 1/√I(θ̂) below a threshold) tuned on these same examinees:
every threshold from 0.10 to 1.00 in steps of 0.01 is applied to one run of up to --max-items
items, and the largest threshold (shortest tests) whose accuracy reaches edgecut's is reported
(an optimistic tuning for catsim: it is chosen on the test set). θ estimation: the bank without
cut scores (each grid point its own class), EAP RMSE after 10 and 20 items against catsim's
MLE RMSE, with intervals. Time per selection: the median of one choice of the next item
(edgecut: one ``engine.decide`` on the carried belief; catsim: one ``select``) at 300 and 3,000
items, measured in the same run on the shared machine (``--only times`` runs it alone). Variants
(``--only variants``, not part of the full run): fixed length 10 and 20 on finer grids, with
other policies, on cells whose boundaries fall on the cut scores, each read as the class
posterior's argmax and as the level holding θ̂ EAP, against the same catsim runs.

Exposure control (``--only exposure`` runs it alone): fixed length 20 at the two cut scores,
without control, with randomesque k = 5, progressive, with Sympson–Hetter parameters set by
``calibrate_exposure`` (``edgecut calibrate-exposure``) on its own examinees drawn from the prior
(``--calibration-examinees`` per iteration, ``--calibration-iterations``, seed --seed + 1), then
evaluated on the 2,000 examinees with the same coins, and with the restricted method at each
``--restricted-rates``, with and without its reserve and the two paired (the examinees taken in
order as sessions, the counts kept across them);
and content balancing over three areas (item j in area j mod 3; targets 50 / 30 / 20 %).
Accuracy, the most-used item's rate, and the accuracy change paired with the uncontrolled run.
``--exposure-methods restricted`` (or any of randomesque, progressive, sympson_hetter,
restricted, catsim, content) runs those rows alone beside the run without control:

    python3 -m bench.item_banks --only exposure --exposure-methods restricted --seed 1
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas.instance import Instance  # noqa: E402
from service import engine  # noqa: E402

CUTS = (-0.5, 0.8)
LEVELS = ("basic", "proficient", "advanced")
SE_THRESHOLDS = np.round(np.arange(0.10, 1.0001, 0.01), 2)


def draw_bank(n_items: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 3): a, b, c."""
    return np.column_stack([rng.lognormal(0.0, 0.25, n_items), rng.normal(0.0, 1.0, n_items),
                            rng.uniform(0.0, 0.25, n_items)])


def item_bank(params: np.ndarray, cuts: tuple[float, ...] | None) -> dict:
    items = [{"id": f"q{j}", "model": "3PL", "a": float(a), "b": float(b), "c": float(c)}
             for j, (a, b, c) in enumerate(params)]
    bank: dict = {"items": items, "prior": {"mean": 0, "sd": 1}}
    if cuts:
        bank.update(cut_scores=list(cuts), levels=list(LEVELS[:len(cuts) + 1]))
    return {"item_bank": bank}


def right_probability(params: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """(examinees, items): the 3PL probability of a right answer."""
    a, b, c = params.T
    return c + (1 - c) / (1 + np.exp(-a * (theta[:, None] - b)))


def edgecut_run(inst, policy, rules, right: np.ndarray) -> tuple[list[int], list[float], int]:
    """One examinee: the MAP class and the EAP before each item and at the stop, and the items given."""
    observations: list = []
    belief = None
    classes, eaps = [], []
    while True:
        belief = engine.observe(inst, observations, belief)
        classes.append(int(np.argmax(belief.class_mass)))
        eaps.append(engine.theta_estimate(belief)[0])
        decision = engine.decide(belief, policy, rules)
        if decision.done:
            return classes, eaps, len(observations)
        t = decision.next_test
        observations = observations + [(t, int(right[t]))]


def catsim_run(bank, selector, estimator, see, right: np.ndarray, max_items: int) -> tuple[list[float], list[float]]:
    """One examinee, catsim item by item: θ̂ and SE(θ̂) after each item."""
    administered: list[int] = []
    responses: list[bool] = []
    estimate, estimates, errors = 0.0, [], []
    for _ in range(max_items):
        j = int(selector.select(item_bank=bank, administered_items=administered, est_theta=estimate))
        administered.append(j)
        responses.append(bool(right[j]))
        estimate = float(estimator.estimate(item_bank=bank, administered_items=administered,
                                            response_vector=responses, est_theta=estimate))
        estimates.append(estimate)
        errors.append(see(estimate, bank.get_items(administered)))
    return estimates, errors


def level_of(theta: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(CUTS), theta, side="right")


def accuracy_cell(right: np.ndarray) -> str:
    low, high = engine.wilson_interval(float(right.mean()), right.size)
    return f"{right.mean():.1%} [{low:.1%}, {high:.1%}]"


def paired_cell(ours: np.ndarray, theirs: np.ndarray, percent: bool = True) -> str:
    difference = ours.astype(float) - theirs.astype(float)
    low, high = engine.mean_interval(difference)
    if percent:
        return f"{difference.mean() * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}] points"
    return f"{difference.mean():+.3f} [{low:+.3f}, {high:+.3f}]"


def rmse_cell(errors: np.ndarray) -> str:
    squared = errors ** 2
    low, high = engine.mean_interval(squared)
    return f"{math.sqrt(squared.mean()):.3f} [{math.sqrt(max(low, 0)):.3f}, {math.sqrt(high):.3f}]"


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(row) + " |" for row in rows])


def classification(args, params, theta, right, catsim_parts) -> tuple[str, dict]:
    """Fixed length 10 and 20, and variable length to confidence 0.95 against a tuned SE stop."""
    inst = engine.compile_instance(Instance.model_validate(item_bank(params, CUTS)))
    policy = engine.resolve_policy(inst, None)
    truth = level_of(theta)
    n = theta.size
    fixed = [edgecut_run(inst, policy, engine.StopRules(max_tests=20), right[e]) for e in range(n)]
    variable = [edgecut_run(inst, policy, engine.StopRules(confidence=0.95, max_tests=args.max_items), right[e])
                for e in range(n)]
    bank, selector, estimator, see = catsim_parts
    runs = [catsim_run(bank, selector, estimator, see, right[e], args.max_items) for e in range(n)]
    estimates = np.array([r[0] for r in runs])
    errors = np.array([r[1] for r in runs])

    rows = []
    for length in (10, 20):
        ours = np.array([classes[length] for classes, _, _ in fixed]) == truth
        theirs = level_of(estimates[:, length - 1]) == truth
        rows.append([str(length), accuracy_cell(ours), accuracy_cell(theirs), paired_cell(ours, theirs)])
    fixed_table = table(["items", f"edgecut ({policy.name})", "catsim (max info, MLE)", "edgecut − catsim (paired)"],
                        rows)

    ours = np.array([classes[-1] for classes, _, _ in variable]) == truth
    lengths = np.array([given for _, _, given in variable], dtype=float)
    target = ours.mean()
    tuned = None
    for threshold in SE_THRESHOLDS[::-1]:  # shortest tests first
        below = errors < threshold
        stop = np.where(below.any(axis=1), below.argmax(axis=1), args.max_items - 1)
        theirs = level_of(estimates[np.arange(n), stop]) == truth
        if theirs.mean() >= target:
            tuned = (float(threshold), theirs, stop + 1.0)
            break
    rows = [["edgecut, confidence 0.95", accuracy_cell(ours), f"{lengths.mean():.2f} ± "
             f"{(engine.mean_interval(lengths)[1] - lengths.mean()):.2f}", "-"]]
    if tuned is None:
        rows.append([f"catsim, no SE threshold ≥ 0.10 reaches it within {args.max_items} items", "-", "-", "-"])
        ratio = None
    else:
        threshold, theirs, their_lengths = tuned
        ratio = lengths.mean() / their_lengths.mean()
        rows.append([f"catsim, SE < {threshold:.2f} (tuned)", accuracy_cell(theirs),
                     f"{their_lengths.mean():.2f} ± {(engine.mean_interval(their_lengths)[1] - their_lengths.mean()):.2f}",
                     f"{ratio:.2f} ({paired_cell(lengths, their_lengths, percent=False)} items)"])
    variable_table = table(["run", "accuracy", "mean items", "edgecut / catsim items (paired difference)"], rows)
    return fixed_table + "\n\n" + variable_table, {"estimates": estimates, "ratio": ratio}


def estimation(args, params, theta, right, catsim_estimates: np.ndarray) -> str:
    inst = engine.compile_instance(Instance.model_validate(item_bank(params, None)))
    policy = engine.resolve_policy(inst, None)
    runs = [edgecut_run(inst, policy, engine.StopRules(max_tests=20), right[e]) for e in range(theta.size)]
    rows = []
    for length in (10, 20):
        ours = np.array([eaps[length] for _, eaps, _ in runs]) - theta
        theirs = catsim_estimates[:, length - 1] - theta
        ratio = math.sqrt((ours ** 2).mean() / (theirs ** 2).mean())
        rows.append([str(length), rmse_cell(ours), rmse_cell(theirs), f"{ratio:.2f}"])
    return table(["items", f"edgecut EAP ({policy.name}, θ grid as classes)", "catsim MLE", "edgecut / catsim"], rows)


def catsim_estimates(args, right, catsim_parts, max_items: int) -> np.ndarray:
    """(examinees, max_items): catsim's θ̂ after each item."""
    return np.array([catsim_run(*catsim_parts, right[e], max_items)[0] for e in range(right.shape[0])])


def cut_aligned_prior(cells: int) -> dict:
    """The N(0, 1) prior on ``cells`` cells over ±4 whose boundaries fall on the cut scores (each
    level tiled by cells of one width, about 8/cells), as a given grid: each cell's centre weighted
    by the prior's mass in it. On the evenly spaced grid a cut falls inside a cell, whose whole
    mass goes to one level (at 61 points −0.5 falls a quarter step inside the cell of −0.53, which
    counts as basic), so the class posterior's levels are offset by up to half a step."""
    bounds = [-4.0, *CUTS, 4.0]
    edges = [np.linspace(low, high, max(1, round((high - low) * cells / 8)) + 1)[:-1]
             for low, high in zip(bounds[:-1], bounds[1:])]
    edges = np.append(np.concatenate(edges), 4.0)
    mass = np.diff([0.5 * (1 + math.erf(x / math.sqrt(2))) for x in edges])
    return {"grid": ((edges[:-1] + edges[1:]) / 2).tolist(), "weights": mass.tolist()}


def fixed_length_variants(args, params, theta, right, estimates: np.ndarray) -> str:
    """Fixed length 10 and 20 under each choice that could move edgecut's accuracy: the θ grid
    (61, 121 or 201 points, or cells whose boundaries fall on the cut scores), the policy, and the
    level reported (the class posterior's argmax, or the level holding θ̂ EAP). Each cell: edgecut's
    accuracy and its paired difference with catsim's (the same examinees and coins)."""
    truth = level_of(theta)
    theirs = {length: level_of(estimates[:, length - 1]) == truth for length in (10, 20)}
    rows = []
    for label, points, prior, name in (("61 points (default)", 61, None, "infogain"),
                                       ("121 points", 121, None, "infogain"),
                                       ("201 points", 201, None, "infogain"),
                                       ("61 points", 61, None, "effecxtive"),
                                       ("61 points", 61, None, "eced"),
                                       ("60 cells on the cuts", None, cut_aligned_prior(60), "infogain")):
        wire = item_bank(params, CUTS)
        if prior is not None:
            wire["item_bank"]["prior"] = prior
        inst = engine.compile_instance(Instance.model_validate(wire), grid_points=points or 61)
        policy = engine.resolve_policy(inst, name)
        runs = [edgecut_run(inst, policy, engine.StopRules(max_tests=20), right[e]) for e in range(theta.size)]
        cells = []
        for length in (10, 20):
            # A run that stopped sooner (effecxtive once no item can move the class posterior) keeps
            # its last reading.
            argmax = np.array([classes[min(length, len(classes) - 1)] for classes, _, _ in runs]) == truth
            eap = level_of(np.array([eaps[min(length, len(eaps) - 1)] for _, eaps, _ in runs])) == truth
            cells += [f"{ours.mean():.1%} ({paired_cell(ours, theirs[length])})" for ours in (argmax, eap)]
        rows.append([label, name, *cells])
    header = ["θ grid", "policy", "10 items, argmax", "10 items, EAP's level", "20 items, argmax",
              "20 items, EAP's level"]
    return (table(header, rows) + f"\n\ncatsim (max info, MLE): 10 items {accuracy_cell(theirs[10])}, "
            f"20 items {accuracy_cell(theirs[20])}")


def selection_times(args, catsim) -> str:
    rows = []
    for n_items in (300, 3000):
        rng = np.random.default_rng([args.seed, n_items])
        params = draw_bank(n_items, rng)
        inst = engine.compile_instance(Instance.model_validate(item_bank(params, CUTS)))
        policy = engine.resolve_policy(inst, None)
        bank = catsim.item_bank.ItemBank(np.column_stack([params, np.ones(n_items)]))
        selector = catsim.selection.MaxInfoSelector()
        ours, theirs = [], []
        for k in range(args.timed):
            # The same state for both: five items answered at random, θ̂ from a random draw.
            given = rng.choice(n_items, size=5, replace=False).tolist()
            answers = rng.integers(0, 2, size=5).tolist()
            belief = engine.observe(inst, list(zip(given, answers)))
            start = time.perf_counter()
            engine.decide(belief, policy, engine.StopRules(max_tests=30))
            ours.append(time.perf_counter() - start)
            estimate = float(rng.normal())
            start = time.perf_counter()
            selector.select(item_bank=bank, administered_items=given, est_theta=estimate)
            theirs.append(time.perf_counter() - start)
        ours_ms, theirs_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        rows.append([f"{n_items:,}", f"{ours_ms:.3f}", f"{theirs_ms:.3f}", f"{ours_ms / theirs_ms:.2f}"])
    return table(["items", "edgecut ms (median)", "catsim ms (median)", "edgecut / catsim"], rows)


EXPOSURE_METHODS = ("randomesque", "progressive", "sympson_hetter", "restricted", "catsim", "content")


def _choices(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(EXPOSURE_METHODS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose among {', '.join(EXPOSURE_METHODS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--examinees", type=int, default=2000)
    parser.add_argument("--max-items", type=int, default=60, help="longest variable-length test (both sides)")
    parser.add_argument("--timed", type=int, default=200, help="selections timed per bank size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("exposure", "times", "variants"), default=None, help="one section alone")
    parser.add_argument("--calibration-examinees", type=int, default=1000,
                        help="Sympson–Hetter calibration: simulated examinees per iteration")
    parser.add_argument("--calibration-iterations", type=int, default=10,
                        help="Sympson–Hetter calibration: iterations before its check")
    parser.add_argument("--exposure-methods", type=_choices, default=",".join(EXPOSURE_METHODS),
                        help="the exposure section's rows, comma-separated among " + ", ".join(EXPOSURE_METHODS)
                        + " (default all; the run without control is always there)")
    parser.add_argument("--restricted-rates", type=lambda text: [float(r) for r in text.split(",")], default=[0.3],
                        help="the restricted method's max_rate, a pair of rows each, with and without its reserve "
                        "(comma-separated; default 0.3)")
    args = parser.parse_args(argv)
    try:
        import catsim.estimation
        import catsim.irt
        import catsim.item_bank
        import catsim.selection
    except ImportError:
        print("bench/item_banks.py needs catsim 0.21: pip install -c constraints.txt -e '.[bench]'", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    params = draw_bank(args.items, rng)
    theta = rng.normal(0.0, 1.0, args.examinees)
    coins = rng.uniform(size=(args.examinees, args.items))
    right = coins < right_probability(params, theta)
    bank = catsim.item_bank.ItemBank(np.column_stack([params, np.ones(args.items)]))
    parts = (bank, catsim.selection.MaxInfoSelector(), catsim.estimation.NumericalSearchEstimator(), catsim.irt.see)

    from bench.item_bank_exposure import exposure  # it reads this module's helpers

    print(f"{args.items} 3PL items, {args.examinees} examinees, seed {args.seed}; catsim "
          f"{getattr(catsim, '__version__', '0.21')}; 95 % intervals in brackets\n")
    if args.only == "exposure":
        print("## Exposure control\n\n" + exposure(args, params, theta, right, parts) + "\n")
        print(f"({time.perf_counter() - started:.0f} s)")
        return 0
    if args.only == "times":
        print("## Time per selection\n\n" + selection_times(args, catsim) + "\n")
        return 0
    if args.only == "variants":
        estimates = catsim_estimates(args, right, parts, 20)
        print("## Fixed length: grid, policy, reported level\n\n"
              + fixed_length_variants(args, params, theta, right, estimates) + "\n")
        return 0
    tables, found = classification(args, params, theta, right, parts)
    print("## Classification at two cut scores\n\n" + tables + "\n")
    print("## θ estimation\n\n" + estimation(args, params, theta, right, found["estimates"]) + "\n")
    print("## Exposure control\n\n" + exposure(args, params, theta, right, parts) + "\n")
    print("## Time per selection\n\n" + selection_times(args, catsim) + "\n")
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
