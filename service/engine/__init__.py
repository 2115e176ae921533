"""The mathematics of adaptive testing: pure functions on numpy arrays (no Flask, no Redis).

Typical use::

    from schemas.instance import Instance
    from service import engine

    inst = engine.compile_instance(Instance.model_validate(payload))
    decision = engine.next_step(inst, engine.parse_observations(inst, [("ecg", "abnormal")]))
    decision.next_test_id, decision.stop_reason, decision.class_posterior   # 'ecg', None, {'admit': 0.7, ...}
"""

from .belief import SKIPPED, Belief, Observation, OutcomeStats, observe, parse_observations
from .compilation import compile_instance, count_noisy_copies
from .compiled import CompiledInstance, log_p_min_bound
from .item_bank import item_probabilities, theta_estimate
from .errors import (
    ConflictingObservation,
    EngineError,
    InconsistentObservation,
    InfeasibleComputation,
    InstanceTooLarge,
    PolicyNotApplicable,
    StopRuleNotApplicable,
    UnknownOutcome,
    UnknownPolicy,
    UnknownTest,
)
from .evaluate import (
    RunResult,
    TreeNode,
    expected_cost,
    expected_tests,
    final_decision,
    optimal_decision_cost,
    optimal_expected_cost,
    policy_tree,
    run_policy,
    worst_case_cost,
)
from . import item_bank, restricted
from .intervals import mean_interval, wilson_interval
from .policies import AUTO, DEFAULT_POLICIES, POLICIES, Policy, default_policy, policy_names, resolve_policy
from .recommend import Budget, CandidateResult, Recommendation, applicable_policies, recommend
from .regions import choose_decision, decision_posterior, expected_loss
from .select import (
    DEFAULT_LIKELIHOOD_CONFIDENCE,
    MAX_BATCH_BRANCHES,
    MAX_BATCH_CELLS,
    Decision,
    StopReason,
    StopRules,
    check_batch,
    decide,
    greedy_batch,
    next_step,
)

__all__ = [name for name in dir() if not name.startswith("_")]
