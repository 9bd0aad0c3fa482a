"""Faults on demand: what each kind is, when it fires, and what it does to the cluster
and the host. The command line that makes them is cli.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from localrun import chart
from localrun.cluster.cluster import Cluster
from localrun.cluster.pod import Pod
from localrun.host.network import Network

log = logging.getLogger(__name__)


class FaultKind(str, Enum):
    KILL = "kill"  # SIGKILL every process of the pod's running container
    PREEMPT = "preempt"  # delete the pod: SIGTERM, SIGKILL after the grace period
    PARTITION = "partition"  # pod link down (for DURATION seconds, or until the end)
    SCALE = "scale"  # set a worker StatefulSet's replicas
    RESTART_RENDEZVOUS = "restart-rendezvous"  # delete the etcd pod; the StatefulSet recreates it


#: Kinds that name a pod.
POD_FAULTS = (FaultKind.KILL, FaultKind.PREEMPT, FaultKind.PARTITION)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at: float  # seconds after the run started
    target: str = ""  # pod name, or worker group / StatefulSet name for SCALE
    duration: float | None = None  # KILL/PREEMPT: down time; PARTITION: None keeps it down
    replicas: int | None = None  # SCALE only
    at_step: int | None = None  # fire when training reaches this step instead (`@step=N`)

    def when(self) -> str:
        return f"step {self.at_step}" if self.at_step is not None else f"{self.at:g}s"

    def due(self, elapsed: float, step: int | None) -> bool:
        if self.at_step is not None:
            return step is not None and step >= self.at_step
        return elapsed >= self.at

    def describe(self) -> str:
        if self.kind is FaultKind.SCALE:
            return f"scale {self.target}={self.replicas}"
        if self.kind is FaultKind.RESTART_RENDEZVOUS:
            return "restart-rendezvous"
        if self.kind is FaultKind.PARTITION and self.duration is not None:
            return f"partition {self.target} for {self.duration:g}s"
        return f"{self.kind.value} {self.target}"


def schedule(faults: list[Fault]) -> list[Fault]:
    """Faults in the order they fire (stable for equal times); step-triggered ones last."""
    return sorted(faults, key=lambda f: (f.at_step is not None, f.at_step or 0, f.at))


class Injector:
    """Fires the faults of a run when they are due, and heals timed partitions."""

    def __init__(
        self,
        faults: list[Fault],
        cluster: Cluster,
        network: Network,
        *,
        event: Callable[[str], None],
        scale: Callable[[str, str, int], bool],
    ) -> None:
        self.pending = schedule(faults)
        self.cluster = cluster
        self.network = network
        self.event = event
        self.scale = scale  # (namespace, name, replicas) through the API server; False: failed
        self.partitions: list[tuple[float, str]] = []  # (link up at, pod)

    def unknown_pods(self) -> list[str]:
        """Pods named by a fault that no StatefulSet makes."""
        return [
            f.target
            for f in self.pending
            if f.kind in POD_FAULTS and self.cluster.owner(f.target) is None
        ]

    def due(self, now: float, elapsed: float, step: int | None) -> list[Fault]:
        fired = [f for f in self.pending if f.due(elapsed, step)]
        for f in fired:
            self.pending.remove(f)
            self.fire(f, now)
        return fired

    def healed(self, now: float) -> list[str]:
        """Pods whose partition ended now (their link is up again)."""
        out = []
        for heal_at, pod in list(self.partitions):
            if now >= heal_at:
                self.partitions.remove((heal_at, pod))
                self.network.set_link(pod, True)
                self.event(f"{pod}: link up (partition over)")
                out.append(pod)
        return out

    def fire(self, f: Fault, now: float) -> None:
        desc = f.describe()
        self.event(f"FAULT {desc} (at {f.when()})")
        if f.kind is FaultKind.SCALE:
            self._scale(f)
        elif f.kind is FaultKind.RESTART_RENDEZVOUS:
            targets = [p for p in self.cluster.pods() if chart.is_rendezvous(p.labels)]
            if not targets:
                self.event("fault restart-rendezvous: no rendezvous pod")
            for p in targets:
                self.cluster.delete(p, now)
        else:
            self._pod_fault(f, now)

    def _scale(self, f: Fault) -> None:
        sets = [(s.name, s.labels) for s in self.cluster.sets.values()]
        name = chart.find_statefulset(sets, f.target)
        if name is None:
            self.event(f"fault {f.describe()}: no StatefulSet or worker group named {f.target!r}")
            return
        assert f.replicas is not None
        if not self.scale(self.cluster.sets[name].namespace, name, f.replicas):
            self.cluster.scale(name, f.replicas)

    def _pod_fault(self, f: Fault, now: float) -> None:
        pod = self._find_pod(f.target)
        if pod is None:
            self.event(f"fault {f.describe()}: no pod {f.target!r} exists now")
            return
        if f.kind is FaultKind.KILL:
            self.cluster.kill(pod, now, down=f.duration or 0.0)
        elif f.kind is FaultKind.PREEMPT:
            self.cluster.delete(pod, now, down=f.duration or 0.0)
        elif f.kind is FaultKind.PARTITION:
            self.network.set_link(pod.name, False)
            self.event(f"{pod.name}: link down")
            if f.duration is not None:
                self.partitions.append((now + f.duration, pod.name))

    def _find_pod(self, name: str) -> Pod | None:
        pod = self.cluster.pod(name)
        if pod is not None:
            return pod
        cands = [p for p in self.cluster.pods() if p.name.endswith("-" + name)]
        return cands[0] if len(cands) == 1 else None
