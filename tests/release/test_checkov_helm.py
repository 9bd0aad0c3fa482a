"""`checkov --framework helm` the way a user's scanner runs it: on the packaged charts it
scans elastic-job's own resources (its StatefulSet, Role, test Pod...), and no check
fails. On the source tree the etcd-rendezvous symlink makes checkov skip elastic-job
silently ("found symbolic link in path"), which is why the scan runs on the packages."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from testlib import ROOT

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
HELM3 = ROOT / ".tools" / "helm3"
# checkov's helm runner renders with `helm template` and no --namespace, so every
# namespaced resource lands in "default" and CKV_K8S_21 fires whatever the chart does;
# the rendered-manifest scan (tests/charts/test_checkov.py) sets a namespace and covers it.
NAMESPACE_ARTEFACT = "CKV_K8S_21"


def _scan(directory: Path, home: Path) -> list[dict]:
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


def _checks(report: list[dict], key: str) -> list[dict]:
    return [c for part in report for c in part.get("results", {}).get(key, [])]


def _scanned(report: list[dict]) -> set[tuple[str, str]]:
    """(chart directory, resource kind) of every resource a check ran on."""
    out = set()
    for c in _checks(report, "passed_checks") + _checks(report, "failed_checks"):
        path = c["file_path"].lstrip("/")
        out.add((path, c["resource"].split(".", 1)[0]))
    return out


@pytest.fixture(scope="module")
def packaged_report(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    work = tmp_path_factory.mktemp("checkov-helm")
    dist, charts = work / "dist", work / "charts"
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
    return _scan(charts, work)


def test_packaged_elastic_job_resources_are_scanned(packaged_report: list[dict]) -> None:
    """elastic-job's own templates are scanned, not only the etcd-rendezvous chart."""
    kinds = {
        kind
        for path, kind in _scanned(packaged_report)
        if path.startswith("elastic-job/templates/")
    }
    assert {"StatefulSet", "Role", "RoleBinding", "Pod"} <= kinds, sorted(kinds)


def test_packaged_charts_fail_no_check(packaged_report: list[dict]) -> None:
    """No check fails on the packaged charts (bar checkov's own namespace artefact)."""
    failed = [
        c for c in _checks(packaged_report, "failed_checks") if c["check_id"] != NAMESPACE_ARTEFACT
    ]
    lines = [f"{c['check_id']} {c['resource']} ({c['file_path']})" for c in failed]
    assert not failed, "\n".join(lines)


def test_source_tree_scan_misses_elastic_job(tmp_path: Path) -> None:
    """The symlinked dependency hides elastic-job from a scan of the checkout's charts/."""
    assert (ROOT / "charts" / "elastic-job" / "charts" / "etcd-rendezvous").is_symlink()
    scanned = _scanned(_scan(ROOT / "charts", tmp_path))
    assert not [p for p, _ in scanned if p.startswith("elastic-job/templates/")], sorted(scanned)
