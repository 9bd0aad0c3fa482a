"""templates/worker-service.yaml: the one headless Service of the job's workers."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, RELEASE, objects, one, selects, worker_statefulsets

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"


def test_headless_and_published_before_ready() -> None:
    """clusterIP None and publishNotReadyAddresses (workers have no readiness probe)."""
    service = one(objects(ELASTIC_JOB), "Service", f"{RELEASE}-elastic-job-workers")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_selects_the_pods_of_every_group_and_nothing_else() -> None:
    """Selector name/instance/component=worker: every group's pods, not etcd's."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    service = one(objs, "Service", f"{RELEASE}-elastic-job-workers")
    selector = service["spec"]["selector"]
    assert set(selector) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
    }
    for sts in worker_statefulsets(objs):
        assert selects(selector, sts["spec"]["template"]["metadata"]["labels"])
    etcd = one(objs, "StatefulSet", f"{RELEASE}-etcd-rendezvous")
    assert not selects(selector, etcd["spec"]["template"]["metadata"]["labels"])
