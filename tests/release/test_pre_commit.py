""".pre-commit-config.yaml: local hooks calling the .venv tools scripts/test uses; each
hook's entry runs here on the files pre-commit would hand it, and passes."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml
from testlib import ROOT

CONFIG = ROOT / ".pre-commit-config.yaml"


def _hooks() -> list[dict[str, Any]]:
    (repo,) = yaml.safe_load(CONFIG.read_text())["repos"]
    assert repo["repo"] == "local"
    return list(repo["hooks"])


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if (ROOT / line).is_file()]


def _selected(hook: dict[str, Any], files: list[str]) -> list[str]:
    pattern = re.compile(hook.get("files", ""))
    chosen = [f for f in files if pattern.search(f)]
    if "python" in hook.get("types_or", []):
        chosen = [f for f in chosen if f.endswith((".py", ".pyi"))]
    return chosen


def test_hooks_are_the_test_commands_checks() -> None:
    """ruff check, ruff format --check (as scripts/test), the chart docs check and
    yamllint with ct's config, all from .venv: nothing for pre-commit to download."""
    hooks = {h["id"]: h for h in _hooks()}
    assert set(hooks) >= {"ruff-check", "ruff-format", "mypy", "gen-chart-docs", "yamllint"}
    test_script = (ROOT / "scripts" / "test").read_text()
    assert "ruff check ." in test_script and "ruff format --check ." in test_script
    for hook in hooks.values():
        assert hook["language"] == "system"
        assert hook["entry"].startswith(".venv/bin/"), hook["entry"]


# The mypy hook runs `.venv/bin/mypy` on no file names: the command scripts/test runs before
# pytest (test_the_mypy_hook_is_scripts_tests_mypy holds that), 42 s on a fresh clone's
# empty cache. Run again here it would only repeat that check, so it is not.
SKIP_MYPY = pytest.mark.skip(reason="scripts/test runs the same mypy before pytest")


@pytest.mark.parametrize(
    "hook",
    [pytest.param(h, marks=SKIP_MYPY) if h["id"] == "mypy" else h for h in _hooks()],
    ids=lambda h: h["id"],
)
def test_each_hook_passes_on_the_tree(hook: dict[str, Any]) -> None:
    files = _selected(hook, _tracked())
    assert files, f"{hook['id']} selects no file: check its files/types"
    argv = shlex.split(hook["entry"]) + (files if hook.get("pass_filenames", True) else [])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_mypy_hook_is_scripts_tests_mypy() -> None:
    """The hook is exactly scripts/test's `mypy` (its configuration in pyproject.toml, no
    file names), so the tree passing scripts/test passes the hook."""
    (hook,) = [h for h in _hooks() if h["id"] == "mypy"]
    assert (hook["entry"], hook.get("pass_filenames")) == (".venv/bin/mypy", False)
    steps = [
        line.split("#")[0].strip() for line in (ROOT / "scripts" / "test").read_text().splitlines()
    ]
    assert "mypy" in steps and 'export PATH="$ROOT/.venv/bin:$PATH"' in steps


def test_yamllint_hook_covers_the_files_ct_lint_checks() -> None:
    """The yamllint hook's pattern selects Chart.yaml, values.yaml, ci values and
    values-examples, as tests/charts/test_lint.py's yamllint run does."""
    (hook,) = [h for h in _hooks() if h["id"] == "yamllint"]
    chosen = set(_selected(hook, _tracked()))
    for want in (
        "charts/elastic-job/Chart.yaml",
        "charts/etcd-rendezvous/values.yaml",
        "charts/elastic-job/ci/gang-values.yaml",
        "values-examples/cpu-smoke.yaml",
        "values-examples/argocd/application.yaml",
        "ci/workflows/charts.yaml",
    ):
        assert want in chosen, want
    assert not any(f.startswith("charts/elastic-job/templates/") for f in chosen)
