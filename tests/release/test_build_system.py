"""The project's pyprojects are built by setuptools (scripts/bootstrap's editable installs
and the images' wheels, both without build isolation): each declares the setuptools it
needs, 77 or newer for a PEP 639 `license = "SPDX"` string (older releases refuse the
string; tests/release/test_advisories.py holds the floor at the security minimum, 78.1.1),
and the setuptools that builds them is that or newer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version
from testlib import ROOT

PYPROJECTS = sorted(
    p for p in [ROOT / "pyproject.toml", *ROOT.glob("*/*/pyproject.toml")] if ".venv" not in p.parts
)
#: setuptools 77.0.0 reads `project.license` as an SPDX expression (PEP 639).
SPDX_LICENSE_SETUPTOOLS = Version("77.0.0")


def _setuptools_requirement(pyproject: Path) -> Requirement:
    requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    (req,) = [Requirement(r) for r in requires if Requirement(r).name == "setuptools"]
    return req


def _building_setuptools() -> dict[str, Version]:
    """Where a setuptools that builds the packages is pinned -> its version."""
    out = {}
    dev = (ROOT / "requirements" / "dev.txt").read_text()
    match = re.search(r"^setuptools==(\S+)$", dev, re.M)
    assert match, "requirements/dev.txt must pin setuptools (bootstrap builds without isolation)"
    out["requirements/dev.txt"] = Version(match[1])
    for dockerfile in sorted(ROOT.glob("images/*/Dockerfile")):
        for pin in re.findall(r"^ARG SETUPTOOLS_VERSION=(\S+)$", dockerfile.read_text(), re.M):
            out[str(dockerfile.relative_to(ROOT))] = Version(pin)
    return out


def test_every_pyproject_is_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in PYPROJECTS}
    assert {"pyproject.toml", "images/worker/pyproject.toml"} <= names
    assert {"packages/torch-etcd-v3/pyproject.toml", "images/init-topology/pyproject.toml"} <= names


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_build_system_requires_a_setuptools_that_reads_its_metadata(pyproject: Path) -> None:
    req = _setuptools_requirement(pyproject)
    floor = min((Version(s.version) for s in req.specifier if s.operator == ">="), default=None)
    assert floor is not None and floor >= SPDX_LICENSE_SETUPTOOLS, (
        f"{pyproject.relative_to(ROOT)}: build-system requires {req}, which admits a setuptools "
        "that refuses an SPDX license string: write setuptools>=77 (the advisories' floor is "
        "higher: requirements/advisories.toml)"
    )
    for where, version in _building_setuptools().items():
        assert version in req.specifier, f"{where} builds with setuptools {version}, not {req}"
