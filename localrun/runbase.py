"""What the parts of one local run share (run.py, runsetup.py, runend.py): its
configuration, exit codes and errors, and the runner's state and steps that one part
calls in another (declared here, each defined in its part)."""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun import chart, prometheus
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.apiserver import Fault as ApiFault
from localrun.cluster.cluster import Cluster
from localrun.cluster.nodelifecycle import NodeTimings
from localrun.cluster.pod import Pod
from localrun.cluster.podspec import Container
from localrun.faults import Fault, Injector
from localrun.host.mountpoints import Mountpoints
from localrun.host.network import Network
from localrun.kubestate import KubeState
from localrun.state import RunState
from localrun.view import Progress

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Seconds between reads of the completion marker while the job runs.
COMPLETION_POLL = 2.0


@dataclass
class RunConfig:
    chart: Path
    values: list[Path]
    sets: list[str]
    release: str = "demo"
    namespace: str = "default"
    profile: str = "local"
    cluster_domain: str = "cluster.local"
    faults: list[Fault] = field(default_factory=list)
    api_faults: list[tuple[str, ApiFault]] = field(default_factory=list)
    json_path: Path | None = None
    output: Path | None = None
    timeout: float = 1800.0
    backoff_base: float = 10.0
    backoff_cap: float = 300.0
    give_up_after: int = 5
    live: bool | None = None  # None: live view when stdout is a terminal
    loopback: bool = False  # force the no-root fallback
    linger: float = 0.0  # seconds the API server stays up after the end
    prometheus: bool = False  # run Debian's prometheus on the pods (localrun/prometheus.py)
    cluster_sets: list[str] = field(default_factory=list)  # --cluster-set, with --prometheus
    images: dict[str, Path] = field(default_factory=dict)  # --image NAME=VENV
    node_timings: NodeTimings = field(default_factory=NodeTimings)  # the node lifecycle's


class Interrupted(Exception):
    pass


class SetupError(Exception):
    """Setup failed; the message is the run's error, the code its exit."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class RunnerBase(ABC):
    """The runner's state, as Runner.__init__ sets it, and the steps one part of the run
    calls in another."""

    cfg: RunConfig
    events: queue.Queue[tuple[Any, ...]]
    start: float
    progress: Progress
    state: RunState
    job_id: str
    rdzv_backend: str
    _stop_signal: int | None
    _next_completion_check: float
    api: FakeApiServer | None
    network: Network | None
    cluster: Cluster | None
    injector: Injector | None
    mountpoints: Mountpoints
    client_tls: chart.ClientTls | None
    prometheus: prometheus.Prometheus | None
    kubestate: KubeState | None
    _incarnations: dict[str, int]
    _published: dict[str, dict[str, Any]]
    workdir: Path
    outdir: Path

    # run.py
    @abstractmethod
    def _rel(self, t: float | None = None) -> float: ...

    @abstractmethod
    def event(self, text: str) -> None: ...

    @abstractmethod
    def _publish_pods(self) -> None: ...

    @abstractmethod
    def _log_source(self, namespace: str, pod: str, container: str) -> tuple[Path, int] | None: ...

    @abstractmethod
    def _pending(self) -> Iterator[tuple[Any, ...]]: ...

    @abstractmethod
    def _partitioned(self, pod: str) -> bool: ...

    @abstractmethod
    def _container_started(self, pod: Pod, c: Container) -> None: ...

    @abstractmethod
    def _container_exited(self, pod: Pod, c: Container, rc: int, now: float) -> None: ...

    # runend.py
    @abstractmethod
    def _check_completion(self, now: float) -> bool | None: ...

    @abstractmethod
    def _scale_via_api(self, ns: str, name: str, replicas: int) -> bool: ...
