"""A policy's whole decision tree, for people to read, print and audit: JSON, Graphviz DOT, and
SVG / PNG rendered by Graphviz's ``dot``.

Each internal node names the test the policy runs there, with one branch per outcome that can
still happen (probability p(x | x_A) = Σ_i α(i, t, x) / M); each leaf says why the policy stops,
the class it would report (MAP), the probability of reaching the leaf and the cost paid on the
way. The JSON shape is fixed by ``tree.schema.json`` beside this file (docs/evaluation.md).

Likelihood instances never become certain, so their trees are cut at a depth (``max_depth``);
leaves cut there say ``"truncated": true``. Every export is bounded by ``max_nodes``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from importlib import resources

import numpy as np

from service.engine import (
    CompiledInstance,
    InfeasibleComputation,
    StopReason,
    StopRules,
    TreeNode,
    decision_posterior,
    expected_cost,
    expected_tests,
    final_decision,
    policy_tree,
    resolve_policy,
    worst_case_cost,
)

from .limits import EvaluationLimitExceeded

FORMATS = ("json", "dot", "svg", "png")
MEDIA_TYPES = {
    "json": "application/json",
    "dot": "text/vnd.graphviz",
    "svg": "image/svg+xml",
    "png": "image/png",
}
SCHEMA_ID = "https://edgecut.invalid/schemas/policy-tree/v1"
# Leaves list their surviving hypotheses only up to this many (the count is always given).
MAX_LISTED_HYPOTHESES = 20
# Nested JSON of a deeper tree would hit Python's recursion limit (3 levels per tree level).
MAX_EXPORT_DEPTH = 200
# Pastel fills, one per class (cycled): readable under black text when printed in grey too.
CLASS_COLOURS = ("#b3e2cd", "#fdcdac", "#cbd5e8", "#f4cae4", "#e6f5c9", "#fff2ae", "#f1e2cc", "#cccccc")


class TreeTooLarge(InfeasibleComputation):
    code = "tree-too-large"


class GraphvizMissing(RuntimeError):
    """``dot`` is not on PATH: SVG / PNG cannot be rendered (JSON and DOT still can)."""


class RenderFailed(RuntimeError):
    pass


class RenderTimedOut(RenderFailed):
    pass


@dataclass(frozen=True)
class TreeLimits:
    max_nodes: int = 2000
    # Likelihood instances only: the deepest level exported (deterministic trees end by themselves).
    max_depth: int = 5
    render_timeout: float = 30.0  # seconds for one ``dot`` run
    # Seconds of wall clock for building the tree (HTTP: EVALUATION_TIME_LIMIT); None: no limit.
    time_limit: float | None = None


def build_tree(
    inst: CompiledInstance,
    policy: str | None = None,
    rules: StopRules = StopRules(),
    seed: int = 0,
    limits: TreeLimits = TreeLimits(),
    depth: int | None = None,
) -> tuple[TreeNode, StopRules, int | None]:
    """The policy tree within ``limits``: returns (tree, the rules it was built with, the depth
    it was cut at or None). ``depth`` asks for a shallower cut than ``limits.max_depth``."""
    resolved = resolve_policy(inst, policy, rules)
    cut = None
    if inst.kind == "likelihood" or depth is not None:
        cut = min(depth if depth is not None else limits.max_depth, limits.max_depth)
        if rules.max_tests is not None and rules.max_tests <= cut:
            cut = None  # the policy's own max_tests ends it first: nothing is truncated
    if cut is not None:
        # Keep the confidence the policy would run with: capping max_tests alone would switch
        # off the likelihood default (StopRules.effective_confidence), changing the policy.
        rules = StopRules(max_tests=cut, max_cost=rules.max_cost,
                          confidence=rules.effective_confidence(inst), max_expected_loss=rules.max_expected_loss,
                          max_se=rules.max_se)
    check = None
    if limits.time_limit is not None:
        deadline = time.monotonic() + limits.time_limit

        def check() -> None:
            if time.monotonic() > deadline:
                raise EvaluationLimitExceeded(
                    f"the policy tree would not be built within the {limits.time_limit:g} s limit "
                    "(EVALUATION_TIME_LIMIT); bound it with max_tests or a smaller depth, or use "
                    "edgecut tree, which has no time limit")
    try:
        tree = policy_tree(inst, resolved, rules, seed, max_nodes=limits.max_nodes, check=check)
    except EvaluationLimitExceeded:
        raise  # out of time, not too large
    except InfeasibleComputation as error:
        advice = "a smaller depth" if inst.kind == "likelihood" else "max_tests or max_cost"
        raise TreeTooLarge(
            f"the policy tree has more than {limits.max_nodes} nodes (max_nodes); bound it with "
            f"{advice}, or evaluate the policy instead of drawing it"
        ) from error
    deepest = max(leaf.depth for leaf in tree.leaves())
    if deepest > MAX_EXPORT_DEPTH:
        raise TreeTooLarge(f"the policy tree is {deepest} tests deep; export stops at {MAX_EXPORT_DEPTH}")
    return tree, rules, cut


def tree_to_dict(inst: CompiledInstance, tree: TreeNode, policy: str, rules: StopRules,
                 cut: int | None = None) -> dict:
    """The tree in the documented JSON shape (tree.schema.json)."""
    root = _node_dict(inst, tree, cut, iter(range(1 << 62)))
    leaves = list(tree.leaves())
    return {
        "$schema": SCHEMA_ID,
        "policy": policy,
        "instance": {
            "id": inst.content_hash,
            "kind": inst.kind,
            "classes": list(inst.class_labels),
            **({"decisions": list(inst.decision_labels)} if inst.is_decision else {}),
            "n_hypotheses": inst.n_hypotheses,
            "n_tests": inst.n_tests,
        },
        "rules": {"max_tests": rules.max_tests, "max_cost": rules.max_cost,
                  "confidence": rules.effective_confidence(inst),
                  **({} if rules.max_expected_loss is None else {"max_expected_loss": rules.max_expected_loss})},
        "truncated_at_depth": cut,
        "summary": {
            "nodes": sum(1 for _ in tree.nodes()),
            "leaves": len(leaves),
            "depth": max(leaf.depth for leaf in leaves),
            "expected_cost": expected_cost(tree),
            "expected_tests": expected_tests(tree),
            "worst_case_cost": worst_case_cost(tree),
        },
        "root": root,
    }


def _node_dict(inst: CompiledInstance, node: TreeNode, cut: int | None, counter) -> dict:
    """One node of the tree and, recursively, its subtree (at most MAX_EXPORT_DEPTH deep)."""
    belief = node.belief
    posterior = belief.class_posterior
    top = int(np.argmax(posterior))
    out: dict = {
        "id": f"n{next(counter)}",
        "depth": node.depth,
        "probability": node.probability,
        "cost": node.cost,
        "class_posterior": {inst.class_labels[c]: float(posterior[c]) for c in np.flatnonzero(posterior > 0)},
        "map_class": inst.class_labels[top],
    }
    if inst.is_decision:
        out["decision"] = inst.decision_labels[final_decision(belief)]
        probability = decision_posterior(belief)
        out["decision_posterior"] = {inst.decision_labels[d]: float(probability[d])
                                     for d in np.flatnonzero(probability > 0)}
    if node.is_leaf:
        reason = node.decision.stop_reason
        out["stop_reason"] = reason.value if reason is not None else None
        out["truncated"] = bool(cut is not None and reason == StopReason.MAX_TESTS and node.depth >= cut)
        out["n_hypotheses"] = int(belief.alive.size)
        if inst.kind == "deterministic" and belief.alive.size <= MAX_LISTED_HYPOTHESES:
            out["hypotheses"] = [inst.hypothesis_ids[h] for h in belief.alive]
        return out
    t = node.test
    out["test"] = inst.test_ids[t]
    out["test_cost"] = float(inst.costs[t])
    out["branches"] = [
        {"outcome": inst.outcome_labels[t][k],
         "probability": child.probability / node.probability if node.probability > 0 else 0.0,
         "node": _node_dict(inst, child, cut, counter)}
        for k, child in sorted(node.children.items())
    ]
    return out


def tree_to_json(document: dict) -> str:
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


def tree_schema() -> dict:
    """The JSON Schema (draft 2020-12) of :func:`tree_to_dict`'s output."""
    text = resources.files("service.evaluation").joinpath("tree.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _quote(text: str) -> str:
    """A DOT double-quoted string: backslash and quote escaped; a newline becomes DOT's centred
    line break ``\\n``. Labels come from users, so they are never pasted in raw."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "")
    return '"' + escaped.replace("\n", "\\n") + '"'


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.0f}"


def tree_to_dot(document: dict) -> str:
    """Graphviz DOT of the JSON document: tests as rounded boxes, leaves coloured by class (on a
    decision instance: labelled and coloured by the decision)."""
    classes = document["instance"].get("decisions", document["instance"]["classes"])
    colour = {label: CLASS_COLOURS[i % len(CLASS_COLOURS)] for i, label in enumerate(classes)}
    settled = (StopReason.DETERMINED.value, StopReason.DECIDED.value)
    summary = document["summary"]
    title = (f"{document['policy']} policy tree — expected cost {_fmt(summary['expected_cost'])}, "
             f"expected tests {_fmt(summary['expected_tests'])}, worst case {_fmt(summary['worst_case_cost'])}")
    if document["truncated_at_depth"] is not None:
        title += f" (cut at depth {document['truncated_at_depth']}; figures of the cut tree)"
    lines = [
        "digraph policy_tree {",
        f"  graph [rankdir=TB, fontname=Helvetica, fontsize=12, labelloc=t, label={_quote(title)}];",
        "  node [fontname=Helvetica, fontsize=10];",
        "  edge [fontname=Helvetica, fontsize=9];",
    ]
    stack = [document["root"]]
    while stack:
        node = stack.pop()
        if "test" in node:
            label = f"{node['test']}\n(cost {_fmt(node['test_cost'])})"
            lines.append(f"  {node['id']} [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", "
                         f"label={_quote(label)}];")
            for branch in node["branches"]:
                child = branch["node"]
                edge = f"{branch['outcome']}\n{_fmt(branch['probability'])}"
                lines.append(f"  {node['id']} -> {child['id']} [label={_quote(edge)}];")
                stack.append(child)
        else:
            shown = node.get("decision", node["map_class"])
            label = f"{shown}\nP {_fmt(node['probability'])} · cost {_fmt(node['cost'])}"
            if node["stop_reason"] not in settled:
                if "decision" in node:
                    share = node["decision_posterior"].get(shown, 0.0)
                else:
                    share = node["class_posterior"].get(shown, 0.0)
                label += f"\n{'cut here' if node['truncated'] else node['stop_reason']} ({share:.0%})"
            style = "filled" if node["stop_reason"] in settled else "\"filled,dashed\""
            lines.append(f"  {node['id']} [shape=ellipse, style={style}, "
                         f"fillcolor=\"{colour.get(shown, '#ffffff')}\", label={_quote(label)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(dot_text: str, fmt: str = "svg", timeout: float = 30.0) -> bytes:
    """Run Graphviz ``dot -T<fmt>``; raises :class:`GraphvizMissing` when it is not installed."""
    if fmt not in ("svg", "png"):
        raise ValueError(f"cannot render '{fmt}'; choose svg or png")
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizMissing(
            "rendering SVG/PNG needs Graphviz's 'dot' program, which is not installed "
            "(Debian/Ubuntu: apt-get install graphviz); the json and dot formats work without it"
        )
    try:
        done = subprocess.run([dot, f"-T{fmt}"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise RenderTimedOut(f"Graphviz did not finish within {timeout:g} s") from error
    if done.returncode != 0:
        raise RenderFailed(f"Graphviz failed: {done.stderr.decode('utf-8', 'replace').strip()[:500]}")
    return done.stdout


def export_tree(
    inst: CompiledInstance,
    policy: str | None = None,
    fmt: str = "json",
    rules: StopRules = StopRules(),
    seed: int = 0,
    limits: TreeLimits = TreeLimits(),
    depth: int | None = None,
) -> bytes:
    """The tree in one of :data:`FORMATS`, as bytes ready to write or send."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tree format '{fmt}'; choose one of {', '.join(FORMATS)}")
    started = time.monotonic()
    name = resolve_policy(inst, policy, rules).name
    tree, used_rules, cut = build_tree(inst, name, rules, seed, limits, depth)
    document = tree_to_dict(inst, tree, name, used_rules, cut)
    if fmt == "json":
        return tree_to_json(document).encode("utf-8")
    dot_text = tree_to_dot(document)
    if fmt == "dot":
        return dot_text.encode("utf-8")
    if limits.time_limit is None:
        return render(dot_text, fmt, limits.render_timeout)
    # Drawing counts against the same limit as building.
    left = min(limits.render_timeout, limits.time_limit - (time.monotonic() - started))
    try:
        if left <= 0:
            raise RenderTimedOut("no time left to draw")
        return render(dot_text, fmt, left)
    except RenderTimedOut:
        raise EvaluationLimitExceeded(
            f"the policy tree would not be drawn within the {limits.time_limit:g} s limit "
            "(EVALUATION_TIME_LIMIT); ask for format=json or dot, or use edgecut tree") from None
