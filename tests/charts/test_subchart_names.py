"""elastic-job takes the bundled etcd-rendezvous's names from that chart's own helpers, so
the workers reach the etcd the subchart renders whatever its name settings."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chart_render import (
    ELASTIC_JOB,
    NAMESPACE,
    TEST_VALUES,
    container,
    env_of,
    etcd_statefulset,
    objects,
    of_kind,
    one,
    pod_spec,
    worker_statefulsets,
)

CERT_MANAGER = TEST_VALUES / "tls-cert-manager.yaml"
NAMINGS = [
    (),
    ("etcd-rendezvous.nameOverride=rdzv",),
    ("etcd-rendezvous.fullnameOverride=job-etcd",),
    ("etcd-rendezvous.clusterDomain=corp.example",),
    ("global.clusterDomain=k8s.example", "etcd-rendezvous.nameOverride=rdzv"),
    ("fullnameOverride=trainer", "nameOverride=trainer"),
]


def _client_endpoint(objs: list[dict[str, Any]]) -> str:
    """host:port of the etcd client Service as the subchart rendered it."""
    sts = etcd_statefulset(objs)
    [etcd] = pod_spec(sts)["containers"]
    [advertise] = [a for a in etcd["command"] if a.startswith("--advertise-client-urls=")]
    endpoint = str(advertise).split("://", 1)[1]
    service = one(objs, "Service", endpoint.split(".", 1)[0])
    [port] = [p["port"] for p in service["spec"]["ports"] if p["name"] == "client"]
    name = re.escape(service["metadata"]["name"])
    assert re.fullmatch(rf"{name}\.{NAMESPACE}\.svc\.[a-z0-9.-]+:{port}", endpoint), endpoint
    return endpoint


@pytest.mark.parametrize("sets", NAMINGS, ids=lambda s: ",".join(s) or "defaults")
def test_workers_are_given_the_endpoint_the_etcd_advertises(sets: tuple[str, ...]) -> None:
    """ELASTIC_RDZV_ENDPOINT = <etcd Service>.<namespace>.svc.<domain>:<client port>."""
    objs = objects(ELASTIC_JOB, sets=sets)
    endpoint = _client_endpoint(objs)
    for sts in worker_statefulsets(objs):
        assert env_of(container(sts, "worker"))["ELASTIC_RDZV_ENDPOINT"] == endpoint


@pytest.mark.parametrize("sets", NAMINGS, ids=lambda s: ",".join(s) or "defaults")
def test_workers_mount_the_secrets_cert_manager_writes(sets: tuple[str, ...]) -> None:
    """With etcd-rendezvous.tls.certManager: the CA and client Secrets the workers mount are
    the secretNames of the subchart's server and client Certificates."""
    objs = objects(ELASTIC_JOB, values=[CERT_MANAGER], sets=sets)
    secrets = {c["metadata"]["name"]: c["spec"]["secretName"] for c in of_kind(objs, "Certificate")}
    etcd_name = etcd_statefulset(objs)["metadata"]["name"]
    assert set(secrets) == {f"{etcd_name}-server", f"{etcd_name}-client"}
    for sts in worker_statefulsets(objs):
        volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
        assert volumes["rendezvous-ca"]["secret"]["secretName"] == secrets[f"{etcd_name}-server"]
        assert (
            volumes["rendezvous-client"]["secret"]["secretName"] == secrets[f"{etcd_name}-client"]
        )
        assert env_of(container(sts, "worker"))["ELASTIC_RDZV_ENDPOINT"] == _client_endpoint(objs)


def test_an_external_endpoint_is_passed_as_written() -> None:
    """etcd-rendezvous.enabled=false: rendezvous.endpoint unchanged, no etcd objects."""
    endpoint = "etcd.shared.svc.cluster.local:2379"
    objs = objects(ELASTIC_JOB, values=[TEST_VALUES / "external-rendezvous.yaml"])
    assert not [
        o
        for o in objs
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "rendezvous"
    ]
    for sts in worker_statefulsets(objs):
        assert env_of(container(sts, "worker"))["ELASTIC_RDZV_ENDPOINT"] == endpoint
