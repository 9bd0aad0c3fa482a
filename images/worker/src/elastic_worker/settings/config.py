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
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elastic_worker.settings import envfile
from elastic_worker.settings.definitions import BY_NAME
from elastic_worker.settings.rendezvous import (
    KNOWN_RDZV_KEYS,
    Endpoint,
    RdzvTls,
    parse_endpoint,
    parse_rdzv_conf,
    parse_tls,
    rdzv_keys,
)
from elastic_worker.settings.schema import BACKENDS, ConfigError, Kind, Setting

__all__ = [
    "KNOWN_RDZV_KEYS",
    "NODE_INFO",
    "Config",
    "ConfigError",
    "Endpoint",
    "KubeApi",
    "RdzvTls",
    "load",
    "parse_endpoint",
    "parse_rdzv_conf",
    "parse_tls",
    "rdzv_keys",
    "text",
]

# The topology init-topology writes (its NODE_* variables), as the labels of the
# elastic_job_node_info series: what a dashboard groups pods by (e.g. spot vs on-demand).
NODE_INFO = (
    ("instance_type", "NODE_INSTANCE_TYPE"),
    ("capacity_type", "NODE_CAPACITY_TYPE"),
    ("gpu_model", "NODE_GPU_MODEL"),
    ("zone", "NODE_ZONE"),
)

MISMATCH_MODES = ("refuse", "warn", "off")

_JOB_ID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


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
    exit_barrier_timeout: float
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
    # What the gate compares with the job's: NODE_GPU_MODEL, NODE_GPU_COUNT, NODE_FABRIC.
    node_kind: tuple[str, str, str]
    reclaim: bool
    reclaim_after: float
    hang_detection: bool
    hang_multiple: int
    hang_floor: float
    hang_first_step: float
    topology_mismatch: str
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


def _backend(env: Mapping[str, str]) -> str:
    raw = text(env, "ELASTIC_RDZV_BACKEND")
    if raw not in BACKENDS:
        raise ConfigError(
            f"ELASTIC_RDZV_BACKEND={raw!r} is not a rendezvous backend: use etcd-v2, etcd-v3 or "
            "etcd-lease (chart: global.rendezvousBackend)"
        )
    return raw


def _mismatch(env: Mapping[str, str]) -> str:
    raw = text(env, "ELASTIC_TOPOLOGY_MISMATCH")
    if raw in MISMATCH_MODES:
        return raw
    raise ConfigError(
        f"ELASTIC_TOPOLOGY_MISMATCH={raw!r}: use refuse, warn or off (chart: topology.mismatch)"
    )


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
        exit_barrier_timeout=_seconds(env, "ELASTIC_EXIT_BARRIER_TIMEOUT"),
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
        node_kind=(
            text(env, "NODE_GPU_MODEL"),
            text(env, "NODE_GPU_COUNT"),
            text(env, "NODE_FABRIC"),
        ),
        reclaim=_bool(env, "ELASTIC_RECLAIM"),
        reclaim_after=_seconds(env, "ELASTIC_RECLAIM_AFTER"),
        hang_detection=_bool(env, "ELASTIC_HANG_DETECTION"),
        hang_multiple=_int(env, "ELASTIC_HANG_STEP_MULTIPLE"),
        hang_floor=_seconds(env, "ELASTIC_HANG_FLOOR"),
        hang_first_step=_seconds(env, "ELASTIC_HANG_FIRST_STEP"),
        topology_mismatch=_mismatch(env),
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
