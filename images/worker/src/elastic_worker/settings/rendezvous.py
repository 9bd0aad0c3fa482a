"""The rendezvous settings: the endpoint, the --rdzv-conf pairs checked against the keys
the backend's handler reads, and the TLS of etcd read from them (the same CA and client
certificate for the worker's own client as for torch's)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from elastic_worker.settings.schema import V3_BACKENDS, ConfigError, rdzv_conf_default

# The --rdzv-conf keys `--rdzv-backend=etcd-v2` takes (torch 2.13). Written out, not
# imported: the worker runs etcd-v2 without torch-etcd-v3 installed (an image without it)
# and without importing torch. tests/worker/settings/test_config.py holds
# DYNAMIC_RENDEZVOUS_KEYS equal to torch_etcd_v3.config.RENDEZVOUS_KEYS.
#: What torch's dynamic rendezvous reads itself (dynamic_rendezvous.create_handler).
DYNAMIC_RENDEZVOUS_KEYS = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    }
)
#: What torch's etcd-v2 backend reads (etcd_rendezvous_backend.create_backend), and
#: `timeout`, which torch's launcher writes into the conf itself (launcher/api.py), and
#: `is_host`, which only torch's c10d backend reads (accepted as it always was; ignored).
KNOWN_RDZV_KEYS = DYNAMIC_RENDEZVOUS_KEYS | frozenset(
    {
        "read_timeout",
        "protocol",
        "ssl_cert",
        "ssl_cert_key",
        "ca_cert",
        "timeout",
        "is_host",
    }
)


def rdzv_keys(backend: str) -> frozenset[str]:
    """The --rdzv-conf keys the backend's handler (and torch's rendezvous) read."""
    if backend in V3_BACKENDS:
        # The handler's own list (torch_etcd_v3.config is standard library only, no torch);
        # imported here, not above, so etcd-v2 runs without the package.
        try:
            from torch_etcd_v3.config import KEYS  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigError(
                f"ELASTIC_RDZV_BACKEND={backend} needs the torch-etcd-v3 package ({exc}): "
                "use the project's worker image, pip install packages/torch-etcd-v3, or set "
                "global.rendezvousBackend=etcd-v2"
            ) from None
        return KEYS
    return KNOWN_RDZV_KEYS


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


# The chart value behind each TLS key of ELASTIC_RDZV_CONF (charts/elastic-job
# `elastic-job.rdzvConf`): named in errors so that a user knows which value to fix.
_TLS_CHART_VALUE = {
    "protocol": "rendezvous.tls.enabled",
    "ca_cert": "rendezvous.tls.caSecret",
    "ssl_cert": "rendezvous.tls.clientCertSecret",
    "ssl_cert_key": "rendezvous.tls.clientCertSecret",
}


@dataclass(frozen=True)
class RdzvTls:
    """HTTPS to etcd, read from the --rdzv-conf keys torch's etcd-v2 handler reads
    (`protocol`, `ca_cert`, `ssl_cert`, `ssl_cert_key`), so that the worker's own client
    and torch's always use the same CA and client certificate."""

    ca_cert: str | None
    cert: str | None
    key: str | None

    @staticmethod
    def setting(key: str) -> str:
        """How a user finds the setting behind an rdzv-conf key, for error lines."""
        return f"ELASTIC_RDZV_CONF {key} (chart: {_TLS_CHART_VALUE[key]})"

    def ssl_context(self) -> ssl.SSLContext:
        """The worker client's TLS context, as torch's handler builds its own: `ca_cert`
        (else the system's CAs), `ssl_cert` with `ssl_cert_key` (or a PEM holding both).
        The files are read here, when the client is made, not when settings are parsed:
        they are Secret volumes of the pod. A file that cannot be used is a ConfigError."""
        ca = _tls_file("ca_cert", self.ca_cert) if self.ca_cert else None
        try:
            context = ssl.create_default_context(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{self.setting('ca_cert')}: {ca} holds no usable CA: {exc}"
            ) from None
        if self.cert is not None:
            cert = _tls_file("ssl_cert", self.cert)
            key = _tls_file("ssl_cert_key", self.key) if self.key else None
            try:
                context.load_cert_chain(cert, key)
            except (ssl.SSLError, OSError) as exc:
                with_key = f" with {key}" if key else ""
                raise ConfigError(
                    f"{self.setting('ssl_cert')}: cannot load {cert}{with_key}: {exc}"
                ) from None
        return context


def parse_endpoint(raw: str, name: str = "ELASTIC_RDZV_ENDPOINT") -> Endpoint:
    text = raw.strip()
    for scheme in ("http://", "https://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
    text = text.rstrip("/")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        ok = bool(sep)
    else:
        host, _, port_text = text.rpartition(":")
        ok = ":" not in host
    if not ok or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{name}={raw!r} is not host:port (e.g. etcd.ns.svc:2379)")
    return Endpoint(host, int(port_text))


def _pairs(raw: str, name: str, known: frozenset[str] = KNOWN_RDZV_KEYS) -> dict[str, str]:
    given: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(f"{name}: {item!r} is not key=value (e.g. last_call_timeout=2)")
        if key not in known:
            reader = (
                "torch-etcd-v3's etcd-v3" if known is not KNOWN_RDZV_KEYS else "torch's etcd-v2"
            )
            raise ConfigError(
                f"{name}: unknown key {key!r}; {reader} reads: {', '.join(sorted(known))}"
            )
        given[key] = value
    return given


def parse_rdzv_conf(
    raw: str, name: str = "ELASTIC_RDZV_CONF", backend: str = "etcd-v2", max_nodes: int = 1
) -> tuple[tuple[str, str], ...]:
    """`k=v,k=v` into ordered pairs, keys checked against the backend's; the default's
    for a job of up to `max_nodes` fill the keys not given."""
    known = rdzv_keys(backend)
    merged = _pairs(rdzv_conf_default(max_nodes, backend), name, known)
    merged.update(_pairs(raw, name, known))
    return tuple(merged.items())


def _tls_file(key: str, path: str) -> str:
    if not os.access(path, os.R_OK):
        why = "does not exist" if not os.path.exists(path) else "is not readable"
        raise ConfigError(
            f"{RdzvTls.setting(key)}: {path} {why}; mount the Secret there or fix the path"
        )
    return path


def parse_tls(conf: Sequence[tuple[str, str]]) -> RdzvTls | None:
    """The TLS of the rendezvous from the rdzv-conf pairs; None for plain HTTP.

    Mirrors torch's etcd-v2 `_create_etcd_client`: `protocol` is http or https (any
    case); `ssl_cert` alone is a PEM holding certificate and key.
    """
    given = dict(conf)
    protocol = given.get("protocol", "http").strip().lower()
    if protocol not in {"http", "https"}:
        raise ConfigError(f"ELASTIC_RDZV_CONF: protocol={given['protocol']!r}: use http or https")
    files = [k for k in ("ca_cert", "ssl_cert", "ssl_cert_key") if k in given]
    if protocol == "http":
        if files:
            raise ConfigError(
                f"ELASTIC_RDZV_CONF: {files[0]} is set but protocol is http: add "
                "protocol=https (chart: rendezvous.tls.enabled) or remove it"
            )
        return None
    if "ssl_cert_key" in given and "ssl_cert" not in given:
        raise ConfigError(
            f"{RdzvTls.setting('ssl_cert_key')} is set without ssl_cert: give the certificate too"
        )
    return RdzvTls(given.get("ca_cert"), given.get("ssl_cert"), given.get("ssl_cert_key"))
