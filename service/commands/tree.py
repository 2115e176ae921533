"""``edgecut tree INSTANCE.json --policy ec2 --format svg -o tree.svg``: a policy's whole decision
tree as JSON, Graphviz DOT, SVG or PNG (docs/evaluation.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service import engine
from service.evaluation import trees

from .evaluate import CommandError, add_stop_rules, load_instance, rules_from_arguments


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "tree", help="export a policy's decision tree (json, dot, svg, png)",
        description="The policy's decision tree: a node per test, a branch per outcome, leaves "
        "with the class, its probability and the path cost. SVG and PNG need Graphviz's 'dot'.",
    )
    parser.add_argument("instance", type=Path, help="instance JSON file")
    parser.add_argument("--policy", default=None,
                        help="policy name, or auto (default: hec for decision instances, ec2, or auto for "
                        "likelihood instances)")
    parser.add_argument("--format", choices=trees.FORMATS, default=None,
                        help="output format (default: from the -o suffix, else json)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="output file (default stdout)")
    add_stop_rules(parser)
    parser.add_argument("--depth", type=int, default=None,
                        help=f"cut the tree at this depth (likelihood instances: at most "
                        f"{trees.TreeLimits.max_depth} unless --max-depth says more)")
    parser.add_argument("--max-depth", type=int, default=trees.TreeLimits.max_depth,
                        help="the deepest cut allowed for likelihood instances")
    parser.add_argument("--max-nodes", type=int, default=trees.TreeLimits.max_nodes,
                        help=f"refuse trees with more nodes (default {trees.TreeLimits.max_nodes})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    fmt = args.format
    if fmt is None:
        suffix = args.output.suffix.lstrip(".").lower() if args.output is not None else ""
        fmt = suffix if suffix in trees.FORMATS else "json"
    limits = trees.TreeLimits(max_nodes=args.max_nodes, max_depth=args.max_depth)
    try:
        inst = load_instance(args.instance)
        data = trees.export_tree(inst, args.policy, fmt, rules_from_arguments(args), args.seed, limits, args.depth)
    except (CommandError, engine.EngineError, trees.GraphvizMissing, trees.RenderFailed) as error:
        print(f"edgecut: error: {error}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_bytes(data)
        print(f"{fmt} tree written to {args.output}", file=sys.stderr)
    return 0
