"""What ``policy: "auto"`` resolves to: computed once per instance and stop rules by the engine
(service/engine/recommend.py), then shared by every worker through the store.

The first worker to finish the simulation stores its result (:meth:`SessionStore.put_value`,
first writer wins) and every worker adopts the stored one, so all sessions of an instance under
the same stop rules run the same policy even when a CPU budget cut two simulations at different
points. Each worker also keeps the recommendations it has read, per tenant (a cache shared
between tenants would tell one by its speed what another had asked).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import orjson

from service import engine
from service.store import SessionStore

log = logging.getLogger(__name__)

# The simulation's seed: fixed, so that the same instance, stop rules and budget give the same
# pick wherever it is computed (when the respondent count, not the CPU time, ends it).
AUTO_SEED = 0
# Recommendations one worker keeps (a few kB each).
KEPT = 1024


class AutoChoices:
    """``auto`` per (tenant, instance, stop rules), over one store."""

    def __init__(self, store: SessionStore, budget: engine.Budget = engine.Budget(),
                 clock: Callable[[], float] = time.thread_time):
        self.store = store
        self.budget = budget
        self.clock = clock  # CPU seconds of the thread simulating
        self._kept: OrderedDict[tuple[str, str], engine.Recommendation] = OrderedDict()
        self._lock = threading.Lock()

    def choose(self, compiled: engine.CompiledInstance, rules: engine.StopRules,
               tenant: str) -> engine.Recommendation:
        """The recommendation for ``compiled`` under ``rules``: this worker's, the store's, or
        simulated now (within the budget) and stored."""
        name = self.value_name(compiled, rules)
        with self._lock:
            kept = self._kept.get((tenant, name))
            if kept is not None:
                self._kept.move_to_end((tenant, name))
                return kept
        recommendation = _decoded(self.store.get_value(name, tenant), name)
        if recommendation is None:
            simulated = engine.recommend(compiled, rules, seed=AUTO_SEED, budget=self.budget, clock=self.clock)
            stored = self.store.put_value(name, orjson.dumps(simulated.to_dict()), tenant)
            recommendation = _decoded(stored, name) or simulated
        with self._lock:
            self._kept[(tenant, name)] = recommendation
            if len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return recommendation

    def policy(self, compiled: engine.CompiledInstance, name: str | None, rules: engine.StopRules,
               tenant: str) -> str:
        """The policy a request runs: ``name``, or the instance's default when None, with
        ``auto`` resolved; unknown or inapplicable names are refused (the engine's errors)."""
        name = engine.default_policy(compiled) if name is None else name
        if name == engine.AUTO:
            name = self.choose(compiled, rules, tenant).policy
        return engine.resolve_policy(compiled, name, rules).name

    def value_name(self, compiled: engine.CompiledInstance, rules: engine.StopRules) -> str:
        """The store's name for a recommendation: everything it depends on — the content, the
        stop rules, the budget and seed, and the registered policies (a new one is a candidate)."""
        basis = orjson.dumps([compiled.content_hash, list(rules), self.budget.respondents, self.budget.cpu_seconds,
                              AUTO_SEED, list(engine.POLICIES)])
        return "auto:" + hashlib.sha256(basis).hexdigest()


def _decoded(raw: bytes | None, name: str) -> engine.Recommendation | None:
    """The stored recommendation; None when there is none, or it does not decode (logged, and
    computed again)."""
    if raw is None:
        return None
    try:
        return engine.Recommendation.from_dict(orjson.loads(raw))
    except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as error:
        log.error("the stored recommendation %s does not decode (%s); simulating again", name, error)
        return None
