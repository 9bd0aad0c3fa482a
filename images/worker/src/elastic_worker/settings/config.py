"""The worker's settings (environment, then /etc/inject/env) as one frozen object.

Every variable is defined once in settings.py (name, kind, default); `load()` reads
them all through that table, once, and nothing else in the package reads a setting from
os.environ. A bad or missing setting raises ConfigError with one line naming the
variable and saying what to do; main() prints it and exits 2 (exits.py).
"""

from __future__ import annotations

import fnmatch
import os
import re
import socket
import ssl
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elastic_worker.settings import envfile
from elastic_worker.settings.definitions import BY_NAME, Kind, Setting, rdzv_conf_default

# The topology init-topology writes (its NODE_* variables), as the labels of the
# elastic_job_node_info series: what a dashboard groups pods by (e.g. spot vs on-demand).
NODE_INFO = (
    ("instance_type", "NODE_INSTANCE_TYPE"),
    ("capacity_type", "NODE_CAPACITY_TYPE"),
    ("gpu_model", "NODE_GPU_MODEL"),
    ("zone", "NODE_ZONE"),
)

BACKENDS = ("etcd-v2", "etcd-v3")

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


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ConfigError(ValueError):
    """A setting is missing or malformed; the message is the one line to print."""


def rdzv_keys(backend: str) -> frozenset[str]:
    """The --rdzv-conf keys the backend's handler (and torch's rendezvous) read."""
    if backend == "etcd-v3":
        # The handler's own list; importing it imports torch, which etcd-v3 runs anyway.
        try:
            from torch_etcd_v3.config import KEYS  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigError(
                f"ELASTIC_RDZV_BACKEND=etcd-v3 needs the torch-etcd-v3 package ({exc}): "
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


@dataclass(frozen=True)
class KubeApi:
    """Where and how to reach the API server (in-cluster; the directory of the token and
    CA can be moved with ELASTIC_SERVICEACCOUNT_DIR, for local runs and tests)."""

    base_url: str
    token: str = field(repr=False)
    ca_file: str | None


@dataclass(frozen=True)
class Config:
    job_id: str
    endpoint: Endpoint
    rdzv_backend: str
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
    statefulsets_file: Path | None
    rendezvous_statefulset: str
    pod_name: str
    group: str
    metrics: bool
    loss_detection: bool
    lifeline: bool
    lifeline_port: int
    warm_start: bool
    warm_preload: tuple[str, ...]
    metrics_port: int
    events: bool
    pod_namespace: str
    pod_uid: str
    node_name: str
    # The node's topology from /etc/inject/env, as label -> value (metrics.NODE_INFO).
    node_info: tuple[tuple[str, str], ...]
    pod_ip: str
    local_addr: str
    nccl_socket_ifname: str
    gloo_socket_ifname: str
    kube_api: KubeApi | None
    debug: bool
    command: tuple[str, ...]
    tls: RdzvTls | None

    @property
    def rdzv_url(self) -> str:
        """The base URL of the worker's own etcd client: https exactly when torch's is."""
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def key_prefix(self) -> str:
        """The project's own etcd key prefix ("directory") for this job."""
        return f"/elastic-job/{self.job_id}"

    def matches_mesh(self, ifname: str) -> bool:
        return any(fnmatch.fnmatchcase(ifname, glob) for glob in self.mesh_interfaces)


_REQUIRED_HINT = {
    "ELASTIC_JOB_ID": "set job.id or install through the chart",
    "ELASTIC_RDZV_ENDPOINT": "give the etcd host:port",
    "ELASTIC_MIN_NODES": "give an integer >= 1",
    "ELASTIC_MAX_NODES": "give an integer >= 1",
}


def text(env: Mapping[str, str], name: str) -> str:
    """The variable as set (stripped), else its default from settings.py; a required
    variable that is unset or empty is a ConfigError."""
    setting: Setting = BY_NAME[name]
    raw = env.get(name, "").strip()
    if raw:
        return raw
    if setting.default is None:
        hint = _REQUIRED_HINT.get(name, f"give {setting.kind.value}")
        raise ConfigError(f"{name} is not set: {hint}")
    return setting.default


def _int(env: Mapping[str, str], name: str) -> int:
    minimum = 0 if BY_NAME[name].kind is Kind.COUNT0 else 1
    raw = text(env, name)
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer: give one >= {minimum}") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} is below {minimum}")
    return value


def _port(env: Mapping[str, str], name: str) -> int:
    raw = text(env, name)
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{name}={raw!r} is not a port: give an integer from 1 to 65535")
    return int(raw)


def _seconds(env: Mapping[str, str], name: str) -> float:
    raw = text(env, name)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = text(env, name)
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f'{name}={raw!r} is not a boolean: use "true" or "false"')


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text(env, name).split(",") if item.strip())


def read_statefulsets(path: Path | None) -> tuple[str, ...]:
    """The StatefulSets named in ELASTIC_STATEFULSETS_FILE, one a line, read now rather than
    at start: the kubelet updates a mounted ConfigMap, so a group added by an upgrade is
    there when the job completes. () without a file; ConfigError when it cannot be used."""
    if path is None:
        return ()
    try:
        names = tuple(path.read_text().split())
    except OSError as exc:
        raise ConfigError(
            f"ELASTIC_STATEFULSETS_FILE={path}: cannot read it: {exc.strerror}"
        ) from None
    for name in names:
        if not _NAME.fullmatch(name):
            raise ConfigError(
                f"ELASTIC_STATEFULSETS_FILE={path}: {name!r} is not a Kubernetes name"
            )
    return names


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
    merged = _pairs(rdzv_conf_default(max_nodes), name, known)
    merged.update(_pairs(raw, name, known))
    return tuple(merged.items())


def _backend(env: Mapping[str, str]) -> str:
    raw = text(env, "ELASTIC_RDZV_BACKEND")
    if raw not in BACKENDS:
        raise ConfigError(
            f"ELASTIC_RDZV_BACKEND={raw!r} is not a rendezvous backend: use etcd-v2 or etcd-v3 "
            "(chart: global.rendezvousBackend)"
        )
    return raw


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


def _nproc(env: Mapping[str, str]) -> str:
    raw = text(env, "ELASTIC_NPROC_PER_NODE")
    if raw in {"auto", "cpu", "gpu"} or (raw.isdigit() and int(raw) >= 1):
        return raw
    raise ConfigError(f"ELASTIC_NPROC_PER_NODE={raw!r}: give an integer >= 1, auto, cpu or gpu")


def load(
    argv: Sequence[str],
    environ: MutableMapping[str, str] | None = None,
) -> Config:
    """Merge /etc/inject/env into `environ` (never overriding) and build the Config."""
    env = os.environ if environ is None else environ
    inject = Path(text(env, "ELASTIC_INJECT_ENV"))
    try:
        envfile.merge(envfile.read(inject), env)
    except envfile.EnvFileError as exc:
        raise ConfigError(f"{exc} (written by init-topology; see docs/contracts.md)") from None
    except OSError as exc:
        raise ConfigError(f"ELASTIC_INJECT_ENV={inject}: cannot read it: {exc.strerror}") from None

    if not argv:
        raise ConfigError("no training command: pass it as arguments (job.command)")

    job_id = text(env, "ELASTIC_JOB_ID")
    if not _JOB_ID.fullmatch(job_id):
        raise ConfigError(
            f"ELASTIC_JOB_ID={job_id!r}: use 1-63 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    endpoint = parse_endpoint(text(env, "ELASTIC_RDZV_ENDPOINT"))
    min_nodes = _int(env, "ELASTIC_MIN_NODES")
    max_nodes = _int(env, "ELASTIC_MAX_NODES")
    if max_nodes < min_nodes:
        raise ConfigError(
            f"ELASTIC_MAX_NODES={max_nodes} is below ELASTIC_MIN_NODES={min_nodes}: "
            "raise the maximum or lower the minimum"
        )
    statefulsets_file = text(env, "ELASTIC_STATEFULSETS_FILE")
    preload = _list(env, "ELASTIC_WARM_PRELOAD")
    for module in preload:
        if not _MODULE.fullmatch(module):
            raise ConfigError(
                f"ELASTIC_WARM_PRELOAD has {module!r}, not a Python module name: list "
                "importable modules separated by commas, e.g. torch,torchvision"
            )
    rendezvous_statefulset = text(env, "ELASTIC_RENDEZVOUS_STATEFULSET")
    if rendezvous_statefulset and not _NAME.fullmatch(rendezvous_statefulset):
        raise ConfigError(
            f"ELASTIC_RENDEZVOUS_STATEFULSET: {rendezvous_statefulset!r} is not a Kubernetes name"
        )
    pod_name = text(env, "POD_NAME") or socket.gethostname()
    if "/" in pod_name:
        raise ConfigError(f"POD_NAME={pod_name!r} must not contain '/'")
    backend = _backend(env)
    rdzv_conf = parse_rdzv_conf(
        text(env, "ELASTIC_RDZV_CONF"), backend=backend, max_nodes=max_nodes
    )
    # "," alone is no glob: the default's, as for an empty value.
    mesh = _list(env, "ELASTIC_MESH_INTERFACES") or _list({}, "ELASTIC_MESH_INTERFACES")

    return Config(
        job_id=job_id,
        endpoint=endpoint,
        rdzv_backend=backend,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=_nproc(env),
        max_restarts=_int(env, "ELASTIC_MAX_RESTARTS"),
        rdzv_conf=rdzv_conf,
        tls=parse_tls(rdzv_conf),
        monitor_interval=_seconds(env, "ELASTIC_MONITOR_INTERVAL"),
        gate_timeout=_seconds(env, "ELASTIC_GATE_TIMEOUT"),
        gate_peers=_bool(env, "ELASTIC_GATE_PEERS"),
        mesh_interfaces=mesh,
        mesh_required=_bool(env, "ELASTIC_MESH_REQUIRED"),
        inject_env=inject,
        grace_period=_int(env, "ELASTIC_GRACE_PERIOD"),
        scale_down=_bool(env, "ELASTIC_SCALE_DOWN"),
        statefulsets_file=Path(statefulsets_file) if statefulsets_file else None,
        rendezvous_statefulset=rendezvous_statefulset,
        pod_name=pod_name,
        group=text(env, "ELASTIC_GROUP"),
        metrics=_bool(env, "ELASTIC_METRICS"),
        loss_detection=_bool(env, "ELASTIC_LOSS_DETECTION"),
        lifeline=_bool(env, "ELASTIC_LIFELINE"),
        lifeline_port=_port(env, "ELASTIC_LIFELINE_PORT"),
        warm_start=_bool(env, "ELASTIC_WARM_START"),
        warm_preload=preload,
        metrics_port=_port(env, "ELASTIC_METRICS_PORT"),
        events=_bool(env, "ELASTIC_EVENTS"),
        pod_namespace=text(env, "POD_NAMESPACE"),
        pod_uid=text(env, "POD_UID"),
        node_name=text(env, "NODE_NAME"),
        node_info=tuple((label, text(env, var)) for label, var in NODE_INFO),
        pod_ip=text(env, "POD_IP"),
        local_addr=text(env, "ELASTIC_LOCAL_ADDR"),
        nccl_socket_ifname=text(env, "NCCL_SOCKET_IFNAME"),
        gloo_socket_ifname=text(env, "GLOO_SOCKET_IFNAME"),
        kube_api=_kube_api(env),
        debug=_bool(env, "ELASTIC_DEBUG"),
        command=tuple(argv),
    )


def _kube_api(env: Mapping[str, str]) -> KubeApi | None:
    """In-cluster API access as the kubelet provides it; None without a host or token."""
    host = text(env, "KUBERNETES_SERVICE_HOST")
    sa_dir = Path(text(env, "ELASTIC_SERVICEACCOUNT_DIR"))
    try:
        token = (sa_dir / "token").read_text().strip()
    except OSError:
        return None
    if not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    ca = sa_dir / "ca.crt"
    port = text(env, "KUBERNETES_SERVICE_PORT")
    return KubeApi(f"https://{host}:{port}", token, str(ca) if ca.exists() else None)
