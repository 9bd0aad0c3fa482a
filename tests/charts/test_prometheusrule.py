"""templates/prometheusrule.yaml: the job's alerts, unit-tested with `promtool test rules`.

The chart's PrometheusRule is rendered with the test-only values in
tests/charts/values/monitoring.yaml, its groups written to a rules file, and each file in
tests/charts/alerts/ (one per alert: the series that should fire it, and a healthy job
that must not) run against it by Debian's promtool (scripts/bootstrap installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import ELASTIC_JOB, objects, of_kind, one
from testlib import ROOT

ALERTS_DIR = Path(__file__).parent / "alerts"
MONITORING = Path(__file__).parent / "values" / "monitoring.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMTOOL = shutil.which("promtool")


def rule(**kwargs: Any) -> dict[str, Any]:
    return one(objects(ELASTIC_JOB, values=[MONITORING], **kwargs), "PrometheusRule")


def alerts(prometheus_rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in prometheus_rule["spec"]["groups"] for r in group["rules"]}


def write_rules(prometheus_rule: dict[str, Any], where: Path) -> Path:
    path = where / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": prometheus_rule["spec"]["groups"]}))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if PROMTOOL is None:
        pytest.skip("promtool not found: run scripts/bootstrap (Debian's prometheus package)")
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_each_alert_fires_on_its_series_and_stays_silent_on_a_healthy_job(
    tmp_path: Path,
) -> None:
    """promtool test rules, one file per alert in tests/charts/alerts/."""
    rules = write_rules(rule(), tmp_path)
    tests = []
    for source in sorted(ALERTS_DIR.glob("*.yaml")):
        spec = yaml.safe_load(source.read_text())
        spec.update(rule_files=[str(rules)], evaluation_interval="1m")
        target = tmp_path / source.name
        target.write_text(yaml.safe_dump(spec))
        tests.append(str(target))
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    """Each rendered alert appears in tests/charts/alerts/ both with expected alerts and
    with none (a healthy job), so no alert goes untested or only half tested."""
    fired: set[str] = set()
    silent: set[str] = set()
    for source in ALERTS_DIR.glob("*.yaml"):
        for case in yaml.safe_load(source.read_text())["tests"]:
            for check in case["alert_rule_test"]:
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts(rule()))
    assert names == fired, "alerts without a firing test (or tests of no alert)"
    assert names <= silent, "alerts without a silent (healthy) test"


def test_the_rules_pass_promtool_check(tmp_path: Path) -> None:
    result = promtool("check", "rules", str(write_rules(rule(), tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_each_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    """kubernetes-mixin style: a severity label, summary and description, and a
    runbook_url whose anchor is a section of docs/runbook.md."""
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    for name, alert in alerts(rule()).items():
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base.endswith("docs/runbook.md"), url
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section {anchor}"


def test_thresholds_and_durations_come_from_the_values() -> None:
    """monitoring.prometheusRule.*: each threshold and duration reaches its expression."""
    found = alerts(
        rule(
            sets=[
                "monitoring.prometheusRule.rendezvousOnGpuNode.for=1h",
                "monitoring.prometheusRule.worldSizeBelowMin.for=7m",
                "monitoring.prometheusRule.restartStorm.restarts=9",
                "monitoring.prometheusRule.restartStorm.window=2h",
                "monitoring.prometheusRule.rendezvousFlapping.reforms=11",
                "monitoring.prometheusRule.rendezvousFlapping.window=3h",
                "monitoring.prometheusRule.trainingStalled.window=45m",
                "monitoring.prometheusRule.trainingStalled.for=9m",
                "monitoring.prometheusRule.restartsNearlyExhausted.remaining=4",
                "monitoring.prometheusRule.runbookUrl=https://wiki.example/runbook.md",
            ]
        )
    )
    assert found["ElasticJobRendezvousOnGpuNode"]["for"] == "1h"
    assert found["ElasticJobWorldSizeBelowMin"]["for"] == "7m"
    assert "[2h])) > 9" in found["ElasticJobRankRestartStorm"]["expr"]
    assert "[3h])) > 11" in found["ElasticJobRendezvousFlapping"]["expr"]
    assert "[45m])) == 0" in found["ElasticJobTrainingStalled"]["expr"]
    assert found["ElasticJobTrainingStalled"]["for"] == "9m"
    assert ") <= 4\n" in found["ElasticJobRestartsNearlyExhausted"]["expr"]
    for alert in found.values():
        assert alert["annotations"]["runbook_url"].startswith("https://wiki.example/runbook.md#")


def test_the_rules_select_this_jobs_series_by_its_id() -> None:
    """job.id set: every worker-series selector names it (the series' `job` label)."""
    found = alerts(rule(sets=["job.id=llm-7b"]))
    for name, alert in found.items():
        selectors = re.findall(r"elastic_job_\w+\{([^}]*)\}", alert["expr"])
        assert all(s == 'job="llm-7b"' for s in selectors), (name, selectors)
    assert found["ElasticJobRendezvousOnGpuNode"]["labels"]["job"] == "llm-7b"


def test_an_external_rendezvous_has_no_etcd_placement_alert() -> None:
    """etcd-rendezvous.enabled=false: the job has no etcd pod to place."""
    found = alerts(
        rule(sets=["etcd-rendezvous.enabled=false", "rendezvous.endpoint=etcd.infra:2379"])
    )
    assert "ElasticJobRendezvousOnGpuNode" not in found
    assert len(found) == 5


def test_no_rule_by_default() -> None:
    assert not of_kind(objects(ELASTIC_JOB, sets=["monitoring.enabled=true"]), "PrometheusRule")
