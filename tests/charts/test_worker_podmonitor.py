"""templates/worker-podmonitor.yaml and the workers' metrics port (monitoring.*)."""

from __future__ import annotations

import pytest
from chart_render import (
    ELASTIC_JOB,
    NAMESPACE,
    RELEASE,
    container,
    env_of,
    objects,
    of_kind,
    one,
    render_error,
    selects,
    worker_statefulsets,
)

ON = ["monitoring.enabled=true", "monitoring.podMonitor.enabled=true"]
MULTIGROUP = ELASTIC_JOB / "ci" / "multigroup-values.yaml"


def test_the_pod_monitor_scrapes_the_metrics_port_of_every_worker_group() -> None:
    """monitoring.podMonitor.enabled: the PodMonitor selects the worker pods of every group
    in the release's namespace, on the container port named `metrics`, without honorLabels
    (the series' labels are not target labels); interval and extra labels as set."""
    objs = objects(
        ELASTIC_JOB,
        values=[MULTIGROUP],
        sets=[
            *ON,
            "monitoring.port=9555",
            "monitoring.podMonitor.interval=15s",
            "monitoring.podMonitor.labels.release=prom",
        ],
    )
    monitor = one(objs, "PodMonitor")
    assert monitor["metadata"]["name"] == f"{RELEASE}-elastic-job-workers"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "scheme": "http",
            "interval": "15s",
        }
    ]
    statefulsets = worker_statefulsets(objs)
    assert len(statefulsets) >= 2
    for sts in statefulsets:
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert selects(monitor["spec"]["selector"]["matchLabels"], labels)
        worker = container(sts, "worker")
        assert {"name": "metrics", "containerPort": 9555, "protocol": "TCP"} in worker["ports"]
        env = env_of(worker)
        assert (env["ELASTIC_METRICS"], env["ELASTIC_METRICS_PORT"]) == ("true", "9555")
        group = labels["elastic-job.pytorch.org/group"]
        assert env["ELASTIC_GROUP"] == group  # the `group` label of the pod's series
    etcd_pods = [o for o in of_kind(objs, "StatefulSet") if o not in statefulsets]
    for other in etcd_pods:
        assert not selects(
            monitor["spec"]["selector"]["matchLabels"],
            other["spec"]["template"]["metadata"]["labels"],
        )


def test_monitoring_off_by_default_no_port_no_monitor_metrics_off() -> None:
    """Defaults: no PodMonitor, no metrics port, ELASTIC_METRICS=false."""
    objs = objects(ELASTIC_JOB)
    assert not of_kind(objs, "PodMonitor") and not of_kind(objs, "PrometheusRule")
    worker = container(worker_statefulsets(objs)[0], "worker")
    assert "metrics" not in {p["name"] for p in worker.get("ports", [])}
    assert env_of(worker)["ELASTIC_METRICS"] == "false"


def test_metrics_without_a_pod_monitor_only_open_the_port() -> None:
    """monitoring.enabled alone: the port and the metrics, no CRD objects (own scrape config)."""
    objs = objects(ELASTIC_JOB, sets=["monitoring.enabled=true"])
    assert not of_kind(objs, "PodMonitor") and not of_kind(objs, "PrometheusRule")
    assert container(worker_statefulsets(objs)[0], "worker")["ports"][0]["name"] == "metrics"


def test_a_monitor_without_metrics_is_refused_naming_both_values() -> None:
    """monitoring.podMonitor.enabled with monitoring.enabled=false: one error naming both."""
    err = render_error(ELASTIC_JOB, sets=["monitoring.podMonitor.enabled=true"])
    assert "monitoring.podMonitor.enabled is true but monitoring.enabled is false" in err.stderr
    assert "set monitoring.enabled=true" in err.stderr


@pytest.mark.parametrize(
    ("value", "cluster_value"),
    [
        ("monitoring.prometheusRule.enabled", "prometheusRule.enabled=true"),
        ("monitoring.dashboard.enabled", "dashboard.enabled=true"),
        ("rbac.nodeReader.enabled", "nodeReader.namespaces.ml=true"),
    ],
)
def test_a_cluster_wide_part_asked_of_a_release_says_where_it_went(
    value: str, cluster_value: str
) -> None:
    """Values of earlier versions that made cluster-wide objects per release: one error
    naming the value and the elastic-job-cluster chart's value to use instead; the same
    keys set false are accepted (an old values file that turned them off)."""
    err = render_error(ELASTIC_JOB, sets=["monitoring.enabled=true", f"{value}=true"])
    assert value in err.stderr and "elastic-job-cluster" in err.stderr, err.stderr
    assert cluster_value in err.stderr, err.stderr
    assert objects(ELASTIC_JOB, sets=[f"{value}=false"])


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("monitoring.port=0", "monitoring.port"),
        ("monitoring.port=70000", "monitoring.port"),
        ("monitoring.podMonitor.interval=30", "monitoring.podMonitor.interval"),
    ],
)
def test_bad_monitoring_values_are_refused_by_the_schema(value: str, needle: str) -> None:
    err = render_error(ELASTIC_JOB, sets=["monitoring.enabled=true", value])
    # Helm up to 3.17 names the value `a.b`; 3.18+ (its new JSON schema library) `/a/b`.
    assert needle in err.stderr or "/" + needle.replace(".", "/") in err.stderr, err.stderr
