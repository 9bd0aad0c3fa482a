"""What the kubelet asks of a container runtime (a small CRI): a sandbox per pod with its
address and DNS, and containers started from a fully resolved spec. The host layer
(localrun/host/runtime.py) implements it with namespaces and processes; the pod lifecycle
tests implement it in memory."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from localrun.cluster.dns import PodRecord

#: (pod, container, line, monotonic time) for every line a container prints.
LineSink = Callable[[str, str, str, float], None]


@dataclass(frozen=True)
class BindMount:
    source: str  # host path ("" with tmpfs)
    target: str  # path inside the container
    read_only: bool = False
    tmpfs_size: str = ""  # set: a tmpfs of this size instead of a bind mount (medium Memory)


@dataclass(frozen=True)
class ContainerSpec:
    """One container start, everything resolved: what a runtime needs and nothing more."""

    pod: str
    container: str
    argv: list[str]
    env: dict[str, str]
    mounts: list[BindMount]
    working_dir: str
    log_path: Path
    incarnation: int = 1  # the pod's: which of its sandboxes the container runs in


class RunningContainer(Protocol):
    """One run of one container."""

    started: float  # time.monotonic() at start

    def poll(self) -> int | None:
        """The exit code as Kubernetes reports it (128 + N after signal N), or None."""

    def terminate(self) -> None:
        """SIGTERM to the entrypoint only, as the kubelet does."""

    def kill(self) -> None:
        """SIGKILL every process of the container."""

    def freeze(self) -> None:
        """Stop every process of the container where it is (its node froze)."""

    def thaw(self) -> None:
        """Let every process of the container go on (its node is back)."""

    def wait(self, timeout: float) -> int | None:
        """poll(), waiting up to `timeout` seconds."""


class ContainerRuntime(Protocol):
    @property
    def isolated(self) -> bool:
        """Whether pods have sandboxes of their own (else they share the host's network)."""

    @property
    def host_ip(self) -> str:
        """The address the host has on the pods' network (the API server listens there)."""

    def run_sandbox(self, pod: str, incarnation: int) -> str:
        """Make the pod's sandbox (network namespace, eth0); returns the pod's IP."""

    def remove_sandbox(self, pod: str, incarnation: int) -> None:
        """Remove the pod's sandbox; a pod without one is left alone."""

    def set_link(self, pod: str, incarnation: int, up: bool) -> None:
        """The sandbox's network link up or down (its node is cut off, or back)."""

    def publish_dns(self, pods: list[PodRecord], table: Mapping[str, list[str]]) -> None:
        """The cluster DNS changed: every sandbox resolves `table` from now on."""

    def start(self, spec: ContainerSpec, on_line: LineSink) -> RunningContainer:
        """Start a container in its pod's sandbox."""
