"""What the gate checks: the endpoint's name resolves, etcd answers on the API of the
rendezvous backend (with one line naming the setting to fix when TLS or the API can never
work), a mesh interface is up. Each probe returns (done, detail) or raises wait.Fatal."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from elastic_worker import exits
from elastic_worker.gate import certusage, netif
from elastic_worker.gate.wait import CheckResult, Fatal
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config, RdzvTls
from elastic_worker.settings.schema import V3_BACKENDS


class Resolver:
    """Resolves the endpoint's host name; remembers the address for the interface choice."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.address: str | None = None

    def __call__(self) -> CheckResult:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            return False, str(getattr(exc, "strerror", None) or exc)
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        self.address = str(infos[0][4][0])
        return True, ""


def tls_refused_message(exc: kvstore.TlsRefused, config: Config) -> str:
    """One line naming the setting to fix, as the user sets it (ELASTIC_RDZV_CONF, and
    the chart value behind it)."""
    url = config.rdzv_url
    tls = config.tls
    if exc.side == "protocol":
        return (
            f"rendezvous endpoint {url}: {exc}; {RdzvTls.setting('protocol')} says https: "
            "enable TLS on etcd or drop protocol=https"
        )
    if exc.side == "server":
        where = f"={tls.ca_cert}" if tls and tls.ca_cert else " is not set (system CAs used)"
        return (
            f"rendezvous endpoint {url}: etcd's certificate is not trusted ({exc}): "
            f"{RdzvTls.setting('ca_cert')}{where}; give the CA that signed etcd's certificate"
        )
    if tls is None or tls.cert is None:
        return (
            f"rendezvous endpoint {url}: etcd requires a client certificate ({exc}) and "
            f"{RdzvTls.setting('ssl_cert')} is not set; give one signed by etcd's trusted CA"
        )
    refused = f"rendezvous endpoint {url}: etcd refused this worker's client certificate ({exc})"
    cert = f"{RdzvTls.setting('ssl_cert')}={tls.cert}"
    return f"{refused}: {cert} {client_cert_fault(str(exc), Path(tls.cert))}"


def client_cert_fault(alert: str, cert: Path) -> str:
    """What is wrong with a client certificate etcd refused, as far as the alert and the
    certificate itself tell (etcd's reason is in its log only). etcd built with Go 1.20
    or later names an unknown CA and an expiry in its alert; every other refusal, and all
    of them from older builds, is bad_certificate."""
    if "UNKNOWN_CA" in alert:
        return "is not signed by a CA etcd trusts (its --trusted-ca-file): give one that is"
    if "CERTIFICATE_EXPIRED" in alert:
        return "has expired or is not valid yet: renew it"
    try:
        refused = certusage.refused_usages(cert)
    except (OSError, ValueError):
        refused = None
    if refused is not None:
        index, usages = refused
        which = "its certificate" if index == 0 else f"certificate {index + 1} of its chain"
        return (
            f"allows no client authentication: {which} has extended key usage "
            f"{certusage.describe(usages)}, without clientAuth (etcd's log: \"certificate "
            'specifies an incompatible key usage"); issue it for client auth (cert-manager: '
            "usages [client auth]; openssl: extendedKeyUsage=clientAuth)"
        )
    return (
        "must be signed by a CA etcd trusts (its --trusted-ca-file), be valid now and allow "
        "client authentication (extendedKeyUsage clientAuth, or none)"
    )


def no_api_message(client: kvstore.KeyStore, config: Config) -> str:
    """One line: the endpoint lacks the API of the backend, and what to change."""
    version = client.server_version()
    what = f"etcd {version}" if version else "the server"
    url = client.base_url
    if config.rdzv_backend in V3_BACKENDS:
        return (
            f"rendezvous endpoint {url} has no etcd v3 API ({what} answers 404 on "
            f"/v3/maintenance/status), which the {config.rdzv_backend} backend needs: run "
            "etcd 3.4 or newer "
            "(its v3 JSON gateway), or set global.rendezvousBackend=etcd-v2 "
            "(ELASTIC_RDZV_BACKEND) for an etcd with the v2 API only"
        )
    return (
        f"rendezvous endpoint {url} has no etcd v2 API ({what} answers 404 on /v2/keys), "
        "which the etcd-v2 backend needs: etcd 3.6 removed the v2 API; set "
        "global.rendezvousBackend=etcd-v3 (ELASTIC_RDZV_BACKEND) or run etcd 3.5 with "
        "--enable-v2=true"
    )


def etcd_api_probe(client: kvstore.KeyStore, config: Config) -> Callable[[], CheckResult]:
    """The etcd API the backend needs answers (v2 keys, or v3 through its gateway)."""

    def probe() -> CheckResult:
        try:
            client.check_api()
        except kvstore.TlsRefused as exc:
            raise Fatal(tls_refused_message(exc, config), exits.CONFIG) from None
        except kvstore.NoApi:
            raise Fatal(no_api_message(client, config), exits.NO_API) from None
        except kvstore.EtcdError as exc:
            return False, str(exc)
        return True, ""

    return probe


def mesh_probe(globs: Sequence[str]) -> Callable[[], CheckResult]:
    def probe() -> CheckResult:
        if netif.mesh_interface(netif.interfaces(), globs) is not None:
            return True, ""
        return False, f"no up interface matches {','.join(globs)}"

    return probe
