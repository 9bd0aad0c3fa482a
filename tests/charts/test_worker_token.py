"""The ServiceAccount token in the worker pods: init-topology reads its Node with it; the
worker container, where the user's training code runs, sees it only when the job scales
itself down (ELASTIC_SCALE_DOWN) or records Events; extra containers only when
worker.extraContainersWithToken names them."""

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


# --- extra containers (worker.extraInitContainers, worker.extraContainers) ---------------

SIDECARS = [
    "worker.extraInitContainers[0].name=fabric-daemon",
    "worker.extraInitContainers[0].image=registry.example.com/fabric-daemon:3.1.4",
    "worker.extraInitContainers[0].restartPolicy=Always",
    "worker.extraContainers[0].name=log-shipper",
    "worker.extraContainers[0].image=registry.example.com/log-shipper:0.9.1",
]


@pytest.mark.parametrize(
    "sets", [(), ("events.enabled=true",), ("rbac.scaleDown.enabled=false",)], ids=str
)
def test_extra_containers_get_no_token_whatever_the_worker_gets(sets: tuple[str, ...]) -> None:
    """worker.extraInitContainers (a native sidecar too) and worker.extraContainers: an
    empty volume over the token's path, whether or not the worker container sees it
    (rbac.scaleDown, events): a fabric daemon or log shipper cannot scale the job to 0."""
    sts = _sts(*SIDECARS, *sets)
    spec = pod_spec(sts)
    assert _token_containers(spec) & {"fabric-daemon", "log-shipper"} == set()
    assert "init-topology" in _token_containers(spec)
    for name in ("fabric-daemon", "log-shipper"):
        mounts = container(sts, name)["volumeMounts"]
        [mount] = [m for m in mounts if m["mountPath"] == TOKEN_DIR]
        assert mount["readOnly"] is True
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert set(volume) == {"name", "emptyDir"}


def test_extra_containers_with_token_names_those_that_see_it() -> None:
    """worker.extraContainersWithToken: the listed container gets the token as the kubelet
    mounts it; the others still do not."""
    spec = pod_spec(_sts(*SIDECARS, "worker.extraContainersWithToken={log-shipper}"))
    assert _token_containers(spec) == {"init-topology", "worker", "log-shipper"}


def test_an_extra_container_that_mounts_its_own_token_keeps_it() -> None:
    """An extra container with its own volume at the token's path (a projected token for
    another audience) keeps it: no second mount at the same path."""
    sts = _sts(
        *SIDECARS,
        "worker.extraContainers[0].volumeMounts[0].name=vault-token",
        f"worker.extraContainers[0].volumeMounts[0].mountPath={TOKEN_DIR}/",
    )
    mounts = container(sts, "log-shipper")["volumeMounts"]
    assert [m["name"] for m in mounts] == ["vault-token"]


def test_no_cover_volume_without_a_mounted_token() -> None:
    """worker.automountServiceAccountToken=false: no container has a token to hide."""
    spec = pod_spec(_sts(*SIDECARS, "worker.automountServiceAccountToken=false"))
    assert all(v["name"] != "no-api-token" for v in spec["volumes"])
    assert _token_containers(spec) == set()
