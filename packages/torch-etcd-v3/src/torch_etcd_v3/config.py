"""`--rdzv-endpoint` and `--rdzv-conf` -> one typed configuration, checked once.

The keys are torch's etcd-v2 handler's where they apply (protocol, ca_cert, ssl_cert,
ssl_cert_key, read_timeout), plus user/password_file, key_prefix and lease_ttl. Timing
keys (join_timeout, last_call_timeout, close_timeout, heartbeat, keep_alive_*) belong to
torch's dynamic rendezvous, which reads them itself.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from .backend import Backoff
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


@dataclass(frozen=True)
class Config:
    client: ClientSettings
    run_id: str
    key_prefix: str
    lease_ttl: int
    backoff: Backoff

    @property
    def state_key(self) -> bytes:
        return f"{self.key_prefix}/rendezvous/{self.run_id}".encode()

    @property
    def store_prefix(self) -> bytes:
        return f"{self.key_prefix}/store/{self.run_id}/".encode()


def _positive_int(params: RendezvousParameters, key: str, default: int) -> int:
    raw = params.config.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value <= 0:
        raise ConfigError(
            f"--rdzv-conf {key}={raw!r}: must be a whole number of seconds above 0 "
            f"(default {default})"
        )
    return value


def _readable(key: str, path: str) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"--rdzv-conf {key}={path!r}: no such file; give the path of a PEM file")
    return path


def _tls(params: RendezvousParameters, protocol: str) -> ssl.SSLContext | None:
    ca_cert = params.get("ca_cert")
    ssl_cert = params.get("ssl_cert")
    ssl_cert_key = params.get("ssl_cert_key")
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


def _password(params: RendezvousParameters, user: str | None) -> str | None:
    password_file = params.get("password_file")
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


def load(params: RendezvousParameters) -> Config:
    if not params.endpoint:
        raise ConfigError(
            "--rdzv-endpoint is empty: give HOST:PORT of etcd (port 2379 if left out)"
        )
    try:
        host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    except ValueError as exc:
        raise ConfigError(f"--rdzv-endpoint={params.endpoint!r}: {exc}") from exc
    if not params.run_id:
        raise ConfigError("--rdzv-id is empty: give the job a run id")

    protocol = str(params.get("protocol", "http")).strip().lower()
    if protocol not in ("http", "https"):
        raise ConfigError(f"--rdzv-conf protocol={params.get('protocol')!r}: use http or https")

    key_prefix = str(params.get("key_prefix", DEFAULT_KEY_PREFIX)).rstrip("/")
    if not key_prefix.startswith("/"):
        raise ConfigError(
            f"--rdzv-conf key_prefix={params.get('key_prefix')!r}: must start with / "
            f"(default {DEFAULT_KEY_PREFIX})"
        )

    user = params.get("user") or None
    return Config(
        client=ClientSettings(
            host=host,
            port=port,
            tls=_tls(params, protocol),
            read_timeout=_positive_int(params, "read_timeout", DEFAULT_READ_TIMEOUT),
            user=user,
            password=_password(params, user),
        ),
        run_id=params.run_id,
        key_prefix=key_prefix,
        lease_ttl=_positive_int(params, "lease_ttl", DEFAULT_LEASE_TTL),
        backoff=Backoff.for_job(
            params.max_nodes,
            params.get_as_int("keep_alive_interval") or TORCH_KEEP_ALIVE_INTERVAL,
        ),
    )
