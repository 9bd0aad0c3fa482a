"""checkov's Helm scan the way a user's scanner runs it, on the source tree (`checkov -d .
--framework helm` at the root of a clone, or on one chart's directory) and on the packaged
charts: it scans elastic-job's own resources (the worker StatefulSet, Role, test Pod...), and
no check fails. A symlink in a chart (elastic-job/charts/etcd-rendezvous used to be one)
makes checkov's `helm template` print a warning, and checkov then drops the whole chart
silently: exit 0, nothing scanned."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from testlib import ROOT
from workflow_runner import clean_copy

# checkov's scans (three: the checkout, one chart directory, the packaged charts), as
# tests/charts/test_checkov.py's: 24 s for the file here; scripts/test and CI run them.
pytestmark = pytest.mark.slow

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
HELM3 = ROOT / ".tools" / "helm3"
# checkov's helm runner renders with `helm template` and no --namespace, so every
# namespaced resource lands in "default" and CKV_K8S_21 fires whatever the chart does;
# the rendered-manifest scan (tests/charts/test_checkov.py) sets a namespace and covers it.
NAMESPACE_ARTEFACT = "CKV_K8S_21"
Report = list[dict[str, Any]]


def _scan(directory: Path, home: Path) -> Report:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: run scripts/bootstrap")
    proc = subprocess.run(
        [CHECKOV, "-d", directory, "--framework", "helm", "--output", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PATH": f"{HELM3}:/usr/bin:/bin", "BC_SKIP_MAPPING": "TRUE", "HOME": str(home)},
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith(("[", "{")) else []
    return report if isinstance(report, list) else [report]


def _checks(report: Report, key: str) -> list[dict[str, Any]]:
    return [c for part in report for c in part.get("results", {}).get(key, [])]


def _scanned(report: Report) -> set[tuple[str, str]]:
    """(template path, resource kind) of every resource a check ran on."""
    out = set()
    for c in _checks(report, "passed_checks") + _checks(report, "failed_checks"):
        out.add((c["file_path"].lstrip("/"), c["resource"].split(".", 1)[0]))
    return out


def _failed(report: Report) -> list[str]:
    return [
        f"{c['check_id']} {c['resource']} ({c['file_path']})"
        for c in _checks(report, "failed_checks")
        if c["check_id"] != NAMESPACE_ARTEFACT
    ]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return clean_copy(ROOT, tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="module")
def root_report(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _scan(checkout, tmp_path_factory.mktemp("home"))


def test_a_scan_of_the_checkout_finds_the_worker_statefulset(root_report: Report) -> None:
    """`checkov -d . --framework helm` at the clone's root scans elastic-job's templates
    (the worker StatefulSet among them) and its etcd-rendezvous dependency."""
    scanned = _scanned(root_report)
    kinds = {kind for path, kind in scanned if path.startswith("charts/elastic-job/templates/")}
    assert {"StatefulSet", "Role", "RoleBinding", "Pod"} <= kinds, sorted(scanned)
    assert ("charts/elastic-job/templates/worker-statefulset.yaml", "StatefulSet") in scanned
    assert ("charts/etcd-rendezvous/templates/statefulset.yaml", "StatefulSet") in scanned
    assert any(p.startswith("charts/elastic-job/charts/etcd-rendezvous/") for p, _ in scanned)


def test_a_scan_of_the_checkout_fails_no_check(root_report: Report) -> None:
    """No check fails on the source tree (bar checkov's own namespace artefact)."""
    failed = _failed(root_report)
    assert not failed, "\n".join(failed)


def test_a_scan_of_one_chart_directory_finds_the_worker_statefulset(
    checkout: Path, tmp_path: Path
) -> None:
    """`checkov --framework helm -d charts/elastic-job`, as a scanner pointed at the chart."""
    report = _scan(checkout / "charts" / "elastic-job", tmp_path)
    assert ("elastic-job/templates/worker-statefulset.yaml", "StatefulSet") in _scanned(report)
    assert not _failed(report), "\n".join(_failed(report))


def test_packaged_charts_are_scanned_and_fail_no_check(tmp_path: Path) -> None:
    """The release's archives (scripts/package), unpacked as a registry scanner sees them."""
    dist, charts = tmp_path / "dist", tmp_path / "charts"
    charts.mkdir()
    proc = subprocess.run(
        [ROOT / "scripts" / "package", dist],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HELM": str(HELM3 / "helm")},
    )
    assert proc.returncode == 0, proc.stderr
    for tgz in sorted(dist.glob("*.tgz")):
        with tarfile.open(tgz) as archive:
            archive.extractall(charts, filter="data")
    report = _scan(charts, tmp_path)
    kinds = {kind for path, kind in _scanned(report) if path.startswith("elastic-job/templates/")}
    assert {"StatefulSet", "Role", "RoleBinding", "Pod"} <= kinds, sorted(kinds)
    assert not _failed(report), "\n".join(_failed(report))
