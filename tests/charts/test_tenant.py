"""A release installed by a tenant of a shared cluster: someone who holds Kubernetes' built-in
`admin` ClusterRole through a RoleBinding in their namespace, and nothing cluster-wide
(values-examples/tenant.yaml).

- No configuration of elastic-job renders a cluster-scoped object; "cluster-scoped" comes
  from the API discovery data (tests/charts/discovery.py), not from a list of kinds.
- That tenant may create every object of a release, through RBAC as the API server
  evaluates it (tests/charts/rbac.py) over the `admin` role's upstream rules
  (tests/charts/upstream/kubernetes-admin-clusterroles.yaml), including the escalation
  check on each Role and RoleBinding: a role grants only what its creator holds. Helm's own
  release records (Secrets in the namespace) are part of the install.
- What a tenant cannot grant, init-topology's `get` on its Node, comes from the
  elastic-job-cluster chart: its binding serves every release of a named namespace.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CLUSTER, ELASTIC_JOB, EXAMPLES, Case, cases, objects, pod_spec
from chart_render import worker_statefulsets as workers
from discovery import resource_of
from rbac import Request, User, authorized, rules_for, service_account, uncovered
from testlib import shared_dir

ADMIN_ROLES = Path(__file__).parent / "upstream" / "kubernetes-admin-clusterroles.yaml"
TENANT_NS = "team-a"
TENANT = User("alice@example.com", ("team-a-ml", "system:authenticated"))
TENANT_EXAMPLE = EXAMPLES / "tenant.yaml"
JOB_CASES = [c for c in cases() if c.chart == ELASTIC_JOB]
SHARED = shared_dir()
# Helm 3 and 4 keep each release revision in a Secret of the release namespace
# (`sh.helm.release.v1.<release>.v<revision>`, storage driver "secret"): an install lists
# them, creates one, and later revisions get, update and delete them.
HELM_STORAGE = [
    Request(verb, "", "secrets") for verb in ("list", "get", "create", "update", "delete")
]


@functools.cache
def admin_roles() -> list[dict[str, Any]]:
    return list(yaml.safe_load(ADMIN_ROLES.read_text())["items"])


def namespace_admin_binding(namespace: str) -> dict[str, Any]:
    """The usual way a team gets its namespace: `admin` bound by a RoleBinding there."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "team-a-admin", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "admin",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a-ml"}
        ],
    }


def tenant_rules(namespace: str = TENANT_NS) -> list[Any]:
    return rules_for(TENANT, namespace, [namespace_admin_binding(TENANT_NS)], admin_roles())


def refusals(objs: list[dict[str, Any]], namespace: str = TENANT_NS) -> list[str]:
    """What the tenant may not do to install `objs`: each object's create (at its scope and
    in its namespace), each Role's and RoleBinding's escalation check, Helm's records."""
    bindings, roles = [namespace_admin_binding(TENANT_NS)], admin_roles()
    rendered_roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Role"}
    out = [
        f"{r.verb} secrets (helm's release record)"
        for r in HELM_STORAGE
        if not authorized(TENANT, r, namespace, bindings, roles)
    ]
    for obj in objs:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        res = resource_of(obj, SHARED)
        assert res is not None, f"{what}: kind unknown to the discovery data"
        where = obj["metadata"].get("namespace", namespace) if res.namespaced else ""
        if not authorized(
            TENANT, Request("create", res.group, res.resource), where, bindings, roles
        ):
            scope = f"in namespace {where}" if where else "at the cluster scope"
            out.append(f"create {what} ({res.group or 'core'}/{res.resource} {scope})")
            continue
        granted: list[Any] = []
        if obj["kind"] == "Role":
            granted = obj.get("rules") or []
        elif obj["kind"] == "RoleBinding":
            ref = obj["roleRef"]
            assert ref["kind"] == "Role", f"{what}: binds a ClusterRole"
            granted = rendered_roles[ref["name"]].get("rules") or []
        out += [f"{what} escalates: {m}" for m in uncovered(tenant_rules(where), granted)]
    return out


def _needs_shared(case: Case, objs: list[dict[str, Any]]) -> None:
    if SHARED is None and any(resource_of(o, None) is None for o in objs):
        pytest.skip(
            f"{case}: CRD-backed objects and no ../shared/crds (offline): their scope is unknown"
        )


@pytest.mark.parametrize("case", JOB_CASES, ids=str)
def test_no_configuration_renders_a_cluster_scoped_object(case: Case) -> None:
    """Defaults, every ci/*-values.yaml, values-examples file and test-only values: each
    object's kind is namespaced (API discovery data), in the release namespace."""
    objs = objects(case, namespace=TENANT_NS)
    _needs_shared(case, objs)
    for obj in objs:
        res = resource_of(obj, SHARED)
        what = f"{obj['apiVersion']} {obj['kind']} {obj['metadata']['name']}"
        assert res is not None, f"{what}: kind unknown to the discovery data"
        assert res.namespaced, f"{what} is cluster-scoped: a tenant cannot create it"
        assert obj["metadata"].get("namespace", TENANT_NS) == TENANT_NS, what


@pytest.mark.parametrize("case", JOB_CASES, ids=str)
def test_a_namespace_admin_can_install_every_built_in_object_of_every_configuration(
    case: Case,
) -> None:
    """Every object of a Kubernetes API group, its Roles' and RoleBindings' grants
    included, and Helm's release records: allowed to `admin` in the namespace. Custom
    resources (PodMonitor, PodGroup, LocalQueue, Certificate) are the add-on's to grant:
    the next test says which."""
    objs = [o for o in objects(case, namespace=TENANT_NS) if resource_of(o, None) is not None]
    assert refusals(objs) == []


def test_the_tenant_example_installs_entirely_with_the_admin_role() -> None:
    """values-examples/tenant.yaml, custom resources included: nothing refused."""
    objs = objects(ELASTIC_JOB, values=[TENANT_EXAMPLE], namespace=TENANT_NS)
    kinds = {o["kind"] for o in objs}
    assert {"Role", "RoleBinding", "StatefulSet", "ServiceAccount", "Pod"} <= kinds, kinds
    assert refusals(objs) == []


def test_a_release_of_its_own_podmonitor_needs_more_than_the_admin_role() -> None:
    """monitoring.podMonitor.enabled: `admin` has no rule for monitoring.coreos.com (unless
    the cluster aggregates one into it), hence the cluster chart's PodMonitor for every
    job. Also shows the check refuses what it should."""
    if SHARED is None:
        pytest.skip("no ../shared/crds (offline): the PodMonitor's scope is unknown")
    objs = objects(
        ELASTIC_JOB, values=[ELASTIC_JOB / "ci" / "monitoring-values.yaml"], namespace=TENANT_NS
    )
    assert refusals(objs) == [
        "create PodMonitor run42-elastic-job-workers "
        f"(monitoring.coreos.com/podmonitors in namespace {TENANT_NS})"
    ]


def test_the_check_refuses_cluster_scoped_objects_and_grants_beyond_the_admin_role() -> None:
    """What the old per-release node reader was: a ClusterRole and its binding (refused at
    the cluster scope), and a Role granting `get` on nodes (refused as an escalation)."""
    reader = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    cluster_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "team-a-run42-node-reader"},
        "rules": [reader],
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "nodes", "namespace": TENANT_NS},
        "rules": [
            reader,
            {"apiGroups": ["apps"], "resources": ["statefulsets/status"], "verbs": ["update"]},
        ],
    }
    assert refusals([cluster_role, role]) == [
        "create ClusterRole team-a-run42-node-reader "
        "(rbac.authorization.k8s.io/clusterroles at the cluster scope)",
        "Role nodes escalates: get core/nodes",
        "Role nodes escalates: update apps/statefulsets/status",
    ]
    assert (
        uncovered(
            tenant_rules(),
            [
                {
                    "apiGroups": ["apps"],
                    "resources": ["statefulsets/scale"],
                    "verbs": ["patch"],
                    "resourceNames": ["x"],
                }
            ],
        )
        == []
    )
    assert refusals([role], namespace="team-b")[0].startswith("list secrets")


# -- the node reader, from the cluster chart -------------------------------------------------


def init_topology_identity(namespace: str) -> User:
    """Who init-topology's GET of its Node comes from: the pod's ServiceAccount token."""
    objs = objects(ELASTIC_JOB, values=[TENANT_EXAMPLE], namespace=namespace)
    (sts, *_) = workers(objs)
    spec = pod_spec(sts)
    assert spec.get("automountServiceAccountToken", True)
    return service_account(namespace, spec["serviceAccountName"])


def may_read_its_node(user: User, cluster_objs: list[dict[str, Any]]) -> bool:
    # init-topology: GET /api/v1/nodes/<NODE_NAME> (images/init-topology nodeapi.py)
    request = Request.from_http("GET", "/api/v1/nodes/gpu-node-7")
    bindings = [o for o in cluster_objs if o["kind"].endswith("Binding")]
    roles = [o for o in cluster_objs if o["kind"].endswith("Role")]
    return authorized(user, request, "", bindings, roles)


def test_the_node_reader_serves_every_release_of_the_namespaces_it_names() -> None:
    """nodeReader.namespaces.team-a: any release in team-a (its own ServiceAccount,
    whatever its name) may GET its Node; a release in another namespace may not, nor may
    any without the cluster chart."""
    cluster = objects(CLUSTER, sets=["nodeReader.namespaces.team-a=true"], namespace="kube-system")
    assert may_read_its_node(init_topology_identity(TENANT_NS), cluster)
    assert may_read_its_node(service_account(TENANT_NS, "some-other-release-elastic-job"), cluster)
    assert not may_read_its_node(init_topology_identity("team-b"), cluster)
    assert not may_read_its_node(init_topology_identity(TENANT_NS), [])


def test_all_service_accounts_serves_every_namespace() -> None:
    cluster = objects(CLUSTER, sets=["nodeReader.allServiceAccounts=true"])
    assert may_read_its_node(init_topology_identity("team-b"), cluster)


def test_the_node_reader_grants_nothing_but_get_on_nodes() -> None:
    """The binding serves every pod with a token in the namespace: it may read a Node and
    nothing else (no list or watch of Nodes, nothing namespaced)."""
    cluster = objects(CLUSTER, sets=["nodeReader.namespaces.team-a=true"])
    user = service_account(TENANT_NS, "anything")
    bindings = [o for o in cluster if o["kind"].endswith("Binding")]
    roles = [o for o in cluster if o["kind"].endswith("Role")]
    assert rules_for(user, "", bindings, roles) == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    ]
    assert rules_for(user, TENANT_NS, bindings, roles) == rules_for(user, "", bindings, roles)
    assert not authorized(user, Request("list", "", "nodes"), "", bindings, roles)
