""".github/workflows/ci.yaml, the project's own CI on GitHub's runners, run here as written
(tests/workflow_runner.py): its Python and pip step for real, in a stand-in for setup-python;
the steps that change a GitHub runner (its preinstalled SDKs, its system git config) named as
not run here; and the last step, which runs the whole suite (this test is part of it, so it
is not run from here), checked to be exactly the command README.md and .ci/run give."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from testlib import ROOT, runner_python
from workflow_runner import Skip, clean_copy, load, run_job

WORKFLOW = ROOT / ".github" / "workflows" / "ci.yaml"
SUITE = "Run the tests (.ci/run, as root)"
NOT_HERE = {
    "Free disk space (torch, the images' stand-in bases)": Skip(
        "frees a GitHub runner's preinstalled SDKs; there are none here"
    ),
    "Let root read the checkout": Skip(
        "writes the runner's system git config; here the suite runs as root in a clone already"
    ),
    SUITE: Skip("runs the whole suite, which this test is part of: its command is checked below"),
}


def test_the_workflow_is_valid_for_github_actions() -> None:
    proc = subprocess.run(
        [ROOT / ".venv/bin/check-jsonschema", "--builtin-schema", "vendor.github-workflows",
         WORKFLOW], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_it_runs_on_pull_requests_and_pushes_to_main() -> None:
    on = load(WORKFLOW)[True]  # PyYAML reads the bare `on:` key as True
    assert "pull_request" in on
    assert on["push"] == {"branches": ["main"]}
    assert load(WORKFLOW)["permissions"] == {"contents": "read"}


@pytest.mark.slow
def test_the_setup_runs_and_gives_the_projects_python_and_pip(tmp_path: Path) -> None:
    python_bin = runner_python(tmp_path / "setup-python")
    run = run_job(
        WORKFLOW, "test", clean_copy(ROOT, tmp_path / "checkout"),
        skip=NOT_HERE, path=[python_bin],
    )  # fmt: skip
    assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-4000:]
    assert [s.name for s in run.steps if s.ran] == ["The project's Python and pip"]
    pinned = re.search(r"^pip==(\S+)", (ROOT / "requirements/pip.txt").read_text(), re.M)
    assert pinned and f"pip {pinned[1]} from" in run.step("The project's Python and pip").output


def test_the_python_is_the_projects() -> None:
    """setup-python's 3.11 is the project's Python (pyproject's mypy target, the release's)."""
    steps = load(WORKFLOW)["jobs"]["test"]["steps"]
    (setup,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python@")]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'python_version = "{setup["with"]["python-version"]}"' in pyproject
    release = yaml.safe_load((ROOT / ".github/workflows/release.yaml").read_text())
    versions = {
        s["with"]["python-version"]
        for job in release["jobs"].values()
        for s in job["steps"]
        if str(s.get("uses", "")).startswith("actions/setup-python@")
    }
    assert versions == {setup["with"]["python-version"]}


def test_the_last_step_runs_ci_run_as_the_readme_says() -> None:
    """The suite's step is `bash .ci/run` (as root, with the runner's PATH): the command the
    project's CI runs, which runs scripts/test, README.md's command for every test."""
    steps = load(WORKFLOW)["jobs"]["test"]["steps"]
    assert steps[-1]["name"] == SUITE
    argv = shlex.split(steps[-1]["run"])
    assert argv[0] == "sudo" and argv[-2:] == ["bash", ".ci/run"], argv
    assert 'env "PATH=$PATH"' in steps[-1]["run"]  # setup-python's python, also as root
    ci_run = (ROOT / ".ci/run").read_text()
    assert ci_run.rstrip().endswith("scripts/test")
    assert re.search(r"^scripts/test +# .*every test.*as CI does", (ROOT / "README.md").read_text(),
                     re.M)  # fmt: skip


def test_the_timeout_is_the_projects_ci_limit() -> None:
    assert load(WORKFLOW)["jobs"]["test"]["timeout-minutes"] == 90


def test_every_action_is_pinned_by_commit_with_its_tag() -> None:
    uses = [ln.strip() for ln in WORKFLOW.read_text().splitlines() if "uses:" in ln]
    assert uses
    for line in uses:
        ref = line.split("@")[1]
        assert re.fullmatch(r"[0-9a-f]{40} # v\d+(\.\d+)*", ref), line
