"""Restricted exposure control across sessions: a test is held back while it has been given in
``max_rate`` of its instance's sessions or more (Revuelta & Ponsoda, 1998).

The counts live in the store (:class:`~service.store.base.ExposureCounts`), shared by every
worker: a session counts once when it is created and once for each test it is first given (an
answer or a skip: the respondent saw it). The tests held back (and those reserved for sessions
unsure of the class, service/engine/restricted.py) are fixed in the record whenever its
observations are stored, from the counts read just before, so a step stays a function of
the record and every worker (and every replay of a GET) proposes the same next test.

The cap is exact for sessions that run one after another. Sessions that run at once read the
counts before either has stored its answer, so each of k concurrent sessions may be given a
test that is one below its cap: a test can pass it by at most k − 1. A count that the store
refuses after the session's write went through is logged and left out, not answered as a failure
of a write that was stored (a retry would start a second session).
"""

from __future__ import annotations

import logging

import numpy as np

from service import engine
from service.store import SessionRecord, SessionStore, StoreUnavailable

from .steps import Labelled

log = logging.getLogger("service.sessions")

# The share of the cap below which the store may leave a test's count out: under the reserve's
# (engine/restricted.py), with room for the store's rounding, so no test that matters is left out.
LISTED_SHARE = 0.8


def restriction(store: SessionStore, compiled: engine.CompiledInstance, record: SessionRecord,
                starting: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tests ``record``'s session holds back and reserves for its next step, from the counts
    now (``starting``: the session is not counted yet, so it is added to the sessions)."""
    sessions, given = store.exposure_counts(record.instance_id, record.tenant, LISTED_SHARE * record.max_rate)
    counts = np.zeros(compiled.n_tests)
    for test, count in given.items():
        t = compiled.test_index.get(test)
        if t is not None:  # a count under an id this instance does not have is no one's
            counts[t] = count
    restricted = engine.restricted.restriction(counts, sessions + (1 if starting else 0), record.max_rate)
    return tuple(tuple(compiled.test_ids[t] for t in np.flatnonzero(tests)) for tests in restricted)


def first_given(before: SessionRecord, after: Labelled) -> tuple[str, ...]:
    """The tests ``after``'s observations show that ``before``'s did not: each is counted once
    per session (a repeated answer, a correction or a withdrawal shows nothing new)."""
    shown = {test for test, _ in before.observations}
    return tuple(dict.fromkeys(test for test, _ in after if test not in shown))


def count(store: SessionStore, record: SessionRecord, sessions: int = 0, tests: tuple[str, ...] = ()) -> None:
    """Count a session, or the tests it showed, once its write is stored."""
    try:
        store.count_exposure(record.instance_id, record.tenant, sessions=sessions, tests=tests)
    except StoreUnavailable as error:
        log.warning("exposure counts of instance %r (tenant %r) missed a session's use: %s",
                    record.instance_id, record.tenant, error)
