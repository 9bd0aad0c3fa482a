"""TLS (server and mutual, a CA made by the openssl CLI) and etcd user/password
authentication, against real etcd with only the v3 API."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd3_helpers import connect
from testlib import EtcdServer, start_etcd
from torch._C._distributed_c10d import Store
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch_etcd_v3.client import EtcdAuthError
from worker.etcd_tls import Pki, _key_and_csr, _sign, make_pki, start_tls_etcd


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    # etcd's JSON gateway dials etcd's own gRPC port presenting the server certificate as
    # its client certificate: with client-cert-auth on, that certificate needs clientAuth
    # too, or every call through the gateway fails with "connection closed".
    _key_and_csr(pki.dir, "server-gw", "etcd")
    _sign(
        pki.dir,
        "server-gw",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    return pki


def _server_flags(pki: Pki, *, mutual: bool) -> list[str]:
    cert = "server-gw" if mutual else "server"
    flags = [f"--cert-file={pki.path(cert + '.crt')}", f"--key-file={pki.path(cert + '.key')}"]
    if mutual:
        flags += [f"--trusted-ca-file={pki.path('ca.crt')}", "--client-cert-auth=true"]
    return [*flags, "--enable-v2=false"]  # the last --enable-v2 wins


@pytest.fixture
def tls_etcd(tmp_path: Path, pki: Pki, request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    server = start_tls_etcd(tmp_path / "etcd", pki, _server_flags(pki, mutual=request.param))
    yield server
    server.stop()


def _round_trip(endpoint: str, **conf: str) -> None:
    backend, store = connect(endpoint, **conf)
    result = backend.set_state(b"state")
    assert result is not None and result[2]
    store.set("k", "v")
    assert store.get("k") == b"v"


@pytest.mark.parametrize("tls_etcd", [False], indirect=True, ids=["server-tls"])
def test_server_tls_with_the_ca(tls_etcd: EtcdServer, pki: Pki) -> None:
    _round_trip(tls_etcd.endpoint, protocol="https", ca_cert=pki.path("ca.crt"))


@pytest.mark.parametrize("tls_etcd", [True], indirect=True, ids=["mutual-tls"])
def test_mutual_tls_with_a_client_certificate(tls_etcd: EtcdServer, pki: Pki) -> None:
    _round_trip(
        tls_etcd.endpoint,
        protocol="https",
        ca_cert=pki.path("ca.crt"),
        ssl_cert=pki.path("client.crt"),
        ssl_cert_key=pki.path("client.key"),
    )


def test_mutual_tls_with_a_server_certificate_lacking_client_auth_says_so(
    tmp_path: Path, pki: Pki
) -> None:
    flags = [
        f"--cert-file={pki.path('server.crt')}",  # extendedKeyUsage serverAuth only
        f"--key-file={pki.path('server.key')}",
        f"--trusted-ca-file={pki.path('ca.crt')}",
        "--client-cert-auth=true",
        "--enable-v2=false",
    ]
    server = start_tls_etcd(tmp_path / "etcd", pki, flags)
    try:
        with pytest.raises(RendezvousConnectionError, match="needs extendedKeyUsage clientAuth"):
            connect(
                server.endpoint,
                protocol="https",
                ca_cert=pki.path("ca.crt"),
                ssl_cert=pki.path("client.crt"),
                ssl_cert_key=pki.path("client.key"),
            )
    finally:
        server.stop()


@pytest.mark.parametrize("tls_etcd", [True], indirect=True, ids=["mutual-tls"])
def test_mutual_tls_refuses_a_certificate_of_another_ca(tls_etcd: EtcdServer, pki: Pki) -> None:
    with pytest.raises(RendezvousConnectionError, match=tls_etcd.endpoint):
        connect(
            tls_etcd.endpoint,
            protocol="https",
            ca_cert=pki.path("ca.crt"),
            ssl_cert=pki.path("rogue-client.crt"),
            ssl_cert_key=pki.path("rogue-client.key"),
        )


@pytest.mark.parametrize("tls_etcd", [False], indirect=True, ids=["server-tls"])
def test_server_tls_refuses_a_server_the_ca_did_not_sign(tls_etcd: EtcdServer, pki: Pki) -> None:
    with pytest.raises(RendezvousConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        connect(tls_etcd.endpoint, protocol="https", ca_cert=pki.path("rogue.crt"))


def _gateway(
    etcd: EtcdServer, path: str, body: dict[str, object], token: str = ""
) -> dict[str, object]:
    headers = {"Authorization": token} if token else {}
    req = urllib.request.Request(
        f"{etcd.url}{path}", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        reply: dict[str, object] = json.load(resp)
        return reply


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """etcd with auth on: root, and `trainer` allowed read-write under /torch/elastic/ only."""
    server = start_etcd(tmp_path / "etcd", v2=False)
    _gateway(server, "/v3/auth/role/add", {"name": "root"})
    _gateway(server, "/v3/auth/user/add", {"name": "root", "password": "rootpw"})
    _gateway(server, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    _gateway(server, "/v3/auth/role/add", {"name": "trainer"})
    perm = {
        "key": _b64("/torch/elastic/"),
        "range_end": _b64("/torch/elastic0"),
        "permType": "READWRITE",
    }
    _gateway(server, "/v3/auth/role/grant", {"name": "trainer", "perm": perm})
    _gateway(server, "/v3/auth/user/add", {"name": "trainer", "password": "trainpw"})
    _gateway(server, "/v3/auth/user/grant", {"user": "trainer", "role": "trainer"})
    _gateway(server, "/v3/auth/enable", {})
    yield server
    server.stop()


def test_user_and_password_file(auth_etcd: EtcdServer, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("trainpw\n")
    _round_trip(auth_etcd.endpoint, user="trainer", password_file=str(tmp_path / "pw"))
    _, store = connect(auth_etcd.endpoint, user="trainer", password_file=str(tmp_path / "pw"))
    assert isinstance(store, Store)
    assert store.add("n", 2) == 2


def test_wrong_password_is_one_clear_error(auth_etcd: EtcdServer, tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("guess")
    with pytest.raises(RendezvousConnectionError, match="refused user 'trainer'") as caught:
        connect(auth_etcd.endpoint, user="trainer", password_file=str(tmp_path / "pw"))
    assert isinstance(caught.value.__cause__, EtcdAuthError)


def test_no_user_on_an_etcd_with_auth_is_refused(auth_etcd: EtcdServer) -> None:
    with pytest.raises(RendezvousConnectionError, match="user name is empty"):
        connect(auth_etcd.endpoint)


def test_an_expired_auth_token_is_renewed(auth_etcd: EtcdServer, tmp_path: Path) -> None:
    # etcd forgets simple tokens after --auth-token-ttl (5 min) idle and when auth is
    # switched off and on; an agent idle that long must not fail its next request.
    (tmp_path / "pw").write_text("trainpw")
    _, store = connect(auth_etcd.endpoint, user="trainer", password_file=str(tmp_path / "pw"))
    store.set("before", "1")
    root = str(
        _gateway(auth_etcd, "/v3/auth/authenticate", {"name": "root", "password": "rootpw"})[
            "token"
        ]
    )
    _gateway(auth_etcd, "/v3/auth/disable", {}, token=root)
    _gateway(auth_etcd, "/v3/auth/enable", {})
    store.set("after", "2")
    assert store.get("before") == b"1"
    assert store.get("after") == b"2"
