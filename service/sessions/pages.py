"""Walking a batch of new observations through the states they pass, and the pages of batch
sessions.

Each new observation must come before the session stops, or be on the page the session proposed
last before it stopped (batch sessions: the respondent saw those tests together and answers them
in any order). The walk carries one belief forward through the batch and asks the engine only
whether each state is done, so a batch costs one step per observation, not the JSON of every
state between.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from service import engine
from service.errors import SessionDone
from service.store import SessionRecord

from .steps import Labelled, StepKey, Steps, decide, session_key


class SessionWorkLimit(engine.InfeasibleComputation):
    """A request to a session would work past SESSION_TIME_LIMIT."""


@dataclass(frozen=True)
class Deadline:
    """When a request to a session must have finished its work (SESSION_TIME_LIMIT)."""

    at: float
    limit: float
    timer: Callable[[], float] = time.thread_time

    @classmethod
    def after(cls, limit: float, timer: Callable[[], float] = time.thread_time) -> Deadline:
        return cls(timer() + limit, limit, timer)

    def check(self) -> None:
        if self.timer() > self.at:
            raise SessionWorkLimit(f"the observations would not be applied within the {self.limit:g} s limit "
                                   "(SESSION_TIME_LIMIT); post them in smaller batches. Nothing is stored")


def walk(steps: Steps, record: SessionRecord, compiled: engine.CompiledInstance, fresh: Labelled,
         deadline: Deadline) -> engine.Belief:
    """The belief after ``fresh`` follows the record's observations, each checked in turn: the
    session must not have stopped before it (SessionDone), and no observation may leave no
    hypothesis alive (InconsistentObservation). Nothing is cached but the state before the first."""
    recorded = record.observations
    start = len(recorded)
    first_step, first_belief = steps.computed(record, compiled, recorded)
    parsed = tuple(engine.parse_observations(compiled, fresh, first_belief.observations, start))
    key = session_key(record, compiled, recorded)
    # The beliefs after the last batch_size observations walked, by their count of observations.
    window: deque[tuple[int, engine.Belief]] = deque(maxlen=record.batch_size)
    belief, done, stop_reason = first_belief, first_step.done, first_step.stop_reason
    for j, (test, _) in enumerate(fresh):
        if j:
            deadline.check()
            window.append((start + j - 1, belief))
            belief = engine.observe(compiled, parsed[:start + j], belief)
            # Whether a state is done does not depend on the page's size: one test is enough to ask.
            decision = decide(compiled, key, belief, batch_size=1)
            done, stop_reason = decision.done, decision.stop_reason
        if done and test not in last_page(steps, record, compiled, key, start + j, dict(window)):
            raise SessionDone(f"the session stopped ({stop_reason}) before '{test}' was observed; start a new "
                              "session to go on")
    return engine.observe(compiled, parsed, belief)


def last_page(steps: Steps, record: SessionRecord, compiled: engine.CompiledInstance, key: StepKey, count: int,
              walked: dict[int, engine.Belief]) -> set[str]:
    """The tests of the page a batch session proposed last before it stopped, after ``count``
    observations (empty for a one-test session): the latest of the last ``batch_size`` states
    that was not done. ``walked``: beliefs of states not recorded yet, by their count."""
    if record.batch_size <= 1:
        return set()
    for end in range(count - 1, max(-1, count - record.batch_size - 1), -1):
        if end in walked:
            decision = decide(compiled, key, walked[end])
            if not decision.done:
                return {compiled.test_ids[t] for t in decision.batch}
            continue
        state = steps.of_session(record, compiled, record.observations[:end])
        if not state.done:
            return set(state.next_tests)
    return set()
