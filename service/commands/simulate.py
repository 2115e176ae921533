"""``edgecut simulate lotteries``: the paper's figure 2 experiment with simulated subjects.

Writes, under ``--out`` (a new ``lotteries-results/`` by default, so a trial run never
overwrites the committed results; the docs regenerate theirs with ``--out docs``):

* ``lotteries{-tag}.csv``: accuracy after 0..T tests per study and policy, with 95% intervals;
* ``figures/lotteries{-tag}-{study}.png``: the accuracy curves with their 95% bands;
* a results block in ``lotteries.md`` between ``<!-- results:{tag} -->`` markers (the rest of the
  file is hand-written and left alone; the block is appended when the markers are missing).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from service.examples import lotteries

from .extras import MissingExtra, progress_bar, require_plotting
from service.examples.simulation import (
    WHEN_UNINFORMATIVE,
    Curve,
    SubjectRun,
    curve,
    map_subjects,
    paired_difference_interval,
    run_subject,
)

PAPER_POLICIES = ("effecxtive", "infogain", "voi", "uncertainty", "gbs", "random")
DEFAULT_SUBJECTS = {"fixed": 1000, "uncertain": 500}  # as in the paper
STUDY_NUMBER = {"fixed": 0, "uncertain": 1}  # part of each subject's seed
FIGURE = {"fixed": "2a, fixed parameters", "uncertain": "2b, parameter uncertainty"}
REPORT_AFTER = (5, 10, 20, 30)
STYLE = {
    "effecxtive": ("tab:red", "-"),
    "infogain": ("tab:blue", "-"),
    "voi": ("tab:green", "--"),
    "uncertainty": ("tab:purple", "-."),
    "gbs": ("tab:orange", ":"),
    "random": ("black", "--"),
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="run a worked example's simulation study")
    examples = parser.add_subparsers(dest="example", required=True, metavar="EXAMPLE")
    lot = examples.add_parser(
        "lotteries",
        help="figure 2 of the paper: which economic theory explains a subject's choices",
        description="Simulated subjects answer 30 lottery questions chosen by each policy; "
        "accuracy of the MAP theory after each answer (docs/lotteries.md).",
    )
    lot.add_argument("--study", choices=("fixed", "uncertain", "both"), default="both",
                     help="fixed: figure 2a; uncertain: figure 2b (default: both)")
    lot.add_argument("--policies", nargs="+", default=list(PAPER_POLICIES), metavar="POLICY",
                     help="engine policy names (default: the paper's six)")
    lot.add_argument("--subjects", type=int, default=None,
                     help="subjects per policy (default: 1000 for fixed, 500 for uncertain)")
    lot.add_argument("--tests", type=int, default=30, help="tests per subject (default 30)")
    lot.add_argument("--seed", type=int, default=0)
    lot.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                     help="worker processes; results do not depend on it (default 2)")
    lot.add_argument("--when-uninformative", choices=WHEN_UNINFORMATIVE, default="stop",
                     help="when no test has positive gain: stop (the engine's rule), or keep "
                     "asking the first / a random unrun test (diagnostic)")
    lot.add_argument("--out", type=Path, default=Path("lotteries-results"),
                     help="output folder (default lotteries-results/; the committed results are in docs/)")
    lot.add_argument("--tag", default="",
                     help="suffix for output names and the results block, for diagnostic runs")
    lot.add_argument("--no-progress", action="store_true", help="no progress bar")
    lot.set_defaults(handler=run_lotteries)


# --- running subjects in parallel ------------------------------------------------------------

_INSTANCES: dict = {}


def _load_instances(instances: dict) -> None:
    _INSTANCES.update(instances)


def _run_task(task: tuple[str, str, int, int, int, str]) -> SubjectRun:
    study, policy, tests, seed, subject, when_uninformative = task
    return run_subject(_INSTANCES[study], policy, tests, seed, STUDY_NUMBER[study], subject,
                       when_uninformative)


def simulate(studies, policies, subjects, tests, seed, jobs, when_uninformative, progress=True):
    """{study: {policy: [SubjectRun, ...]}}, in subject order whatever ``jobs`` is."""
    instances = {study: lotteries.compiled_instance(study) for study in studies}
    tasks = [
        (study, policy, tests, seed, k, when_uninformative)
        for study in studies
        for policy in policies
        for k in range(subjects[study])
    ]
    bar = progress_bar(len(tasks), "subjects", enabled=progress)
    results = []
    for result in map_subjects(_run_task, tasks, jobs, _load_instances, (instances,), chunksize=16):
        results.append(result)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    runs: dict[str, dict[str, list[SubjectRun]]] = {}
    for (study, policy, *_), result in zip(tasks, results):
        runs.setdefault(study, {}).setdefault(policy, []).append(result)
    return runs


# --- outputs ---------------------------------------------------------------------------------


def write_csv(path: Path, curves: dict[str, dict[str, Curve]]) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["study", "policy", "tests", "subjects", "correct", "accuracy", "ci_low", "ci_high"])
        for study, by_policy in curves.items():
            for policy, c in by_policy.items():
                low, high = c.interval
                for t in range(len(c.correct)):
                    out.writerow([study, policy, t, c.subjects, int(c.correct[t]),
                                  f"{c.accuracy[t]:.4f}", f"{low[t]:.4f}", f"{high[t]:.4f}"])


def plot(path: Path, study: str, by_policy: dict[str, Curve], title_suffix: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for policy, c in by_policy.items():
        color, line = STYLE.get(policy, (None, "-"))
        x = np.arange(len(c.correct))
        low, high = c.interval
        label = policy
        if policy == "gbs" and "uncertainty" in by_policy and \
                np.array_equal(c.correct, by_policy["uncertainty"].correct):
            # On two-outcome tests both maximise a decreasing function of |p(x) − ½|: same tests.
            label = "gbs (= uncertainty)"
        ax.plot(x, c.accuracy, line, color=color, label=label, linewidth=1.8)
        ax.fill_between(x, low, high, color=color, alpha=0.15, linewidth=0)
    n = next(iter(by_policy.values())).subjects
    ax.set_title(f"Figure {FIGURE[study]}: {n} subjects per policy{title_suffix}", fontsize=10)
    ax.set_xlabel("number of tests")
    ax.set_ylabel("accuracy of the MAP theory (95% band)")
    ax.set_xlim(0, len(x) - 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def results_block(runs, curves, tests, wall_seconds, command, jobs, when_uninformative) -> str:
    lines = [f"Command: `{command}`", ""]
    lines.append(f"Wall time: {wall_seconds:.0f} s with {jobs} worker process(es) "
                 f"(simulation only; the instance compiles in under a second). "
                 f"When no test is informative: `{when_uninformative}`.")
    for study, by_policy in curves.items():
        n = next(iter(by_policy.values())).subjects
        after = sorted({a for a in REPORT_AFTER if a <= tests} | {tests})
        lines += ["", f"**Figure {FIGURE[study]}** ({n} subjects per policy; accuracy of the MAP "
                  "theory, 95% Wilson interval)", ""]
        lines.append("| policy | " + " | ".join(f"{a} tests" for a in after)
                     + " | tests asked (mean) | stopped early |")
        lines.append("|---|" + "---|" * (len(after) + 2))
        for policy, c in by_policy.items():
            low, high = c.interval
            cells = [f"{c.accuracy[a]:.3f} [{low[a]:.3f}, {high[a]:.3f}]" for a in after]
            stopped = ", ".join(f"{k} {v / c.subjects:.0%}" for k, v in sorted(c.stop_reasons.items())) or "—"
            lines.append(f"| {policy} | " + " | ".join(cells) + f" | {c.mean_tests_asked:.1f} | {stopped} |")
        pairs = [(a, b) for a, b in (("effecxtive", "infogain"), ("infogain", "random"),
                                     ("effecxtive", "random"), ("random", "voi"),
                                     ("random", "uncertainty"), ("random", "gbs"))
                 if a in by_policy and b in by_policy]
        if pairs:
            lines += ["", "Paired differences (same subjects), accuracy(A) − accuracy(B), 95% interval:", ""]
            lines.append("| A − B | " + " | ".join(f"{a} tests" for a in after) + " |")
            lines.append("|---|" + "---|" * len(after))
            for a, b in pairs:
                cells = []
                for k in after:
                    mean, low, high = paired_difference_interval(runs[study][a], runs[study][b], k)
                    cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
                lines.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def update_markdown(path: Path, tag: str, block: str) -> None:
    """Replace the block between this tag's markers, keeping the hand-written text around it."""
    begin, end = f"<!-- results:{tag or 'main'} begin -->", f"<!-- results:{tag or 'main'} end -->"
    fenced = f"{begin}\n{block}\n{end}"
    text = path.read_text() if path.exists() else "# Lotteries: reproducing figure 2\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: fenced, text)
    else:
        text = text.rstrip("\n") + "\n\n" + fenced + "\n"
    path.write_text(text)


def run_lotteries(args: argparse.Namespace) -> int:
    unknown = [p for p in args.policies if p not in lotteries_policies()]
    if unknown:
        print(f"unknown policies {unknown}; choose from {sorted(lotteries_policies())}", file=sys.stderr)
        return 2
    if args.tests < 1 or (args.subjects is not None and args.subjects < 2):
        print("--tests must be >= 1 and --subjects >= 2", file=sys.stderr)
        return 2
    try:
        require_plotting("edgecut simulate (it draws the accuracy figures)")
    except MissingExtra as error:
        print(f"edgecut: error: {error}", file=sys.stderr)
        return 2
    studies = ("fixed", "uncertain") if args.study == "both" else (args.study,)
    subjects = {s: args.subjects or DEFAULT_SUBJECTS[s] for s in studies}
    start = time.perf_counter()
    runs = simulate(studies, args.policies, subjects, args.tests, args.seed, args.jobs,
                    args.when_uninformative, progress=not args.no_progress)
    wall = time.perf_counter() - start
    curves = {study: {p: curve(p, r) for p, r in by_policy.items()} for study, by_policy in runs.items()}

    suffix = f"-{args.tag}" if args.tag else ""
    (args.out / "figures").mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"lotteries{suffix}.csv"
    write_csv(csv_path, curves)
    written = [csv_path]
    for study, by_policy in curves.items():
        png = args.out / "figures" / f"lotteries{suffix}-{study}.png"
        plot(png, study, by_policy, f" ({args.tag})" if args.tag else "")
        written.append(png)
    command = canonical_command(args)
    block = results_block(runs, curves, args.tests, wall, command, args.jobs, args.when_uninformative)
    md = args.out / "lotteries.md"
    update_markdown(md, args.tag, block)
    written.append(md)
    print(block)
    print(f"\nwrote {', '.join(str(p) for p in written)} in {wall:.0f} s", file=sys.stderr)
    return 0


def lotteries_policies() -> set[str]:
    from service.engine import POLICIES

    return {name for name, p in POLICIES.items() if not p.deterministic_only}


def canonical_command(args: argparse.Namespace) -> str:
    """The command line that regenerates these outputs, every option spelled out."""
    parts = ["edgecut", "simulate", "lotteries", "--study", args.study,
             "--policies", *args.policies, "--tests", str(args.tests), "--seed", str(args.seed),
             "--jobs", str(args.jobs), "--out", str(args.out)]
    if args.subjects is not None:
        parts += ["--subjects", str(args.subjects)]
    if args.when_uninformative != "stop":
        parts += ["--when-uninformative", args.when_uninformative]
    if args.tag:
        parts += ["--tag", args.tag]
    return " ".join(shlex.quote(part) for part in parts)
