"""Evaluating and exporting policies (pure Python/numpy, no Flask): expected and worst-case
cost, gap to the exact optimum, decision trees as JSON / DOT / SVG / PNG, comparison plots.
See docs/evaluation.md."""

from .limits import EvaluationLimitExceeded, EvaluationLimits
from .report import (
    ClassCost,
    EvaluationReport,
    PolicyEvaluation,
    default_policies,
    evaluate,
    work_units,
)
from .tables import format_recommendation, format_tables

__all__ = [name for name in dir() if not name.startswith("_")]
