"""Between QTI's results and the session domain's observations and states.

In: each ``itemResult`` is an answer to the test its ``identifier`` names, with the outcome label
its response variable carries (read by schemas/cat.py's CatItemResult; an empty value list is a
skip). Out: a state becomes ``nextItems`` (the proposed tests, ``stageLength`` of them; none once
the session is done) and an assessment result whose test-level outcome variables say where the
session stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from schemas.cat import CatItemResult
from service.errors import ServiceError, SessionDone

Answer = tuple[str, "str | None"]  # (test, outcome label); None is a skip


class ItemNotAsked(ServiceError):
    code = "item-not-asked"


def answers_of(items: Sequence[CatItemResult]) -> list[Answer]:
    return [(item.identifier, item.outcome) for item in items]


def new_answers(state: dict[str, Any], answers: Sequence[Answer]) -> list[Answer]:
    """The answers that are not a replay of one the state already holds, checked against what
    was asked: each must answer an item of the current stage. A replay (the same item, the same
    outcome, already recorded and not asked again) is dropped, so a retried post changes nothing."""
    asked = {test["id"] for test in state["next_tests"]}
    recorded = {(h["test"], None if h.get("skipped") else h.get("outcome")) for h in state["history"]}
    new: list[Answer] = []
    for position, (test, outcome) in enumerate(answers):
        if test not in asked and (test, outcome) in recorded:
            continue
        if state["done"]:
            raise SessionDone(f"itemResult[{position}] answers '{test}' after the session stopped "
                              f"({state['stop_reason']}); nothing is stored")
        if test not in asked:
            raise ItemNotAsked(f"itemResult[{position}] answers '{test}', which is not an item of the current "
                               f"stage ({', '.join(sorted(asked))}); nothing is stored")
        new.append((test, outcome))
    return new


def next_items(state: dict[str, Any]) -> dict[str, Any]:
    items = [] if state["done"] else [test["id"] for test in state["next_tests"]]
    return {"itemIdentifiers": items, "stageLength": len(items)}


def assessment_result(session_id: str, state: dict[str, Any]) -> dict[str, Any]:
    """The session so far as a QTI assessment result: the test-level outcome variables."""
    posterior = state["class_posterior"]
    outcomes = [_variable("CLASS", "identifier", state["map_class"]),
                _variable("CLASS_PROBABILITY", "float", posterior.get(state["map_class"], 0.0))]
    if state.get("decision") is not None:
        outcomes += [_variable("DECISION", "identifier", state["decision"]["id"]),
                     _variable("DECISION_PROBABILITY", "float", state["decision"]["probability"])]
    outcomes += [_variable("COMPLETION_STATUS", "identifier", "completed" if state["done"] else "incomplete"),
                 _variable("ITEMS_ANSWERED", "integer", state["step"]),
                 _variable("COST_SPENT", "float", state["cost_spent"])]
    if state["stop_reason"] is not None:
        outcomes.append(_variable("STOP_REASON", "identifier", state["stop_reason"]))
    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return {"context": {"sessionIdentifiers": [{"sourceID": "edgecut", "identifier": session_id}]},
            "testResult": {"identifier": session_id, "datestamp": now, "outcomeVariable": outcomes}}


def _variable(identifier: str, base_type: str, value: Any) -> dict[str, Any]:
    return {"identifier": identifier, "cardinality": "single", "baseType": base_type,
            "value": [{"value": str(value)}]}
