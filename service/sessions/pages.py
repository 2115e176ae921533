"""Batch sessions propose a page of tests at once; the respondent answers them in any order."""

from __future__ import annotations

from service import engine
from service.store import SessionRecord

from .steps import Labelled, Steps


def last_page(steps: Steps, record: SessionRecord, compiled: engine.CompiledInstance,
              observations: Labelled) -> set[str]:
    """The tests of the page a batch session proposed last before it stopped (empty for a
    one-test session): the latest of the last ``batch_size`` states that was not done. Its
    remaining answers are still accepted once the session is done: the respondent saw them
    together and answered them in any order."""
    if record.batch_size <= 1:
        return set()
    for end in range(len(observations) - 1, max(-1, len(observations) - record.batch_size - 1), -1):
        state = steps.of_session(record, compiled, observations[:end])
        if not state.done:
            return set(state.next_tests)
    return set()
