"""`--rdzv-endpoint` and `--rdzv-conf` -> one typed configuration, checked once.

The keys are torch's etcd-v2 handler's where they apply (protocol, ca_cert, ssl_cert,
ssl_cert_key, read_timeout), plus user/password_file, key_prefix and lease_ttl. Timing
keys (join_timeout, last_call_timeout, close_timeout, heartbeat, keep_alive_*) belong to
torch's dynamic rendezvous, which reads them itself.

Standard library only: the worker checks a conf and reaches etcd with this module without
importing torch. `load` takes torch's RendezvousParameters (or anything shaped like it);
`from_conf` the same values as plain arguments.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .backoff import Backoff
from .client import ClientSettings

#: The --rdzv-conf keys this handler reads (load() below).
HANDLER_KEYS = frozenset(
    {
        "protocol",
        "ca_cert",
        "ssl_cert",
        "ssl_cert_key",
        "read_timeout",
        "user",
        "password_file",
        "key_prefix",
        "lease_ttl",
    }
)
#: The keys torch's dynamic rendezvous reads itself (torch's create_handler).
RENDEZVOUS_KEYS = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    }
)
#: Every key that means something to `--rdzv-backend=etcd-v3`.
KEYS = HANDLER_KEYS | RENDEZVOUS_KEYS

DEFAULT_PORT = 2379
DEFAULT_KEY_PREFIX = "/torch/elastic"
DEFAULT_LEASE_TTL = 60
DEFAULT_READ_TIMEOUT = 60
#: torch's dynamic rendezvous's, when --rdzv-conf sets none (its create_handler).
TORCH_KEEP_ALIVE_INTERVAL = 5


class ConfigError(ValueError):
    """A --rdzv-endpoint or --rdzv-conf value that cannot work; the message names it."""


class Parameters(Protocol):
    """What `load` reads of torch's RendezvousParameters."""

    @property
    def endpoint(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def config(self) -> Mapping[str, object]: ...


@dataclass(frozen=True)
class Config:
    client: ClientSettings
    run_id: str
    #: Without a trailing /: "" is the root of the keyspace (`key_prefix=/`).
    key_prefix: str
    lease_ttl: int
    backoff: Backoff

    @property
    def state_key(self) -> bytes:
        return f"{self.key_prefix}/rendezvous/{self.run_id}".encode()

    @property
    def store_prefix(self) -> bytes:
        return f"{self.key_prefix}/store/{self.run_id}/".encode()


def _get(conf: Mapping[str, object], key: str) -> str | None:
    """The key's value as given; None when absent or empty (empty means the default, as
    `key=` on a command line or an empty Helm value would mean)."""
    value = conf.get(key)
    return None if value is None or str(value) == "" else str(value)


def _positive_int(conf: Mapping[str, object], key: str, default: int) -> int:
    raw = _get(conf, key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(
            f"--rdzv-conf {key}={raw!r}: must be a whole number of seconds above 0 "
            f"(default {default})"
        )
    return value


_HOST = re.compile(r"[\w.:-]+")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`HOST[:PORT]` or `[IPv6][:PORT]` -> (host, port); port 2379 if left out."""
    text = endpoint.strip()
    where = f"--rdzv-endpoint={endpoint!r}"
    if not text:
        raise ConfigError(
            "--rdzv-endpoint is empty: give HOST:PORT of etcd (port 2379 if left out)"
        )
    if "://" in text:
        raise ConfigError(
            f"{where}: give HOST:PORT without a scheme (for TLS add protocol=https to --rdzv-conf)"
        )
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ConfigError(f"{where}: write an IPv6 address as [ADDRESS]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise ConfigError(f"{where}: write an IPv6 address in brackets, as [ADDRESS]:PORT")
    else:
        host, colon, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if colon else None
    if not host or not _HOST.fullmatch(host):
        raise ConfigError(f"{where}: {host!r} is not a host name or address")
    if port_text is None:
        return host, DEFAULT_PORT
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 2**16:
        raise ConfigError(f"{where}: the port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def _readable(key: str, path: str) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"--rdzv-conf {key}={path!r}: no such file; give the path of a PEM file")
    return path


def _tls(conf: Mapping[str, object], protocol: str) -> ssl.SSLContext | None:
    ca_cert = _get(conf, "ca_cert")
    ssl_cert = _get(conf, "ssl_cert")
    ssl_cert_key = _get(conf, "ssl_cert_key")
    if protocol == "http":
        for key, value in (("ca_cert", ca_cert), ("ssl_cert", ssl_cert)):
            if value:
                raise ConfigError(
                    f"--rdzv-conf {key}={value!r} is set but protocol is http: "
                    "add protocol=https to use TLS"
                )
        return None
    if ssl_cert_key and not ssl_cert:
        raise ConfigError(
            f"--rdzv-conf ssl_cert_key={ssl_cert_key!r} without ssl_cert: "
            "give the client certificate too"
        )
    try:
        context = ssl.create_default_context(
            cafile=_readable("ca_cert", ca_cert) if ca_cert else None
        )
        if ssl_cert:
            context.load_cert_chain(
                _readable("ssl_cert", ssl_cert),
                _readable("ssl_cert_key", ssl_cert_key) if ssl_cert_key else None,
            )
    except ssl.SSLError as exc:
        raise ConfigError(
            f"--rdzv-conf ca_cert={ca_cert!r} ssl_cert={ssl_cert!r} "
            f"ssl_cert_key={ssl_cert_key!r}: not a usable PEM certificate/key: {exc}"
        ) from exc
    return context


def _password(conf: Mapping[str, object], user: str | None) -> str | None:
    password_file = _get(conf, "password_file")
    if not user:
        if password_file:
            raise ConfigError(
                f"--rdzv-conf password_file={password_file!r} without user: add user=NAME"
            )
        return None
    if not password_file:
        raise ConfigError(
            f"--rdzv-conf user={user!r} without password_file: add password_file=PATH "
            "(a file holding the password; never the password itself on the command line)"
        )
    try:
        text = Path(password_file).read_text()
    except OSError as exc:
        raise ConfigError(
            f"--rdzv-conf password_file={password_file!r}: cannot read it ({exc.strerror})"
        ) from exc
    # Secrets mounted from Kubernetes or written by `echo` end in a newline.
    password = text.rstrip("\r\n")
    if not password:
        raise ConfigError(f"--rdzv-conf password_file={password_file!r} is empty")
    return password


def _key_prefix(conf: Mapping[str, object]) -> str:
    raw = _get(conf, "key_prefix")
    if raw is None:
        return DEFAULT_KEY_PREFIX
    if not raw.startswith("/"):
        raise ConfigError(
            f"--rdzv-conf key_prefix={raw!r}: must start with / (/ alone is the root of "
            f"etcd's keyspace; default {DEFAULT_KEY_PREFIX})"
        )
    # `/` is the root: the keys are then /rendezvous/<run_id> and /store/<run_id>/...
    return raw.rstrip("/")


def from_conf(endpoint: str, run_id: str, conf: Mapping[str, object], max_nodes: int = 1) -> Config:
    """The configuration of `--rdzv-endpoint`, `--rdzv-id` and `--rdzv-conf` (as a mapping);
    `max_nodes` (the upper bound of `--nnodes`) scales the backoff."""
    host, port = parse_endpoint(endpoint or "")
    if not run_id:
        raise ConfigError("--rdzv-id is empty: give the job a run id")

    protocol = (_get(conf, "protocol") or "http").strip().lower()
    if protocol not in ("http", "https"):
        raise ConfigError(f"--rdzv-conf protocol={_get(conf, 'protocol')!r}: use http or https")
    key_prefix = _key_prefix(conf)
    user = _get(conf, "user")
    return Config(
        client=ClientSettings(
            host=host,
            port=port,
            tls=_tls(conf, protocol),
            read_timeout=_positive_int(conf, "read_timeout", DEFAULT_READ_TIMEOUT),
            user=user,
            password=_password(conf, user),
        ),
        run_id=run_id,
        key_prefix=key_prefix,
        lease_ttl=_positive_int(conf, "lease_ttl", DEFAULT_LEASE_TTL),
        backoff=Backoff.for_job(
            max_nodes,
            _positive_int(conf, "keep_alive_interval", TORCH_KEEP_ALIVE_INTERVAL),
        ),
    )


def load(params: Parameters) -> Config:
    """The configuration of torch's RendezvousParameters for this backend."""
    return from_conf(params.endpoint, params.run_id, params.config, params.max_nodes)
