"""VERSION is the one place for the release number: every other place that carries it (the
charts, the chart lock, the Python packages, the changelog) must agree, or this names the
file and the value to write there."""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from testlib import ROOT

VERSION = (ROOT / "VERSION").read_text().strip()


def _yaml(rel: str) -> Any:
    return yaml.safe_load((ROOT / rel).read_text())


def _pyproject(rel: str) -> str:
    return str(tomllib.loads((ROOT / rel).read_text())["project"]["version"])


def _pin(rel: str, name: str) -> str:
    """The version a package pins one of the project's own packages at."""
    deps = tomllib.loads((ROOT / rel).read_text())["project"]["dependencies"]
    (pin,) = [d.split("==")[1] for d in deps if d.split("==")[0] == name]
    return str(pin)


def _dunder_version(rel: str) -> str:
    tree = ast.parse((ROOT / rel).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise AssertionError(f"{rel}: no __version__")


def _dependency(rel: str) -> str:
    (dep,) = [d for d in _yaml(rel)["dependencies"] if d["name"] == "etcd-rendezvous"]
    return str(dep["version"])


def _changelog_top() -> str:
    match = re.search(r"^## \[(\d[^\]]*)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert match, "CHANGELOG.md has no '## [x.y.z]' section"
    return match[1]


PLACES: dict[str, Callable[[], str]] = {
    "charts/elastic-job/Chart.yaml version": lambda: str(
        _yaml("charts/elastic-job/Chart.yaml")["version"]
    ),
    "charts/elastic-job/Chart.yaml appVersion (the images' tag)": lambda: str(
        _yaml("charts/elastic-job/Chart.yaml")["appVersion"]
    ),
    "charts/elastic-job/Chart.yaml dependencies[etcd-rendezvous].version": lambda: _dependency(
        "charts/elastic-job/Chart.yaml"
    ),
    "charts/elastic-job/Chart.lock dependencies[etcd-rendezvous].version": lambda: _dependency(
        "charts/elastic-job/Chart.lock"
    ),
    "charts/elastic-job-cluster/Chart.yaml version": lambda: str(
        _yaml("charts/elastic-job-cluster/Chart.yaml")["version"]
    ),
    "charts/elastic-job-cluster/Chart.yaml appVersion (the worker metrics it reads)": lambda: str(
        _yaml("charts/elastic-job-cluster/Chart.yaml")["appVersion"]
    ),
    "charts/etcd-rendezvous/Chart.yaml version": lambda: str(
        _yaml("charts/etcd-rendezvous/Chart.yaml")["version"]
    ),
    "pyproject.toml [project] version": lambda: _pyproject("pyproject.toml"),
    "images/worker/pyproject.toml [project] version": lambda: _pyproject(
        "images/worker/pyproject.toml"
    ),
    "images/init-topology/pyproject.toml [project] version": lambda: _pyproject(
        "images/init-topology/pyproject.toml"
    ),
    "packages/torch-etcd-v3/pyproject.toml [project] version": lambda: _pyproject(
        "packages/torch-etcd-v3/pyproject.toml"
    ),
    "packages/elastic-job-cli/pyproject.toml [project] version": lambda: _pyproject(
        "packages/elastic-job-cli/pyproject.toml"
    ),
    "packages/elastic-snapshot/pyproject.toml [project] version": lambda: _pyproject(
        "packages/elastic-snapshot/pyproject.toml"
    ),
    "images/init-topology/src/init_topology/__init__.py __version__": lambda: _dunder_version(
        "images/init-topology/src/init_topology/__init__.py"
    ),
    "pyproject.toml dependencies elastic-worker==": lambda: _pin(
        "pyproject.toml", "elastic-worker"
    ),
    "images/worker/pyproject.toml dependencies torch-etcd-v3==": lambda: _pin(
        "images/worker/pyproject.toml", "torch-etcd-v3"
    ),
    "CHANGELOG.md newest section": _changelog_top,
    "values-examples/argocd/application.yaml targetRevision (v<VERSION>)": lambda: str(
        _yaml("values-examples/argocd/application.yaml")["spec"]["source"]["targetRevision"]
    ).removeprefix("v"),
}


def test_version_file_is_one_semver() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", VERSION), VERSION
    assert (ROOT / "VERSION").read_text() == VERSION + "\n"


@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_place_carries_the_version_file(place: str) -> None:
    """A release bumps VERSION, then each place this lists (the test names the one left)."""
    got = PLACES[place]()
    assert got == VERSION, f"{place} is {got!r}: set it to {VERSION!r} (VERSION is the source)"


def test_no_other_file_carries_the_version_unchecked() -> None:
    """Every project file (outside tests/) that mentions the version is a checked place, so a
    new copy cannot appear unnoticed."""
    checked = {Path(p.split(" ")[0]) for p in PLACES} | {Path("VERSION")}
    pattern = re.compile(rf"(?<![\d.]){re.escape(VERSION)}(?![\d])")
    # Tests hold expected values; git's list leaves out .venv, .tools and other ignored files.
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    found = set()
    for name in listed:
        rel, path = Path(name), ROOT / name
        if rel.parts[0] == "tests" or not path.is_file() or path.is_symlink():
            continue
        if path.suffix not in {".yaml", ".yml", ".toml", ".py", ".json", ".lock", ""}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if pattern.search(text):
            found.add(rel)
    # The Artifact Hub images annotation and the docs name image tags: checked elsewhere.
    unchecked = sorted(str(f) for f in found - checked)
    assert not unchecked, (
        f"{unchecked} carry {VERSION!r} unchecked: read it from VERSION there, or add the "
        "place to PLACES in tests/release/test_version.py"
    )
