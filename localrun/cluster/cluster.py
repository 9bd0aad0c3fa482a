"""The mini-cluster: one controller per concern, run in turn by `reconcile`.

    StatefulSet controller  statefulset.py  pods at each set's replicas, recreation
    admission               tolerations     the default not-ready/unreachable tolerations
    scheduler               scheduler.py    a node for each pending pod
    kubelet                 kubelet.py      sandboxes, containers, back-off, deletion; a
                                            node's kubelet stopped and back
    node lifecycle          nodelifecycle   NotReady, taints, taint eviction, pod GC
    DNS                     dns.py          names of pods and Services, to the runtime

It knows Kubernetes, not any chart: what a pod runs comes from the rendered objects, and
how it runs from the injected container runtime.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

from localrun.cluster.dns import PodRecord, ServiceRecord, dns_table
from localrun.cluster.kubelet import Kubelet, KubeletConfig, PodEvents
from localrun.cluster.nodelifecycle import NodeLifecycle, NodeTimings
from localrun.cluster.pod import NODE_SHUTDOWN, Disruption, Phase, Pod
from localrun.cluster.runtime import ContainerRuntime
from localrun.cluster.scheduler import choose_node
from localrun.cluster.statefulset import StatefulSet, StatefulSetController
from localrun.cluster.tolerations import admitted_tolerations
from localrun.cluster.volumes import VolumeSources

Obj = dict[str, Any]


class Cluster:
    def __init__(
        self,
        *,
        statefulsets: list[Obj],
        services: list[Obj],
        nodes: Mapping[str, Obj],
        runtime: ContainerRuntime,
        kubelet: KubeletConfig,
        sources: VolumeSources,
        events: PodEvents,
        namespace: str = "default",
        domain: str = "cluster.local",
        timings: NodeTimings | None = None,
        now: float = 0.0,
    ) -> None:
        self.services = services
        #: The Node objects as the control plane has them (conditions, taints): its own copy.
        self.nodes: dict[str, Obj] = copy.deepcopy(dict(nodes))
        self.runtime = runtime
        self.namespace = namespace
        self.domain = domain
        self.events = events
        self.timings = timings or NodeTimings()
        self.kubelet = Kubelet(kubelet, runtime, sources, self.nodes, events)
        self.statefulsets = StatefulSetController(
            statefulsets, delete=self.kubelet.delete, event=events.event, admit=self._admit
        )
        self.node_lifecycle = NodeLifecycle(self.nodes, self.timings, events.event, now)
        self._dns_dirty = True

    def _admit(self, pod: Pod) -> None:
        """Admission at the pod's creation: DefaultTolerationSeconds."""
        tolerations = pod.sts.pod_spec.get("tolerations") or []
        pod.tolerations = admitted_tolerations(tolerations, self.timings)

    # -- queries -------------------------------------------------------------------------

    @property
    def sets(self) -> dict[str, StatefulSet]:
        return self.statefulsets.sets

    def pods(self) -> list[Pod]:
        return self.statefulsets.pods()

    def pod(self, name: str) -> Pod | None:
        return next((p for p in self.pods() if p.name == name), None)

    def everything(self) -> list[Pod]:
        """The pods the API has and those its kubelets still run that it does not."""
        return [*self.pods(), *self.kubelet.orphans]

    def node_down(self, node: str) -> bool:
        """Whether the node's kubelet is stopped."""
        return node in self.kubelet.stopped

    def owner(self, pod_name: str) -> StatefulSet | None:
        """The StatefulSet that makes a pod of this name, whether it exists now or not."""
        return next((s for s in self.sets.values() if s.owns(pod_name)), None)

    # -- what a user or a fault asks -----------------------------------------------------

    def scale(self, name: str, replicas: int) -> None:
        self.statefulsets.scale(name, replicas)

    def delete(
        self,
        pod: Pod,
        now: float,
        down: float = 0.0,
        why: tuple[str, str] | None = NODE_SHUTDOWN,
        grace: float | None = None,
    ) -> None:
        """A pod deleted from outside (the local run's faults: a reclaimed node; the API's
        DELETE; taint eviction); the StatefulSet recreates it once it is gone, not before
        `down` seconds. `why` is its DisruptionTarget condition (reason, message; None: a
        plain DELETE sets none); `grace` the deletion's grace period (None: the pod's
        terminationGracePeriodSeconds; 0: `force_delete`)."""
        if grace == 0:
            self.force_delete(pod, now, why)
            return
        if not pod.deleting and why is not None:
            pod.disruption = Disruption(why[0], why[1], time.time())
        if down and not pod.deleting:
            self.statefulsets.recreate_after(pod, now + down)
        self.kubelet.delete(pod, now, grace)

    def force_delete(self, pod: Pod, now: float, why: tuple[str, str] | None) -> None:
        """Grace 0 (`kubectl delete pod --force --grace-period=0`, pod GC): the pod is gone
        from the API at once, so its StatefulSet makes it again; whatever of it still runs
        is its kubelet's to stop, now or when its node is back."""
        if pod.sts.pods.get(pod.ordinal) is not pod:
            return  # gone from the API already
        if pod.disruption is None and why is not None:
            pod.disruption = Disruption(why[0], why[1], time.time())
        del pod.sts.pods[pod.ordinal]
        by = f" ({why[0]})" if why is not None else ""
        self.events.event(f"{pod.name}: force-deleted{by} on {pod.node or 'no node'}")
        if pod.proc is None and self.kubelet.active(pod.node, now):
            self.kubelet.remove(pod)  # nothing runs: nothing to wait for
        else:
            self.kubelet.orphan(pod, now)
        self._dns_dirty = True

    def kill(self, pod: Pod, now: float, down: float = 0.0) -> None:
        self.kubelet.kill(pod, now, down)

    # -- what happens to nodes ---------------------------------------------------------------

    def stop_node(self, node: str, now: float) -> None:
        """The node's kubelet stops (frozen, or cut off): its pods freeze and lose the
        network; the control plane notices after its grace period."""
        if node in self.kubelet.stopped or node not in self.nodes:
            return
        self.kubelet.stop_node(node, self.everything())
        self.node_lifecycle.kubelet_stopped(node, now)

    def start_node(self, node: str, now: float) -> None:
        """The node is back (its VM thawed, its link restored)."""
        if node not in self.kubelet.stopped or node not in self.nodes:
            return
        self.node_lifecycle.kubelet_started(node, now)
        self.kubelet.start_node(node, self.everything(), now)

    def delete_node(self, node: str, now: float) -> None:
        """The Node object is deleted (its instance is gone for good)."""
        self.stop_node(node, now)
        self.node_lifecycle.delete_node(node, now)

    def taint_node(self, node: str, key: str, effect: str) -> None:
        self.node_lifecycle.set_taint(node, key, effect)

    # -- the loop ------------------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        for d in self.node_lifecycle.reconcile(now, self.pods()):
            if d.force:
                self.force_delete(d.pod, now, d.why)
            else:
                self.delete(d.pod, now, why=d.why)
        if self.statefulsets.reconcile(now):
            self._dns_dirty = True
        for pod in list(self.kubelet.orphans):
            if self.kubelet.sync(pod, now):
                self.kubelet.orphans.remove(pod)
        for pod in self.pods():
            unplaced = pod.phase == Phase.PENDING and not pod.node and not pod.deleting
            if unplaced and now >= pod.down_until and self._schedule(pod):
                self._publish_dns()  # the pod's names resolve before its first container starts
            if self.kubelet.sync(pod, now):
                if pod.sts.pods.get(pod.ordinal) is pod:
                    del pod.sts.pods[pod.ordinal]
                self._dns_dirty = True
        if self._dns_dirty:
            self._publish_dns()

    def _schedule(self, pod: Pod) -> bool:
        placed: dict[str, list[Obj]] = {}
        for p in self.pods():  # the scheduler knows the API's pods, not a kubelet's orphans
            if p.node and p is not pod:
                placed.setdefault(p.node, []).append(p.sts.pod_spec)
        node, why = choose_node(pod.sts.pod_spec, self.nodes, placed)
        if node is None:
            if pod.message != why:
                self.events.event(f"{pod.name}: unschedulable: {why}")
            pod.message = why
            return False
        self.kubelet.placed(pod, node)
        return True

    def stop(self, grace: float = 5.0) -> dict[str, int | None]:
        """Stop and remove every pod; the exit code of each main container that ran."""
        pods = self.pods()
        codes = self.kubelet.stop([*pods, *self.kubelet.orphans], grace)
        for p in pods:
            p.sts.pods.pop(p.ordinal, None)
        self.kubelet.orphans.clear()
        return codes

    # -- DNS -----------------------------------------------------------------------------

    def dns_table(self) -> dict[str, list[str]]:
        return dns_table(self._pod_records(), self._service_records(), self.domain)

    def _pod_records(self) -> list[PodRecord]:
        return [
            PodRecord(p.name, p.sts.namespace, p.ip, p.sts.service_name)
            for p in self.pods()
            if p.ip and p.phase != Phase.GONE
        ]

    def _service_records(self) -> list[ServiceRecord]:
        out = []
        for svc in self.services:
            sel = (svc.get("spec") or {}).get("selector") or {}
            if not sel:
                continue
            names = [
                p.name
                for p in self.pods()
                if p.ip
                and all(
                    {**p.sts.labels, "statefulset.kubernetes.io/pod-name": p.name}.get(k) == v
                    for k, v in sel.items()
                )
            ]
            out.append(
                ServiceRecord(
                    svc["metadata"]["name"],
                    svc["metadata"].get("namespace", self.namespace),
                    (svc.get("spec") or {}).get("clusterIP") == "None",
                    tuple(names),
                )
            )
        return out

    def _publish_dns(self) -> None:
        self.runtime.publish_dns(self._pod_records(), self.dns_table())
        self._dns_dirty = False
