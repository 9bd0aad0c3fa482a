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
    NODE_DOWN = "node-down"  # the node's kubelet stops: its pods frozen and cut off
    DELETE_NODE = "delete-node"  # the Node object deleted (its instance gone for good)
    OUT_OF_SERVICE = "out-of-service"  # an admin's node.kubernetes.io/out-of-service taint


#: A target naming the pod at a group rank of the current round when the fault fires
#: (`rank:1`): a pod that trains, whichever it is.
RANK = "rank:"
#: Kinds that name a pod.
POD_FAULTS = (FaultKind.KILL, FaultKind.PREEMPT, FaultKind.PARTITION)
#: Kinds that name a node.
NODE_FAULTS = (FaultKind.NODE_DOWN, FaultKind.DELETE_NODE, FaultKind.OUT_OF_SERVICE)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at: float = 0.0  # seconds after the run started
    target: str = ""  # pod name, or worker group / StatefulSet name for SCALE
    duration: float | None = None  # KILL/PREEMPT: down time; PARTITION: None keeps it down
    replicas: int | None = None  # SCALE only
    at_step: int | None = None  # fire when training reaches this step instead (`@step=N`)
    #: fire when a training step runs at this world size instead (`@world=N`): a fault
    #: that needs the one before it to have taken effect, whatever the machine's speed
    at_world: int | None = None
    #: Node faults: the node of this pod when it fires (`pod:NAME`, or `rank:N`); else
    #: target is the node.
    node_of: str = ""

    def when(self) -> str:
        if self.at_step is not None:
            return f"step {self.at_step}"
        if self.at_world is not None:
            return f"world size {self.at_world}"
        return f"{self.at:g}s"

    def due(self, elapsed: float, step: int | None, world: int | None = None) -> bool:
        """`step`: the highest training step seen; `world`: the last step's world size."""
        if self.at_step is not None:
            return step is not None and step >= self.at_step
        if self.at_world is not None:
            return world == self.at_world
        return elapsed >= self.at

    def describe(self) -> str:
        if self.kind is FaultKind.SCALE:
            return f"scale {self.target}={self.replicas}"
        if self.kind is FaultKind.RESTART_RENDEZVOUS:
            return "restart-rendezvous"
        if self.kind is FaultKind.PARTITION and self.duration is not None:
            return f"partition {self.target} for {self.duration:g}s"
        target = f"pod:{self.node_of}" if self.node_of else self.target
        if self.kind is FaultKind.NODE_DOWN and self.duration is not None:
            return f"node-down {target} for {self.duration:g}s"
        return f"{self.kind.value} {target}"


def schedule(faults: list[Fault]) -> list[Fault]:
    """Faults in the order they fire (stable for equal times); step- and world-triggered
    ones last."""
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
        rank: Callable[[int], str | None] = lambda n: None,
    ) -> None:
        self.pending = schedule(faults)
        self.cluster = cluster
        self.network = network
        self.event = event
        self.scale = scale  # (namespace, name, replicas) through the API server; False: failed
        self.rank = rank  # the pod at group rank N of the current round (`rank:N` targets)
        self.partitions: list[tuple[float, str]] = []  # (link up at, pod)
        self.node_returns: list[tuple[float, str]] = []  # (back at, node)

    def unknown_pods(self) -> list[str]:
        """Pods named by a fault that no StatefulSet makes (`rank:N` names none)."""
        named = [f.target for f in self.pending if f.kind in POD_FAULTS]
        named += [f.node_of for f in self.pending if f.node_of]
        return [
            name for name in named if not name.startswith(RANK) and self.cluster.owner(name) is None
        ]

    def unknown_nodes(self) -> list[str]:
        """Nodes named by a fault that the profile does not have."""
        return [
            f.target
            for f in self.pending
            if f.kind in NODE_FAULTS and not f.node_of and f.target not in self.cluster.nodes
        ]

    def due(
        self, now: float, elapsed: float, step: int | None, world: int | None = None
    ) -> list[Fault]:
        fired = [f for f in self.pending if f.due(elapsed, step, world)]
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

    def nodes_back(self, now: float) -> list[str]:
        """Nodes whose time down ended now (their kubelet and pods go on)."""
        out = []
        for back_at, node in list(self.node_returns):
            if now >= back_at:
                self.node_returns.remove((back_at, node))
                self.cluster.start_node(node, now)
                out.append(node)
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
        elif f.kind in NODE_FAULTS:
            self._node_fault(f, now)
        else:
            self._pod_fault(f, now)

    def _node_fault(self, f: Fault, now: float) -> None:
        node = f.target
        if f.node_of:
            pod = self._find_pod(f.node_of)
            node = pod.node if pod is not None else ""
            if not node:
                self.event(f"fault {f.describe()}: pod {f.node_of!r} is on no node now")
                return
        if node not in self.cluster.nodes:
            self.event(f"fault {f.describe()}: no node {node!r} (deleted, or not in the profile)")
            return
        if f.kind is FaultKind.NODE_DOWN:
            self.cluster.stop_node(node, now)
            if f.duration is not None:
                self.node_returns.append((now + f.duration, node))
        elif f.kind is FaultKind.DELETE_NODE:
            self.cluster.delete_node(node, now)
        elif f.kind is FaultKind.OUT_OF_SERVICE:
            # What Kubernetes' docs tell an administrator to add to a node that is shut
            # down for good (NodeOutOfServiceVolumeDetach, GA in 1.28).
            self.cluster.taint_node(node, "node.kubernetes.io/out-of-service", "NoExecute")

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
        if self.cluster.node_down(pod.node):
            self.event(f"fault {f.describe()}: {pod.name}'s node {pod.node} is down")
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
        if name.startswith(RANK):
            who = self.rank(int(name[len(RANK) :]))
            if who is None:
                return None
            name = who
        pod = self.cluster.pod(name)
        if pod is not None:
            return pod
        cands = [p for p in self.cluster.pods() if p.name.endswith("-" + name)]
        return cands[0] if len(cands) == 1 else None
