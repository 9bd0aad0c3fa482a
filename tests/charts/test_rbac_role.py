"""templates/rbac-role.yaml and rbac-rolebinding.yaml: scale this release's own StatefulSets."""

from __future__ import annotations

from chart_render import ELASTIC_JOB, NAMESPACE, RELEASE, objects, of_kind, one, worker_statefulsets

MULTI = ELASTIC_JOB / "ci" / "multigroup-values.yaml"
SA = f"{RELEASE}-elastic-job"


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
