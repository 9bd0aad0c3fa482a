"""An in-memory container runtime for the mini-cluster's tests: containers are objects the
test ends by setting `rc`; no root, no processes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localrun.cluster.cluster import Cluster
from localrun.cluster.dns import PodRecord
from localrun.cluster.kubelet import KubeletConfig, PodEvents
from localrun.cluster.nodelifecycle import NodeTimings
from localrun.cluster.pod import Pod
from localrun.cluster.podspec import Container
from localrun.cluster.runtime import ContainerSpec, LineSink
from localrun.cluster.volumes import VolumeSources


class FakeContainer:
    def __init__(self, spec: ContainerSpec, started: float) -> None:
        self.spec = spec
        self.started = started
        self.rc: int | None = None
        self.signals: list[str] = []
        self.exit_on_term: int | None = 0  # None: ignores SIGTERM
        self.frozen = False

    def poll(self) -> int | None:
        return self.rc

    def terminate(self) -> None:
        self.signals.append("TERM")
        if self.exit_on_term is not None and not self.frozen:
            self.rc = self.exit_on_term

    def freeze(self) -> None:
        self.signals.append("STOP")
        self.frozen = True

    def thaw(self) -> None:
        self.signals.append("CONT")
        self.frozen = False

    def kill(self) -> None:
        self.signals.append("KILL")
        self.rc = 137

    def wait(self, timeout: float) -> int | None:
        return self.rc


class FakeRuntime:
    isolated = True
    host_ip = "10.0.0.1"

    def __init__(self) -> None:
        self.now = 0.0
        self.sandboxes: dict[str, int] = {}  # pod -> its newest sandbox's incarnation
        self.links: dict[tuple[str, int], bool] = {}  # (pod, incarnation) -> link up
        self.containers: list[FakeContainer] = []
        self.hosts: dict[str, dict[str, list[str]]] = {}
        self._next = 10

    def run_sandbox(self, pod: str, incarnation: int) -> str:
        self.sandboxes[pod] = incarnation
        self.links[(pod, incarnation)] = True
        self._next += 1
        return f"10.0.0.{self._next}"

    def remove_sandbox(self, pod: str, incarnation: int) -> None:
        if self.sandboxes.get(pod) == incarnation:
            del self.sandboxes[pod]
        self.links.pop((pod, incarnation), None)

    def set_link(self, pod: str, incarnation: int, up: bool) -> None:
        self.links[(pod, incarnation)] = up

    def publish_dns(self, pods: list[PodRecord], table: Mapping[str, list[str]]) -> None:
        for rec in pods:
            self.hosts[rec.name] = dict(table)

    def start(self, spec: ContainerSpec, on_line: LineSink) -> FakeContainer:
        c = FakeContainer(spec, self.now)
        self.containers.append(c)
        return c

    def running(self, pod: str, container: str) -> FakeContainer:
        return next(
            c
            for c in reversed(self.containers)
            if c.spec.pod == pod and c.spec.container == container and c.rc is None
        )


def statefulset(
    replicas: int = 2,
    grace: int = 5,
    name: str = "w",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "replicas": replicas,
            "serviceName": "w-headless",
            "template": {
                "metadata": {"labels": {"app": "w", **(labels or {})}},
                "spec": {
                    "terminationGracePeriodSeconds": grace,
                    "initContainers": [{"name": "init", "command": ["true"]}],
                    "containers": [
                        {"name": "main", "command": ["train", "$(POD_NAME)"], "env": env}
                    ],
                    **spec,
                },
            },
        },
    }


NODES = {
    "n0": {"metadata": {"name": "n0", "labels": {}}, "status": {"allocatable": {"cpu": "4"}}},
    "n1": {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"cpu": "4"}}},
}
SERVICE = {
    "metadata": {"name": "w-headless", "namespace": "ns"},
    "spec": {"clusterIP": "None", "selector": {"app": "w"}},
}


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        *sts: dict[str, Any],
        nodes: dict[str, Any] = NODES,
        timings: NodeTimings | None = None,
    ):
        self.runtime = FakeRuntime()
        self.events: list[str] = []
        self.exits: list[tuple[str, str, int]] = []
        self.cluster = Cluster(
            statefulsets=list(sts),
            services=[SERVICE],
            nodes=nodes,
            runtime=self.runtime,
            kubelet=KubeletConfig(
                workdir=tmp_path,
                logdir=tmp_path / "logs",
                base_env={"PATH": "/bin"},
                backoff_base=2,
                backoff_cap=8,
            ),
            sources=VolumeSources(tmp_path, {}, {}, {}, None),
            events=PodEvents(
                event=self.events.append,
                line=lambda *a: None,
                container_started=lambda pod, c: None,
                container_exited=self._exited,
            ),
            namespace="ns",
            timings=timings,
        )

    def _exited(self, pod: Pod, c: Container, rc: int, now: float) -> None:
        self.exits.append((pod.name, c.name, rc))

    def tick(self, t: float) -> None:
        self.runtime.now = t
        self.cluster.reconcile(t)

    def pod(self, name: str) -> Pod:
        pod = self.cluster.pod(name)
        assert pod is not None, f"{name} does not exist"
        return pod
