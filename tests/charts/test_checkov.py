"""checkov on the rendered manifests of every configuration: no failed check; every
skipped check is skipped by a `checkov.io/skipN: CKV_...=<reason>` annotation with a
reason from the chart's one table of reasons; and every skip matches a finding.

checkov does not evaluate a skipped check (base_check.run returns SKIPPED before
scanning), so it cannot say that a skip has become needless. The renders are therefore
scanned twice, as rendered and with the skip annotations removed: the checks skipped in
the first scan must be exactly the checks failed in the second."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHARTS, ROOT, cases, load, render

# checkov's scan of every render takes over a minute: not in `scripts/test --quick`.
pytestmark = pytest.mark.slow

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
SKIP_KEY = re.compile(r"^checkov\.io/skip\d+$")
# Where each chart keeps its reasons (the one place), and nowhere else in its templates.
REASON_HELPERS = {
    "elastic-job": ('define "elastic-job.checkovReasons"', "elastic-job.checkovAnnotations"),
    "etcd-rendezvous": ('define "etcd-rendezvous.checkovSkips"',),
}

Finding = tuple[str, str, str]  # (check id, rendered file, checkov resource)


def _scan(directory: Path, home: Path) -> subprocess.Popen[str]:
    """checkov over `directory`, started: the two scans run side by side (each is one
    single-threaded Python process; together they take the time of one on two cores)."""
    return subprocess.Popen(
        [CHECKOV, "-d", directory, "--framework", "kubernetes", "--output", "json",
         "--skip-download"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "BC_SKIP_MAPPING": "TRUE", "HOME": str(home)},
    )  # fmt: skip


def _report(scan: subprocess.Popen[str]) -> list[dict[str, Any]]:
    try:
        stdout, stderr = scan.communicate(timeout=600)
    finally:
        scan.kill()  # nothing once it has ended; a scan past the timeout does not linger
    assert scan.returncode in (0, 1), stderr[-3000:]
    report = json.loads(stdout)
    return report if isinstance(report, list) else [report]


def _without_skips(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        annotations = doc.get("metadata", {}).get("annotations") or {}
        for key in [k for k in annotations if SKIP_KEY.match(k)]:
            del annotations[key]
        yield doc


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    for index, case in enumerate(cases()):
        name = case.name.replace(":", "_").replace("/", "_")
        # checkov joins every file of a directory into one graph, and CKV2_K8S_6 links
        # a NetworkPolicy to pods by labels: a release name of its own per render (as
        # long as "run42") keeps one render's policies off another's pods.
        release = f"run{index:02d}"
        (out / f"{index:02d}-{name}.yaml").write_text(render(case, release=release))
    return out


@pytest.fixture(scope="module")
def reports(
    rendered: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The scan of the renders, and of the same renders with every checkov.io/skipN
    annotation removed."""
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: run scripts/bootstrap")
    out = tmp_path_factory.mktemp("unskipped")
    for path in sorted(rendered.glob("*.yaml")):
        docs = list(_without_skips(load(path.read_text())))
        (out / path.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    scans = _scan(rendered, rendered), _scan(out, out)
    return _report(scans[0]), _report(scans[1])


@pytest.fixture(scope="module")
def checkov_report(
    reports: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    return reports[0]


@pytest.fixture(scope="module")
def unskipped_report(
    reports: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    return reports[1]


def _results(report: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [check for part in report for check in part.get("results", {}).get(key, [])]


def _findings(report: list[dict[str, Any]], key: str) -> set[Finding]:
    return {
        (c["check_id"], Path(c["file_path"]).name, c["resource"]) for c in _results(report, key)
    }


def _annotated(rendered: Path) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    """(file, object, check id, reason) of every skip annotation in the renders."""
    for path in sorted(rendered.glob("*.yaml")):
        for doc in load(path.read_text()):
            for key, value in (doc["metadata"].get("annotations") or {}).items():
                if SKIP_KEY.match(key):
                    check, _, reason = str(value).partition("=")
                    yield path.name, doc, check, reason


def test_checkov_finds_no_failed_check(checkov_report: list[dict[str, Any]]) -> None:
    """No checkov check fails on any rendered configuration."""
    failed = _results(checkov_report, "failed_checks")
    lines = [f"{c['check_id']} {c['resource']} ({Path(c['file_path']).name})" for c in failed]
    assert not failed, "\n".join(lines)


def test_checkov_ran_checks(checkov_report: list[dict[str, Any]]) -> None:
    """The scan is not vacuous: hundreds of checks passed."""
    assert len(_results(checkov_report, "passed_checks")) > 200


def test_every_skipped_check_has_a_reason(checkov_report: list[dict[str, Any]]) -> None:
    """Each skip comes from an annotation `CKV_..=<reason>` with a real reason."""
    skipped = _results(checkov_report, "skipped_checks")
    assert skipped
    for check in skipped:
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason.split()) >= 4, f"{check['check_id']} on {check['resource']}: {reason!r}"


def test_every_skip_matches_a_finding(
    checkov_report: list[dict[str, Any]], unskipped_report: list[dict[str, Any]]
) -> None:
    """A check is skipped on a resource exactly when it fails there without the skip: no
    needless skip (the finding was fixed or never applied), no finding left unskipped."""
    skipped = _findings(checkov_report, "skipped_checks")
    failed = _findings(unskipped_report, "failed_checks")
    needless = sorted(skipped - failed)
    assert not needless, "skipped but passes without the skip:\n" + "\n".join(map(str, needless))
    hidden = sorted(failed - skipped)
    assert not hidden, "fails without the skip, yet not skipped:\n" + "\n".join(map(str, hidden))


def test_every_skip_annotation_is_applied(
    rendered: Path, checkov_report: list[dict[str, Any]]
) -> None:
    """Each annotation names a check that checkov skipped on that object (a misspelt id
    or a check that does not run on the kind would silently do nothing). Graph checks
    (CKV2_*) run on the Pod checkov derives from a StatefulSet, named after it."""
    skipped = _findings(checkov_report, "skipped_checks")
    for file, doc, check, _ in _annotated(rendered):
        meta = doc["metadata"]
        names = {f"{kind}.{meta['namespace']}.{meta['name']}" for kind in (doc["kind"], "Pod")}
        assert any(
            c == check and f == file and (r in names or any(r.startswith(n + ".") for n in names))
            for c, f, r in skipped
        ), f"{file}: {check} annotated on {doc['kind']} {meta['name']} but not skipped"


def test_one_reason_per_check(rendered: Path) -> None:
    """A check id has one reason per component of a chart, whatever the configuration:
    the reasons come from one table, not from text assembled per render."""
    reasons: dict[tuple[str, str, str], set[str]] = {}
    for _, doc, check, reason in _annotated(rendered):
        labels = doc["metadata"]["labels"]
        key = (labels["app.kubernetes.io/name"], labels["app.kubernetes.io/component"], check)
        reasons.setdefault(key, set()).add(reason)
    assert reasons
    several = {key: sorted(r) for key, r in reasons.items() if len(r) > 1}
    assert not several, several


@pytest.mark.parametrize("chart", sorted(REASON_HELPERS))
def test_skip_annotations_come_from_the_reasons_helper(chart: str) -> None:
    """No template writes a checkov.io/skip annotation or a check id of its own: they all
    go through the chart's helper that holds the reasons."""
    templates = CHARTS / chart / "templates"
    helpers = (templates / "_helpers.tpl").read_text()
    for marker in REASON_HELPERS[chart]:
        assert marker in helpers, f"{marker} missing from {chart}/templates/_helpers.tpl"
    for path in sorted(templates.rglob("*")):
        if path.is_file() and path.name != "_helpers.tpl":
            text = path.read_text()
            assert "checkov.io/skip" not in text, f"{path.relative_to(ROOT)} writes a skip itself"
            reason = re.search(r"CKV2?_K8S_\d+=", text)
            assert not reason, f"{path.relative_to(ROOT)} holds a skip reason"
