"""The bounds of one evaluation (sizes, samples, time) and the refusal past one."""

from __future__ import annotations

import time
from dataclasses import dataclass

from service.engine import CompiledInstance, InfeasibleComputation


class EvaluationLimitExceeded(InfeasibleComputation):
    """The evaluation asked for more work than the configured limits allow (samples, time)."""

    code = "evaluation-limit"


@dataclass(frozen=True)
class EvaluationLimits:
    """Bounds on one evaluation; the HTTP layer sets them from its settings, the CLI is generous."""

    max_samples: int = 1_000_000
    max_tree_nodes: int = 200_000
    max_dp_states: int = 50_000
    time_limit: float | None = None  # seconds of wall clock for the whole evaluation
    # n · N · (number of policies): the deadline is checked between tree walks and between Monte
    # Carlo runs, so one walk or run must itself be small; this bounds it before anything starts.
    max_policy_cells: int | None = None


def check_size(inst: CompiledInstance, n_policies: int, method: str, samples: int,
               limits: EvaluationLimits) -> None:
    """Refuse, before any work, an evaluation past ``max_policy_cells`` or ``max_samples``."""
    work = inst.n_hypotheses * inst.n_tests * n_policies
    if limits.max_policy_cells is not None and work > limits.max_policy_cells:
        raise EvaluationLimitExceeded(
            f"{inst.n_hypotheses} hypotheses × {inst.n_tests} tests × {n_policies} policies = {work} "
            f"exceeds the limit of {limits.max_policy_cells} (max_policy_cells); evaluate fewer "
            "policies at a time, or use the command line (edgecut evaluate)"
        )
    if method == "monte_carlo" and not 1 <= samples <= limits.max_samples:
        raise EvaluationLimitExceeded(f"samples must be between 1 and {limits.max_samples} (max_samples)")


def check_deadline(deadline: float | None, limits: EvaluationLimits) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise EvaluationLimitExceeded(
            f"the evaluation would not finish within the {limits.time_limit:g} s limit "
            "(EVALUATION_TIME_LIMIT, time_limit); ask for fewer samples or fewer policies, or run "
            "edgecut evaluate, which has no time limit"
        )
