"""checkov on the rendered manifests of every configuration: no failed check, and every
skipped check is skipped by a `checkov.io/skipN: CKV_...=<reason>` annotation with a reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from chart_render import ROOT, cases, render

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"


@pytest.fixture(scope="module")
def checkov_report(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: run scripts/bootstrap")
    out = tmp_path_factory.mktemp("rendered")
    for index, case in enumerate(cases()):
        name = case.name.replace(":", "_").replace("/", "_")
        (out / f"{index:02d}-{name}.yaml").write_text(render(case))
    proc = subprocess.run(
        [CHECKOV, "-d", out, "--framework", "kubernetes", "--output", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PATH": "/usr/bin:/bin", "BC_SKIP_MAPPING": "TRUE", "HOME": str(out)},
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return report if isinstance(report, list) else [report]


def _results(report: list[dict], key: str) -> list[dict]:
    return [check for part in report for check in part.get("results", {}).get(key, [])]


def test_checkov_finds_no_failed_check(checkov_report: list[dict]) -> None:
    """No checkov check fails on any rendered configuration."""
    failed = _results(checkov_report, "failed_checks")
    lines = [f"{c['check_id']} {c['resource']} ({Path(c['file_path']).name})" for c in failed]
    assert not failed, "\n".join(lines)


def test_checkov_ran_checks(checkov_report: list[dict]) -> None:
    """The scan is not vacuous: hundreds of checks passed."""
    assert len(_results(checkov_report, "passed_checks")) > 200


def test_every_skipped_check_has_a_reason(checkov_report: list[dict]) -> None:
    """Each skip comes from an annotation `CKV_..=<reason>` with a real reason."""
    skipped = _results(checkov_report, "skipped_checks")
    assert skipped
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason.split()) >= 4, f"{check['check_id']} on {check['resource']}: {reason!r}"
