"""elastic-job-cluster templates/worker-podmonitor.yaml: one PodMonitor for the workers of
every elastic-job release, so that teams need none of their own."""

from __future__ import annotations

from chart_render import (
    CLUSTER,
    ELASTIC_JOB,
    container,
    etcd_statefulset,
    objects,
    of_kind,
    one,
    selects,
    worker_statefulsets,
)

ON = ["podMonitor.enabled=true"]
MULTIGROUP = ELASTIC_JOB / "ci" / "multigroup-values.yaml"


def test_it_selects_the_workers_of_any_release_and_not_their_etcd() -> None:
    """Its selector matches the worker pods of every group of releases with any name or
    nameOverride, never the bundled etcd; the endpoint is the workers' `metrics` port."""
    monitor = one(objects(CLUSTER, sets=ON, namespace="monitoring"), "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for release, sets in (("run42", []), ("llm", ["nameOverride=trainer"])):
        job = objects(
            ELASTIC_JOB,
            values=[MULTIGROUP],
            sets=["monitoring.enabled=true", *sets],
            release=release,
            namespace="team-a",
        )
        for sts in worker_statefulsets(job):
            assert selects(selector, sts["spec"]["template"]["metadata"]["labels"]), release
            ports = container(sts, "worker")["ports"]
            assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in ports}
        etcd = etcd_statefulset(job)["spec"]["template"]["metadata"]["labels"]
        assert not selects(selector, etcd)


def test_every_namespace_by_default_and_the_named_ones_when_set() -> None:
    """podMonitor.namespaces empty: `any: true`; set: those, sorted."""
    monitor = one(objects(CLUSTER, sets=ON), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    monitor = one(
        objects(
            CLUSTER,
            sets=[*ON, "podMonitor.namespaces.team-b=true", "podMonitor.namespaces.team-a=true"],
        ),
        "PodMonitor",
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_no_honor_labels_and_the_interval_and_labels_as_set() -> None:
    """kube-prometheus-stack conventions: the target's labels win (the series carry only
    elastic_job and group, docs/contracts.md); podMonitor.interval and .labels."""
    monitor = one(
        objects(CLUSTER, sets=[*ON, "podMonitor.interval=10s", "podMonitor.labels.release=kps"]),
        "PodMonitor",
    )
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "10s"}
    ]


def test_off_by_default() -> None:
    assert not of_kind(objects(CLUSTER), "PodMonitor")
