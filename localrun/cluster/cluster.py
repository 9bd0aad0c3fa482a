"""The mini-cluster: one controller per concern, run in turn by `reconcile`.

    StatefulSet controller  statefulset.py  pods at each set's replicas, recreation
    scheduler               scheduler.py    a node for each pending pod
    kubelet                 kubelet.py      sandboxes, containers, back-off, deletion
    DNS                     dns.py          names of pods and Services, to the runtime

It knows Kubernetes, not any chart: what a pod runs comes from the rendered objects, and
how it runs from the injected container runtime.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from localrun.cluster.dns import PodRecord, ServiceRecord, dns_table
from localrun.cluster.kubelet import Kubelet, KubeletConfig, PodEvents
from localrun.cluster.pod import NODE_SHUTDOWN, Disruption, Phase, Pod
from localrun.cluster.runtime import ContainerRuntime
from localrun.cluster.scheduler import choose_node
from localrun.cluster.statefulset import StatefulSet, StatefulSetController
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
    ) -> None:
        self.services = services
        self.nodes = nodes
        self.runtime = runtime
        self.namespace = namespace
        self.domain = domain
        self.events = events
        self.kubelet = Kubelet(kubelet, runtime, sources, nodes, events)
        self.statefulsets = StatefulSetController(
            statefulsets, delete=self.kubelet.delete, event=events.event
        )
        self._dns_dirty = True

    # -- queries -------------------------------------------------------------------------

    @property
    def sets(self) -> dict[str, StatefulSet]:
        return self.statefulsets.sets

    def pods(self) -> list[Pod]:
        return self.statefulsets.pods()

    def pod(self, name: str) -> Pod | None:
        return next((p for p in self.pods() if p.name == name), None)

    def owner(self, pod_name: str) -> StatefulSet | None:
        """The StatefulSet that makes a pod of this name, whether it exists now or not."""
        return next((s for s in self.sets.values() if s.owns(pod_name)), None)

    # -- what a user or a fault asks -----------------------------------------------------

    def scale(self, name: str, replicas: int) -> None:
        self.statefulsets.scale(name, replicas)

    def delete(
        self, pod: Pod, now: float, down: float = 0.0, why: tuple[str, str] = NODE_SHUTDOWN
    ) -> None:
        """A pod deleted from outside (the local run's faults: a reclaimed node); the
        StatefulSet recreates it, not before `down` seconds. `why` is its DisruptionTarget
        condition (reason, message)."""
        if not pod.deleting:
            pod.disruption = Disruption(why[0], why[1], time.time())
        if down and not pod.deleting:
            self.statefulsets.recreate_after(pod, now + down)
        self.kubelet.delete(pod, now)

    def kill(self, pod: Pod, now: float, down: float = 0.0) -> None:
        self.kubelet.kill(pod, now, down)

    # -- the loop ------------------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        if self.statefulsets.reconcile(now):
            self._dns_dirty = True
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
        for p in self.pods():
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
        codes = self.kubelet.stop(pods, grace)
        for p in pods:
            p.sts.pods.pop(p.ordinal, None)
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
