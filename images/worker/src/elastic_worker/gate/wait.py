"""The readiness gate: bounded waits, with a progress line naming what is still missing.

Each check returns (done, detail) or raises Fatal. Checks run in order every poll; the
first one not yet done stops the round (later ones depend on it). A progress line
is logged every `progress_every` seconds; after `timeout` seconds GateTimeout names
what was still missing.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic_worker import certusage, exits
from elastic_worker.gate import netif
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config, RdzvTls

logger = logging.getLogger(__name__)

MEMBER_TTL = 30
PROGRESS_EVERY = 5.0
POLL_EVERY = 0.5


class Fatal(Exception):
    """Waiting cannot help (no API for the backend, TLS refused); `exit_code` is the
    process's."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class GateTimeout(Exception):
    """The gate's time ran out; the message names what was missing."""


class Completed(Exception):
    """Waiting is over because the job finished (its rendezvous was scaled to 0)."""


class Interrupted(Exception):
    """A signal asked us to stop while waiting."""


CheckResult = tuple[bool, str]


@dataclass
class Check:
    name: str
    probe: Callable[[], CheckResult]


def wait(
    checks: Sequence[Check],
    timeout: float,
    *,
    progress_every: float = PROGRESS_EVERY,
    poll_every: float = POLL_EVERY,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll the checks until all pass; raise GateTimeout after `timeout` seconds."""
    stop = stop or threading.Event()
    start = clock()
    next_progress = start + progress_every
    done: set[str] = set()
    while True:
        pending: list[str] = []
        for index, check in enumerate(checks):
            if check.name in done:
                continue
            ok, detail = check.probe()
            if ok:
                done.add(check.name)
                continue
            pending.append(f"{check.name} ({detail})" if detail else check.name)
            pending += [c.name for c in checks[index + 1 :] if c.name not in done]
            break
        if not pending:
            return
        now = clock()
        if now - start >= timeout:
            raise GateTimeout(
                f"readiness gate timed out after {timeout:g} s waiting for: {'; '.join(pending)}"
            )
        if now >= next_progress:
            logger.info(
                "waiting %.0f s of %g s for: %s", now - start, timeout, "; then ".join(pending)
            )
            next_progress = now + progress_every
        if stop.wait(min(poll_every, max(0.0, timeout - (now - start)))):
            raise Interrupted("interrupted while waiting in the readiness gate")


def unless_complete(
    probe: Callable[[], CheckResult],
    complete: Callable[[], bool],
    *,
    every: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], CheckResult]:
    """`probe`, but while it fails ask `complete()` (at most every `every` seconds, it
    reads the API server) and raise Completed when it says the job is done."""
    next_ask = clock()

    def check() -> CheckResult:
        nonlocal next_ask
        ok, detail = probe()
        if not ok and clock() >= next_ask:
            next_ask = clock() + every
            if complete():
                raise Completed(detail)
        return ok, detail

    return check


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
    if config.rdzv_backend == "etcd-v3":
        return (
            f"rendezvous endpoint {url} has no etcd v3 API ({what} answers 404 on "
            "/v3/maintenance/status), which the etcd-v3 backend needs: run etcd 3.4 or newer "
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


class Registration:
    """This pod's entry under <prefix>/members/ with a TTL, refreshed until stopped."""

    def __init__(self, client: kvstore.KeyStore, config: Config, address: str) -> None:
        self.client = client
        self.key = f"{config.key_prefix}/members/{config.pod_name}"
        self.dir = f"{config.key_prefix}/members"
        self.value = address  # docs/contracts.md: the value is the pod IP
        self.min_nodes = config.min_nodes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        self.client.set(self.key, self.value, ttl=MEMBER_TTL)

    def count(self) -> int:
        return len(self.client.list_dir(self.dir))

    def probe(self) -> CheckResult:
        try:
            self.register()
            count = self.count()
        except kvstore.EtcdError as exc:
            return False, str(exc)
        if count >= self.min_nodes:
            return True, ""
        return False, f"{count} of {self.min_nodes} registered"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refresh, name="member-ttl", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(MEMBER_TTL / 3):
            try:
                self.register()
            except kvstore.EtcdError as exc:
                logger.warning("could not refresh %s: %s", self.key, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.client.delete(self.key)
        except kvstore.EtcdError as exc:
            logger.info("could not remove %s (it expires in %d s): %s", self.key, MEMBER_TTL, exc)
