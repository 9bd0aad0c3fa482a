"""How a worker setting is described (Kind, Source, Setting), the error a bad one raises,
and the rendezvous defaults the table's text derives from. The table itself is
definitions.py."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ConfigError(ValueError):
    """A setting is missing or malformed; the message is the one line to print."""


class Kind(Enum):
    """How a value is written; config.py has one parser per kind."""

    JOB_ID = "job id"
    ENDPOINT = "host:port"
    BACKEND = "etcd-v2, etcd-v3 or etcd-lease"
    COUNT = "integer >= 1"
    COUNT0 = "integer >= 0"
    PORT = "port 1-65535"
    NPROC = "integer >= 1, auto, cpu or gpu"
    SECONDS = "seconds > 0"
    MISMATCH = "refuse, warn or off"
    BOOL = "true or false"
    GLOBS = "comma-separated globs"
    NAMES = "comma-separated names"
    RDZV_CONF = "k=v,k=v"
    PATH = "path"
    TEXT = "string"


class Source(Enum):
    """Who sets a variable in a pod the chart renders."""

    VALUE = "value"  # the chart, from the values.yaml key named in `chart`
    DERIVED = "derived"  # the chart, computed (release, namespace, objects it renders)
    KUBELET = "kubelet"  # the downward API or the kubelet itself
    IMAGE = "image"  # nobody: the image's default, or the user's env (local runs, tests)
    USER = "user"  # the user's env (worker.env) or init-topology's file, when at all


@dataclass(frozen=True)
class Setting:
    name: str
    kind: Kind
    #: The value when the variable is unset or empty, written as in the environment;
    #: None: the variable is required.
    default: str | None
    source: Source
    #: The values.yaml keys it comes from, what the chart derives it from, or who sets it.
    chart: str
    meaning: str


#: Heartbeat writes per second the rendezvous key is sized for: every node rewrites the
#: whole state (a compare-and-set of one key) each keep_alive_interval, and joining nodes
#: compete with those writes. Above it the heartbeats of nodes already in the round stop
#: landing within interval x attempts, the others evict them, they join again, and the
#: round never completes (docs/notes/2026-11-25-rendezvous-at-scale.md).
HEARTBEATS_PER_S = 32


#: The rendezvous backends (global.rendezvousBackend); those that speak etcd's v3 API, for
#: the worker's own keys too.
BACKENDS = ("etcd-v2", "etcd-v3", "etcd-lease")
V3_BACKENDS = ("etcd-v3", "etcd-lease")


def keep_alive_interval(max_nodes: int, backend: str = "etcd-v2") -> int:
    """The default `keep_alive_interval` for a job of up to `max_nodes` nodes: 1 s up to
    HEARTBEATS_PER_S nodes, then longer in proportion. It trades detection time: a node
    lost without leaving is dropped from the round after interval x keep_alive_max_attempt.
    etcd-lease's heartbeat is a lease keep-alive of a few bytes that no other write
    contends with (docs/rendezvous.md): 1 s at every size."""
    if backend == "etcd-lease":
        return 1
    return max(1, -(-max_nodes // HEARTBEATS_PER_S))


def rdzv_conf_default(max_nodes: int, backend: str = "etcd-v2") -> str:
    """Rendezvous settings the chart writes from `rendezvous.*` (docs/recovery.md says what
    each trades); keys the chart does not set fall back to these."""
    return (
        "join_timeout=600,last_call_timeout=1,close_timeout=10,"
        f"keep_alive_interval={keep_alive_interval(max_nodes, backend)},"
        "keep_alive_max_attempt=3,heartbeat_timeout=5"
    )


#: The defaults of a job of up to HEARTBEATS_PER_S nodes (as bench-recovery runs).
RDZV_CONF_DEFAULT = rdzv_conf_default(1)
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
