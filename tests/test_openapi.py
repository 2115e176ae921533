"""openapi.yaml is the generated contract: current with the wire models, valid, complete."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from service.api.openapi import render
from service.api.problems import PROBLEMS
from service.app import create_app
from service.ui import PAGE_BLUEPRINTS

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_contract_is_current():
    assert (ROOT / "openapi.yaml").read_text() == render(), \
        "openapi.yaml is stale: python3 -m service.api.openapi > service/openapi.yaml"


def test_the_contract_is_valid_openapi_3_1():
    from openapi_spec_validator import validate

    validate(yaml.safe_load((ROOT / "openapi.yaml").read_text()))


def test_every_route_of_the_app_is_documented_with_its_methods():
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    app = create_app({"redis_url": None})
    served: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        # The pages for people (/ui, /docs) are HTML, not part of the API's contract.
        if rule.endpoint != "static" and rule.endpoint.split(".")[0] not in PAGE_BLUEPRINTS:
            path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)  # <path:test> is {test}
            served.setdefault(path, set()).update(rule.methods - {"HEAD", "OPTIONS"})
    documented = {path: {method.upper() for method in item} for path, item in spec["paths"].items()}
    assert served == documented


def test_every_problem_status_is_documented_somewhere():
    text = (ROOT / "openapi.yaml").read_text()
    spec = yaml.safe_load(text)
    statuses = {int(code) for item in spec["paths"].values() for op in item.values() for code in op["responses"]}
    assert {status for status, _, _ in PROBLEMS.values()} - {405} <= statuses
    assert all(code in text for code in PROBLEMS)  # each problem code is named in the contract
