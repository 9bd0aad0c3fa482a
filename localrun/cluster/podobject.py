"""A pod of the mini-cluster as kube-apiserver serves it (core/v1 Pod), built from the
pod's lifecycle (pod.py): phase, conditions, node, container status with restartCount,
state and lastState, the owner reference to its StatefulSet.

The mapping from the lifecycle to what the kubelet reports:

    Pending, Init            phase Pending; the container waiting (PodInitializing)
    Running                  phase Running, Ready; the container running since its start
    CrashLoopBackOff         phase Running once the container ran (else Pending), waiting
                             CrashLoopBackOff; lastState terminated with its exit code
    Terminating              phase Running, deletionTimestamp set, not Ready
    DisruptionTarget         True from the deletion of a reclaimed node's pod (pod.disruption)
    its node not Ready       the Ready condition False (the node lifecycle controller's
                             MarkPodsNotReady); ContainersReady and the container status
                             as the kubelet last posted them, ready
    tolerations              as admission left them (DefaultTolerationSeconds)
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

from localrun.cluster.pod import Phase, Pod

JsonObject = dict[str, Any]


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    kind: str, ok: bool, at: float | None, reason: str = "", message: str = ""
) -> JsonObject:
    c: JsonObject = {
        "type": kind,
        "status": "True" if ok else "False",
        "lastProbeTime": None,
        "lastTransitionTime": rfc3339(at) if at else None,
    }
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def _state(pod: Pod) -> JsonObject:
    name = pod.sts.containers[0].name
    if pod.phase in (Phase.RUNNING, Phase.TERMINATING) and pod.proc is not None and not pod.in_init:
        return {"running": {"startedAt": rfc3339(pod.started_at or pod.created_at)}}
    if pod.phase == Phase.BACKOFF and pod.main_started:
        return {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off restarting failed container={name} pod={pod.name}",
            }
        }
    if pod.message.startswith("CreateContainerConfigError"):
        return {"waiting": {"reason": "CreateContainerConfigError", "message": pod.message}}
    return {"waiting": {"reason": "PodInitializing" if pod.node else "ContainerCreating"}}


def _last_state(pod: Pod) -> JsonObject:
    run = pod.last_run
    if run is None:
        return {}
    # Exit 137 is a SIGKILL (the kernel's OOM killer's too: the kubelet says OOMKilled
    # only from the cgroup's event, which the local run has not).
    reason = "Completed" if run.exit_code == 0 else "Error"
    return {
        "terminated": {
            "exitCode": run.exit_code,
            "reason": reason,
            "startedAt": rfc3339(run.started_at),
            "finishedAt": rfc3339(run.finished_at),
            "containerID": f"containerd://{pod.uid.replace('-', '')}{pod.restarts:04d}",
        }
    }


def _phase(pod: Pod) -> str:
    if pod.phase in (Phase.RUNNING, Phase.TERMINATING):
        return "Running"
    if pod.phase == Phase.BACKOFF and pod.main_started:
        return "Running"
    return "Pending"


def pod_object(pod: Pod, owner_uid: str, host_ip: str = "") -> JsonObject:
    """The pod as `kubectl get pod -o json` shows it (`host_ip`: its node's address)."""
    sts = pod.sts
    labels = {
        **sts.labels,
        "statefulset.kubernetes.io/pod-name": pod.name,
        "apps.kubernetes.io/pod-index": str(pod.ordinal),
    }
    meta: JsonObject = {
        "name": pod.name,
        "generateName": f"{sts.name}-",
        "namespace": sts.namespace,
        "uid": pod.uid,
        "creationTimestamp": rfc3339(pod.created_at),
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": sts.name,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if sts.annotations:
        meta["annotations"] = dict(sts.annotations)
    if pod.deleting:
        grace = sts.grace if pod.grace is None else pod.grace
        meta["deletionTimestamp"] = rfc3339((pod.deleted_at or pod.created_at) + grace)
        meta["deletionGracePeriodSeconds"] = int(grace)
    spec = copy.deepcopy(sts.pod_spec)
    if pod.tolerations:
        spec["tolerations"] = copy.deepcopy(pod.tolerations)
    spec["hostname"] = pod.name
    if sts.service_name:
        spec["subdomain"] = sts.service_name
    if pod.node:
        spec["nodeName"] = pod.node
    running = pod.phase == Phase.RUNNING and not pod.in_init and pod.proc is not None
    ready = running and not pod.deleting
    node_ok = pod.node_not_ready_at is None
    container = sts.containers[0]
    status: JsonObject = {
        "phase": _phase(pod),
        "qosClass": "BestEffort",
        "conditions": [
            _condition("PodScheduled", bool(pod.node), pod.scheduled_at or pod.created_at),
            _condition("Initialized", not pod.in_init, pod.started_at if not pod.in_init else None),
            _condition("ContainersReady", ready, pod.started_at),
            _condition(
                "Ready",
                ready and node_ok,
                pod.started_at if node_ok else pod.node_not_ready_at,
            ),
        ],
    }
    if not pod.node and pod.message:
        status["conditions"][0].update(reason="Unschedulable", message=pod.message)
    if pod.disruption is not None:
        d = pod.disruption
        status["conditions"].append(_condition("DisruptionTarget", True, d.at, d.reason, d.message))
    if pod.node:
        status["startTime"] = rfc3339(pod.scheduled_at or pod.created_at)
    if host_ip and pod.node:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    if pod.ip:
        status["podIP"] = pod.ip
        status["podIPs"] = [{"ip": pod.ip}]
    status["containerStatuses"] = [
        {
            "name": container.name,
            "image": str(sts.pod_spec["containers"][0].get("image", "")),
            "imageID": "",
            "ready": ready,
            "started": running,
            "restartCount": pod.restarts,
            "state": _state(pod),
            "lastState": _last_state(pod),
        }
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _conditions(pod: JsonObject) -> dict[str, JsonObject]:
    return {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}


def _node_not_ready(pod: JsonObject) -> bool:
    """The node lifecycle controller's mark: Ready False while the containers are ready
    (a kubelet never posts that; it sets both together)."""
    c = _conditions(pod)
    return (
        c.get("Ready", {}).get("status") == "False"
        and c.get("ContainersReady", {}).get("status") == "True"
    )


def _disruption(pod: JsonObject) -> str:
    return str(_conditions(pod).get("DisruptionTarget", {}).get("reason", ""))


def _event(
    obj: JsonObject,
    reason: str,
    message: str,
    component: str,
    host: str = "",
    *,
    kind: str = "Normal",
) -> JsonObject:
    meta = obj["metadata"]
    source: JsonObject = {"component": component, **({"host": host} if host else {})}
    return {
        "metadata": {"namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", "Pod"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": source,
        "count": 1,
    }


def lifecycle_events(before: dict[str, JsonObject], after: list[JsonObject]) -> list[JsonObject]:
    """The Events the StatefulSet controller, the scheduler and the kubelet record for the
    change from the pods `before` (by name) to the pods `after` (timestamps: now)."""
    out: list[JsonObject] = []
    now = {p["metadata"]["name"]: p for p in after}
    for name, new in now.items():
        old = before.get(name)
        meta = new["metadata"]
        fresh = old is None or old["metadata"]["uid"] != meta["uid"]
        owner = (meta.get("ownerReferences") or [{}])[0]
        if fresh and owner.get("kind") == "StatefulSet":
            sts = {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {
                    "name": owner["name"],
                    "namespace": meta["namespace"],
                    "uid": owner.get("uid", ""),
                },
            }
            message = f"create Pod {name} in StatefulSet {owner['name']} successful"
            out.append(_event(sts, "SuccessfulCreate", message, "statefulset-controller"))
        node = new["spec"].get("nodeName")
        if node and (fresh or not (old or {}).get("spec", {}).get("nodeName")):
            message = f"Successfully assigned {meta['namespace']}/{name} to {node}"
            out.append(_event(new, "Scheduled", message, "default-scheduler"))
        if _node_not_ready(new) and (fresh or not _node_not_ready(old or {})):
            out.append(
                _event(new, "NodeNotReady", "Node is not ready", "node-controller", kind="Warning")
            )
        deleted = meta.get("deletionTimestamp") and (
            fresh or not (old or {})["metadata"].get("deletionTimestamp")
        )
        if deleted and _disruption(new) == "DeletionByTaintManager":
            message = f"Marking for deletion Pod {meta['namespace']}/{name}"
            out.append(_event(new, "TaintManagerEviction", message, "taint-eviction-controller"))
        if deleted:
            container = new["spec"]["containers"][0]["name"]
            out.append(
                _event(new, "Killing", f"Stopping container {container}", "kubelet", node or "")
            )
    for name, old in before.items():
        gone = name not in now or now[name]["metadata"]["uid"] != old["metadata"]["uid"]
        if gone and not old["metadata"].get("deletionTimestamp"):
            container = old["spec"]["containers"][0]["name"]
            host = old["spec"].get("nodeName", "")
            out.append(_event(old, "Killing", f"Stopping container {container}", "kubelet", host))
    return out
