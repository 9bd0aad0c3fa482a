"""templates/rbac-role-reclaim.yaml and rbac-rolebinding-reclaim.yaml: with
`nodeLoss.reclaim.enabled` the workers may get and delete this release's own worker pods,
by name (every ordinal the groups' replicas make), and nothing else: no other pod, no list,
no Nodes (a peer's node readiness is read from its pod's conditions)."""

from __future__ import annotations

from typing import Any

import pytest
from chart_render import (
    ELASTIC_JOB,
    NAMESPACE,
    RELEASE,
    container,
    env_of,
    objects,
    one,
    render_error,
    worker_statefulsets,
)
from rbac import Request, allows
from test_rbac_role_events import SA, worker_sees_token


def reclaim_roles(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-reclaim")]


def pod(method: str, name: str) -> Request:
    return Request.from_http(method, f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")


def test_reclaim_grants_get_and_delete_on_every_worker_pod_by_name_and_nothing_else() -> None:
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "nodeLoss.reclaim.enabled=true",
            "workerGroups.default.replicas=2",
            "workerGroups.spot.replicas=3",
        ],
    )
    (role,) = reclaim_roles(objs)
    (rule,) = role["rules"]
    names = {f"{RELEASE}-elastic-job-default-{i}" for i in range(2)}
    names |= {f"{RELEASE}-elastic-job-spot-{i}" for i in range(3)}
    assert set(rule["resourceNames"]) == names and len(rule["resourceNames"]) == 5
    for name in names:
        assert allows([role], pod("GET", name)) and allows([role], pod("DELETE", name))
    assert not allows([role], pod("DELETE", f"{RELEASE}-elastic-job-spot-3"))  # beyond replicas
    assert not allows([role], pod("DELETE", f"{RELEASE}-etcd-rendezvous-0"))
    assert not allows([role], pod("PATCH", f"{RELEASE}-elastic-job-default-0"))
    assert not allows([role], Request("get", "", "nodes", name="node-1"))
    binding = one(objs, "RoleBinding", role["metadata"]["name"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}]
    for sts in worker_statefulsets(objs):
        assert worker_sees_token(sts)  # it deletes with the pod's token


def test_reclaim_is_off_by_default_no_role() -> None:
    objs = objects(ELASTIC_JOB, sets=["rbac.scaleDown.enabled=false"])
    assert reclaim_roles(objs) == []
    (sts,) = worker_statefulsets(objs)
    assert not worker_sees_token(sts)


def test_reclaim_with_no_pod_to_name_renders_no_role_never_an_empty_resource_names() -> None:
    # An empty resourceNames grants every pod of the namespace.
    objs = objects(
        ELASTIC_JOB,
        sets=[
            "nodeLoss.reclaim.enabled=true",
            "workerGroups.default.replicas=0",
            "job.minNodes=1",
            "workerGroups.later.replicas=1",
        ],
    )
    (role,) = reclaim_roles(objs)
    assert role["rules"][0]["resourceNames"] == [f"{RELEASE}-elastic-job-later-0"]


@pytest.mark.parametrize(
    "sets", [("serviceAccount.create=false",), ("worker.automountServiceAccountToken=false",)]
)
def test_reclaim_without_a_token_is_refused_by_name(sets: tuple[str, ...]) -> None:
    err = render_error(ELASTIC_JOB, sets=["nodeLoss.reclaim.enabled=true", *sets])
    assert "nodeLoss.reclaim.enabled" in err.stderr and "ServiceAccount" in err.stderr


def test_reclaim_settings_reach_the_worker() -> None:
    (sts,) = worker_statefulsets(
        objects(
            ELASTIC_JOB,
            sets=["nodeLoss.reclaim.enabled=true", "nodeLoss.reclaim.afterSeconds=12"],
        )
    )
    env = env_of(container(sts, "worker"))
    assert env["ELASTIC_RECLAIM"] == "true" and env["ELASTIC_RECLAIM_AFTER"] == "12"
    (off,) = worker_statefulsets(objects(ELASTIC_JOB))
    assert env_of(container(off, "worker"))["ELASTIC_RECLAIM"] == "false"
