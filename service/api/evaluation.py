"""``/v1/instances/{id}/evaluate`` and ``/v1/instances/{id}/tree``: how good a policy is on a
stored instance, and its whole decision tree (service/evaluation, docs/evaluation.md).

Long work is **bounded, not queued**: an evaluation runs inside the request with a wall-clock
limit well under the worker timeout (and a cap on samples, on the optimum's DP states and on tree
nodes); past a limit the request is refused with 422 and a detail naming the limit, so a worker
is never held beyond it. Deterministic evaluations are exact and fast (a tree walk visits at most
2n − 1 nodes); only large Monte Carlo runs meet the limit, and the CLI
(``edgecut evaluate``) has no such limit for them.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from schemas.api import EvaluateRequest
from service import engine
from service.evaluation import EvaluationLimits, evaluate
from service.evaluation import trees
from service.sessions import stop_rules
from service.settings import Settings

from .context import services, sessions, tenant
from .contract import INSTANCE_ID, json_body, operation, problems, request_body
from .bodies import parse_body
from .errors import GraphvizUnavailable, InvalidParameter
from .responses import json_response

bp = Blueprint("evaluation", __name__, url_prefix="/v1/instances")

TREE_FORMATS = ("json", "dot", "svg", "png")
TREE_PARAMETERS = [
    {"name": "format", "in": "query", "required": False, "schema": {"type": "string", "enum": list(TREE_FORMATS)}},
    {"name": "policy", "in": "query", "required": False, "schema": {"type": "string", "enum": engine.policy_names()}},
    {"name": "max_tests", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "max_cost", "in": "query", "required": False, "schema": {"type": "number", "exclusiveMinimum": 0}},
    {"name": "confidence", "in": "query", "required": False,
     "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
    {"name": "max_expected_loss", "in": "query", "required": False, "schema": {"type": "number", "minimum": 0}},
    {"name": "seed", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "depth", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 0, "maximum": Settings.model_fields["tree_max_depth"].default},
     "description": "At most TREE_MAX_DEPTH (the default shown); deeper is 422"},
]


@bp.post("/<instance_id>/evaluate")
@operation("evaluateInstance", "instances",
           "Expected cost, tests and accuracy of policies on a stored instance (docs/evaluation.md)",
           description="Bounded by time, samples and size limits; past one the answer is 422 naming it.",
           parameters=[INSTANCE_ID],
           body=request_body("EvaluateRequest", "Policies (default: all that apply; `auto` for the one it chooses), "
                             "stop rules, samples"),
           responses={"200": json_body({"type": "object", "properties": {"instance_id": {"type": "string"}},
                                        "required": ["instance_id"], "additionalProperties": True},
                                       "The evaluation report"),
                      **problems(400, 404, 413, 415, 422, 500, 503)})
def evaluate_policies(instance_id: str) -> Response:
    body = parse_body(EvaluateRequest)
    inst = sessions().instance(instance_id, tenant())
    settings = services().settings
    limits = EvaluationLimits(
        max_samples=settings.evaluation_max_samples,
        max_tree_nodes=2 * inst.n_hypotheses + 1,  # a deterministic tree never has more
        max_dp_states=settings.evaluation_max_dp_states,
        time_limit=settings.evaluation_time_limit,
        max_policy_cells=settings.evaluation_max_policy_cells,
    )
    rules = stop_rules(body)
    # What auto resolves to under these rules, when it is evaluated or every policy is.
    auto = None
    if body.policies is None or engine.AUTO in body.policies:
        auto = sessions().auto.choose(inst, rules, tenant())
    report = evaluate(inst, body.policies, rules, samples=body.samples, seed=body.seed,
                      optimum=body.optimum, limits=limits, auto=auto)
    return json_response({"instance_id": instance_id, **report.to_dict()})


@bp.get("/<instance_id>/tree")
@operation("getPolicyTree", "instances", "A policy's decision tree as JSON, DOT, SVG or PNG (docs/evaluation.md)",
           parameters=[INSTANCE_ID, *TREE_PARAMETERS],
           responses={"200": {"description": "The tree in the requested format", "content": {
               "application/json": {"schema": {"type": "object"}},
               "text/vnd.graphviz": {"schema": {"type": "string"}},
               "image/svg+xml": {"schema": {"type": "string"}},
               "image/png": {"schema": {"type": "string", "format": "binary"}}}},
               **problems(400, 404, 422, 500, 501, 503)})
def tree(instance_id: str) -> Response:
    fmt = request.args.get("format", "json")
    if fmt not in TREE_FORMATS:
        raise InvalidParameter(f"format must be one of {', '.join(TREE_FORMATS)}, got {fmt!r}")
    rules = engine.StopRules(
        max_tests=_int_arg("max_tests"), max_cost=_float_arg("max_cost"), confidence=_float_arg("confidence"),
        max_expected_loss=_float_arg("max_expected_loss"))
    settings = services().settings
    limits = trees.TreeLimits(max_nodes=settings.tree_max_nodes, max_depth=settings.tree_max_depth,
                              render_timeout=settings.evaluation_time_limit,
                              time_limit=settings.evaluation_time_limit)
    depth = _int_arg("depth")
    if depth is not None and depth > limits.max_depth:
        raise engine.InfeasibleComputation(f"depth must be at most {limits.max_depth} (tree_max_depth)")
    inst = sessions().instance(instance_id, tenant())
    policy = sessions().auto.policy(inst, request.args.get("policy"), rules, tenant())
    try:
        data = trees.export_tree(inst, policy, fmt, rules, _int_arg("seed") or 0, limits, depth)
    except trees.GraphvizMissing as error:
        raise GraphvizUnavailable(str(error)) from None
    return Response(data, content_type=trees.MEDIA_TYPES[fmt] + ("; charset=utf-8" if fmt != "png" else ""))


def _int_arg(name: str) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidParameter(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise InvalidParameter(f"{name} must be >= 0, got {value}")
    return value


def _float_arg(name: str) -> float | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidParameter(f"{name} must be a number, got {raw!r}") from None
    if name == "max_expected_loss":  # a loss may be 0
        if not 0 <= value < float("inf"):
            raise InvalidParameter(f"{name} must be a finite number >= 0, got {raw!r}")
        return value
    if not value > 0 or value == float("inf") or (name == "confidence" and value > 1):
        bound = "in (0, 1]" if name == "confidence" else "a finite number > 0"
        raise InvalidParameter(f"{name} must be {bound}, got {raw!r}")
    return value
