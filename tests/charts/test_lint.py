"""The ct lint steps, run here without ct: helm lint --strict, yamale on Chart.yaml with
ci/chart_schema.yaml, yamllint with ci/lintconf.yaml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from chart_render import CHARTS, EXAMPLES, ROOT, TEST_VALUES, helm_run

CI = ROOT / "ci"
VENV_BIN = ROOT / ".venv" / "bin"
CHART_DIRS = sorted(p.parent for p in CHARTS.glob("*/Chart.yaml"))


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_helm_lint_strict_with_defaults_and_each_ci_values_file(helm: Path, chart: Path) -> None:
    """helm lint --strict passes for the defaults and each ci/*-values.yaml (Helm 3 and 4)."""
    runs = [[]] + [["-f", str(v)] for v in sorted((chart / "ci").glob("*-values.yaml"))]
    for extra in runs:
        proc = helm_run(helm, "lint", "--strict", str(chart), *extra)
        assert proc.returncode == 0, f"{extra}\n{proc.stdout}\n{proc.stderr}"
        assert "[WARNING]" not in proc.stdout, proc.stdout


def test_helm_lint_strict_with_each_values_example(helm: Path) -> None:
    """helm lint --strict passes for elastic-job with each values-examples file."""
    for values in sorted(EXAMPLES.glob("*.yaml")):
        proc = helm_run(helm, "lint", "--strict", str(CHARTS / "elastic-job"), "-f", str(values))
        assert proc.returncode == 0, f"{values.name}\n{proc.stdout}\n{proc.stderr}"
        assert "[WARNING]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_chart_yaml_matches_ci_chart_schema(chart: Path) -> None:
    """yamale validates Chart.yaml against ci/chart_schema.yaml (ct's chart-yaml-schema)."""
    proc = subprocess.run(
        [VENV_BIN / "yamale", "-s", CI / "chart_schema.yaml", chart / "Chart.yaml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_yamllint_with_ci_lintconf() -> None:
    """yamllint (ci/lintconf.yaml) passes on Chart.yaml, values.yaml, ci/, values-examples/
    and the test-only values."""
    targets = [
        *[c / "Chart.yaml" for c in CHART_DIRS],
        *[c / "values.yaml" for c in CHART_DIRS],
        *sorted(CHARTS.glob("*/ci/*.yaml")),
        CI,
        EXAMPLES,
        TEST_VALUES,
    ]
    proc = subprocess.run(
        [VENV_BIN / "yamllint", "--strict", "-c", CI / "lintconf.yaml", *targets],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ct_config_points_at_the_ci_files() -> None:
    """ci/ct.yaml uses ci/chart_schema.yaml and ci/lintconf.yaml and the charts/ dir."""
    config = yaml.safe_load((CI / "ct.yaml").read_text())
    assert config["chart-dirs"] == ["charts"]
    assert (ROOT / config["chart-yaml-schema"]) == CI / "chart_schema.yaml"
    assert (ROOT / config["lint-conf"]) == CI / "lintconf.yaml"


def test_elastic_job_depends_on_etcd_rendezvous_by_file() -> None:
    """elastic-job's dependency is file://../etcd-rendezvous at that chart's version, with
    condition etcd-rendezvous.enabled, and the committed Chart.lock agrees; nothing in the
    chart is a symlink."""
    chart = yaml.safe_load((CHARTS / "elastic-job" / "Chart.yaml").read_text())
    etcd = yaml.safe_load((CHARTS / "etcd-rendezvous" / "Chart.yaml").read_text())
    (dep,) = chart["dependencies"]
    assert dep["repository"] == "file://../etcd-rendezvous"
    assert dep["version"] == etcd["version"]
    assert dep["condition"] == "etcd-rendezvous.enabled"
    lock = yaml.safe_load((CHARTS / "elastic-job" / "Chart.lock").read_text())
    assert [(d["name"], d["version"]) for d in lock["dependencies"]] == [
        ("etcd-rendezvous", etcd["version"])
    ]
    # No symlink to the sibling (scanners skip a chart holding one: tests/release).
    assert not [p for p in (CHARTS / "elastic-job").rglob("*") if p.is_symlink()]


def test_image_tags_default_to_the_pinned_app_version() -> None:
    """Worker and init-topology tags default to appVersion (pinned, never latest) and the
    etcd tag is the chart's appVersion."""
    for name in ("elastic-job", "etcd-rendezvous"):
        chart = yaml.safe_load((CHARTS / name / "Chart.yaml").read_text())
        assert chart["appVersion"] not in ("", "latest")
    etcd_chart = yaml.safe_load((CHARTS / "etcd-rendezvous" / "Chart.yaml").read_text())
    etcd_values = yaml.safe_load((CHARTS / "etcd-rendezvous" / "values.yaml").read_text())
    assert etcd_values["image"]["tag"] == f"v{etcd_chart['appVersion']}"
