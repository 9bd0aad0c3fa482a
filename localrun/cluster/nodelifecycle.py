"""A node's life as the control plane sees it: kube-controller-manager's node lifecycle,
taint eviction and pod GC controllers, and kube-apiserver's DefaultTolerationSeconds
admission, as data (the Node objects, their conditions and taints) and one controller.

    a node's kubelet      posts Ready while it runs; stopped (`--node-down`) it posts
                          nothing: the node lifecycle controller notices
    node lifecycle        no heartbeat for node-monitor-grace-period (50 s since Kubernetes
                          1.32, 40 s before): Ready, MemoryPressure, DiskPressure and
                          PIDPressure Unknown (NodeStatusUnknown, "Kubelet stopped posting
                          node status."), taints node.kubernetes.io/unreachable NoSchedule
                          and NoExecute; a kubelet that posts Ready=False: not-ready. Its
                          pods' Ready condition False (MarkPodsNotReady; their containers'
                          statuses stay as the kubelet last posted them)
    taint eviction        a pod on a node with a NoExecute taint it does not tolerate is
                          deleted at once; one it tolerates for N s, N s after the taint
                          was added (DisruptionTarget DeletionByTaintManager; the rule in
                          tolerations.py). Deleted means a deletionTimestamp: the pod is
                          Terminating until its kubelet confirms, so on a node that is
                          down it stays so
    DefaultTolerationSeconds   a pod created without a toleration of not-ready or
                          unreachable NoExecute gets one of 300 s (admission, at creation:
                          tolerations.py)
    pod GC                every 20 s: pods bound to a Node that has been gone for 40 s
                          (its quarantine) are force-deleted (DeletionByPodGC); Terminating
                          pods on a node that is not Ready and carries the
                          node.kubernetes.io/out-of-service taint are force-deleted

The StatefulSet controller makes a pod again only once the old one is gone from the API:
after its kubelet confirmed (node back), a force delete (grace 0: `kubectl delete pod
--force --grace-period=0`, pod GC) or, with the node deleted, pod GC.

Source: kubernetes/kubernetes pkg/controller/nodelifecycle (node_lifecycle_controller.go),
pkg/controller/tainteviction, pkg/controller/podgc (gc_controller.go),
plugin/pkg/admission/defaulttolerationseconds. The lease is not modelled: a kubelet that
runs posts its status continuously, so NotReady comes one grace period after it stopped
(in a cluster, up to one lease renewal, 10 s, sooner).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from localrun.cluster.tolerations import NOT_READY, UNREACHABLE, eviction_delay

Obj = dict[str, Any]

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
#: The conditions a silent kubelet's node gets as Unknown (NetworkUnavailable is the
#: control plane's own and is left alone, as upstream does).
KUBELET_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
#: Why each deletion by the control plane happens (the pod's DisruptionTarget condition).
TAINT_EVICTION = ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
POD_GC_NODE_GONE = ("DeletionByPodGC", "PodGC: node no longer exists")
POD_GC_OUT_OF_SERVICE = ("DeletionByPodGC", "PodGC: node is out of service")
KUBELET_READY = ("KubeletReady", "kubelet is posting ready status")
KUBELET_NOT_READY = ("KubeletNotReady", "container runtime is down")
STATUS_UNKNOWN = ("NodeStatusUnknown", "Kubelet stopped posting node status.")
#: The pressure conditions a healthy kubelet posts (type, reason, message).
HEALTHY_PRESSURE = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
)


@dataclass(frozen=True)
class NodeTimings:
    """The control plane's durations (seconds), shortened for tests by the command line."""

    monitor_period: float = 5.0  # kube-controller-manager --node-monitor-period
    grace_period: float = 50.0  # --node-monitor-grace-period (40 s before Kubernetes 1.32)
    not_ready_toleration: int = 300  # kube-apiserver --default-not-ready-toleration-seconds
    unreachable_toleration: int = 300  # --default-unreachable-toleration-seconds
    pod_gc_period: float = 20.0  # pod GC's loop (gcCheckPeriod)
    pod_gc_quarantine: float = 40.0  # how long a Node must be gone before its pods go


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the Node object ------------------------------------------------------------------------


def condition(node: Obj, kind: str) -> Obj | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def ready_status(node: Obj) -> str:
    """ "True", "False" or "Unknown" (no Ready condition: Unknown, as upstream treats it)."""
    c = condition(node, "Ready")
    return str(c.get("status", "Unknown")) if c else "Unknown"


def taints(node: Obj) -> list[Obj]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or []]


def _set_condition(node: Obj, kind: str, status: str, why: tuple[str, str], at: float) -> None:
    """Set one condition (`why`: reason, message); its transition time when it changes."""
    reason, message = why
    conditions = node.setdefault("status", {}).setdefault("conditions", [])
    for c in conditions:
        if c.get("type") == kind:
            if c.get("status") != status:
                c["lastTransitionTime"] = rfc3339(at)
            c.update(status=status, reason=reason, message=message)
            return
    conditions.append(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": rfc3339(at),
            "lastTransitionTime": rfc3339(at),
        }
    )


def _heartbeat(node: Obj, at: float) -> None:
    for c in (node.get("status") or {}).get("conditions") or []:
        c["lastHeartbeatTime"] = rfc3339(at)


def _add_taint(node: Obj, key: str, effect: str, at: float) -> bool:
    spec = node.setdefault("spec", {})
    have = spec.setdefault("taints", [])
    if any(t.get("key") == key and t.get("effect") == effect for t in have):
        return False
    taint: Obj = {"key": key, "effect": effect}
    if effect == "NoExecute":
        taint["timeAdded"] = rfc3339(at)  # set by the controller for NoExecute taints
    have.append(taint)
    return True


def _remove_taints(node: Obj, keys: Iterable[str]) -> bool:
    spec = node.get("spec") or {}
    have = spec.get("taints") or []
    kept = [t for t in have if t.get("key") not in set(keys)]
    if len(kept) == len(have):
        return False
    if kept:
        spec["taints"] = kept
    else:
        spec.pop("taints", None)
    return True


# -- the controller -------------------------------------------------------------------------


class PodView(Protocol):
    """What the controllers read of a pod and change on it (cluster/pod.py's Pod)."""

    name: str
    node: str
    deleting: bool
    tolerations: list[Obj]
    node_not_ready_at: float | None


@dataclass
class NodeState:
    """The control plane's record of one node's kubelet (nodeHealth upstream)."""

    kubelet_up: bool = True
    posts_ready: bool = True  # what a running kubelet reports (False: it says NotReady)
    last_heartbeat: float = 0.0  # monotonic time of its last status
    deleted_at: float | None = None  # the Node object is gone (pod GC's quarantine runs)
    #: NoExecute taints by key, with the monotonic time the controller added them.
    no_execute_since: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Deletion:
    """A deletion the controllers ask for: graceful (a deletionTimestamp), or `force`
    (grace 0: the object goes at once), with the pod's DisruptionTarget reason."""

    pod: Any  # cluster/pod.py's Pod
    why: tuple[str, str]
    force: bool = False


class NodeLifecycle:
    """The node lifecycle, taint eviction and pod GC controllers over `nodes` (changed in
    place: the scheduler reads their taints); `changed` names the Node objects to publish.
    Times are monotonic seconds (`now`), timestamps in objects wall-clock."""

    def __init__(
        self,
        nodes: dict[str, Obj],
        timings: NodeTimings,
        event: Callable[[str], None],
        now: float = 0.0,
    ) -> None:
        self.nodes = nodes
        self.timings = timings
        self.event = event
        self.state = {name: NodeState(last_heartbeat=now) for name in nodes}
        self.gone: dict[str, Obj] = {}  # Node objects deleted, by name (their pods' nodes)
        self.changed: set[str] = set()
        self._next_monitor = now
        self._next_gc = now + timings.pod_gc_period

    # -- what happens to a node ------------------------------------------------------------

    def kubelet_stopped(self, name: str, now: float) -> None:
        """The node's kubelet stops posting status (the node froze or lost the network)."""
        st = self.state[name]
        if st.kubelet_up:
            st.kubelet_up = False
            st.last_heartbeat = now

    def kubelet_started(self, name: str, now: float) -> None:
        """The node's kubelet posts its status again: Ready (if it says so), and the
        controller takes its taints away at its next pass."""
        st = self.state.get(name)
        if st is None or st.kubelet_up:
            return
        st.kubelet_up = True
        st.last_heartbeat = now
        node = self.nodes.get(name)
        if node is not None:
            self._post_status(name, node, time.time())

    def set_taint(self, name: str, key: str, effect: str) -> None:
        """An administrator's taint (`kubectl taint nodes NAME KEY=...:EFFECT`)."""
        node = self.nodes.get(name)
        if node is not None and _add_taint(node, key, effect, time.time()):
            self.event(f"node {name}: taint {key}:{effect}")
            self.changed.add(name)

    def delete_node(self, name: str, now: float) -> None:
        """The Node object is deleted (the cloud removed the instance): pod GC force-deletes
        its pods once it has been gone for the quarantine."""
        node = self.nodes.pop(name, None)
        if node is None:
            return
        self.gone[name] = node
        st = self.state[name]
        st.kubelet_up = False
        st.deleted_at = now
        self.changed.add(name)
        self.event(f"node {name}: deleted")

    def is_ready(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and ready_status(node) == "True"

    # -- the loop --------------------------------------------------------------------------

    def reconcile(self, now: float, pods: Iterable[PodView]) -> list[Deletion]:
        """One pass: node health every monitor period, pod GC every GC period, and the
        taint evictions due now. Returns the deletions to carry out."""
        pods = list(pods)
        wall = time.time()
        out: list[Deletion] = []
        if now >= self._next_monitor:
            self._next_monitor = now + self.timings.monitor_period
            for name, node in self.nodes.items():
                self._monitor(name, node, now, wall, pods)
        out += self._evictions(now, pods)
        if now >= self._next_gc:
            self._next_gc = now + self.timings.pod_gc_period
            out += self._pod_gc(now, pods)
        return out

    def _post_status(self, name: str, node: Obj, wall: float) -> None:
        """What a running kubelet posts: its Ready condition and a fresh heartbeat."""
        st = self.state[name]
        before = ready_status(node)
        if st.posts_ready:
            _set_condition(node, "Ready", "True", KUBELET_READY, wall)
            for kind, reason, message in HEALTHY_PRESSURE:
                _set_condition(node, kind, "False", (reason, message), wall)
        else:
            _set_condition(node, "Ready", "False", KUBELET_NOT_READY, wall)
        _heartbeat(node, wall)
        if ready_status(node) != before:
            self.changed.add(name)
            self.event(f"node {name}: Ready={ready_status(node)} (kubelet)")

    def _monitor(self, name: str, node: Obj, now: float, wall: float, pods: list[PodView]) -> None:
        st = self.state[name]
        before = ready_status(node)
        if st.kubelet_up:
            st.last_heartbeat = now
            self._post_status(name, node, wall)
        elif now - st.last_heartbeat > self.timings.grace_period:
            for kind in KUBELET_CONDITIONS:
                c = condition(node, kind)
                if c is None or c.get("status") != "Unknown":
                    _set_condition(node, kind, "Unknown", STATUS_UNKNOWN, wall)
        status = ready_status(node)
        if self._taint_by_condition(name, node, status, now, wall):
            self.changed.add(name)
        if status != before:
            self.changed.add(name)
            if status != "True":
                self.event(f"node {name}: NodeNotReady (Ready={status})")
                for p in pods:
                    if p.node == name and p.node_not_ready_at is None:
                        p.node_not_ready_at = wall  # MarkPodsNotReady
            else:
                self.event(f"node {name}: NodeReady")

    def _taint_by_condition(
        self, name: str, node: Obj, status: str, now: float, wall: float
    ) -> bool:
        """not-ready for Ready=False, unreachable for Unknown, NoSchedule (TaintNodesByCondition)
        and NoExecute (taint-based eviction); none when Ready."""
        st = self.state[name]
        want = {"False": NOT_READY, "Unknown": UNREACHABLE}.get(status)
        other = [k for k in (NOT_READY, UNREACHABLE) if k != want]
        changed = _remove_taints(node, other)
        for key in other:
            st.no_execute_since.pop(key, None)
        if want is not None:
            changed |= _add_taint(node, want, "NoSchedule", wall)
            if _add_taint(node, want, "NoExecute", wall):
                st.no_execute_since[want] = now
                changed = True
                self.event(f"node {name}: taint {want}:NoExecute")
        return changed

    def _evictions(self, now: float, pods: list[PodView]) -> list[Deletion]:
        """Taint eviction: pods on nodes with NoExecute taints, once their toleration ends."""
        out: list[Deletion] = []
        for p in pods:
            node = self.nodes.get(p.node) if p.node else None
            if node is None or p.deleting:
                continue
            no_execute = [t for t in taints(node) if t.get("effect") == "NoExecute"]
            if not no_execute:
                continue
            delay = eviction_delay(p.tolerations, no_execute)
            if delay is None:
                continue
            since = self._no_execute_since(p.node, no_execute, now)
            if now >= since + delay:
                self.event(f"{p.name}: taint eviction (NoExecute taint on {p.node})")
                out.append(Deletion(p, TAINT_EVICTION))
        return out

    def _no_execute_since(self, name: str, no_execute: list[Obj], now: float) -> float:
        """When the node's NoExecute taints were added (the controller's own, or an
        administrator's, first seen now)."""
        st = self.state[name]
        for t in no_execute:
            st.no_execute_since.setdefault(str(t.get("key")), now)
        return max(st.no_execute_since[str(t.get("key"))] for t in no_execute)

    def _pod_gc(self, now: float, pods: list[PodView]) -> list[Deletion]:
        out: list[Deletion] = []
        for p in pods:
            if not p.node:
                continue
            st = self.state.get(p.node)
            node = self.nodes.get(p.node)
            if node is None:
                gone_for = now - (st.deleted_at if st and st.deleted_at is not None else now)
                if gone_for >= self.timings.pod_gc_quarantine:
                    out.append(Deletion(p, POD_GC_NODE_GONE, force=True))
            elif (
                p.deleting
                and ready_status(node) != "True"
                and any(t.get("key") == OUT_OF_SERVICE for t in taints(node))
            ):
                out.append(Deletion(p, POD_GC_OUT_OF_SERVICE, force=True))
        return out

    # -- publishing ----------------------------------------------------------------------

    def take_changed(self) -> tuple[list[Obj], list[str]]:
        """Node objects changed since the last call, and names of deleted ones."""
        names, self.changed = self.changed, set()
        present = [copy.deepcopy(self.nodes[n]) for n in sorted(names) if n in self.nodes]
        deleted = sorted(n for n in names if n not in self.nodes)
        return present, deleted


def node_events(before: Mapping[str, Obj], after: Iterable[Obj]) -> list[Obj]:
    """The Events of Node status changes (node-controller's NodeNotReady, the kubelet's
    NodeReady), as `kubectl get events` shows them."""
    out: list[Obj] = []
    for node in after:
        name = node["metadata"]["name"]
        old = before.get(name)
        was = ready_status(old) if old is not None else "True"
        now = ready_status(node)
        if was == now:
            continue
        reason, component = (
            ("NodeReady", "kubelet") if now == "True" else ("NodeNotReady", "node-controller")
        )
        out.append(
            {
                "metadata": {"namespace": "default"},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": node["metadata"].get("uid", ""),
                },
                "reason": reason,
                "message": f"Node {name} status is now: {reason}",
                "type": "Normal",
                "source": {"component": component},
                "count": 1,
            }
        )
    return out
