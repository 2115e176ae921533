"""``edgecut calibrate-exposure BANK.json --max-rate 0.3 > calibrated.json``: Sympson–Hetter
exposure parameters for an item bank, set by simulation (service/evaluation/exposure.py,
docs/item-banks.md); the bank is written back with each item's ``exposure_parameter``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from service import engine
from service.evaluation.exposure import ExposureIteration, calibrate_exposure

from .evaluate import CommandError, add_stop_rules, load_instance, rules_from_arguments
from .extras import progress_bar


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate-exposure", help="set an item bank's Sympson–Hetter exposure parameters by simulation",
        description="Simulate examinees drawn from the bank's prior, tested under the stop rules with "
        "Sympson–Hetter exposure control, and set each item's exposure_parameter until no item is given to "
        "more than --max-rate of them (Sympson & Hetter's iterative procedure, its estimates pooled over the "
        "second half of the iterations). The bank, with the parameters, goes to standard output; each "
        "iteration's top rate, and the parameters' top rate on examinees no iteration drew, to standard error.",
    )
    parser.add_argument("instance", type=Path, help="item-bank instance JSON file")
    parser.add_argument("--max-rate", type=float, required=True,
                        help="the largest share of examinees any one item may be given, in (0, 1]")
    parser.add_argument("--policy", default=None, help="the policy sessions will use (default: the instance's)")
    add_stop_rules(parser, sympson_hetter=False)
    parser.add_argument("--examinees", type=int, default=1000,
                        help="simulated examinees per iteration (default 1000)")
    parser.add_argument("--iterations", type=int, default=10, help="simulations before the check (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated examinees (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        if not 0 < args.max_rate <= 1 or args.examinees < 1 or args.iterations < 1 or args.seed < 0:
            raise CommandError("--max-rate must be in (0, 1]; --examinees and --iterations at least 1; "
                               "--seed at least 0")
        inst = load_instance(args.instance)
        if inst.theta is None:
            raise CommandError(f"{args.instance} is not an item bank: exposure parameters belong to items")
        bar = progress_bar(args.examinees * (args.iterations + 1), "calibrating", enabled=not args.no_progress)
        try:
            calibration = calibrate_exposure(
                inst, args.max_rate, rules_from_arguments(args), policy=args.policy, examinees=args.examinees,
                iterations=args.iterations, seed=args.seed, progress=bar.update if bar is not None else None,
                on_iteration=lambda step: _report(inst, step, args.max_rate))
        finally:
            if bar is not None:
                bar.close()
    except (CommandError, engine.EngineError) as error:
        print(f"edgecut: error: {error}", file=sys.stderr)
        return 2
    print("on fresh examinees: ", end="", file=sys.stderr)
    _report(inst, calibration.check, args.max_rate)
    if not calibration.reached:
        print(f"edgecut: on fresh examinees the top rate is more than {calibration.margin:.1%} above "
              f"{args.max_rate:g} (more than counting {args.examinees} examinees explains) after {args.iterations} "
              "iterations (more --iterations or --examinees, or a bank with more items, may reach it)", file=sys.stderr)
    body = json.loads(args.instance.read_text(encoding="utf-8"))
    for item in body["item_bank"]["items"]:
        item["exposure_parameter"] = float(calibration.exposure_parameters[inst.test_index[item["id"]]])
    json.dump(body, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def _report(inst: engine.CompiledInstance, step: ExposureIteration, max_rate: float) -> None:
    top = int(step.given_rate.argmax())
    above = int((step.given_rate > max_rate).sum())
    limited = int((step.exposure_parameters < 1).sum())
    print(f"top exposure {step.top_rate:.1%} ({inst.test_ids[top]}), {above} items above {max_rate:g}, "
          f"{limited} items with K < 1", file=sys.stderr)
