"""Instances the tests build from definitions, shared so each is written once: the paper's two
bad instances (section 3 and the appendix), and compilation of wire dicts and reference models.

They are built here, not read from examples/, so a change to an example file cannot make the
tests agree with themselves."""

from __future__ import annotations

from schemas.instance import Instance
from service import engine
from tests import reference as ref


def compile_wire(payload: dict) -> engine.CompiledInstance:
    return engine.compile_instance(Instance.model_validate(payload))


def compile_model(model: ref.Model) -> engine.CompiledInstance:
    return compile_wire(ref.to_payload(model))


def section3(n: int) -> dict:
    """Section 3: uniform prior over h_1..h_n, H1 = {h_1..h_(n-1)}, H2 = {h_n}; test t_j (j = 0..n-1)
    answers [h = h_(j+1)]."""
    return {
        "tests": [{"id": f"t{j}", "outcomes": ["0", "1"]} for j in range(n)],
        "matrix": [[int(i == j) for j in range(n)] for i in range(n)],
        "classes": ["H1"] * (n - 1) + ["H2"],
        "hypothesis_ids": [f"h{i}" for i in range(1, n + 1)],
    }


def appendix(q: int, dummies: int = 3) -> dict:
    """The appendix: 2^q classes H_a = {h_(a,0), h_(a,1)}, uniform prior. Tests, in this order:
    t0 reveals v; t_k (k = 1..q) answers [bit_k(a) = v]; seq_k (k = 1..2^q) answers [a = k];
    dummies answer 0."""
    m = 2**q
    rows, classes, ids = [], [], []
    for a in range(1, m + 1):
        for v in (0, 1):
            bits = [int(((a >> (k - 1)) & 1) == v) for k in range(1, q + 1)]
            rows.append([v, *bits, *(int(a == k) for k in range(1, m + 1)), *([0] * dummies)])
            classes.append(f"H{a}")
            ids.append(f"h{a},{v}")
    test_ids = ["t0", *(f"t{k}" for k in range(1, q + 1)), *(f"seq{k}" for k in range(1, m + 1)),
                *(f"dummy{k}" for k in range(dummies))]
    return {"tests": [{"id": t, "outcomes": ["0", "1"]} for t in test_ids], "matrix": rows,
            "classes": classes, "hypothesis_ids": ids}
