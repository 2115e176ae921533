"""Computing a session's steps, and the per-process cache that keeps them.

A step is the engine's decision after some observations, rendered as JSON (state.py). It depends
only on what :class:`StepKey` holds, so any worker computes the same step from the same facts.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from service import engine
from service.metrics import SELECTION_SECONDS
from service.store import SessionRecord
from service.store.cache import ByteBoundedLRU

from .state import Step, step_of

# Observations by label; the outcome of a skipped test is None.
Labelled = tuple[tuple[str, str | None], ...]

# A step and the belief it was computed from (None when the step cache did not keep it).
Computed = tuple[Step, "engine.Belief | None"]

# Estimates from above of CPython's objects (64-bit): a 2-tuple of one observation and its slot
# in the tuple of all of them, and a key's members but its labels (the rules, the tuples, the
# hash string, the tenant's name of at most 64 ASCII characters).
OBSERVATION_BYTES = 72
KEY_BYTES = 1024


class StepKey(NamedTuple):
    """Everything a step depends on, and the tenant asking: one tenant's steps are never another's
    cache hits, so nothing one tenant does changes how fast another's identical step is answered
    (the latency would tell it what the other answered)."""

    tenant: str
    instance: str  # content hash
    policy: str
    rules: engine.StopRules
    seed: int | None  # None when the policy does not draw from it
    excluded: tuple[str, ...]
    batch_size: int
    # Restricted exposure control's tests held back and reserved, from the counts the record fixed.
    held_back: tuple[str, ...]
    reserved: tuple[str, ...]
    observations: Labelled


def step_key(tenant: str, compiled: engine.CompiledInstance, policy: str, rules: engine.StopRules, seed: int,
             observations: Labelled, excluded: tuple[str, ...], batch_size: int,
             restriction: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())) -> StepKey:
    # Sessions that differ in their seed alone share their steps, unless the policy draws from it.
    seeded = engine.resolve_policy(compiled, policy).seeded or rules.draws_for_exposure
    return StepKey(tenant, compiled.content_hash, policy, rules, seed if seeded else None, excluded, batch_size,
                   *restriction, observations)


def session_key(record: SessionRecord, compiled: engine.CompiledInstance, observations: Labelled) -> StepKey:
    """The key of the step after ``observations`` in ``record``'s session."""
    rules = engine.StopRules(record.max_tests, record.max_cost, record.confidence, record.max_expected_loss,
                             record.max_se, record.randomesque, bool(record.sympson_hetter), bool(record.progressive),
                             record.max_rate)
    seed = session_seed(record.seed, record.session_id) if rules.draws_for_exposure else record.seed
    return step_key(record.tenant, compiled, record.policy, rules, seed, observations, record.exclude_tests,
                    record.batch_size, (record.held_back, record.reserved))


def session_seed(seed: int, session_id: str) -> int:
    """The seed a session's exposure control draws from: its own seed and its id, so two sessions
    with the same answers (and the default seed) do not ask the same items, while a session's
    replays draw the same."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{session_id}".encode()).digest()[:8], "little")


def key_bytes(key: StepKey, compiled: engine.CompiledInstance) -> int:
    """A step cache key's bytes, from above: every label as large as the instance's largest of
    its kind (a key's labels are the instance's test ids and outcome labels, or equal strings),
    counted in full though the keys of one session's steps share those of their common
    observations."""
    test_bytes, outcome_bytes = compiled.largest_label_bytes
    return (KEY_BYTES + (OBSERVATION_BYTES + test_bytes + outcome_bytes) * len(key.observations)
            + test_bytes * (len(key.excluded) + len(key.held_back) + len(key.reserved)))


def belief_bytes(belief: engine.Belief) -> int:
    arrays = {id(a): a for a in (belief.alive, belief.mass, belief.support, belief.log_posterior) if a is not None}
    return sum(a.nbytes for a in arrays.values())


def decide(compiled: engine.CompiledInstance, key: StepKey, belief: engine.Belief,
           batch_size: int | None = None) -> engine.Decision:
    """The engine's decision on ``belief`` under the key's policy and rules (``batch_size``: the
    key's unless given)."""
    restriction = None
    if key.rules.max_rate is not None:
        restriction = engine.restricted.Restriction(_mask(compiled, key.held_back), _mask(compiled, key.reserved))
    # The key holds the seed whenever the policy draws from it.
    return engine.decide(belief, engine.resolve_policy(compiled, key.policy), key.rules, key.seed or 0,
                         _mask(compiled, key.excluded) if key.excluded else None,
                         key.batch_size if batch_size is None else batch_size, restriction)


def _mask(compiled: engine.CompiledInstance, tests: tuple[str, ...]) -> np.ndarray:
    """(N,) bool of ``tests`` (known ids)."""
    mask = np.zeros(compiled.n_tests, dtype=bool)
    mask[[compiled.test_index[t] for t in tests]] = True
    return mask


class _Entry(NamedTuple):
    step: Step
    belief: engine.Belief | None  # None when not kept (see StepCache)
    nbytes: int


class StepCache(ByteBoundedLRU):
    """A small per-process LRU of computed steps keyed by everything a step depends on
    (instance, policy, stop rules, the seed where the policy draws from it, observations). A POST
    of an observation needs the step before it (is the session done?) and after it; the one
    before is usually the step this worker answered last time, so it is not computed twice, and
    its belief is carried forward to compute the one after (a pass over the survivors, not over
    every row).

    Bounded by the bytes its entries hold, not their number: keys (:func:`key_bytes`), steps
    (:attr:`Step.nbytes`; a step of a long session carries its whole history) and the beliefs
    kept to carry forward (their arrays). A belief over an eighth of the budget is not kept (its
    step is): it would push out many steps to save one pass.

    ``hits`` and ``misses`` count :meth:`get`'s answers (for tests and diagnostics)."""

    hits = 0
    misses = 0

    def get(self, key: StepKey) -> Step | None:
        entry = self.lookup(key)
        return None if entry is None else entry[0]

    def lookup(self, key: StepKey) -> Computed | None:
        """The step and the belief it was computed from (None when not kept)."""
        entry = self._lookup(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry.step, entry.belief

    def computed(self, key: StepKey) -> Computed | None:
        """The step and the belief it was computed from (None when not kept), without touching
        the order of eviction."""
        entry = self._peek(key)
        return None if entry is None else (entry.step, entry.belief)

    def put(self, key: StepKey, step: Step, belief: engine.Belief) -> None:
        size = key_bytes(key, belief.instance) + step.nbytes
        held = belief_bytes(belief)
        if held > self.max_bytes // 8:
            belief, held = None, 0
        if size + held <= self.max_bytes:  # else nothing changes, not even an entry of this key
            self._keep(key, _Entry(step, belief, size + held))


class Steps:
    """The steps of sessions and of stateless selects, computed once per worker while cached."""

    def __init__(self, cache_bytes: int):
        self.cache = StepCache(cache_bytes)

    def get(self, key: StepKey) -> Step | None:
        return self.cache.get(key)

    def of_session(self, record: SessionRecord, compiled: engine.CompiledInstance, observations: Labelled) -> Step:
        """The step after ``observations`` in ``record``'s session."""
        return self.compute(compiled, session_key(record, compiled, observations))

    def computed(self, record: SessionRecord, compiled: engine.CompiledInstance,
                 observations: Labelled) -> tuple[Step, engine.Belief]:
        """The step after ``observations`` in ``record``'s session, and its belief."""
        key = session_key(record, compiled, observations)
        entry = self.cache.lookup(key)
        if entry is not None and entry[1] is not None:
            return entry  # type: ignore[return-value]
        belief = self.observe(compiled, key)
        step = entry[0] if entry is not None else self.compute(compiled, key, belief)
        return step, belief

    def compute(self, compiled: engine.CompiledInstance, key: StepKey, belief: engine.Belief | None = None) -> Step:
        """The step ``key`` names (``belief``: its belief, from :meth:`observe`, given by a caller
        that found no step under ``key``)."""
        step = self.cache.get(key) if belief is None else None
        if step is None:
            with SELECTION_SECONDS.time():
                if belief is None:
                    belief = self.observe(compiled, key)
                decision = decide(compiled, key, belief)
            step = step_of(compiled, key.policy, decision)
            self.cache.put(key, step, belief)
        return step

    def observe(self, compiled: engine.CompiledInstance, key: StepKey) -> engine.Belief:
        """The belief after the key's observations, carried forward from the step before's when
        this worker kept it; raises InconsistentObservation when they leave no hypothesis alive."""
        observations = key.observations
        previous = self.cache.computed(StepKey(*key[:-1], observations[:-1])) if observations else None
        before = None if previous is None else previous[1]
        if before is None:
            parsed = engine.parse_observations(compiled, observations)
        else:  # its belief's observations are the parse of all but the last
            parsed = engine.parse_observations(compiled, observations[-1:], before.observations, len(observations) - 1)
        return engine.observe(compiled, parsed, before)
