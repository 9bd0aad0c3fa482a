"""The StatefulSet controller, Parallel pod management: every missing ordinal is created at
once, extra ones are deleted at once (highest first), replicas can change while running,
and a deleted pod comes back with the same name (a new incarnation, after `down` seconds
when a fault asked for it, as while a reclaimed node is replaced)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from localrun.cluster import podspec
from localrun.cluster.pod import Pod
from localrun.cluster.podspec import Container

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class StatefulSet:
    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        meta = obj["metadata"]
        spec = obj["spec"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        self.replicas: int = int(spec.get("replicas", 1))
        self.service_name: str = spec.get("serviceName", "")
        self.template: Obj = spec["template"]
        self.pod_spec: Obj = self.template["spec"]
        self.labels: dict[str, str] = dict(self.template.get("metadata", {}).get("labels") or {})
        self.annotations: dict[str, str] = dict(
            self.template.get("metadata", {}).get("annotations") or {}
        )
        self.init_containers = [
            Container.from_obj(c) for c in self.pod_spec.get("initContainers") or []
        ]
        self.containers = [Container.from_obj(c) for c in self.pod_spec.get("containers") or []]
        if len(self.containers) > 1:
            log.warning(
                "StatefulSet %s has %d containers; the runner runs the first (%s)",
                self.name,
                len(self.containers),
                self.containers[0].name,
            )
        self.volumes = podspec.parse_volumes(self.pod_spec, spec.get("volumeClaimTemplates") or [])
        self.grace = podspec.grace_period(self.pod_spec)
        self.pods: dict[int, Pod] = {}
        self.incarnations: dict[int, int] = {}

    def owns(self, pod_name: str) -> bool:
        """Whether `pod_name` is one this StatefulSet makes (`<name>-<ordinal>`)."""
        prefix = self.name + "-"
        return pod_name.startswith(prefix) and pod_name[len(prefix) :].isdigit()


class StatefulSetController:
    """Keeps each StatefulSet's pods at its replicas."""

    def __init__(
        self,
        statefulsets: Iterable[Obj],
        *,
        delete: Callable[[Pod, float], None],
        event: Callable[[str], None],
        admit: Callable[[Pod], None] = lambda pod: None,
    ) -> None:
        self.sets = {s["metadata"]["name"]: StatefulSet(s) for s in statefulsets}
        self._delete = delete
        self._event = event
        self._admit = admit  # what admission does to a pod at its creation
        self._down: dict[str, float] = {}  # pod name -> no recreation before this time

    def pods(self) -> list[Pod]:
        return [p for s in self.sets.values() for _, p in sorted(s.pods.items())]

    def scale(self, name: str, replicas: int) -> None:
        sts = self.sets.get(name)
        if sts is None or sts.replicas == replicas:
            return
        self._event(f"statefulset {name}: replicas {sts.replicas} -> {replicas}")
        sts.replicas = replicas

    def recreate_after(self, pod: Pod, until: float) -> None:
        """The next incarnation of `pod` waits until `until` for a node."""
        self._down[pod.name] = until

    def reconcile(self, now: float) -> bool:
        """Create missing ordinals, delete extra ones; True when a pod was created."""
        created = False
        for sts in self.sets.values():
            for ordinal in range(sts.replicas):
                if ordinal not in sts.pods:
                    inc = sts.incarnations.get(ordinal, 0) + 1
                    sts.incarnations[ordinal] = inc
                    pod = Pod(f"{sts.name}-{ordinal}", sts, ordinal, inc)
                    if inc > 1:
                        pod.down_until = self._down.pop(pod.name, 0.0)
                    self._admit(pod)
                    sts.pods[ordinal] = pod
                    created = True
            for ordinal in sorted(sts.pods, reverse=True):
                pod = sts.pods[ordinal]
                if ordinal >= sts.replicas and not pod.deleting:
                    self._delete(pod, now)
        return created
