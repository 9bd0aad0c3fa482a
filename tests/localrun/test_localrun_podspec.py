"""Environment as the kubelet resolves it: $(VAR) expansion, downward API, ConfigMaps."""

from __future__ import annotations

import pytest
from elastic_worker.settings import definitions as worker_settings
from init_topology import config as init_config

from localrun.cluster.podspec import (
    SERVICEACCOUNT_PATH,
    Container,
    PodIdentity,
    PodSpecError,
    command_line,
    expand,
    parse_volumes,
    resolve_env,
    wants_serviceaccount,
)

POD = PodIdentity(
    name="demo-elastic-job-default-1",
    namespace="team-a",
    uid="u-1",
    node_name="local-spot-0",
    pod_ip="198.18.7.11",
    host_ip="198.18.0.10",
    service_account="demo-elastic-job",
    labels={"app.kubernetes.io/component": "worker"},
    node_allocatable={"cpu": "4", "memory": "16Gi"},
)


def _container(env: list[dict[str, object]], **kw: object) -> Container:
    return Container.from_obj({"name": "worker", "image": "x", "env": env, **kw})


def _resolve(c: Container, **kw: object) -> dict[str, str]:
    return resolve_env(c, POD, {c.name: c}, configmaps={}, secrets={}, **kw)  # type: ignore[arg-type]


def test_downward_api_fields_resolve_to_the_pod() -> None:
    paths = {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
        "NODE_NAME": "spec.nodeName",
        "HOST_IP": "status.hostIP",
        "SA": "spec.serviceAccountName",
        "COMPONENT": "metadata.labels['app.kubernetes.io/component']",
    }
    env = _resolve(
        _container(
            [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in paths.items()]
        )
    )
    assert env == {
        "POD_NAME": "demo-elastic-job-default-1",
        "POD_NAMESPACE": "team-a",
        "POD_IP": "198.18.7.11",
        "NODE_NAME": "local-spot-0",
        "HOST_IP": "198.18.0.10",
        "SA": "demo-elastic-job",
        "COMPONENT": "worker",
    }


def test_values_expand_earlier_variables_only_and_dollar_dollar_escapes() -> None:
    env = _resolve(
        _container(
            [
                {"name": "A", "value": "$(LATER)-x"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "URL", "value": "http://$(POD_NAME):2379"},
                {"name": "LITERAL", "value": "$$(POD_NAME)"},
                {"name": "LATER", "value": "late"},
            ]
        )
    )
    assert env["A"] == "$(LATER)-x"
    assert env["URL"] == "http://demo-elastic-job-default-1:2379"
    assert env["LITERAL"] == "$(POD_NAME)"


def test_base_environment_comes_first_and_env_wins() -> None:
    env = _resolve(
        _container([{"name": "PATH", "value": "/x"}]), base={"PATH": "/bin", "HOME": "/root"}
    )
    assert env == {"PATH": "/x", "HOME": "/root"}


def test_configmap_and_secret_refs_and_env_from() -> None:
    c = _container(
        [
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "s"}}},
            {
                "name": "O",
                "valueFrom": {"configMapKeyRef": {"name": "no", "key": "k", "optional": True}},
            },
        ],
        envFrom=[{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
    )
    env = resolve_env(
        c, POD, {c.name: c}, configmaps={"cm": {"k": "v"}}, secrets={"sec": {"s": "pw"}}
    )
    assert env == {"CM_k": "v", "K": "v", "S": "pw"}


def test_missing_configmap_key_names_it() -> None:
    c = _container([{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}])
    with pytest.raises(PodSpecError, match="'cm' key 'k'"):
        _resolve(c)


def test_resource_field_ref_uses_limits_then_node_allocatable() -> None:
    c = _container(
        [
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "MEM_MI",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
            {
                "name": "REQ",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}},
            },
        ],
        resources={"limits": {"cpu": "1500m"}, "requests": {"cpu": "500m"}},
    )
    env = _resolve(c)
    assert env == {"CPU": "2", "MEM_MI": str(16 * 1024), "REQ": "500"}


def test_unknown_field_path_is_an_error() -> None:
    c = _container([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}}])
    with pytest.raises(PodSpecError, match=r"spec\.nope"):
        _resolve(c)


def test_command_and_args_expand_against_the_environment() -> None:
    c = _container([], command=["etcd", "--name=$(POD_NAME)"], args=["$(MISSING)"])
    assert command_line(c, {"POD_NAME": "p-0"}) == ["etcd", "--name=p-0", "$(MISSING)"]
    assert expand("a$$b", {}) == "a$b"


def test_volumes_by_kind() -> None:
    spec = {
        "volumes": [
            {"name": "inject", "emptyDir": {"sizeLimit": "1Mi"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        ]
    }
    vols = parse_volumes(spec, [{"metadata": {"name": "data"}}])
    assert [(v.name, v.kind) for v in vols.values()] == [
        ("inject", "emptyDir"),
        ("dshm", "emptyDir"),
        ("checkpoint", "pvc"),
        ("data", "claimTemplate"),
    ]
    assert vols["dshm"].medium == "Memory"
    assert vols["checkpoint"].claim == "checkpoints"


def test_service_account_token_follows_pod_then_service_account() -> None:
    assert wants_serviceaccount({"automountServiceAccountToken": False}, {}) is False
    sa = {"sa": {"automountServiceAccountToken": False}}
    assert wants_serviceaccount({"serviceAccountName": "sa"}, sa) is False
    assert wants_serviceaccount(
        {"serviceAccountName": "sa", "automountServiceAccountToken": True}, sa
    )
    assert wants_serviceaccount({}, {}) is True


def test_both_images_look_for_the_token_where_the_kubelet_mounts_it() -> None:
    """One path per image (they ship apart) and one in the mini-cluster: the same path."""
    assert str(init_config.SERVICEACCOUNT_DIR) == worker_settings.SERVICEACCOUNT_DIR
    assert worker_settings.SERVICEACCOUNT_DIR == SERVICEACCOUNT_PATH
