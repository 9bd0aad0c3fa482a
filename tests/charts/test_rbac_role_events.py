"""templates/rbac-role-events.yaml and rbac-rolebinding-events.yaml: with `events.enabled`
the workers may create Events in their namespace, and nothing more."""

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
    of_kind,
    one,
    pod_spec,
    worker_statefulsets,
)
from rbac import Request, allows

SA = f"{RELEASE}-elastic-job"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def events_roles(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in of_kind(objs, "Role") if r["metadata"]["name"].endswith("-events")]


def worker_sees_token(sts: dict[str, Any]) -> bool:
    mounts = container(sts, "worker").get("volumeMounts", [])
    return all(m["mountPath"].rstrip("/") != TOKEN_DIR for m in mounts)


def test_events_enabled_grants_only_create_on_events_to_the_workers() -> None:
    objs = objects(ELASTIC_JOB, sets=["events.enabled=true", "rbac.scaleDown.enabled=false"])
    (role,) = events_roles(objs)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = one(objs, "RoleBinding", role["metadata"]["name"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}]
    post = Request.from_http("POST", f"/api/v1/namespaces/{NAMESPACE}/events/run42-worker-0.1")
    assert allows([role], post)
    for method in ("GET", "PATCH", "DELETE"):
        assert not allows(
            [role], Request.from_http(method, f"/api/v1/namespaces/{NAMESPACE}/events/x")
        )
    (sts,) = worker_statefulsets(objs)
    env = env_of(container(sts, "worker"))
    assert env["ELASTIC_EVENTS"] == "true"
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # the worker container needs the token to POST, even without scale-down
    assert worker_sees_token(sts)


def test_events_are_off_by_default_no_role_and_the_setting_false() -> None:
    objs = objects(ELASTIC_JOB, sets=["rbac.scaleDown.enabled=false"])
    assert events_roles(objs) == []
    (sts,) = worker_statefulsets(objs)
    assert env_of(container(sts, "worker"))["ELASTIC_EVENTS"] == "false"
    assert not worker_sees_token(sts)


@pytest.mark.parametrize(
    "sets", [("serviceAccount.create=false",), ("worker.automountServiceAccountToken=false",)]
)
def test_events_enabled_without_a_token_renders_no_grant(sets: tuple[str, ...]) -> None:
    objs = objects(ELASTIC_JOB, sets=["events.enabled=true", *sets])
    assert events_roles(objs) == []
    (sts,) = worker_statefulsets(objs)
    assert env_of(container(sts, "worker"))["ELASTIC_EVENTS"] == "false"
    assert pod_spec(sts)  # renders
