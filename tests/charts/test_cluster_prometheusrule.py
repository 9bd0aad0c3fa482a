"""elastic-job-cluster templates/prometheusrule.yaml: the alerts of every job, written once
and grouped by namespace and elastic_job, unit-tested with `promtool test rules`.

The chart's PrometheusRule is rendered (prometheusRule.enabled), its groups written to a
rules file, and each file in tests/charts/alerts/ (one per alert: the series that should
fire it, and healthy jobs that must not; the worker series with the labels a scrape gives
them) run against it by Debian's promtool (scripts/bootstrap installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CLUSTER, ELASTIC_JOB, objects, of_kind, one, render_error
from testlib import ROOT

ALERTS_DIR = Path(__file__).parent / "alerts"
ON = ["prometheusRule.enabled=true"]
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMTOOL = shutil.which("promtool")


def rule(sets: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    return one(objects(CLUSTER, sets=[*ON, *(sets or [])], **kwargs), "PrometheusRule")


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


@pytest.mark.slow
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
            for check in case.get("alert_rule_test", []):
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


def test_the_rules_group_by_namespace_and_job_and_never_name_one() -> None:
    """Written once for every job: each worker-series aggregation keeps namespace and
    elastic_job (the job id), no selector names a job, a namespace or the scrape's `job`."""
    for name, alert in alerts(rule()).items():
        expr = alert["expr"]
        assert "elastic_job=" not in expr and "namespace=" not in expr, (name, expr)
        for by in re.findall(r"\b(?:max|min|sum) by \(([^)]*)\) \(\w*\(?elastic_job_", expr):
            assert {"namespace", "elastic_job"} <= {x.strip() for x in by.split(",")}, (name, by)
        assert not re.search(r"elastic_job_\w+\{", expr), (name, expr)
        assert "job" not in alert["labels"], name


def test_kube_state_metrics_series_are_selected_by_the_mixin_style_selector() -> None:
    """prometheusRule.kubeStateMetricsSelector reaches every kube_* selector."""
    found = alerts(rule(['prometheusRule.kubeStateMetricsSelector=job="ksm"\\,cluster="a"']))
    kube = [m for a in found.values() for m in re.findall(r"kube_\w+\{([^}]*)\}", a["expr"])]
    assert len(kube) == 4, kube
    assert all(m.startswith('job="ksm",cluster="a"') for m in kube), kube


def test_thresholds_and_durations_come_from_the_values() -> None:
    """prometheusRule.*: each threshold and duration reaches its expression."""
    found = alerts(
        rule(
            [
                "prometheusRule.rendezvousOnGpuNode.for=1h",
                'prometheusRule.rendezvousOnGpuNode.podSelector=created_by_name=~"etcd-.+"',
                "prometheusRule.worldSizeBelowMin.for=7m",
                "prometheusRule.restartStorm.restarts=9",
                "prometheusRule.restartStorm.window=2h",
                "prometheusRule.rendezvousFlapping.reforms=11",
                "prometheusRule.rendezvousFlapping.window=3h",
                "prometheusRule.trainingStalled.window=45m",
                "prometheusRule.trainingStalled.for=9m",
                "prometheusRule.restartsNearlyExhausted.remaining=4",
                "prometheusRule.runbookUrl=https://wiki.example/runbook.md",
            ]
        )
    )
    assert found["ElasticJobRendezvousOnGpuNode"]["for"] == "1h"
    assert 'created_by_name=~"etcd-.+",node!=""' in found["ElasticJobRendezvousOnGpuNode"]["expr"]
    assert found["ElasticJobWorldSizeBelowMin"]["for"] == "7m"
    assert "[2h])) > 9" in found["ElasticJobRankRestartStorm"]["expr"]
    assert "[3h])) > 11" in found["ElasticJobRendezvousFlapping"]["expr"]
    assert "[45m])) == 0" in found["ElasticJobTrainingStalled"]["expr"]
    assert found["ElasticJobTrainingStalled"]["for"] == "9m"
    assert ") <= 4\n" in found["ElasticJobRestartsNearlyExhausted"]["expr"]
    for alert in found.values():
        assert alert["annotations"]["runbook_url"].startswith("https://wiki.example/runbook.md#")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("prometheusRule.restartStorm.window=15 minutes", "window"),
        ('prometheusRule.kubeStateMetricsSelector={job="ksm"}', "kubeStateMetricsSelector"),
        ("prometheusRule.restartStorm.restarts=0", "restarts"),
    ],
)
def test_bad_rule_values_are_refused_by_the_schema(value: str, needle: str) -> None:
    err = render_error(CLUSTER, sets=[*ON, value])
    assert needle in err.stderr


def test_the_rule_carries_its_labels_in_the_release_namespace() -> None:
    """prometheusRule.labels: the label the Prometheus selects rules by."""
    found = rule(["prometheusRule.labels.release=kube-prometheus-stack"], namespace="monitoring")
    assert found["metadata"]["namespace"] == "monitoring"
    assert found["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_no_rule_by_default_and_none_in_a_jobs_release() -> None:
    """The CRD is never assumed; a per-job release renders no rule whatever its values."""
    assert not of_kind(objects(CLUSTER), "PrometheusRule")
    assert not of_kind(objects(ELASTIC_JOB, sets=["monitoring.enabled=true"]), "PrometheusRule")
