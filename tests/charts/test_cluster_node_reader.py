"""elastic-job-cluster templates/node-reader-clusterrole.yaml and
node-reader-clusterrolebinding.yaml: `get` on `nodes`, bound once to the service accounts of
the namespaces an admin names (tests/charts/test_tenant.py checks what that grants whom)."""

from __future__ import annotations

from chart_render import CLUSTER, RELEASE, objects, of_kind, one, render_error

NAME = f"{RELEASE}-elastic-job-cluster-node-reader"
GROUP = "rbac.authorization.k8s.io"


def test_cluster_role_grants_only_get_on_nodes() -> None:
    """nodeReader.enabled (the default): a ClusterRole with the single rule `get` on `nodes`."""
    role = one(objects(CLUSTER), "ClusterRole")
    assert role["metadata"]["name"] == NAME
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def test_the_binding_names_each_namespace_as_its_service_accounts_group_sorted() -> None:
    """nodeReader.namespaces: one Group subject system:serviceaccounts:<namespace> per
    namespace set true, sorted (deterministic output); one set false is left out."""
    objs = objects(
        CLUSTER,
        sets=[
            "nodeReader.namespaces.team-b=true",
            "nodeReader.namespaces.team-a=true",
            "nodeReader.namespaces.old-team=false",
        ],
    )
    binding = one(objs, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == NAME
    assert binding["roleRef"] == {"apiGroup": GROUP, "kind": "ClusterRole", "name": NAME}
    assert binding["subjects"] == [
        {"apiGroup": GROUP, "kind": "Group", "name": "system:serviceaccounts:team-a"},
        {"apiGroup": GROUP, "kind": "Group", "name": "system:serviceaccounts:team-b"},
    ]


def test_all_service_accounts_binds_the_one_group_of_every_service_account() -> None:
    """nodeReader.allServiceAccounts: the Group system:serviceaccounts alone."""
    binding = one(
        objects(
            CLUSTER,
            sets=["nodeReader.allServiceAccounts=true", "nodeReader.namespaces.team-a=true"],
        ),
        "ClusterRoleBinding",
    )
    assert binding["subjects"] == [
        {"apiGroup": GROUP, "kind": "Group", "name": "system:serviceaccounts"}
    ]


def test_no_binding_without_a_namespace_and_nothing_when_disabled() -> None:
    """Defaults: the ClusterRole waits for nodeReader.namespaces (NOTES.txt says how);
    nodeReader.enabled=false: neither object."""
    assert not of_kind(objects(CLUSTER), "ClusterRoleBinding")
    assert not of_kind(
        objects(CLUSTER, sets=["nodeReader.namespaces.team-a=false"]), "ClusterRoleBinding"
    )
    off = objects(CLUSTER, sets=["nodeReader.enabled=false", "nodeReader.namespaces.team-a=true"])
    assert not of_kind(off, "ClusterRole") and not of_kind(off, "ClusterRoleBinding")


def test_a_namespace_that_is_not_a_dns_label_is_refused() -> None:
    err = render_error(CLUSTER, sets=["nodeReader.namespaces.Team_A=true"])
    assert "Team_A" in err.stderr, err.stderr


def test_common_labels_reach_every_object_but_not_the_charts_own() -> None:
    """global.commonLabels on each object; a key the chart sets itself is refused."""
    objs = objects(
        CLUSTER,
        sets=[
            "global.commonLabels.team=platform",
            "nodeReader.namespaces.a=true",
            "dashboard.enabled=true",
        ],
    )
    assert len(objs) == 3
    assert all(o["metadata"]["labels"]["team"] == "platform" for o in objs)
    err = render_error(CLUSTER, sets=["global.commonLabels.app\\.kubernetes\\.io/name=x"])
    assert "global.commonLabels.app.kubernetes.io/name" in err.stderr, err.stderr
