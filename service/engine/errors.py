"""Errors the engine raises; the HTTP layer maps each to one problem type (service/api/problems.py)."""


class EngineError(ValueError):
    """Base class: a request the engine refuses. ``code`` is the stable machine-readable name."""

    code = "engine-error"


class InstanceTooLarge(EngineError):
    code = "instance-too-large"


class UnknownTest(EngineError):
    code = "unknown-test"


class UnknownOutcome(EngineError):
    code = "unknown-outcome"


class ConflictingObservation(EngineError):
    """The same test observed twice with different outcomes."""

    code = "conflicting-observation"


class InconsistentObservation(EngineError):
    """An observation that leaves no hypothesis alive (deterministic) or zero posterior mass."""

    code = "inconsistent"


class UnknownPolicy(EngineError):
    code = "unknown-policy"


class PolicyNotApplicable(EngineError):
    code = "policy-not-applicable"


class InfeasibleComputation(EngineError):
    """An exact computation (the optimal DP, a full tree) beyond the size it can be done in."""

    code = "infeasible"


class StopRuleNotApplicable(EngineError):
    """A stop rule the instance cannot apply (``max_expected_loss`` without losses); ``path``
    names the rule as a request spells it (``max_se``, ``exposure.method``), when one asked for it."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path
