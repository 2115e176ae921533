"""docs/architecture.md stays true: the imports flow the way its picture says, every path and
test it names exists, every module under service/ is in its table (by path or by folder), and
every registered policy has its row in docs/engine.md's policy table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from service.engine import POLICIES

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"

# What each layer may import from the project besides itself (the package ``service`` alone,
# which holds only the version, is open to all). A layer not listed sits on top: it may import
# any layer, and no listed layer may import it. The house rule behind the lower rows: the engine
# is pure numpy, api → engine/store → schemas, and nothing imports upwards.
MAY_IMPORT: dict[str, set[str]] = {
    "schemas": set(),
    "service.engine": {"schemas"},
    "service.store": {"schemas", "service.engine"},
    "service.evaluation": {"schemas", "service.engine"},
    "service.examples": {"schemas", "service.engine"},
    "service.errors": set(),
    "service.metrics": set(),
    "service.logs": set(),
    "service.heap": set(),
    "service.settings": {"service.logs"},
    "service.auto": {"schemas", "service.engine", "service.store"},
    "service.sessions": {"schemas", "service.engine", "service.store", "service.auto", "service.errors",
                         "service.metrics"},
    "service.api": {"schemas", "service.engine", "service.store", "service.evaluation", "service.auto", "service.heap",
                    "service.sessions", "service.errors", "service.metrics", "service.logs", "service.settings"},
    "edgecut": {"schemas"},
}
# Single modules allowed one step past their layer's row, and why.
EXCEPTIONS: dict[str, set[str]] = {
    # The contract's generator builds the app to walk its routes (and leaves out the pages').
    "service.api.openapi": {"service.app", "service.ui"},
}
# Third-party packages a layer must not import: no web framework or Redis below the views.
NOT_BELOW_THE_VIEWS = {"flask", "werkzeug", "redis", "gunicorn", "prometheus_client"}
MAY_NOT_IMPORT = {
    "schemas": NOT_BELOW_THE_VIEWS,
    "service.engine": NOT_BELOW_THE_VIEWS,
    "service.evaluation": NOT_BELOW_THE_VIEWS,
    "service.store": {"flask", "werkzeug", "gunicorn"},
    "service.sessions": {"flask", "werkzeug", "gunicorn", "redis"},
}
PROJECT = ("schemas", "service", "edgecut")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer row of MAY_IMPORT a module belongs to (the longest matching prefix), or None."""
    matches = [layer for layer in MAY_IMPORT if module == layer or module.startswith(layer + ".")]
    return max(matches, key=len) if matches else None


def imported(module: str, is_package: bool, source: str) -> set[str]:
    """The project modules (and the top-level names of third-party ones) a module's source
    imports, anywhere in it (imports inside functions count too)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            # ``from service import engine`` imports service.engine, not the package alone.
            for alias in node.names:
                candidate = ROOT.joinpath(*f"{base}.{alias.name}".split("."))
                if candidate.is_dir() or candidate.with_suffix(".py").exists():
                    names.add(f"{base}.{alias.name}")
    return {name for name in names if name and name != "__future__"}


def violations(module: str, is_package: bool, source: str) -> list[str]:
    """What a module imports against MAY_IMPORT, MAY_NOT_IMPORT and EXCEPTIONS."""
    layer = layer_of(module)
    if layer is None:
        return []  # a top layer: it may import any layer
    allowed = MAY_IMPORT[layer] | EXCEPTIONS.get(module, set())
    found = []
    for name in sorted(imported(module, is_package, source)):
        top = name.split(".")[0]
        if top in MAY_NOT_IMPORT.get(layer, set()):
            found.append(f"{module} imports {name}: {layer} must not")
        if top not in PROJECT or name == "service" or layer_of(name) == layer:
            continue
        target = layer_of(name) or name
        if not any(target == ok or target.startswith(ok + ".") for ok in allowed):
            found.append(f"{module} imports {name}, above its layer: {layer} may import only {sorted(allowed)}")
    return found


def sources() -> list[Path]:
    return sorted(path for top in PROJECT for path in (ROOT / top).rglob("*.py"))


def test_the_layer_table_names_modules_that_exist():
    for layer in MAY_IMPORT.keys() | {name for allowed in MAY_IMPORT.values() for name in allowed}:
        path = ROOT.joinpath(*layer.split("."))
        assert path.is_dir() or path.with_suffix(".py").exists(), f"{layer} is not a module"


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_flow_down_the_layers(path):
    assert violations(module_name(path), path.name == "__init__.py", path.read_text()) == []


def test_an_upward_import_or_flask_in_the_engine_is_caught():
    source = "from flask import Flask\nfrom ..sessions import Sessions\nfrom service import store\n"
    assert len(violations("service.engine.rogue", False, source)) == 3
    assert violations("service.app", False, source) == []  # a top layer


# --- the page names what exists ----------------------------------------------------------------

PATH = re.compile(r"(?<![\w/.-])((?:schemas|service|edgecut|deploy|bench|examples|tests|docs)/[\w./-]*\w/?)")
TEST_REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_path_the_page_names_exists():
    text = PAGE.read_text()
    named = PATH.findall(text)
    assert len(named) >= 40, "the page names fewer paths than it should: is the pattern still right?"
    for name in named:
        path = ROOT / name.split("::")[0]
        assert path.exists(), f"docs/architecture.md names {name}, which does not exist"


def test_every_test_the_page_names_exists():
    text = PAGE.read_text()
    cited = TEST_REFERENCE.findall(text)
    assert len(cited) >= 12, "the checklists name fewer tests than they should"
    for file, test in cited:
        assert re.search(rf"^\s*def {test}\(", (ROOT / file).read_text(), re.M), \
            f"docs/architecture.md cites {file}::{test}, which is not a test there"


def test_every_module_under_service_is_in_the_page_by_path_or_folder():
    named = {name.rstrip("/") for name in PATH.findall(PAGE.read_text())}
    for path in sorted((ROOT / "service").rglob("*.py")):
        relative = path.relative_to(ROOT)
        folders = {parent.as_posix() for parent in relative.parents if parent.as_posix() not in (".", "service")}
        assert relative.as_posix() in named or folders & named, \
            f"docs/architecture.md names neither {relative} nor its folder: say where it sits"


def test_every_registered_policy_has_its_row_in_docs_engine_md():
    text = (ROOT / "docs" / "engine.md").read_text()
    table = text.split("\n## Policies\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(\w+)`", table, re.M))
    assert set(POLICIES) <= rows, f"docs/engine.md has no row for {sorted(set(POLICIES) - rows)}"


# /v1 operations the Python client does not call, and why.
NOT_IN_THE_CLIENT = {
    ("GET", "/v1/instances/{}/tree"): "a decision tree is for people: edgecut tree and the page draw it",
}


def test_every_api_operation_is_called_by_the_client():
    """A /v1 operation added to openapi.yaml fails here until edgecut/client.py calls it (or
    NOT_IN_THE_CLIENT says why not)."""
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    operations = {(method.upper(), re.sub(r"\{\w+\}", "{}", path))
                  for path, item in spec["paths"].items() if path.startswith("/v1/") for method in item}
    source = (ROOT / "edgecut" / "client.py").read_text()
    called = {(method, re.sub(r"\{[^}]*\}", "{}", path))
              for method, path in re.findall(r'"(GET|POST|PUT|DELETE)",\s*f?"(/v1/[^"]*)"', source)}
    assert len(called) >= 10, "the pattern finds fewer calls than the client makes"
    assert not NOT_IN_THE_CLIENT.keys() - operations, "NOT_IN_THE_CLIENT names an operation that is gone"
    missing = operations - called - NOT_IN_THE_CLIENT.keys()
    assert not missing, f"edgecut/client.py never calls {sorted(missing)}"
