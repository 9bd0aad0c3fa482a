"""The ServiceAccount token in the worker pods: init-topology reads its Node with it; the
worker container, where the user's training code runs, sees it only when the job scales
itself down (ELASTIC_SCALE_DOWN)."""

from __future__ import annotations

from typing import Any

import pytest
from chart_render import (
    ELASTIC_JOB,
    container,
    env_of,
    objects,
    of_kind,
    pod_spec,
    worker_statefulsets,
)

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _token_containers(spec: dict[str, Any]) -> set[str]:
    """Containers the ServiceAccount admission plugin gives the token: all of them when the
    pod automounts it, except those that already mount something at its path."""
    if not spec.get("automountServiceAccountToken", True):
        return set()
    return {
        c["name"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]
        if all(m["mountPath"].rstrip("/") != TOKEN_DIR for m in c.get("volumeMounts", []))
    }


def _sts(*sets: str) -> dict[str, Any]:
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, sets=sets))
    return sts


def test_both_containers_get_the_token_when_the_job_scales_itself_down() -> None:
    """Defaults: init-topology reads its Node, the worker PATCHes the scale subresource."""
    sts = _sts()
    assert env_of(container(sts, "worker"))["ELASTIC_SCALE_DOWN"] == "true"
    assert _token_containers(pod_spec(sts)) == {"init-topology", "worker"}


@pytest.mark.parametrize(
    "sets", [("rbac.scaleDown.enabled=false",), ("serviceAccount.create=false",)]
)
def test_the_worker_container_gets_no_token_when_scale_down_is_off(sets: tuple[str, ...]) -> None:
    """ELASTIC_SCALE_DOWN false: an empty volume covers the token's path in the worker
    container only; init-topology still reads its Node."""
    sts = _sts(*sets)
    assert env_of(container(sts, "worker"))["ELASTIC_SCALE_DOWN"] == "false"
    assert _token_containers(pod_spec(sts)) == {"init-topology"}
    [mount] = [m for m in container(sts, "worker")["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod_spec(sts)["volumes"] if v["name"] == mount["name"]]
    assert set(volume) == {"name", "emptyDir"}


def test_no_token_and_no_grant_when_automount_is_off() -> None:
    """worker.automountServiceAccountToken=false: no container has a token, no cover
    volume is needed, and neither the ClusterRole nor the Role (unusable) renders."""
    objs = objects(ELASTIC_JOB, sets=["worker.automountServiceAccountToken=false"])
    (sts,) = worker_statefulsets(objs)
    assert _token_containers(pod_spec(sts)) == set()
    assert all(m["mountPath"] != TOKEN_DIR for m in container(sts, "worker")["volumeMounts"])
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert not of_kind(objs, kind), kind
