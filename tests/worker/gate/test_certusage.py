"""elastic_worker.gate.certusage: the extended key usages of certificates openssl made, as
etcd (Go's x509) reads them for client authentication."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from elastic_worker.gate import certusage

from worker.etcd_tls import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def der(pki: Pki, name: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(Path(pki.path(f"{name}.crt")).read_text())


def test_usages_as_openssl_wrote_them(pki: Pki) -> None:
    assert certusage.extended_key_usages(der(pki, "client")) == (certusage.CLIENT_AUTH,)
    assert certusage.extended_key_usages(der(pki, "server")) == ("1.3.6.1.5.5.7.3.1",)
    assert certusage.extended_key_usages(der(pki, "ca")) is None  # no extension: any use


def test_only_a_chain_member_without_client_auth_is_refused(pki: Pki, tmp_path: Path) -> None:
    """Go checks every certificate of the chain that names usages; one without the
    extension allows them all."""
    assert certusage.refused_usages(Path(pki.path("client.crt"))) is None
    assert certusage.refused_usages(Path(pki.path("ca.crt"))) is None
    leaf = certusage.refused_usages(Path(pki.path("server-usage-client.crt")))
    assert leaf == (0, ("1.3.6.1.5.5.7.3.1",))
    chain = tmp_path / "chain.crt"
    chain.write_text(
        Path(pki.path("client.crt")).read_text() + Path(pki.path("server.crt")).read_text()
    )
    assert certusage.refused_usages(chain) == (1, ("1.3.6.1.5.5.7.3.1",))
    assert certusage.describe(("1.3.6.1.5.5.7.3.1", "1.2.3.4")) == "serverAuth, 1.2.3.4"


def test_what_is_not_a_certificate_is_a_value_error(tmp_path: Path) -> None:
    bad = tmp_path / "tls.crt"
    bad.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        certusage.refused_usages(bad)
    with pytest.raises(ValueError, match="DER"):
        certusage.extended_key_usages(b"\x30\x82\x01")
