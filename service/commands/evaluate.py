"""``edgecut evaluate INSTANCE.json``: expected and worst-case cost of policies, gap to the exact
optimum, accuracy, how runs end — as a table, markdown, or JSON (docs/evaluation.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from schemas.instance import Instance, json_path
from service import engine
from service.evaluation import (
    EvaluationLimits,
    default_policies,
    evaluate,
    format_recommendation,
    format_tables,
    work_units,
)
from service.settings import ConfigurationError, load_settings

from .extras import MissingExtra, progress_bar, require_plotting


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="compare policies on an instance: expected cost, worst case, optimum",
        description="Evaluate policies on an instance file (wire format, docs/instances.md). "
        "Deterministic instances are evaluated exactly; likelihood instances by seeded Monte Carlo.",
    )
    parser.add_argument("instance", type=Path, help="instance JSON file")
    parser.add_argument("--policies", type=_names, default=None,
                        help="comma-separated policy names, 'auto' included (default: every policy that applies)")
    add_stop_rules(parser, restricted=True)
    parser.add_argument("--samples", type=int, default=2000,
                        help="Monte Carlo runs per policy: likelihood instances, and any under --max-rate (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo runs (default 0)")
    parser.add_argument("--method", choices=("auto", "exact", "monte_carlo"), default="auto",
                        help="auto: exact when deterministic, else Monte Carlo")
    parser.add_argument("--no-optimum", action="store_true", help="skip the dynamic programme")
    parser.add_argument("--max-dp-states", type=int, default=EvaluationLimits.max_dp_states,
                        help="version spaces the optimum may memoise before giving up "
                        f"(default {EvaluationLimits.max_dp_states})")
    parser.add_argument("--format", choices=("table", "markdown", "json"), default="table",
                        help="what to print on stdout (default table)")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="also write a comparison plot (PNG or SVG by suffix)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--recommend", action="store_true",
                        help="print what policy 'auto' chooses under the stop rules and why: every applicable "
                        "policy ranked on simulated respondents (instead of the evaluation)")
    parser.add_argument("--respondents", type=int, default=engine.Budget.respondents,
                        help=f"--recommend: simulated respondents (default {engine.Budget.respondents}, as the "
                        "service's AUTO_RESPONDENTS)")
    parser.add_argument("--cpu-seconds", type=float, default=engine.Budget.cpu_seconds,
                        help=f"--recommend: CPU seconds it may spend (default {engine.Budget.cpu_seconds:g}, as "
                        "the service's AUTO_CPU_SECONDS)")
    parser.set_defaults(handler=run)


def add_stop_rules(parser: argparse.ArgumentParser, sympson_hetter: bool = True, restricted: bool = False) -> None:
    """The stop rules and exposure control (``sympson_hetter``: its flag too; calibrate-exposure
    always applies it; ``restricted``: --max-rate, which counts across simulated runs, so only
    the evaluation takes it)."""
    parser.add_argument("--max-tests", type=int, default=None, help="stop after this many tests")
    parser.add_argument("--max-cost", type=float, default=None, help="never spend more than this")
    parser.add_argument("--confidence", type=float, default=None,
                        help="stop when a class (decision instances: a decision's acceptability) "
                        "reaches this posterior (likelihood default 0.95)")
    parser.add_argument("--max-expected-loss", type=float, default=None,
                        help="decision instances with losses: stop once the least expected loss is at most this")
    parser.add_argument("--max-se", type=float, default=None,
                        help="item banks: stop once the posterior SD of θ is at most this")
    parser.add_argument("--randomesque", type=int, default=None, metavar="K",
                        help="exposure control: draw each test among the K best (seeded per run)")
    parser.add_argument("--progressive", action="store_true",
                        help="exposure control: score each test by a random draw blended with its gain, the gain's "
                        "weight growing with the step (needs --max-tests; seeded per run)")
    if sympson_hetter:
        parser.add_argument("--sympson-hetter", action="store_true",
                            help="exposure control with the item bank's exposure_parameter (seeded per run)")
    else:  # the command applies it itself
        parser.set_defaults(sympson_hetter=False)
    if restricted:
        # Its own dest: calibrate-exposure's --max-rate is the target, not this control.
        parser.add_argument("--max-rate", type=_rate, default=None, metavar="R", dest="restricted_max_rate",
                            help="exposure control, the restricted method: hold a test back while it was given in R "
                            "of the simulated runs so far or more, unless no other informative test is left "
                            "(R in (0, 1]; each run depends on the runs before it)")
    else:
        parser.set_defaults(restricted_max_rate=None)


def rules_from_arguments(args: argparse.Namespace) -> engine.StopRules:
    """The stop rules and exposure control :func:`add_stop_rules` read."""
    return engine.StopRules(max_tests=args.max_tests, max_cost=args.max_cost, confidence=args.confidence,
                            max_expected_loss=args.max_expected_loss, max_se=args.max_se,
                            randomesque=args.randomesque,
                            sympson_hetter=args.sympson_hetter, progressive=args.progressive,
                            max_rate=args.restricted_max_rate)


def _rate(text: str) -> float:
    rate = float(text)
    if not 0 < rate <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return rate


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


class CommandError(Exception):
    """A message for the user, printed as ``edgecut: error: …`` with exit status 2."""


def load_instance(path: Path) -> engine.CompiledInstance:
    """The instance in ``path``, compiled as the service compiles it: an item bank on
    ITEM_BANK_GRID_POINTS θ from the environment (the service's one settings object)."""
    try:
        grid_points = load_settings().item_bank_grid_points
    except ConfigurationError as error:
        raise CommandError(str(error)) from error
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}") from error
    try:
        instance = Instance.model_validate_json(text)
    except ValidationError as error:
        lines = [f"{path} is not a valid instance:"]
        for problem in error.errors()[:20]:
            where = json_path(tuple(problem["loc"])) or "(top level)"
            lines.append(f"  {where}: {problem['msg']}")
        raise CommandError("\n".join(lines)) from error
    return engine.compile_instance(instance, grid_points=grid_points)


def run(args: argparse.Namespace) -> int:
    if args.recommend:
        return _recommend(args)
    try:
        if args.plot is not None:
            require_plotting("--plot")
        inst = load_instance(args.instance)
        policies = args.policies or default_policies(inst)
        samples = args.samples
        limits = EvaluationLimits(max_dp_states=args.max_dp_states)
        rules = rules_from_arguments(args)
        total = work_units(inst, len(policies), samples, args.method, rules)
        bar = progress_bar(total, "evaluating", enabled=not args.no_progress)
        try:
            report = evaluate(inst, policies, rules, samples=samples, seed=args.seed,
                              method=args.method, optimum=not args.no_optimum, limits=limits,
                              progress=bar.update if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        if args.plot is not None:
            from service.evaluation.plots import comparison_plot

            comparison_plot(report, args.plot, title=args.instance.stem if args.instance.stem != "instance"
                            else args.instance.parent.name)
    except (CommandError, MissingExtra, engine.EngineError) as error:
        print(f"edgecut: error: {error}", file=sys.stderr)
        return 2
    _write(args.format, report, format_tables)
    if args.plot is not None:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _recommend(args: argparse.Namespace) -> int:
    try:
        if args.respondents < 1 or not args.cpu_seconds > 0:
            raise CommandError("--respondents must be at least 1 and --cpu-seconds above 0")
        inst = load_instance(args.instance)
        recommendation = engine.recommend(inst, rules_from_arguments(args), seed=args.seed,
                                          budget=engine.Budget(args.respondents, args.cpu_seconds))
    except (CommandError, engine.EngineError) as error:
        print(f"edgecut: error: {error}", file=sys.stderr)
        return 2
    _write(args.format, recommendation, format_recommendation)
    return 0


def _write(output_format: str, result, as_text) -> None:
    """``result`` (a report or a recommendation) on standard output: its JSON, or ``as_text`` of
    it as Markdown tables or aligned columns."""
    if output_format == "json":
        json.dump(result.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(as_text(result, markdown=output_format == "markdown"))
