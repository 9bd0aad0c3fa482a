"""No pinned dependency is below its known safe version: every pin the project makes (the
requirements files, the pyprojects' exact pins and build requirements' floors, the
Dockerfiles' ARG *_VERSION and base images, scripts/bootstrap's tools, the workflows' tool
versions, the charts' image tags) is checked against requirements/advisories.toml, where the
advisories are kept by hand (pip-audit cannot reach its services from here), with their
sources."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version
from testlib import ROOT

ADVISORIES = ROOT / "requirements" / "advisories.toml"
DATA = tomllib.loads(ADVISORIES.read_text())
ID = re.compile(r"^(CVE-\d{4}-\d{4,}|GHSA(-[23456789cfghjmpqrvwx]{4}){3})$")


@dataclass(frozen=True)
class Pin:
    package: str  # as the advisories name it: PyPI's normalised name, or helm, etcd
    version: str
    where: str  # file and key, for the message


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _floor(req: Requirement) -> str | None:
    """The lowest version a requirement admits, when it says one (==, ===, >=, ~=)."""
    floors = [s.version for s in req.specifier if s.operator in ("==", "===", ">=", "~=")]
    return max(floors, key=Version) if floors else None


def _requirements_files() -> list[Pin]:
    pins = []
    for path in [*sorted((ROOT / "requirements").glob("*.txt")), ROOT / "ci" / "requirements.txt"]:
        for raw in path.read_text().splitlines():
            line = raw.split("#", 1)[0].strip().rstrip("\\").strip()
            if line and not line.startswith("-"):
                req = Requirement(line.split(" --hash", 1)[0])
                if (floor := _floor(req)) is not None:
                    where = f"{path.relative_to(ROOT)} {req.name}"
                    pins.append(Pin(_norm(req.name), floor, where))
    return pins


def _pyprojects() -> list[Pin]:
    """Exact pins (an image's whole dependency set) and the build-system's floors. A library's
    ranges are not pins: they keep the floor of the oldest release with what it calls, so that
    it installs beside a user's tools without moving them (packages/elastic-job-cli)."""
    pins = []
    paths = [ROOT / "pyproject.toml", *sorted(ROOT.glob("*/*/pyproject.toml"))]
    for path in (p for p in paths if ".venv" not in p.parts):
        data = tomllib.loads(path.read_text())
        project = data.get("project", {})
        reqs = [*project.get("dependencies", [])]
        for group in project.get("optional-dependencies", {}).values():
            reqs += group
        for text in reqs:
            req = Requirement(text)
            exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if exact:
                pins.append(Pin(_norm(req.name), exact[0], f"{path.relative_to(ROOT)} {text!r}"))
        for text in data.get("build-system", {}).get("requires", []):
            req = Requirement(text)
            # A build requirement with no floor admits every vulnerable release.
            where = f"{path.relative_to(ROOT)} build-system {text!r}"
            pins.append(Pin(_norm(req.name), _floor(req) or "0", where))
    return pins


def _dockerfiles() -> list[Pin]:
    pins = []
    for path in sorted(ROOT.glob("images/*/Dockerfile")):
        for arg, version in re.findall(r"^ARG ([A-Z0-9_]+)_VERSION=(\S+)$", path.read_text(), re.M):
            if arg == "":  # ARG VERSION is the project's own release
                continue
            pins.append(Pin(_norm(arg), version, f"{path.relative_to(ROOT)} ARG {arg}_VERSION"))
    return pins


def _base_images() -> list[Pin]:
    """Each Dockerfile's default base (ARG BASE_IMAGE=NAME:TAG), as the image's name and the
    version its tag starts with: python:3.11.16-slim-bookworm is python 3.11.16."""
    pins = []
    for path in sorted(ROOT.glob("images/*/Dockerfile")):
        for image in re.findall(r"^ARG BASE_IMAGE=(\S+)$", path.read_text(), re.M):
            name, _, tag = image.split("@")[0].rpartition(":")
            version = re.match(r"v?(\d+(?:\.\d+)*)", tag)
            if version:
                where = f"{path.relative_to(ROOT)} ARG BASE_IMAGE"
                pins.append(Pin(name.rsplit("/", 1)[-1], version[1], where))
    return pins


def _bootstrap() -> list[Pin]:
    text = (ROOT / "scripts" / "bootstrap").read_text()
    pins = []
    for key, version in re.findall(r"^([A-Z0-9_]+_VERSION)=v?(\S+)$", text, re.M):
        package = {"HELM": "helm", "ETCD": "etcd", "CHECKOV": "checkov"}[re.split(r"\d|_", key)[0]]
        pins.append(Pin(package, version, f"scripts/bootstrap {key}"))
    return pins


def _workflows() -> list[Pin]:
    pins = []
    for path in sorted(ROOT.glob("ci/workflows/*.yaml")) + sorted(
        ROOT.glob(".github/workflows/*.yaml")
    ):
        env = yaml.safe_load(path.read_text()).get("env") or {}
        for key, value in env.items():
            if key.startswith("HELM") and key.endswith("_VERSION"):
                pins.append(Pin("helm", str(value).lstrip("v"), f"{path.relative_to(ROOT)} {key}"))
    return pins


def _image_tags(node: Any, where: str) -> list[Pin]:
    """Every {repository, tag} map in a values tree: the image's last path part names it."""
    out = []
    if isinstance(node, dict):
        repo, tag = node.get("repository"), node.get("tag")
        if isinstance(repo, str) and isinstance(tag, str) and tag:
            out.append(Pin(repo.rsplit("/", 1)[-1], tag.lstrip("v").split("@")[0], where))
        for key, value in node.items():
            out += _image_tags(value, f"{where}{'.' if ' ' in where else ' '}{key}")
    return out


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


def _chart_defaults(chart: Path) -> dict[str, Any]:
    """A chart's values.yaml, with each file:// dependency's defaults under its name."""
    values: dict[str, Any] = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    for dep in yaml.safe_load((chart / "Chart.yaml").read_text()).get("dependencies") or []:
        repo = str(dep.get("repository", ""))
        if repo.startswith("file://"):
            sub = _chart_defaults((chart / repo.removeprefix("file://")).resolve())
            values[dep["name"]] = _merge(sub, values.get(dep["name"]) or {})
    return values


def _charts() -> list[Pin]:
    """Each chart's default image tags and those of its ci/ values over the defaults."""
    pins = []
    for chart in sorted(p.parent for p in ROOT.glob("charts/*/Chart.yaml")):
        defaults = _chart_defaults(chart)
        pins += _image_tags(defaults, str((chart / "values.yaml").relative_to(ROOT)))
        for values in sorted(chart.glob("ci/*.yaml")):
            merged = _merge(defaults, yaml.safe_load(values.read_text()) or {})
            pins += _image_tags(merged, str(values.relative_to(ROOT)))
    for chart_yaml in sorted(ROOT.glob("charts/*/Chart.yaml")):
        images = (yaml.safe_load(chart_yaml.read_text()).get("annotations") or {}).get(
            "artifacthub.io/images"
        )
        for item in yaml.safe_load(images or "[]"):
            name, _, tag = item["image"].rpartition(":")
            where = f"{chart_yaml.relative_to(ROOT)} artifacthub.io/images"
            pins.append(Pin(name.rsplit("/", 1)[-1], tag.lstrip("v"), where))
    return pins


def all_pins() -> list[Pin]:
    return [
        *_requirements_files(),
        *_pyprojects(),
        *_dockerfiles(),
        *_base_images(),
        *_bootstrap(),
        *_workflows(),
        *_charts(),
    ]


def fixed_for(advisory: dict[str, Any], version: str) -> Version | None:
    """The first fixed release on `version`'s line, or None when its line is not listed."""
    fixed = advisory["fixed"]
    if isinstance(fixed, str):
        return Version(fixed)
    lines = [line for line in fixed if version == line or version.startswith(line + ".")]
    return Version(fixed[max(lines, key=len)]) if lines else None


def vulnerable(pin: Pin) -> dict[str, Version]:
    """The advisories a pin is below the fix of -> that fix."""
    try:
        version = Version(pin.version)
    except InvalidVersion:
        return {}
    out = {}
    for advisory in DATA["advisory"]:
        if advisory["package"] != pin.package:
            continue
        fixed = fixed_for(advisory, pin.version)
        if fixed is not None and version < fixed:
            out[advisory["id"]] = fixed
    return out


def _waived(pin: Pin) -> set[str]:
    return {
        a
        for e in DATA.get("exception", [])
        if e["package"] == pin.package and e["version"] == pin.version and e["where"] == pin.where
        for a in e["advisories"]
    }


def test_every_advisory_names_its_id_fix_and_sources() -> None:
    for advisory in DATA["advisory"]:
        assert ID.match(advisory["id"]), advisory["id"]
        assert advisory["what"] and advisory["sources"], advisory["id"]
        assert all(s.startswith("https://") for s in advisory["sources"]), advisory["id"]
        fixed = advisory["fixed"]
        for version in [fixed] if isinstance(fixed, str) else fixed.values():
            Version(version)
    ids = [a["id"] for a in DATA["advisory"]]
    assert len(ids) == len(set(ids))


def test_the_pins_are_found_where_they_are_made() -> None:
    """The collectors see the pins this test is about (a moved pin must not drop out)."""
    found = {(p.package, p.where.split(" ", 1)[0]) for p in all_pins()}
    for expected in [
        ("urllib3", "requirements/dev.txt"),
        ("urllib3", "images/worker/pyproject.toml"),
        ("urllib3", "images/worker/Dockerfile"),
        ("setuptools", "images/worker/Dockerfile"),
        ("setuptools", "packages/torch-etcd-v3/pyproject.toml"),
        ("dnspython", "images/worker/Dockerfile"),
        ("helm", "scripts/bootstrap"),
        ("helm", "ci/workflows/charts.yaml"),
        ("etcd", "scripts/bootstrap"),
        ("etcd", "charts/etcd-rendezvous/values.yaml"),
        ("etcd", "charts/etcd-rendezvous/ci/etcd-v3-values.yaml"),
        ("etcd", "charts/elastic-job/Chart.yaml"),
        ("pyyaml", "ci/requirements.txt"),
        ("python", "images/init-topology/Dockerfile"),
        ("pip", "requirements/pip.txt"),
    ]:
        assert expected in found, expected


@pytest.mark.parametrize("pin", all_pins(), ids=lambda p: f"{p.where}={p.version}")
def test_no_pin_is_below_a_known_fix(pin: Pin) -> None:
    below = vulnerable(pin)
    open_ = [f"{a} (fixed in {below[a]})" for a in sorted(set(below) - _waived(pin))]
    assert not open_, (
        f"{pin.where} pins {pin.package} {pin.version}, below the fix of {', '.join(open_)} "
        f"({ADVISORIES.relative_to(ROOT)}): raise it"
    )


def test_every_exception_is_a_live_pin_with_its_reason() -> None:
    """An exception waives only advisories its pin has, and goes when the pin moves."""
    pins = {(p.package, p.version, p.where): p for p in all_pins()}
    for exc in DATA.get("exception", []):
        pin = pins.get((exc["package"], exc["version"], exc["where"]))
        assert pin is not None, f"stale exception (no such pin any more): {exc['where']}"
        have = set(vulnerable(pin))
        assert set(exc["advisories"]) <= have, (exc["where"], sorted(have))
        assert len(exc["reason"].split()) > 15, exc["where"]
        assert exc["where"].startswith("scripts/bootstrap"), "only the tests' tools may lag"


def test_nothing_runs_helm_pull_untar() -> None:
    """The Helm 3 fallback's waiver (CVE-2026-35206) holds while no script, test or workflow
    runs `helm pull --untar`."""
    paths = [*ROOT.glob("scripts/*"), *ROOT.glob("ci/**/*"), *ROOT.glob("tests/**/*.py")]
    paths += [*ROOT.glob("localrun/**/*.py"), *ROOT.glob(".github/**/*")]
    for path in (p for p in paths if p.is_file() and p != Path(__file__)):
        code = [
            ln
            for ln in path.read_text(errors="replace").splitlines()
            if not ln.lstrip().startswith("#")
        ]
        assert not [ln for ln in code if re.search(r"\bpull\b.*--untar", ln)], path
