"""elastic-job-cluster templates/grafana-dashboard.yaml and dashboards/elastic-job.json: the
Grafana dashboard of every job (namespace and job variables), as a ConfigMap for the sidecar
(dashboard.*), with queries that name only series that exist and that Prometheus parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CLUSTER, ELASTIC_JOB, NAMESPACE, RELEASE, objects, render_error
from elastic_worker.observe.metrics import Identity, JobMetrics

DASHBOARD = CLUSTER / "dashboards" / "elastic-job.json"
ON = ["dashboard.enabled=true"]
# kube-state-metrics' standard series the dashboard may use (none today; the node's
# capacity type comes from the worker's own elastic_job_node_info).
KUBE_STATE_METRICS: set[str] = set()
# Grafana's variables and macros, as Prometheus would see them once Grafana filled them in.
GRAFANA = {"$namespace": ".*", "$job": ".*", "$__rate_interval": "2m", "$__range": "6h"}


def dashboard_configmaps(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objs
        if o["kind"] == "ConfigMap"
        and o["metadata"]["labels"].get("app.kubernetes.io/component") == "monitoring"
    ]


def expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def series_the_worker_exports() -> set[str]:
    """Every sample name the worker's registry serves (with _total, _bucket, _info, ...)."""
    metrics = JobMetrics(Identity("j", "g"))
    metrics.node.info({"node": "n"})
    metrics.last_step().set(1)
    metrics.step_seconds().set(1)
    metrics.last_progress().set(1)
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def test_off_by_default_and_never_in_a_jobs_release() -> None:
    """The cluster chart renders it when asked; a per-job release has no dashboard at all."""
    assert dashboard_configmaps(objects(CLUSTER)) == []
    assert dashboard_configmaps(objects(ELASTIC_JOB, sets=["monitoring.enabled=true"])) == []


def test_the_configmap_holds_the_charts_dashboard_file_with_the_sidecars_label() -> None:
    (cm,) = dashboard_configmaps(
        objects(
            CLUSTER,
            sets=[
                *ON,
                "dashboard.sidecarLabel=dashboards.example.com/grafana",
                "dashboard.sidecarLabelValue=ml",
                "dashboard.namespace=grafana",
                "dashboard.annotations.grafana_folder=Training",
            ],
        )
    )
    assert cm["metadata"]["name"] == f"{RELEASE}-elastic-job-cluster-dashboard"
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["dashboards.example.com/grafana"] == "ml"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Training"}
    assert list(cm["data"]) == ["elastic-job.json"]
    assert json.loads(cm["data"]["elastic-job.json"]) == json.loads(DASHBOARD.read_text())


def test_defaults_are_kube_prometheus_stacks_sidecar_label_in_the_release_namespace() -> None:
    (cm,) = dashboard_configmaps(objects(CLUSTER, sets=ON))
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in cm["metadata"]


def test_a_sidecar_label_the_chart_sets_itself_is_refused() -> None:
    err = render_error(CLUSTER, sets=[*ON, "dashboard.sidecarLabel=app.kubernetes.io/name"])
    assert "dashboard.sidecarLabel" in err.stderr, err.stderr


def test_every_panel_reads_the_datasource_and_the_namespace_and_job_variables() -> None:
    """One dashboard for every job: a `namespace` variable, a `job` variable (the series'
    `elastic_job` label, never the scrape's `job`) within it, and every query filtered by
    both and grouped by both."""
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["namespace"]["definition"] == "label_values(elastic_job_min_nodes, namespace)"
    assert variables["job"]["definition"] == (
        'label_values(elastic_job_min_nodes{namespace=~"$namespace"}, elastic_job)'
    )
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert '{namespace=~"$namespace", elastic_job=~"$job"' in expr, (panel["title"], expr)
            assert not re.search(r"\bjob=|\(job[,)]", expr), (panel["title"], expr)
            for by in re.findall(r"\bby \(([^)]*)\)", expr):
                assert {"namespace", "elastic_job"} <= {b.strip() for b in by.split(",")}, expr


def test_every_query_names_only_series_the_worker_or_kube_state_metrics_export() -> None:
    known = series_the_worker_exports() | KUBE_STATE_METRICS
    for expr in expressions():
        for name in re.findall(r"\b(elastic_job_[a-z_]+|kube_[a-z_]+)\s*[{\[(]", expr):
            assert name in known, f"{name} in {expr!r}: no such series ({sorted(known)})"


def test_the_dashboard_shows_what_the_issue_lists() -> None:
    text = " ".join(expressions())
    for series in (
        "elastic_job_world_size_nodes",  # world size over time per job
        "elastic_job_reforms_total",  # re-forms
        "elastic_job_reform_rendezvous_seconds_bucket",  # and their cost
        "elastic_job_step_seconds",  # steps per second
        "elastic_job_worker_restarts_total",  # restarts
        "elastic_job_pod_state",  # pods by state
        "elastic_job_node_info",  # and by capacity type
    ):
        assert series in text, series
    assert "capacity_type" in text


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool parses each expression (as a recording rule), Grafana's variables filled."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: run scripts/bootstrap (Debian's prometheus package)")
    rules = []
    for i, query in enumerate(expressions()):
        expr = query
        for var, value in GRAFANA.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout, result.stdout
