"""charts/etcd-rendezvous templates/service.yaml and service-headless.yaml."""

from __future__ import annotations

from chart_render import ETCD, RELEASE, objects, one, selects

NAME = f"{RELEASE}-etcd-rendezvous"


def test_client_service_on_2379_named_client() -> None:
    """`<fullname>`: port 2379 named `client` (plus metrics 2381), selects the member."""
    objs = objects(ETCD)
    service = one(objs, "Service", NAME)
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"client": 2379, "metrics": 2381}
    assert service["spec"]["type"] == "ClusterIP"
    pod_labels = one(objs, "StatefulSet", NAME)["spec"]["template"]["metadata"]["labels"]
    assert selects(service["spec"]["selector"], pod_labels)


def test_headless_service_publishes_not_ready_addresses() -> None:
    """`<fullname>-headless`: clusterIP None, publishNotReadyAddresses, the StatefulSet's
    serviceName."""
    objs = objects(ETCD)
    headless = one(objs, "Service", f"{NAME}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert one(objs, "StatefulSet", NAME)["spec"]["serviceName"] == f"{NAME}-headless"


def test_service_type_and_annotations() -> None:
    """service.type and service.annotations."""
    service = one(
        objects(ETCD, sets=["service.type=NodePort", "service.annotations.a=b"]), "Service", NAME
    )
    assert service["spec"]["type"] == "NodePort"
    assert service["metadata"]["annotations"] == {"a": "b"}
