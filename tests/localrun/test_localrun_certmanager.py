"""The local run's cert-manager: the chart's Certificates become the Secrets its pods mount,
signed by the run's CA, and a real etcd serving them answers the run's https reads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from testlib import EXISTING_SECRETS_TLS, MUTUAL_TLS
from worker.etcd_tls import Pki, start_tls_etcd

from localrun import chart
from localrun.cluster import certmanager, podspec
from localrun.render import ROOT, Rendered, render

TLS = MUTUAL_TLS
SERVER, CLIENT = "e2e-etcd-rendezvous-server-tls", "e2e-etcd-rendezvous-client-tls"


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml"],
        [",".join(TLS)],
        release="e2e",
        namespace="default",
    )


@pytest.fixture(scope="module")
def issued(rendered: Rendered, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each issued Secret's files as the kubelet would mount them, by Secret name."""
    ca = certmanager.CertificateAuthority(tmp_path_factory.mktemp("pki"))
    out = {}
    for name, secret in certmanager.issue_all(ca, rendered.certificates).items():
        assert secret["type"] == "kubernetes.io/tls"
        d = tmp_path_factory.mktemp(name)
        for key, text in podspec.secret_data(secret).items():
            (d / key).write_text(text)
        out[name] = d
    return out


def _openssl(*args: str) -> str:
    res = subprocess.run(
        ["openssl", *args], check=False, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_every_secret_the_pods_mount_is_issued_with_cert_key_and_ca(
    issued: dict[str, Path], rendered: Rendered
) -> None:
    # the names come from the render: the server Secret etcd mounts, the client Secret the
    # workers mount (none is rendered as a Secret object: cert-manager makes them)
    assert set(issued) == {SERVER, CLIENT}
    assert not rendered.secrets
    for d in issued.values():
        assert {p.name for p in d.iterdir()} == {"tls.crt", "tls.key", "ca.crt"}
        out = _openssl("verify", "-CAfile", str(d / "ca.crt"), str(d / "tls.crt"))
        assert out.strip().endswith(": OK")
        # the key is the certificate's
        pub = _openssl("pkey", "-in", str(d / "tls.key"), "-pubout")
        assert pub == _openssl("x509", "-in", str(d / "tls.crt"), "-noout", "-pubkey")


def test_server_certificate_carries_the_certificates_names_and_usages(
    issued: dict[str, Path], rendered: Rendered
) -> None:
    cert = next(c for c in rendered.certificates if c["spec"]["secretName"] == SERVER)
    text = _openssl(
        "x509", "-in", str(issued[SERVER] / "tls.crt"), "-noout", "-ext",
        "subjectAltName,extendedKeyUsage",
    )  # fmt: skip
    for name in cert["spec"]["dnsNames"]:
        assert f"DNS:{name}," in text or f"DNS:{name}\n" in text, (name, text)
    assert "DNS:e2e-etcd-rendezvous.default.svc.cluster.local" in text
    assert "IP Address:127.0.0.1" in text
    assert "TLS Web Server Authentication" in text
    assert "TLS Web Client Authentication" in text  # etcd's gateway dials etcd with it
    client = _openssl("x509", "-in", str(issued[CLIENT] / "tls.crt"), "-noout", "-ext",
                      "extendedKeyUsage")  # fmt: skip
    assert "TLS Web Client Authentication" in client


def test_a_certificate_without_secret_name_or_with_a_bad_ip_is_one_clear_error(
    tmp_path: Path,
) -> None:
    ca = certmanager.CertificateAuthority(tmp_path)
    bad = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "x"}}
    with pytest.raises(certmanager.CertificateError, match=r"'x' has no spec\.secretName"):
        certmanager.issue(ca, {**bad, "spec": {}})
    with pytest.raises(certmanager.CertificateError, match="'nope' is not an IP address"):
        certmanager.issue(ca, {**bad, "spec": {"secretName": "s", "ipAddresses": ["nope"]}})


def test_is_certificate_only_for_cert_manager() -> None:
    assert certmanager.is_certificate({"apiVersion": "cert-manager.io/v1", "kind": "Certificate"})
    assert not certmanager.is_certificate({"apiVersion": "other.io/v1", "kind": "Certificate"})


def _pki_from(issued: dict[str, Path], tmp_path: Path) -> Pki:
    """tests/worker/etcd_tls.py's file layout, from the issued Secrets."""
    d = tmp_path / "pki"
    d.mkdir()
    (d / "ca.crt").write_bytes((issued[SERVER] / "ca.crt").read_bytes())
    for src, dst in ((SERVER, "server"), (CLIENT, "client")):
        for ext in ("crt", "key"):
            (d / f"{dst}.{ext}").write_bytes((issued[src] / f"tls.{ext}").read_bytes())
    return Pki(d)


@pytest.mark.parametrize("client_auth", [True, False])
def test_the_runs_completion_read_speaks_https_to_an_etcd_serving_the_issued_secret(
    issued: dict[str, Path], tmp_path: Path, client_auth: bool
) -> None:
    pki = _pki_from(issued, tmp_path)
    flags = [f"--cert-file={pki.path('server.crt')}", f"--key-file={pki.path('server.key')}"]
    if client_auth:
        flags += [f"--trusted-ca-file={pki.path('ca.crt')}", "--client-cert-auth=true"]
    etcd = start_tls_etcd(tmp_path / "data", pki, flags)
    try:
        host, port = etcd.endpoint.rsplit(":", 1)
        url = chart.completion_url(host, int(port), "j", "https")
        tls = chart.ClientTls(
            Path(pki.path("ca.crt")), Path(pki.path("client.crt")), Path(pki.path("client.key"))
        )
        name = "e2e-etcd-rendezvous.default.svc.cluster.local"
        assert chart.read_completion(url, tls=tls, server_name=name) is False  # not set yet
        # a name the certificate does not cover fails verification: no answer
        assert chart.read_completion(url, tls=tls, server_name="elsewhere.example") is None
        assert chart.read_completion(url, tls=None) is None
        plain = chart.completion_url(host, int(port), "j")
        assert chart.read_completion(plain, timeout=2) is None  # https only
    finally:
        etcd.stop()


def test_client_endpoint_is_read_from_the_rendered_etcd_flags(rendered: Rendered) -> None:
    etcd = next(s for s in rendered.statefulsets if "etcd" in s["metadata"]["name"])
    ep = chart.client_endpoint(etcd["spec"]["template"]["spec"])
    assert ep == chart.Endpoint("https", "e2e-etcd-rendezvous.default.svc.cluster.local")
    assert chart.client_endpoint({"containers": [{"command": ["etcd"]}]}) == chart.Endpoint()


def test_secrets_a_user_brings_are_issued_as_server_and_client_certificates(
    tmp_path: Path,
) -> None:
    sets = EXISTING_SECRETS_TLS
    r = render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml"],
        [",".join(sets)],
        release="e2e",
        namespace="default",
    )
    assert not r.certificates and not r.secrets
    certs = {
        c["spec"]["secretName"]: c["spec"]
        for c in chart.brought_certificates(r.statefulsets, set())
    }
    # the CA Secret is etcd's server Secret here: issued once, as the server's
    assert set(certs) == {"etcd-tls", "worker-tls"}
    assert certs["etcd-tls"]["dnsNames"][0] == "e2e-etcd-rendezvous.default.svc.cluster.local"
    assert "server auth" in certs["etcd-tls"]["usages"]
    assert certs["worker-tls"]["usages"][0] == "client auth"
    assert chart.brought_certificates(r.statefulsets, {"etcd-tls", "worker-tls"}) == []
    ca = certmanager.CertificateAuthority(tmp_path)
    secret = certmanager.issue(ca, chart.brought_certificates(r.statefulsets, set())[0])
    d = tmp_path / "mounted"
    d.mkdir()
    for key, text in podspec.secret_data(secret).items():
        (d / key).write_text(text)
    _openssl("verify", "-CAfile", str(d / "ca.crt"), str(d / "tls.crt"))
    # the plain chart (no TLS) asks for nothing
    plain = render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml"],
        [],
        release="e2e",
        namespace="default",
    )
    assert chart.brought_certificates(plain.statefulsets, set()) == []
