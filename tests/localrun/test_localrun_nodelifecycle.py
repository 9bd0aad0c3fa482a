"""A node's life as the control plane sees it (nodelifecycle.py) with the mini-cluster on an
in-memory runtime: a stopped kubelet, NotReady after the grace period, the taints, taint
eviction after the pods' tolerations, pods Terminating until their node returns, a force
delete, pod GC of a deleted node's pods, the out-of-service taint. Time is the test's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localrun_fakes import NODES, Harness, statefulset

from localrun.cluster.kubelet import RELIST
from localrun.cluster.nodelifecycle import (
    OUT_OF_SERVICE,
    NodeTimings,
    node_events,
    ready_status,
    taints,
)
from localrun.cluster.pod import Phase, Pod
from localrun.cluster.podobject import lifecycle_events, pod_object
from localrun.cluster.tolerations import (
    NOT_READY,
    UNREACHABLE,
    admitted_tolerations,
    eviction_delay,
)

#: Shortened as a test run shortens them: NotReady 10 s after the kubelet stopped, looked
#: at every second, the default tolerations 30 s, pod GC every 2 s after a 4 s quarantine.
FAST = NodeTimings(
    monitor_period=1,
    grace_period=10,
    not_ready_toleration=30,
    unreachable_toleration=30,
    pod_gc_period=2,
    pod_gc_quarantine=4,
)
THREE = {**NODES, "n2": {"metadata": {"name": "n2"}, "status": {"allocatable": {"cpu": "4"}}}}


def running(h: Harness, t: float = 0) -> None:
    """Every pod through its init container, at time `t`."""
    h.tick(t)
    for p in h.cluster.pods():
        h.runtime.running(p.name, "init").rc = 0
    h.tick(t)
    assert all(p.phase is Phase.RUNNING for p in h.cluster.pods())


def ticks(h: Harness, start: float, end: float, step: float = 0.5) -> None:
    t = start
    while t <= end:
        h.tick(t)
        t += step


def conditions(pod: Pod) -> dict[str, str]:
    obj = pod_object(pod, "sts-uid")
    return {c["type"]: c["status"] for c in obj["status"]["conditions"]}


def keys(node: dict[str, Any]) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in taints(node)}


def test_a_stopped_kubelet_freezes_its_pods_and_its_node_goes_unknown_after_the_grace(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, statefulset(replicas=2), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    main = h.runtime.running("w-0", "main")
    h.cluster.stop_node(w0.node, 0)
    assert main.signals == ["STOP"] and h.runtime.links[("w-0", 1)] is False
    node = h.cluster.nodes[w0.node]
    ticks(h, 0, 10)
    assert ready_status(node) == "True"  # still within the grace period
    assert conditions(w0)["Ready"] == "True"
    ticks(h, 10.5, 12)
    assert ready_status(node) == "Unknown"
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "NodeStatusUnknown"
    assert ready["message"] == "Kubelet stopped posting node status."
    assert keys(node) == {(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")}
    # MarkPodsNotReady: Ready False, the containers as the kubelet last posted them
    assert conditions(w0) == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "False",
    }
    other = h.pod("w-1")
    assert conditions(other)["Ready"] == "True"  # on a healthy node
    # nothing of the pod changes while its kubelet is away
    main.rc = 1
    ticks(h, 12.5, 20)
    assert w0.phase is Phase.RUNNING and w0.restarts == 0


def test_taint_eviction_after_the_default_toleration_leaves_the_pod_terminating(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, statefulset(replicas=2), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    main = h.runtime.running("w-0", "main")
    h.cluster.stop_node(w0.node, 0)
    ticks(h, 0, 40)  # NotReady at ~11 s; evicted 30 s after the taint
    assert not w0.deleting
    ticks(h, 40.5, 45)
    assert w0.deleting and w0.disruption is not None
    assert w0.disruption.reason == "DeletionByTaintManager"
    obj = pod_object(w0, "sts-uid")
    assert obj["metadata"]["deletionTimestamp"]
    assert main.signals == ["STOP"]  # its kubelet is away: nothing stops it
    ticks(h, 45.5, 300, step=5)
    assert h.pod("w-0") is w0  # Terminating for good: the StatefulSet makes no other
    assert w0.phase is Phase.RUNNING and main.rc is None


def test_a_returning_node_carries_out_the_deletion_and_the_pod_comes_back(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, statefulset(replicas=1, grace=5), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    node = w0.node
    main = h.runtime.running("w-0", "main")
    h.cluster.stop_node(node, 0)
    ticks(h, 0, 45)
    assert w0.deleting
    h.cluster.start_node(node, 45)
    assert main.signals == ["STOP", "CONT"] and h.runtime.links[("w-0", 1)] is True
    h.tick(45 + RELIST / 2)
    assert main.signals == ["STOP", "CONT"]  # not synced yet
    h.tick(45 + RELIST)
    assert main.signals == ["STOP", "CONT", "TERM"]  # SIGTERM, then it exits 0
    h.tick(46.5)
    h.tick(46.6)
    new = h.pod("w-0")
    assert new is not w0 and new.incarnation == 2
    assert ready_status(h.cluster.nodes[node]) == "True"
    ticks(h, 47, 49)
    assert not taints(h.cluster.nodes[node])


def test_a_node_back_within_the_toleration_keeps_its_pod(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    h.cluster.stop_node(w0.node, 0)
    ticks(h, 0, 20)
    assert conditions(w0)["Ready"] == "False"
    h.cluster.start_node(w0.node, 20)
    ticks(h, 20, 25)
    assert h.pod("w-0") is w0 and not w0.deleting and conditions(w0)["Ready"] == "True"
    assert h.runtime.running("w-0", "main").signals == ["STOP", "CONT"]


def test_a_force_delete_makes_the_pod_again_elsewhere_and_the_old_one_stops_when_back(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, statefulset(replicas=2, grace=5), nodes=THREE, timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    down = w0.node
    old = h.runtime.running("w-0", "main")
    h.cluster.stop_node(down, 0)
    ticks(h, 0, 12)  # NotReady, tainted NoSchedule
    h.cluster.delete(w0, 12, why=None, grace=0)
    h.tick(12.1)
    new = h.pod("w-0")
    assert new is not w0 and new.incarnation == 2
    assert new.node not in ("", down)  # the unreachable node takes no new pod
    assert w0 in h.cluster.kubelet.orphans and ("w-0", 1) in h.runtime.links
    h.runtime.running("w-0", "init").rc = 0
    h.tick(13)
    fresh = h.runtime.running("w-0", "main")
    assert fresh is not old and new.ip != w0.ip
    h.cluster.start_node(down, 30)
    h.tick(30)
    assert old.signals == ["STOP", "CONT"]  # it runs on until its kubelet has synced
    h.tick(30 + RELIST)
    assert old.signals == ["STOP", "CONT", "TERM"]
    h.tick(31.5)
    assert w0 not in h.cluster.kubelet.orphans and ("w-0", 1) not in h.runtime.links
    assert h.pod("w-0") is new and fresh.signals == []


def test_a_toleration_without_seconds_is_never_evicted(tmp_path: Path) -> None:
    forever = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]
    h = Harness(tmp_path, statefulset(replicas=1, tolerations=forever), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    h.cluster.stop_node(w0.node, 0)
    ticks(h, 0, 400, step=5)
    assert not w0.deleting


def test_the_charts_toleration_seconds_decide_when(tmp_path: Path) -> None:
    tolerations = [
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
    ]
    h = Harness(tmp_path, statefulset(replicas=1, tolerations=tolerations), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    h.cluster.stop_node(w0.node, 0)
    ticks(h, 0, 15)
    assert not w0.deleting
    ticks(h, 15.5, 17)
    assert w0.deleting


def test_pod_gc_force_deletes_the_pods_of_a_deleted_node_after_its_quarantine(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, statefulset(replicas=1), nodes=THREE, timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    gone = w0.node
    h.cluster.delete_node(gone, 1)
    assert gone not in h.cluster.nodes
    ticks(h, 1, 4.5)
    assert h.pod("w-0") is w0  # quarantined
    ticks(h, 5, 7)
    new = h.pod("w-0")
    assert new is not w0 and new.node != gone
    assert w0.disruption is not None and w0.disruption.reason == "DeletionByPodGC"


def test_the_out_of_service_taint_frees_a_dead_nodes_pods(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1), nodes=THREE, timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    down = w0.node
    h.cluster.stop_node(down, 0)
    ticks(h, 0, 12)
    assert not w0.deleting  # tolerated for 30 s
    h.cluster.taint_node(down, OUT_OF_SERVICE, "NoExecute")
    h.tick(12.5)
    assert w0.deleting  # not tolerated: evicted at once...
    ticks(h, 13, 15)
    new = h.pod("w-0")  # ...and pod GC force-deletes it (node not Ready, out of service)
    assert new is not w0 and new.node != down


def test_admission_adds_the_default_tolerations_a_pod_lacks() -> None:
    own = [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]
    got = admitted_tolerations(own, NodeTimings())
    assert got == [
        *own,
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ]
    everything = [{"operator": "Exists"}]  # tolerates every taint: nothing added
    assert admitted_tolerations(everything, NodeTimings()) == everything
    assert eviction_delay(got, [{"key": UNREACHABLE, "effect": "NoExecute"}]) == 300
    assert eviction_delay(got, [{"key": "other", "effect": "NoExecute"}]) == 0
    assert eviction_delay(everything, [{"key": UNREACHABLE, "effect": "NoExecute"}]) is None


def test_pods_show_the_admitted_tolerations(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1), timings=FAST)
    h.tick(0)
    spec = pod_object(h.pod("w-0"), "sts-uid")["spec"]
    assert {(t["key"], t["tolerationSeconds"]) for t in spec["tolerations"]} == {
        (NOT_READY, 30),
        (UNREACHABLE, 30),
    }


def test_the_events_of_a_node_lost_and_its_pod_evicted(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1), timings=FAST)
    running(h)
    w0 = h.pod("w-0")
    before_pod = {"w-0": pod_object(w0, "sts-uid")}
    h.cluster.stop_node(w0.node, 0)
    ticks(h, 0, 12)
    changed, _ = h.cluster.node_lifecycle.take_changed()
    ready = {w0.node: {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}}
    assert [e["message"] for e in node_events(ready, changed)] == [
        f"Node {w0.node} status is now: NodeNotReady"
    ]
    after = pod_object(w0, "sts-uid")
    assert [(e["reason"], e["type"]) for e in lifecycle_events(before_pod, [after])] == [
        ("NodeNotReady", "Warning")
    ]
    ticks(h, 12.5, 45)
    evicted = pod_object(w0, "sts-uid")
    reasons = [e["reason"] for e in lifecycle_events({"w-0": after}, [evicted])]
    assert reasons == ["TaintManagerEviction", "Killing"]
