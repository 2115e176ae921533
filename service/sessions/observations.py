"""Recording observations (answers and skips) in a session."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service import engine
from service.errors import LimitExceeded, PreconditionFailed, PreconditionRequired
from service.store import SessionRecord

from .commit import Change
from .pages import Deadline, walk
from .steps import Labelled, Steps


@dataclass(frozen=True)
class Observe:
    """Record observations in order, all or nothing.

    Re-posting what is already recorded is a no-op, except an answer to a repeatable test, which
    is a new observation each time and therefore needs ``If-Match`` (428 without it), so a retry
    cannot count it twice. The same test with another outcome, or answered and skipped, is a
    conflict; anything new after the session stopped is refused, except the rest of the page it
    proposed last (batch sessions); an observation that contradicts every surviving hypothesis is
    refused and nothing is stored."""

    steps: Steps
    labelled: Sequence[tuple[str, str | None]]
    if_match: Callable[[int], bool] | None
    max_observations: int  # SESSION_MAX_OBSERVATIONS
    deadline: Deadline
    listed: bool = True  # posted as {observations: [...]}, not as one {test, ...}

    def plan(self, record: SessionRecord, compiled: engine.CompiledInstance) -> Change | None:
        fresh = new_observations(compiled, record, self.labelled)
        repeated = [test for test, outcome in fresh
                    if outcome is not None and compiled.repeatable_tests[compiled.test_index[test]]]
        if repeated and self.if_match is None:
            raise PreconditionRequired(
                f"test '{repeated[0]}' is repeatable, so posting its answer again would record it again: "
                "send If-Match with the session's ETag, so a retry of this request cannot be applied twice")
        if self.if_match is not None and not self.if_match(record.version) and fresh:
            # RFC 9110 §13.1.1: a change that has already been applied may answer 2xx.
            raise PreconditionFailed(f"If-Match does not name the session's current version (\"{record.version}\")")
        if not fresh:
            return None
        room = self.max_observations - len(record.observations)
        if len(fresh) > room:
            self.refuse_past(room, fresh)
        belief = walk(self.steps, record, compiled, fresh, self.deadline)
        return Change((*record.observations, *fresh), len(fresh), belief)

    def refuse_past(self, room: int, fresh: Labelled) -> None:
        """Refuse the request, naming the first posted observation past the session's room."""
        position, matched = 0, 0  # the fresh observations are the posted ones in order, replays left out
        for position, observation in enumerate(self.labelled):
            if matched < len(fresh) and tuple(observation) == fresh[matched]:
                if matched == max(room, 0):
                    break
                matched += 1
        path = f"observations[{position}]" if self.listed else "test"
        raise LimitExceeded("SESSION_MAX_OBSERVATIONS", self.max_observations,
                            f"the session holds {self.max_observations - room} observations and {len(fresh)} more "
                            "were posted", [{"path": path, "message": "past the session's observations"}])


def new_observations(compiled: engine.CompiledInstance, record: SessionRecord,
                     labelled: Sequence[tuple[str, str | None]]) -> Labelled:
    """The posted observations not yet recorded, with canonical labels (every answer to a
    repeatable test is new). Raises the engine's UnknownTest / UnknownOutcome /
    ConflictingObservation (positions as posted)."""
    parsed = engine.parse_observations(compiled, labelled)
    recorded = dict(record.observations)  # a repeatable test: its last answer, enough here
    fresh = []
    for t, k in parsed:
        test, outcome = labels_of(compiled, t, k)
        if test in recorded and (recorded[test] is None) != (outcome is None):
            raise engine.ConflictingObservation(
                f"test '{test}' was {'skipped' if recorded[test] is None else 'answered'} in this session; "
                f"to change that, PUT /v1/sessions/{record.session_id}/observations/{test}")
        if test in recorded and not (outcome is not None and compiled.repeatable_tests[t]):
            if recorded[test] != outcome:
                raise engine.ConflictingObservation(
                    f"test '{test}' was already observed as '{recorded[test]}' in this session; to correct "
                    f"it, PUT /v1/sessions/{record.session_id}/observations/{test}")
            continue
        fresh.append((test, outcome))
    return tuple(fresh)


def labels_of(compiled: engine.CompiledInstance, t: int, k: int) -> tuple[str, str | None]:
    return compiled.test_ids[t], None if k == engine.SKIPPED else compiled.outcome_labels[t][k]
