"""Correcting (PUT) or withdrawing (DELETE) one recorded observation.

The state is recomputed from the edited facts, so a corrected session may stop, or go on again.
A result that leaves no consistent hypothesis is refused (409 inconsistent) and nothing is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schemas.api import ObservationCorrection
from service import engine
from service.errors import AmbiguousObservation, ObservationNotFound, PreconditionFailed, PreconditionRequired
from service.store import SessionRecord

from .commit import Change
from .steps import Labelled


@dataclass(frozen=True)
class Correct:
    """Replace a recorded observation of ``test`` by another outcome, or by a skip.

    Idempotent: replacing it by what it already is changes nothing (and answers 200 even on a
    stale If-Match, the change having been applied). A repeated test needs ``occurrence`` (1 =
    its first answer)."""

    test: str
    correction: ObservationCorrection
    occurrence: int | None
    if_match: Callable[[int], bool] | None

    def plan(self, record: SessionRecord, compiled: engine.CompiledInstance) -> Change | None:
        observations = record.observations
        position = position_of(compiled, observations, self.test, self.occurrence)
        outcome = self.correction.outcome
        if outcome is not None:
            t = compiled.test_index[self.test]
            if str(outcome) not in compiled.outcome_index[t]:
                raise engine.UnknownOutcome(f"'{outcome}' is not an outcome of test '{self.test}' "
                                            f"(expected one of {list(compiled.outcome_labels[t])})")
        edited = (*observations[:position], (self.test, outcome), *observations[position + 1:])
        if edited == observations:
            return None  # applied already: a replay, whatever If-Match says
        check_version(self.if_match, record)
        return Change(edited)


@dataclass(frozen=True)
class Withdraw:
    """Remove a recorded observation of ``test``: the state is recomputed as if it was never
    made, so the test may be proposed again. Withdrawing one answer of a repeatable test needs
    If-Match (a retry would withdraw the next one)."""

    test: str
    occurrence: int | None
    if_match: Callable[[int], bool] | None

    def plan(self, record: SessionRecord, compiled: engine.CompiledInstance) -> Change | None:
        observations = record.observations
        position = position_of(compiled, observations, self.test, self.occurrence)
        if compiled.repeatable_tests[compiled.test_index[self.test]] and self.if_match is None:
            raise PreconditionRequired(
                f"test '{self.test}' is repeatable, so a repeated withdrawal would remove another of its "
                "answers: send If-Match with the session's ETag")
        check_version(self.if_match, record)
        return Change((*observations[:position], *observations[position + 1:]))


def check_version(if_match: Callable[[int], bool] | None, record: SessionRecord) -> None:
    if if_match is not None and not if_match(record.version):
        raise PreconditionFailed(f"If-Match does not name the session's current version (\"{record.version}\")")


def position_of(compiled: engine.CompiledInstance, observations: Labelled, test: str, occurrence: int | None) -> int:
    """Where the observation a correction names is in the facts: the test's only one, or its
    ``occurrence``-th (1-based) when it was answered several times."""
    if test not in compiled.test_index:
        raise engine.UnknownTest(f"unknown test '{test}'")
    positions = [i for i, (recorded, _) in enumerate(observations) if recorded == test]
    if not positions:
        raise ObservationNotFound(f"test '{test}' has no observation in this session")
    if occurrence is None:
        if len(positions) > 1:
            raise AmbiguousObservation(f"test '{test}' was answered {len(positions)} times in this session; "
                                       "say which answer with ?occurrence=1 (first) to "
                                       f"?occurrence={len(positions)} (last)")
        return positions[0]
    if occurrence > len(positions):
        raise ObservationNotFound(f"test '{test}' has {len(positions)} observation(s) in this session, "
                                  f"not {occurrence}")
    return positions[occurrence - 1]
