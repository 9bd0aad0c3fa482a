"""The project's own etcd keys (completion marker, generation, members, round keys) through
one interface, on the API of the job's rendezvous backend: etcdv2.Client (etcd's v2 keys
API, TTLs) for etcd-v2, etcdv3.Client (the v3 API, leases) for etcd-v3.

The interface is the v2 keys model the callers were written against: a key with a value,
an optional time to live, compare-and-swap on existence or on the previous value, and the
direct children of a "directory" (a key prefix ending in "/" on v3).
"""

from __future__ import annotations

import ssl
from abc import ABC, abstractmethod
from dataclasses import dataclass

from elastic_worker import timings
from elastic_worker.settings.config import Config
from elastic_worker.settings.schema import V3_BACKENDS


class EtcdError(Exception):
    """etcd answered with an error or could not be reached."""


class Unavailable(EtcdError):
    """No answer (connection refused, timeout, DNS) or a server error."""


class NoApi(EtcdError):
    """The server answers HTTP but lacks the API the backend needs (v2: etcd 3.6 or
    --enable-v2=false; v3: etcd older than 3.4)."""


class TlsRefused(EtcdError):
    """TLS cannot work with these settings; waiting does not help.

    `side` says whose certificate or protocol failed: "server" (this worker does not
    trust etcd's certificate), "client" (etcd refused this worker's certificate, or
    wants one) or "protocol" (https to a server that speaks plain HTTP)."""

    def __init__(self, side: str, detail: str) -> None:
        super().__init__(detail)
        self.side = side


class KeyNotFound(EtcdError):
    pass


class NodeExists(EtcdError):
    pass


class CompareFailed(EtcdError):
    """A compare-and-swap found another value than the one expected."""


@dataclass(frozen=True)
class Entry:
    """A key and its value; on etcd v2 a directory also holds its children."""

    key: str
    value: str | None
    children: tuple[Entry, ...] = ()


# OpenSSL's names for the alerts a server sends when it refuses the client certificate.
_CLIENT_CERT_ALERTS = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_UNKNOWN",
    "HANDSHAKE_FAILURE",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_REVOKED",
    "UNSUPPORTED_CERTIFICATE",
    "ACCESS_DENIED",
)


def tls_refusal(reason: object) -> TlsRefused | None:
    """A refusal the error itself proves (an alert, a certificate that fails to verify)."""
    if isinstance(reason, ssl.SSLCertVerificationError):
        return TlsRefused("server", str(reason.verify_message or reason))
    if isinstance(reason, ssl.SSLError):
        name = str(reason.reason or "")
        if name == "WRONG_VERSION_NUMBER":
            return TlsRefused("protocol", "the server does not speak TLS")
        if any(alert in name for alert in _CLIENT_CERT_ALERTS):
            return TlsRefused("client", f"the server sent {name}")
    return None


@dataclass(frozen=True)
class Write:
    """How a key is written: gone `ttl` seconds after the write when given; `prev_exist` /
    `prev_value` make it a compare-and-swap."""

    ttl: int | None = None
    prev_exist: bool | None = None
    prev_value: str | None = None


class KeyStore(ABC):
    """What the worker does with its own keys, on either API. Every call is bounded by the
    client's timeout and raises EtcdError (or a subclass above) on failure."""

    #: http(s)://host:port of the etcd, for messages.
    base_url: str
    #: The etcd API spoken, "v2" or "v3", for messages.
    api: str

    @abstractmethod
    def get_value(self, key: str) -> str | None:
        """The key's value, or None when it does not exist."""

    def set(
        self,
        key: str,
        value: str,
        *,
        ttl: int | None = None,
        prev_exist: bool | None = None,
        prev_value: str | None = None,
    ) -> object:
        """Write a key, gone `ttl` seconds after its last write when given; `prev_exist`
        / `prev_value` make it a compare-and-swap (NodeExists, KeyNotFound or
        CompareFailed when the comparison fails)."""
        return self._write(key, value, Write(ttl, prev_exist, prev_value))

    @abstractmethod
    def _write(self, key: str, value: str, how: Write) -> object:
        """set(), on this API."""

    @abstractmethod
    def delete(self, key: str, *, prev_value: str | None = None) -> None:
        """Remove the key; a key already gone is no error. `prev_value`: only while it
        holds that value (CompareFailed when it holds another)."""

    @abstractmethod
    def list_dir(self, key: str) -> list[Entry]:
        """The direct children of a directory; empty when it does not exist."""

    @abstractmethod
    def check_api(self) -> None:
        """Raise NoApi, TlsRefused or Unavailable unless the backend's API answers."""

    @abstractmethod
    def server_version(self) -> str:
        """etcd's version, e.g. '3.6.0', or '' when it cannot be read."""

    @abstractmethod
    def with_timeout(self, timeout: float) -> KeyStore:
        """A client for the same etcd, TLS and credentials with another request timeout
        (a thread that must not wait on another's slow request gets its own)."""


def connect(config: Config, timeout: float = timings.ETCD_TIMEOUT) -> KeyStore:
    """The worker's client for the job's etcd, on the API of config.rdzv_backend, with
    the TLS (and, on v3, the credentials) torch's handler is given. Raises
    config.ConfigError when a TLS file or the rdzv-conf cannot be used."""
    if config.rdzv_backend in V3_BACKENDS:
        from elastic_worker.keystore import etcdv3  # noqa: PLC0415 - imports torch; v3 only

        return etcdv3.connect(config, timeout)
    from elastic_worker.keystore import etcdv2  # noqa: PLC0415 - etcdv2 imports this module

    return etcdv2.connect(config, timeout)
