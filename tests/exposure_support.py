"""Item banks for the exposure-control tests, and an independent count of how often each item
is given: examinees drawn from the prior answer by the 3PL formula written here, not by the
compiled instance."""

from __future__ import annotations

import math

import numpy as np

from schemas.instance import Instance
from service import engine


def bank_of(n_items=40, seed=3):
    rng = np.random.default_rng(seed)
    return {"item_bank": {"items": [{"id": f"q{j}", "model": "3PL", "a": float(rng.lognormal(0, 0.25)),
                                     "b": float(rng.normal()), "c": float(rng.uniform(0, 0.25))}
                                    for j in range(n_items)], "cut_scores": [0.0]}}


def compiled(body):
    return engine.compile_instance(Instance.model_validate(body))


def with_parameters(body, parameters):
    items = [{**item, "exposure_parameter": float(k)} for item, k in zip(body["item_bank"]["items"], parameters)]
    return {"item_bank": {**body["item_bank"], "items": items}}


def rates_given(body, rules, examinees, first_seed):
    """Each item's share of ``examinees`` given it under ``rules``: θ ~ N(0, 1), answers drawn
    from the 3PL formula, each examinee's exposure-control draws from its own seed."""
    inst = compiled(body)
    policy = engine.resolve_policy(inst, None)
    rng = np.random.default_rng(first_seed)
    items = body["item_bank"]["items"]
    given = np.zeros(len(items))
    for e in range(examinees):
        theta = rng.normal()
        observations: list = []
        while not (decision := engine.decide(engine.observe(inst, observations), policy, rules,
                                             seed=first_seed + e)).done:
            item = items[decision.next_test]
            right = item["c"] + (1 - item["c"]) / (1 + math.exp(-item["a"] * (theta - item["b"])))
            observations.append((decision.next_test, int(rng.uniform() < right)))
        given[[t for t, _ in observations]] += 1
    return given / examinees
