"""Every command ``edgecut --help`` lists, run as after the README's quick-start install.

``pip install -c constraints.txt -e .`` installs edgecut's ``[project] dependencies`` and what
they need, and nothing from the extras. These tests run each command's main use in a child
Python whose imports are limited to exactly that: the standard library, this repository, and
the top-level modules of the distributions reachable from ``dependencies`` (read from
pyproject.toml and the installed packages' metadata). Any other import fails there as it would
on a machine without the package. So a command that reaches for matplotlib or tqdm (the
``plots`` extra) fails here, and the tests check it says in one line what to install instead of
printing a traceback.

What this does not prove: that pip resolves the pins on a fresh machine, or that a package is
importable when its own files are broken; the child uses the test environment's copies of the
allowed packages. ``test_the_quick_start_install_in_a_fresh_venv`` (slow: a real install from
the package index pip is configured with) covers the install itself.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
import requests
from conftest import free_port

from service.cli import COMMANDS

REPO = Path(__file__).resolve().parent.parent
TRIAGE = str(REPO / "examples" / "triage" / "instance.json")
PLOTS_LINE = "pip install 'edgecut[plots]'"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0]


def _top_level_modules(dist: importlib.metadata.Distribution) -> set[str]:
    names = set()
    for path in dist.files or ():
        top = path.parts[0]
        if top.endswith((".dist-info", ".data", ".pth")) or top in ("..", "__pycache__"):
            continue
        names.add(top.split(".")[0])
    return names


def base_install_modules() -> set[str]:
    """Top-level modules of every distribution ``pip install -e .`` brings, extras left out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pending = [_requirement_name(r) for r in project["dependencies"]]
    seen: set[str] = set()
    modules: set[str] = set()
    while pending:
        name = pending.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # excluded by its marker here (async-timeout on Python >= 3.11.3)
        modules |= _top_level_modules(dist)
        for requirement in dist.requires or ():
            # A dependency's own extras are not installed either; other markers (python version,
            # platform) are kept, which can only allow more.
            if "extra" not in requirement.partition(";")[2]:
                pending.append(_requirement_name(requirement))
    return modules


SITECUSTOMIZE = '''
import sys

ALLOWED = {allowed!r}


class _NotInstalled:
    """Refuses every top-level import that the quick-start install would not provide."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if path is None and top not in ALLOWED and top not in sys.stdlib_module_names \\
                and top not in sys.builtin_module_names and not top.startswith("_sysconfigdata"):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


@pytest.fixture(scope="module")
def quick_start_env(tmp_path_factory):
    """The environment of a child process that sees only the quick-start install's modules."""
    allowed = base_install_modules() | {"service", "schemas", "edgecut", "_distutils_hack"}
    assert "matplotlib" not in allowed and "tqdm" not in allowed and "pytest" not in allowed
    site = tmp_path_factory.mktemp("quick-start-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(allowed=sorted(allowed)))
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "REDIS_URL": "",
            "LOG_LEVEL": "warning"}


def edgecut(env, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=REPO, env=env,
                          input=stdin, capture_output=True, text=True, timeout=120)


def assert_one_line_install_hint(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgecut: error:") and PLOTS_LINE in lines[0], lines


def test_the_child_really_lacks_the_extras(quick_start_env):
    probe = subprocess.run([sys.executable, "-c", "import matplotlib"], env=quick_start_env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No module named 'matplotlib'" in probe.stderr
    numpy = subprocess.run([sys.executable, "-c", "import numpy, flask, redis"], env=quick_start_env,
                           capture_output=True, text=True, timeout=60)
    assert numpy.returncode == 0, numpy.stderr


@pytest.mark.parametrize("command", (None, *COMMANDS))
def test_every_help_text(quick_start_env, command):
    result = edgecut(quick_start_env, *([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: edgecut" in result.stdout


def test_evaluate_prints_its_table_and_plot_says_what_to_install(quick_start_env):
    result = edgecut(quick_start_env, "evaluate", TRIAGE, "--policies", "ec2,gbs")
    assert result.returncode == 0, result.stderr
    assert "ec2" in result.stdout and "gbs" in result.stdout and "optimum" in result.stdout
    assert_one_line_install_hint(edgecut(quick_start_env, "evaluate", TRIAGE, "--plot", "/tmp/never.png"))


def test_tree_writes_json_and_dot(quick_start_env, tmp_path):
    result = edgecut(quick_start_env, "tree", TRIAGE, "--policy", "ec2", "-o", str(tmp_path / "t.json"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "t.json").read_text().startswith("{")
    result = edgecut(quick_start_env, "tree", TRIAGE, "--format", "dot")
    assert result.returncode == 0 and result.stdout.startswith("digraph"), result.stderr


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot draws the SVG")
def test_tree_draws_svg_with_graphviz(quick_start_env, tmp_path):
    result = edgecut(quick_start_env, "tree", TRIAGE, "-o", str(tmp_path / "t.svg"))
    assert result.returncode == 0, result.stderr
    assert "<svg" in (tmp_path / "t.svg").read_text()


def test_tree_without_graphviz_says_so_in_one_line(quick_start_env, tmp_path):
    env = {**quick_start_env, "PATH": str(tmp_path)}  # no dot on this PATH
    result = edgecut(env, "tree", TRIAGE, "--format", "svg")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Graphviz" in result.stderr


def test_simulate_says_what_to_install(quick_start_env, tmp_path):
    result = edgecut(quick_start_env, "simulate", "lotteries", "--study", "fixed", "--subjects", "2",
                     "--tests", "2", "--policies", "random", "--out", str(tmp_path))
    assert_one_line_install_hint(result)
    assert not any(tmp_path.iterdir()), "nothing is written before the refusal"


def test_play_answers_questions_from_stdin(quick_start_env):
    result = edgecut(quick_start_env, "play", "lotteries", "--tests", "3", stdin="1\n2\n1\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Question ") == 3 and "best described by" in result.stdout


def test_serve_answers_a_session(quick_start_env):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                              cwd=REPO, env=quick_start_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if requests.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                assert time.monotonic() < deadline, "edgecut serve did not become ready"
                time.sleep(0.1)
        created = requests.post(url + "/v1/instances", data=Path(TRIAGE).read_bytes(),
                                headers={"Content-Type": "application/json"}, timeout=10)
        assert created.status_code == 201, created.text
        session = requests.post(url + "/v1/sessions", json={"instance_id": created.json()["instance_id"]},
                                timeout=10)
        assert session.status_code == 201 and session.json()["next_test"] is not None
        assert requests.get(url + "/ui", timeout=10).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_the_quick_start_install_in_a_fresh_venv(tmp_path):
    """The README's quick-start install line, verbatim, into a venv without system site
    packages, from the package index pip is configured with (~40 s with a local wheel cache);
    then the installed ``edgecut`` script runs outside the repository. The README's second line
    (the ``test`` extra) is what runs this suite, so the suite itself exercises it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    install = subprocess.run(
        textwrap.dedent(f"""\
            . {bin_dir}/activate
            cd {REPO}
            pip install -c constraints.txt -e ."""),
        shell=True, capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([str(bin_dir / "edgecut"), "evaluate", TRIAGE], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "optimum" in result.stdout
    plot = subprocess.run([str(bin_dir / "edgecut"), "evaluate", TRIAGE, "--plot", "x.png"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert_one_line_install_hint(plot)


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.py")))
def test_every_example_script_explains_itself_in_full(quick_start_env, example):
    script = REPO / "examples" / example
    result = subprocess.run([sys.executable, str(script), "--help"], cwd=REPO, env=quick_start_env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    docstring = ast.get_docstring(ast.parse(script.read_text()))
    first_paragraph = docstring.split("\n\n")[0]
    assert first_paragraph in result.stdout, "the help shows the script's description whole"
