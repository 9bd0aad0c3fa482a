"""renovate.json covers every pin: each pin tests/release/test_advisories.py holds against the
advisories, every version in scripts/bootstrap, the Dockerfiles, the charts' ci/ values and
the workflows, and every action, is read by a rule Renovate applies to its file.

Renovate is not run here (its lookups need the registries' APIs); its file patterns and the
custom managers' regexes are applied as Renovate applies them (JavaScript regexes: the named
groups `(?<name>...)` become Python's `(?P<name>...)`), and a built-in manager counts for the
files its patterns match, the shape it reads checked where it has one (helm-values: a map with
`repository` and `tag`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from test_advisories import Pin, all_pins
from testlib import ROOT

CONFIG: dict[str, Any] = json.loads((ROOT / "renovate.json").read_text())
#: Action inputs Renovate's github-actions manager reads itself (`uses-with` dependencies, as
#: `renovate --platform=local --dry-run=extract` 44.121.2 listed them): no comment is needed.
ACTION_INPUTS = {
    "helm/chart-testing-action": {"version"},
    "helm/kind-action": {"version", "kubectl_version"},
}
#: Which built-in manager reads which of the advisories' pins, by where the pin is made (a
#: file's own entry first, then its top folder's, then its name's).
BUILT_IN = {
    "requirements/release.txt": "pip-compile",
    "requirements": "pip_requirements",
    "ci": "pip_requirements",
    "pyproject.toml": "pep621",
}


@dataclass(frozen=True)
class Found:
    """What a custom manager extracts from a file."""

    path: str
    line: int  # of the value
    dep: str
    value: str


def _patterns(manager: dict[str, Any]) -> list[re.Pattern[str]]:
    out = []
    for pattern in manager.get("managerFilePatterns", []):
        assert pattern.startswith("/") and pattern.endswith("/"), f"not a regex: {pattern}"
        out.append(re.compile(pattern[1:-1]))
    return out


def _matches(manager: dict[str, Any], path: str) -> bool:
    return any(p.search(path) for p in _patterns(manager))


def _python_regex(js: str) -> re.Pattern[str]:
    return re.compile(js.replace("(?<", "(?P<"))


def _tracked() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for pattern in ("scripts/*", "images/*/Dockerfile", ".github/workflows/*", "ci/**/*",
                        "charts/**/*", "requirements/*", "**/pyproject.toml")
        for p in ROOT.glob(pattern)
        if p.is_file() and not {".venv", ".tools"} & set(p.parts)
    )  # fmt: skip


def extracted() -> list[Found]:
    """Every dependency the custom managers extract from the project's files."""
    found = []
    for manager in CONFIG["customManagers"]:
        for rel in filter(lambda r, m=manager: _matches(m, r), _tracked()):  # type: ignore[misc]
            text = (ROOT / rel).read_text()
            for js in manager["matchStrings"]:
                for m in _python_regex(js).finditer(text):
                    groups = m.groupdict()
                    dep = groups.get("depName") or manager.get("depNameTemplate", "")
                    line = text.count("\n", 0, m.start("currentValue")) + 1
                    found.append(Found(rel, line, dep, groups["currentValue"]))
    return found


FOUND = extracted()


def _custom_match(path: str, version: str) -> Found | None:
    for f in FOUND:
        if f.path == path and f.value.lstrip("v").startswith(version.lstrip("v")):
            return f
    return None


def _helm_values_reads(path: str, version: str) -> bool:
    """helm-values reads an image from a map holding `repository` and `tag`."""

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("repository") and str(node.get("tag", "")).lstrip("v") == version:
                return True
            return any(walk(v) for v in node.values())
        return isinstance(node, list) and any(walk(v) for v in node)

    return walk(yaml.safe_load((ROOT / path).read_text()))


def written_in(pin: Pin) -> str:
    """The file the pin's text is in. The advisories read a chart's image tags as rendered
    (a subchart's defaults under a ci/ values file): the tag a file does not write itself
    is its chart's or subchart's values.yaml's."""
    path = pin.where.split(" ")[0]
    if not path.startswith("charts/") or pin.version in (ROOT / path).read_text():
        return path
    (default,) = [
        str(p.relative_to(ROOT))
        for p in sorted(ROOT.glob("charts/*/values.yaml"))
        if re.search(rf"^\s*tag: v?{re.escape(pin.version)}$", p.read_text(), re.M)
    ]
    return default


def rule_for(pin: Pin) -> str:
    """The manager that reads `pin`, or '' when none does."""
    path = written_in(pin)
    built_in = (
        BUILT_IN.get(path) or BUILT_IN.get(path.split("/")[0]) or BUILT_IN.get(Path(path).name)
    )
    if built_in and _matches(CONFIG[built_in], path):
        return built_in
    if _matches(CONFIG["helm-values"], path) and _helm_values_reads(path, pin.version):
        return "helm-values"
    found = _custom_match(path, pin.version)
    return f"custom.regex ({found.dep}, line {found.line})" if found else ""


def test_the_managers_used_are_the_enabled_ones() -> None:
    used = {"pip_requirements", "pip-compile", "pep621", "helm-values", "github-actions",
            "custom.regex"}  # fmt: skip
    assert set(CONFIG["enabledManagers"]) == used
    assert CONFIG["lockFileMaintenance"]["enabled"] is True  # release.txt's indirect pins
    header = (ROOT / "requirements/release.txt").read_text()
    # Options Renovate's pip-compile manager refuses (44.121.2: --no-emit-find-links).
    assert "--no-emit-find-links" not in header and "--find-links" not in header
    assert all(m["customType"] == "regex" for m in CONFIG["customManagers"])


@pytest.mark.parametrize("pin", all_pins(), ids=lambda p: f"{p.where}={p.version}")
def test_every_pin_the_advisories_read_is_matched_by_a_rule(pin: Pin) -> None:
    """(pip-compile reads release.in and compiles release.txt again: its indirect pins move
    with the weekly lock file maintenance, which must be on.)"""
    assert rule_for(pin), (
        f"{pin.where} pins {pin.package} {pin.version} and no renovate.json rule reads it: add "
        "a `# renovate: datasource=... depName=...` comment above it, or a manager pattern"
    )


def _versions_outside_the_advisories() -> list[tuple[str, int, str]]:
    """(file, line, text) of every other version the project pins by hand: scripts/bootstrap's
    KEY=value, the Dockerfiles' ARG *_VERSION and BASE_IMAGE, the workflows' *_VERSION and
    `with:` *version keys (setup-python's python-version aside: the project's Python is
    chosen by hand), the charts' ci/ values' image tags."""
    rules = [
        ("scripts/bootstrap", r"^[A-Z0-9_]+(?:_VERSION|_WHEEL)=\S+"),
        ("images/*/Dockerfile", r"^ARG (?:[A-Z0-9_]+_VERSION|BASE_IMAGE)=\S+"),
        (".github/workflows/*.yaml", r"^\s+(?!python-version)[\w-]*(?:VERSION|version):\s*\S+"),
        ("ci/workflows/*.yaml", r"^\s+(?!python-version)[\w-]*(?:VERSION|version):\s*\S+"),
        ("charts/*/ci/*.yaml", r"^\s+tag:\s*\S+"),
    ]
    out = []
    for pattern, regex in rules:
        for path in sorted(ROOT.glob(pattern)):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.match(regex, line):
                    out.append((str(path.relative_to(ROOT)), n, line.strip()))
    return out


def _action_input(path: str, line: int) -> bool:
    """Whether line `line` of workflow `path` is an input the actions manager reads."""
    lines = (ROOT / path).read_text().splitlines()
    key = lines[line - 1].strip().split(":")[0]
    for above in reversed(lines[: line - 1]):
        if "uses:" in above:
            action = above.split("uses:")[1].strip().split("@")[0]
            return key in ACTION_INPUTS.get(action, set())
        if above.strip().startswith("- "):
            return False
    return False


@pytest.mark.parametrize(
    "where", _versions_outside_the_advisories(), ids=lambda w: f"{w[0]}:{w[2]}"
)
def test_every_version_pinned_by_hand_is_matched_by_a_rule(where: tuple[str, int, str]) -> None:
    path, line, text = where
    if _matches(CONFIG["github-actions"], path) and _action_input(path, line):
        return
    assert any(f.path == path and f.line == line for f in FOUND), (
        f"{path}:{line} `{text}` is read by no renovate.json rule: add a `# renovate: "
        "datasource=... depName=...` comment above it"
    )


def test_every_action_is_in_a_file_the_actions_manager_reads() -> None:
    files = [*ROOT.glob(".github/workflows/*.y*ml"), *ROOT.glob("ci/workflows/*.y*ml")]
    assert files
    for path in files:
        if "uses:" in path.read_text():
            assert _matches(CONFIG["github-actions"], str(path.relative_to(ROOT))), path


def test_a_pin_without_a_rule_is_found() -> None:
    """The checks above can fail: a version without a comment is read by no rule."""
    assert not _custom_match("scripts/bootstrap", "9.9.9")
    lone = "FOO_VERSION=1.2.3\n"
    assert not any(_python_regex(s).search(lone) for m in CONFIG["customManagers"]
                   for s in m["matchStrings"] if "renovate:" in s)  # fmt: skip
    commented = "# renovate: datasource=pypi depName=foo\nFOO_VERSION=1.2.3\n"
    (annotated,) = [m for m in CONFIG["customManagers"] if "renovate:" in m["matchStrings"][0]]
    match = _python_regex(annotated["matchStrings"][0]).search(commented)
    assert match and match["currentValue"] == "1.2.3" and match["depName"] == "foo"


def _rules_for(name: str) -> list[dict[str, Any]]:
    return [
        r for r in CONFIG["packageRules"]
        if name in r.get("matchPackageNames", []) + r.get("matchDepNames", [])
    ]  # fmt: skip


def test_the_project_own_packages_are_left_to_version() -> None:
    """Renovate never bumps the project's own packages (their versions follow VERSION), and
    nothing else is switched off without a description."""
    own = {
        str(tomllib.loads(p.read_text())["project"]["name"])
        for p in ROOT.glob("**/pyproject.toml")
        if not {".venv", ".tools"} & set(p.parts)
    }
    for name in own:
        assert any(r.get("enabled") is False for r in _rules_for(name)), name
    for rule in CONFIG["packageRules"]:
        if rule.get("enabled") is False:
            assert rule.get("description"), rule


def test_etcd_stays_on_its_lines() -> None:
    """The default rendezvous needs etcd 3.5 (the v2 API); the etcd-v3 ci/ values test 3.6."""
    lines = {
        tuple(r["matchFileNames"]): r["allowedVersions"]
        for r in _rules_for("gcr.io/etcd-development/etcd")
        if "allowedVersions" in r
    }
    assert lines == {
        ("charts/*/values.yaml", "charts/*/Chart.yaml"): "/^v3\\.5\\./",
        ("charts/*/ci/*.yaml",): "/^v3\\.6\\./",
    }
    for found in (f for f in FOUND if f.dep == "gcr.io/etcd-development/etcd"):
        want = "v3.6." if "/ci/" in found.path else "v3.5."
        assert found.value.startswith(want), found
