"""templates/serviceaccount.yaml, and each RBAC part switched off."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, objects, of_kind, one, worker_statefulsets


def test_each_part_switches_off() -> None:
    """rbac.scaleDown.enabled and serviceAccount.create (the node reader is the
    elastic-job-cluster chart's, never a release's)."""
    objs = objects(
        ELASTIC_JOB,
        sets=["rbac.scaleDown.enabled=false", "serviceAccount.create=false"],
    )
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
        assert not of_kind(objs, kind), kind
    (sts,) = worker_statefulsets(objs)
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "default"


def test_service_account_name_and_annotations() -> None:
    """serviceAccount.name and .annotations (cloud workload identity); the token is mounted
    by the worker pods only."""
    objs = objects(
        ELASTIC_JOB,
        sets=["serviceAccount.name=trainer", "serviceAccount.annotations.iam\\.gke\\.io/x=y"],
    )
    account = one(objs, "ServiceAccount")
    assert account["metadata"]["name"] == "trainer"
    assert account["metadata"]["annotations"] == {"iam.gke.io/x": "y"}
    assert account["automountServiceAccountToken"] is False
    assert one(objs, "RoleBinding")["subjects"][0]["name"] == "trainer"
    (sts,) = worker_statefulsets(objs)
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "trainer"
