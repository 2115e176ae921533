"""openapi.yaml is the generated contract: current with the wire models, valid, complete."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import pytest
from flask import Blueprint

from service.api.contract import json_body, operation, problems
from service.api.openapi import paths_of, render
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


def test_a_route_without_its_operation_cannot_be_built_into_the_contract():
    app = create_app({"redis_url": None})
    extra = Blueprint("extra", __name__)
    extra.add_url_rule("/v1/undocumented", "undocumented", lambda: "")
    app.register_blueprint(extra)
    with pytest.raises(LookupError, match="extra.undocumented"):
        paths_of(app)


def test_a_documented_route_is_in_the_contract_under_its_path_and_methods():
    app = create_app({"redis_url": None})
    extra = Blueprint("extra", __name__)

    @extra.route("/v1/things/<path:thing>", methods=["PUT", "GET"])
    @operation("thing", "things", "A thing", responses={"200": json_body({"type": "object"}, "The thing"),
                                                       **problems(404)})
    def thing(thing: str) -> str:
        return thing

    app.register_blueprint(extra)
    item = paths_of(app)["/v1/things/{thing}"]
    assert list(item) == ["get", "put"]
    assert item["put"]["operationId"] == "thing" and set(item["put"]["responses"]) == {"200", "404"}
