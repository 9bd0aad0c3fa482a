"""templates/rbac-clusterrole.yaml and rbac-clusterrolebinding.yaml: only `get` on `nodes`."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, NAMESPACE, RELEASE, objects, one

SA = f"{RELEASE}-elastic-job"


def test_cluster_role_grants_only_get_on_nodes() -> None:
    """rbac.nodeReader: a ClusterRole with the single rule `get` on `nodes`."""
    role = one(objects(ELASTIC_JOB), "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def test_cluster_role_is_named_per_namespace_and_release() -> None:
    """Cluster-scoped names differ between namespaces and releases (no clash)."""
    name = one(objects(ELASTIC_JOB), "ClusterRole")["metadata"]["name"]
    assert NAMESPACE in name and RELEASE in name
    other_ns = one(objects(ELASTIC_JOB, namespace="other"), "ClusterRole")["metadata"]["name"]
    other_rel = one(objects(ELASTIC_JOB, release="other"), "ClusterRole")["metadata"]["name"]
    assert len({name, other_ns, other_rel}) == 3


def test_cluster_role_binding_binds_the_service_account() -> None:
    """The ClusterRoleBinding binds that ClusterRole to this release's ServiceAccount."""
    objs = objects(ELASTIC_JOB)
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": one(objs, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}]
