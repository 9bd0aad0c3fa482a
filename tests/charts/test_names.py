"""Object names of a release: the worker StatefulSets and the bundled etcd's never share a
name (their pods would be the same pods), whatever the release name's length; the cluster
chart's names made once, in its helpers, and its NOTES naming what it renders."""

from __future__ import annotations

import pytest
from chart_render import (
    CLUSTER,
    ELASTIC_JOB,
    HELM4,
    NAMESPACE,
    etcd_statefulset,
    helm_run,
    load,
    objects,
    worker_statefulsets,
)

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"


@pytest.mark.parametrize("length", [1, 20, 40, 41, 45, 49, 50, 51, 52, 53])
def test_worker_and_etcd_statefulsets_differ_for_every_release_name_length(length: int) -> None:
    """Helm allows release names up to 53 characters; 50-53 used to give a worker group the
    etcd StatefulSet's name. Names stay within 52 and keep the whole group name."""
    for values in ([], [MULTI]):
        objs = objects(ELASTIC_JOB, release="r" * length, values=values)
        workers = [s["metadata"]["name"] for s in worker_statefulsets(objs)]
        groups = [
            s["metadata"]["labels"]["elastic-job.pytorch.org/group"]
            for s in worker_statefulsets(objs)
        ]
        names = [*workers, etcd_statefulset(objs)["metadata"]["name"]]
        assert len(set(names)) == len(names), names
        for name, group in zip(workers, groups, strict=True):
            assert len(name) <= 52 and name.endswith(f"-{group}"), name
            assert not name.startswith("-") and "--" not in name, name


def test_short_names_are_unchanged() -> None:
    """Names that fit are `<fullname>-<group>`, as before."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    assert [s["metadata"]["name"] for s in worker_statefulsets(objs)] == [
        "run42-elastic-job-anchor",
        "run42-elastic-job-spot",
    ]


@pytest.mark.parametrize("length", [5, 53])
def test_the_cluster_charts_notes_name_its_objects_as_rendered(length: int) -> None:
    """elastic-job-cluster's NOTES.txt names the PodMonitor, PrometheusRule and dashboard
    ConfigMap it renders (names from one helper each, within 63 characters)."""
    release = "r" * length
    sets = ["--set", "dashboard.enabled=true"]
    values = ["-f", str(CLUSTER / "ci" / "monitoring-values.yaml")]
    args = ["--namespace", NAMESPACE, *values, *sets]
    proc = helm_run(HELM4, "install", release, str(CLUSTER), "--dry-run=client", *args)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    objs = load(helm_run(HELM4, "template", release, str(CLUSTER), *args).stdout)
    named = {o["kind"]: o["metadata"]["name"] for o in objs if o["kind"] != "ClusterRole"}
    assert {"PodMonitor", "PrometheusRule", "ConfigMap"} <= set(named), named
    for kind, name in named.items():
        assert len(name) <= 63, name
        assert f"/{name}" in notes or f" {name} " in notes, (kind, name, notes)


def test_the_cluster_charts_templates_name_objects_through_its_helpers() -> None:
    """As in elastic-job: a name is made once, in _helpers.tpl, and templates and NOTES.txt
    include it (an inline printf of fullname drifts from NOTES, as it did)."""
    for template in sorted((CLUSTER / "templates").glob("*")):
        if template.name != "_helpers.tpl":
            text = template.read_text()
            assert '"elastic-job-cluster.fullname"' not in text, template.name
