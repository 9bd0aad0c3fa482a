"""templates/rbac-clusterrole.yaml, rbac-clusterrolebinding.yaml, rbac-role.yaml,
rbac-rolebinding.yaml and serviceaccount.yaml: exactly the access the job needs."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, NAMESPACE, RELEASE, objects, of_kind, one, worker_statefulsets

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"
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


def test_role_grants_get_and_patch_on_own_statefulsets_by_name() -> None:
    """rbac.scaleDown: one rule, apps statefulsets and statefulsets/scale, verbs get and
    patch, resourceNames = exactly this release's worker StatefulSets."""
    objs = objects(ELASTIC_JOB, values=[MULTI])
    (rule,) = one(objs, "Role")["rules"]
    assert rule == {
        "apiGroups": ["apps"],
        "resources": ["statefulsets", "statefulsets/scale"],
        "resourceNames": [s["metadata"]["name"] for s in worker_statefulsets(objs)],
        "verbs": ["get", "patch"],
    }
    assert f"{RELEASE}-etcd-rendezvous" not in rule["resourceNames"]


def test_role_binding_binds_the_service_account() -> None:
    """The RoleBinding binds the Role to the ServiceAccount, in the release namespace."""
    objs = objects(ELASTIC_JOB)
    binding = one(objs, "RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == one(objs, "Role")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}]


def test_no_other_rbac_objects_and_no_wildcards() -> None:
    """Exactly one ClusterRole and one Role, no `*` anywhere in their rules."""
    objs = objects(ELASTIC_JOB)
    roles = of_kind(objs, "ClusterRole") + of_kind(objs, "Role")
    assert len(roles) == 2
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key]


def test_each_part_switches_off() -> None:
    """rbac.nodeReader.enabled, rbac.scaleDown.enabled and serviceAccount.create."""
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "rbac.nodeReader.enabled=false",
            "rbac.scaleDown.enabled=false",
            "serviceAccount.create=false",
        ],
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
