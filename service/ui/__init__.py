"""The pages people open in a browser: ``/ui`` runs a session by hand, ``/docs`` is Swagger UI
over the served ``openapi.yaml`` (docs/ui.md).

Everything is served from package files — the page's own HTML, CSS and JS here, Swagger UI's
assets from the ``flask-swagger-ui`` package that vendors them — so the pages work on a machine
with no network. The session page is itself a client of ``/v1``: it posts instances and
observations through the public API with the user's API key, never through a side door.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import yaml
from flask import Blueprint, Flask, Response, abort, render_template, url_for
from flask_swagger_ui import get_swaggerui_blueprint

from service.engine import AUTO, POLICIES

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates", static_folder="static")
DOCS_BLUEPRINT = "swagger_ui"
# The blueprints of pages for people (HTML), which openapi.yaml does not describe.
PAGE_BLUEPRINTS = (bp.name, DOCS_BLUEPRINT)

# The policy tree is drawn beside the session for instances up to this many hypotheses; the
# tree endpoint's own node limit (TREE_MAX_NODES) still bounds it.
TREE_MAX_HYPOTHESES = 64
DEFAULT_EXAMPLE = "triage"
EXAMPLE_NAME = re.compile(r"\A[a-z0-9_]{1,64}\Z")
OBSERVATIONS_PATH = re.compile(r"\A/v1/sessions/\{[^}]+\}/observations\Z")
CORRECTIONS_PATH = re.compile(r"\A/v1/sessions/\{[^}]+\}/observations/\{[^}]+\}\Z")


# Only this service's own scripts, styles and images: a label in an instance can never run as
# code, even if it got into the page as markup by mistake.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


@bp.after_request
def _harden(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


@bp.get("/", strict_slashes=False)
def page() -> str:
    config = {
        "examples": [{"name": name, "title": title, "url": url_for(".example", name=name)}
                     for name, title in examples().items()],
        "policies": {AUTO: "the policy that does best on sessions simulated from the instance's own model",
                     **{name: policy.summary for name, policy in POLICIES.items()}},
        "defaultExample": DEFAULT_EXAMPLE,
        "features": features(),
        "treeMaxHypotheses": TREE_MAX_HYPOTHESES,
    }
    return render_template("ui.html", config=config)


@bp.get("/examples/<name>.json")
def example(name: str) -> Response:
    if not EXAMPLE_NAME.match(name) or name not in examples():
        abort(404)
    body = _examples_dir().joinpath(name, "instance.json").read_bytes()
    return Response(body, content_type="application/json")


@functools.cache
def examples() -> dict[str, str]:
    """The shipped example instances (service/ui/examples/<name>/, links to examples/<name>/)
    by name, each with the title line of its README."""
    found = {}
    for entry in sorted(_examples_dir().iterdir(), key=lambda e: e.name):
        if EXAMPLE_NAME.match(entry.name) and entry.joinpath("instance.json").is_file():
            readme = entry.joinpath("README.md")
            title = readme.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip() if readme.is_file() else ""
            found[entry.name] = title or entry.name
    return found


def _examples_dir():
    return resources.files("service.ui").joinpath("examples")


@functools.cache
def features() -> dict[str, bool]:
    """What the served contract offers beyond the first version, so the page shows a button only
    where the API has the operation: ``skip`` (an observation may be ``{test, skip: true}``) and
    ``corrections`` (``DELETE /v1/sessions/{id}/observations/{test}`` withdraws one)."""
    from service.api.health import openapi_text

    spec = yaml.safe_load(openapi_text())
    paths = spec.get("paths", {})
    corrections = any(CORRECTIONS_PATH.match(path) and "delete" in operations for path, operations in paths.items())
    observe = next((operations.get("post", {}) for path, operations in paths.items()
                    if OBSERVATIONS_PATH.match(path)), {})
    body = observe.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    return {"skip": _has_property(spec, body, "skip", set()), "corrections": corrections}


def _has_property(spec: dict, schema: Any, name: str, seen: set[str]) -> bool:
    """Whether ``schema`` (following ``$ref``s within ``spec``) declares a property ``name``."""
    if isinstance(schema, list):
        return any(_has_property(spec, item, name, seen) for item in schema)
    if not isinstance(schema, dict):
        return False
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        if ref in seen:
            return False
        seen.add(ref)
        target: Any = spec
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _has_property(spec, target, name, seen)
    properties = schema.get("properties")
    if isinstance(properties, dict) and name in properties:
        return True
    return any(_has_property(spec, value, name, seen) for value in schema.values())


def install(app: Flask) -> None:
    """Register ``/ui`` and ``/docs`` (Swagger UI; it never calls out: no validator badge)."""
    app.register_blueprint(bp)
    app.register_blueprint(get_swaggerui_blueprint(
        "/docs", "/openapi.yaml", config={"app_name": "edgecut API", "validatorUrl": None,
                                         "persistAuthorization": False}, blueprint_name=DOCS_BLUEPRINT))
