"""The chart's settings (environment, then /etc/inject/env) as one frozen object.

`load()` reads everything once; nothing below it reads os.environ for a setting. A bad
or missing setting raises ConfigError with one line naming the variable and saying
what to do; main() prints it and exits 2 (docs/contracts.md).
"""

from __future__ import annotations

import fnmatch
import os
import re
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic_worker import envfile

# Rendezvous settings the entrypoint applies for every key the chart did not set.
# docs/recovery.md explains each value and how it was measured.
DEFAULT_RDZV_CONF: tuple[tuple[str, str], ...] = (
    ("join_timeout", "600"),
    ("last_call_timeout", "2"),
    ("close_timeout", "10"),
    ("keep_alive_interval", "1"),
    ("keep_alive_max_attempt", "3"),
    ("heartbeat_timeout", "5"),
)
DEFAULT_MONITOR_INTERVAL = 0.5
DEFAULT_MAX_RESTARTS = 20
DEFAULT_GATE_TIMEOUT = 300.0
DEFAULT_GRACE_PERIOD = 30
DEFAULT_INJECT_ENV = "/etc/inject/env"
DEFAULT_MESH_INTERFACES = ("wg*",)

# Keys torch's etcd-v2 rendezvous reads from --rdzv-conf (torch 2.13).
KNOWN_RDZV_KEYS = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "read_timeout",
        "protocol",
        "ssl_cert",
        "ssl_cert_key",
        "ca_cert",
        "timeout",
        "is_host",
    }
)

_JOB_ID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class ConfigError(ValueError):
    """A setting is missing or malformed; the message is the one line to print."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}"


@dataclass(frozen=True)
class Config:
    job_id: str
    endpoint: Endpoint
    min_nodes: int
    max_nodes: int
    nproc_per_node: str
    max_restarts: int
    rdzv_conf: tuple[tuple[str, str], ...]
    monitor_interval: float
    gate_timeout: float
    gate_peers: bool
    mesh_interfaces: tuple[str, ...]
    mesh_required: bool
    inject_env: Path
    grace_period: int
    scale_down: bool
    statefulsets: tuple[str, ...]
    pod_name: str
    pod_namespace: str
    pod_ip: str
    local_addr: str
    nccl_socket_ifname: str
    gloo_socket_ifname: str
    command: tuple[str, ...]

    @property
    def key_prefix(self) -> str:
        """The project's own etcd v2 directory for this job."""
        return f"/elastic-job/{self.job_id}"

    def matches_mesh(self, ifname: str) -> bool:
        return any(fnmatch.fnmatchcase(ifname, glob) for glob in self.mesh_interfaces)


def _req(env: Mapping[str, str], name: str, hint: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set: {hint}")
    return value


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        if default is None:
            raise ConfigError(f"{name} is not set: give an integer >= {minimum}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer: give one >= {minimum}") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} is below {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f'{name}={raw!r} is not a boolean: use "true" or "false"')


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in env.get(name, "").split(",") if item.strip())


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


def parse_rdzv_conf(raw: str, name: str = "ELASTIC_RDZV_CONF") -> tuple[tuple[str, str], ...]:
    """`k=v,k=v` into ordered pairs; DEFAULT_RDZV_CONF fills the keys not given."""
    given: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(f"{name}: {item!r} is not key=value (e.g. last_call_timeout=2)")
        if key not in KNOWN_RDZV_KEYS:
            known = ", ".join(sorted(KNOWN_RDZV_KEYS))
            raise ConfigError(f"{name}: unknown key {key!r}; torch's etcd-v2 reads: {known}")
        given[key] = value
    merged = dict(DEFAULT_RDZV_CONF)
    merged.update(given)
    return tuple(merged.items())


def _nproc(env: Mapping[str, str]) -> str:
    raw = env.get("ELASTIC_NPROC_PER_NODE", "").strip() or "1"
    if raw in {"auto", "cpu", "gpu"} or (raw.isdigit() and int(raw) >= 1):
        return raw
    raise ConfigError(f"ELASTIC_NPROC_PER_NODE={raw!r}: give an integer >= 1, auto, cpu or gpu")


def load(
    argv: Sequence[str],
    environ: MutableMapping[str, str] | None = None,
) -> Config:
    """Merge /etc/inject/env into `environ` (never overriding) and build the Config."""
    env = os.environ if environ is None else environ
    inject = Path(env.get("ELASTIC_INJECT_ENV", "").strip() or DEFAULT_INJECT_ENV)
    try:
        envfile.merge(envfile.read(inject), env)
    except envfile.EnvFileError as exc:
        raise ConfigError(f"{exc} (written by init-topology; see docs/contracts.md)") from None
    except OSError as exc:
        raise ConfigError(f"ELASTIC_INJECT_ENV={inject}: cannot read it: {exc.strerror}") from None

    if not argv:
        raise ConfigError("no training command: pass it as arguments (job.command)")

    job_id = _req(env, "ELASTIC_JOB_ID", "set job.id or install through the chart")
    if not _JOB_ID.fullmatch(job_id):
        raise ConfigError(
            f"ELASTIC_JOB_ID={job_id!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    endpoint = parse_endpoint(_req(env, "ELASTIC_RDZV_ENDPOINT", "give the etcd host:port"))
    min_nodes = _int(env, "ELASTIC_MIN_NODES", None, 1)
    max_nodes = _int(env, "ELASTIC_MAX_NODES", min_nodes, 1)
    if max_nodes < min_nodes:
        raise ConfigError(
            f"ELASTIC_MAX_NODES={max_nodes} is below ELASTIC_MIN_NODES={min_nodes}: "
            "raise the maximum or lower the minimum"
        )
    statefulsets = _list(env, "ELASTIC_STATEFULSETS")
    for name in statefulsets:
        if not _NAME.fullmatch(name):
            raise ConfigError(f"ELASTIC_STATEFULSETS: {name!r} is not a Kubernetes name")
    mesh = _list(env, "ELASTIC_MESH_INTERFACES") or DEFAULT_MESH_INTERFACES
    pod_name = env.get("POD_NAME", "").strip() or socket.gethostname()
    if "/" in pod_name:
        raise ConfigError(f"POD_NAME={pod_name!r} must not contain '/'")
    grace = _int(env, "ELASTIC_GRACE_PERIOD", DEFAULT_GRACE_PERIOD, 1)

    return Config(
        job_id=job_id,
        endpoint=endpoint,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=_nproc(env),
        max_restarts=_int(env, "ELASTIC_MAX_RESTARTS", DEFAULT_MAX_RESTARTS, 0),
        rdzv_conf=parse_rdzv_conf(env.get("ELASTIC_RDZV_CONF", "")),
        monitor_interval=_float(env, "ELASTIC_MONITOR_INTERVAL", DEFAULT_MONITOR_INTERVAL),
        gate_timeout=_float(env, "ELASTIC_GATE_TIMEOUT", DEFAULT_GATE_TIMEOUT),
        gate_peers=_bool(env, "ELASTIC_GATE_PEERS", False),
        mesh_interfaces=mesh,
        mesh_required=_bool(env, "ELASTIC_MESH_REQUIRED", False),
        inject_env=inject,
        grace_period=grace,
        scale_down=_bool(env, "ELASTIC_SCALE_DOWN", False),
        statefulsets=statefulsets,
        pod_name=pod_name,
        pod_namespace=env.get("POD_NAMESPACE", "").strip(),
        pod_ip=env.get("POD_IP", "").strip(),
        local_addr=env.get("ELASTIC_LOCAL_ADDR", "").strip(),
        nccl_socket_ifname=env.get("NCCL_SOCKET_IFNAME", "").strip(),
        gloo_socket_ifname=env.get("GLOO_SOCKET_IFNAME", "").strip(),
        command=tuple(argv),
    )
