"""The command installs beside a user's own tools without moving them: its requirements are
ranges with a floor, and pip's resolver, asked for the command together with a newer
`kubernetes` than the dev venv's (and the urllib3 that client needs), keeps that client.

test_pip_keeps_a_newer_client_beside_the_command needs PyPI (pip reads the index and the
packages' metadata; nothing is installed): about 35 s here; skipped, saying so, when pip's
index cannot be reached (offline, or a mirror down). Before: the pin
kubernetes==35.0.0 made the two impossible together (pip: ResolutionImpossible), and pip
replaced an installed 37.0.2 with 35.0.0.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version
from testlib import ROOT

PACKAGE = ROOT / "packages" / "elastic-job-cli"
#: A user's client newer than the dev venv's pin (requirements/dev.txt): the pydantic
#: rewrite, and urllib3 >= 2.8 (tests/cli passed on it, run by hand: the commit says).
NEWER_CLIENT = "kubernetes==37.0.2"


def _requirements() -> list[Requirement]:
    data = tomllib.loads((PACKAGE / "pyproject.toml").read_text())
    return [Requirement(r) for r in data["project"]["dependencies"]]


def test_requirements_are_ranges_with_a_floor() -> None:
    """A library pins nothing and caps nothing: a cap is a future downgrade."""
    for req in _requirements():
        ops = [s.operator for s in req.specifier]
        assert ops == [">="], f"{req}: give a floor (>=), not {', '.join(ops) or 'nothing'}"


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
         *args],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The command's wheel, built from this tree by the dev venv's setuptools (no network)."""
    out = tmp_path_factory.mktemp("wheel")
    # A copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = out / "source"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--disable-pip-version-check", "-w", str(out), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("elastic_job_cli-*.whl")
    return built


@pytest.fixture(scope="module")
def index() -> None:
    """Skip unless pip reaches its index (PyPI, or the mirror pip is configured with): asked
    as pip itself asks, so a proxy or a mirror counts, and once, without retries."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "kubernetes", "--retries", "0",
         "--timeout", "15", "--disable-pip-version-check"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        lines = [line for line in probe.stderr.splitlines() if "experimental" not in line]
        said = " / ".join(lines[-2:]) or f"exit {probe.returncode}"
        pytest.skip(f"pip's package index is unreachable (offline?): {said}")


@pytest.mark.usefixtures("index")
@pytest.mark.slow
def test_pip_keeps_a_newer_client_beside_the_command(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "user-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    report = tmp_path / "report.json"
    _pip(
        venv / "bin" / "python", "install", "--dry-run", "--quiet", "--report", str(report),
        NEWER_CLIENT, str(wheel),
    )  # fmt: skip
    planned = {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert planned["kubernetes"] == NEWER_CLIENT.split("==")[1]
    assert planned["elastic-job-cli"] == (ROOT / "VERSION").read_text().strip()
    # and the urllib3 that client asks for, which the command does not hold back
    assert Version(planned["urllib3"]) >= Version("2.8"), planned
