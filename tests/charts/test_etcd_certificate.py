"""charts/etcd-rendezvous templates/certificate-server.yaml and certificate-client.yaml
(tls.certManager)."""

from __future__ import annotations

from chart_render import ETCD, NAMESPACE, RELEASE, objects, of_kind, one, pod_spec

NAME = f"{RELEASE}-etcd-rendezvous"


def test_cert_manager_issues_server_and_client_certificates() -> None:
    """tls.certManager: Certificates `<fullname>-server` (the client Service names) and, with
    clientCertAuth, `<fullname>-client`; the pod mounts the server Secret."""
    objs = objects(
        ETCD,
        sets=[
            "tls.enabled=true",
            "tls.clientCertAuth=true",
            "tls.certManager.enabled=true",
            "tls.certManager.issuerRef.name=ca",
        ],
    )
    server = one(objs, "Certificate", f"{NAME}-server")
    assert f"{NAME}.{NAMESPACE}.svc.cluster.local" in server["spec"]["dnsNames"]
    assert server["spec"]["secretName"] == f"{NAME}-server-tls"
    # etcd's gateway dials etcd with the server certificate, as a client, under
    # client-cert auth: without "client auth" it is rejected (incompatible key usage).
    assert {"server auth", "client auth"} <= set(server["spec"]["usages"])
    client = one(objs, "Certificate", f"{NAME}-client")
    assert client["spec"]["secretName"] == f"{NAME}-client-tls"
    assert client["spec"]["usages"][0] == "client auth"
    assert server["spec"]["issuerRef"] == client["spec"]["issuerRef"]
    volumes = {v["name"]: v for v in pod_spec(one(objs, "StatefulSet", NAME))["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{NAME}-server-tls"


def test_no_certificates_without_cert_manager() -> None:
    """tls.enabled with tls.existingSecret only: no Certificate objects."""
    objs = objects(ETCD, sets=["tls.enabled=true", "tls.existingSecret=mine"])
    assert not of_kind(objs, "Certificate")
