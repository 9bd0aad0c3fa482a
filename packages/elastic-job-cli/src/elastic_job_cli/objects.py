"""What the command reads from Kubernetes objects (plain dicts, as the API serves them):
the chart's labels, a release's worker StatefulSets and pods, and what node labels say of
capacity type, instance type and GPUs. Pure functions, tested without a cluster."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

Obj = dict[str, Any]

# charts/elastic-job/templates/_helpers.tpl: elastic-job.selectorLabels / labels.
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
GROUP = "elastic-job.pytorch.org/group"
WORKER = "worker"
#: The container the chart runs elastic-worker in, and its metrics port's name.
WORKER_CONTAINER = "worker"
METRICS_PORT = "metrics"


#: The workers' Event when the job is complete (images/worker events.py).
JOB_COMPLETED = "JobCompleted"


def all_workers_selector() -> str:
    """The label selector of every release's worker StatefulSets and pods."""
    return f"{PART_OF}=elastic-job,{COMPONENT}={WORKER}"


def worker_selector(release: str) -> str:
    """The label selector of a release's worker StatefulSets and pods."""
    return f"{INSTANCE}={release},{all_workers_selector()}"


def release_of(obj: Obj) -> str:
    """The Helm release a worker StatefulSet or pod belongs to."""
    return labels(obj).get(INSTANCE, "")


def namespace(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def container(spec: Obj, wanted: str = WORKER_CONTAINER) -> Obj:
    containers = spec.get("containers") or [{}]
    return next((c for c in containers if c.get("name") == wanted), containers[0])


def template_env(sts: Obj) -> dict[str, str]:
    """The literal env values of the StatefulSet's worker container."""
    c = container(sts["spec"]["template"]["spec"])
    return {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}


def has_metrics_port(pod_or_sts: Obj) -> bool:
    spec = pod_or_sts["spec"]
    spec = spec["template"]["spec"] if "template" in spec else spec
    return any(p.get("name") == METRICS_PORT for p in container(spec).get("ports") or [])


@dataclass(frozen=True)
class Limits:
    min_nodes: int
    max_nodes: int
    max_restarts: int


def limits(statefulsets: list[Obj]) -> Limits:
    """job.minNodes, job.maxNodes and rendezvous.maxRestarts, as the chart passes them to
    every worker (ELASTIC_MIN_NODES ...)."""
    env = template_env(statefulsets[0]) if statefulsets else {}

    def number(key: str, default: int) -> int:
        value = env.get(key, "")
        return int(value) if value.isdigit() else default

    return Limits(
        number("ELASTIC_MIN_NODES", 1),
        number("ELASTIC_MAX_NODES", 1),
        number("ELASTIC_MAX_RESTARTS", 0),
    )


def owned_by(pod: Obj, sts_names: set[str]) -> bool:
    refs = pod["metadata"].get("ownerReferences") or []
    return any(r.get("kind") == "StatefulSet" and r.get("name") in sts_names for r in refs)


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    statefulsets: list[Obj]
    pods: list[Obj]

    @property
    def names(self) -> set[str]:
        """The StatefulSets' names and every pod name they make (for Events): the ordinals
        up to their replicas, and at least 16, so that the Events of pods a scale-down
        removed still count."""
        out = {name(s) for s in self.statefulsets} | {name(p) for p in self.pods}
        for s in self.statefulsets:
            out |= {f"{name(s)}-{i}" for i in range(max(int(s["spec"].get("replicas") or 0), 16))}
        return out


# -- nodes -------------------------------------------------------------------------------

# Where clouds and provisioners say spot/preemptible or on-demand (value lower-cased).
_CAPACITY = (
    ("karpenter.sh/capacity-type", {"spot": "spot", "on-demand": "on-demand"}),
    ("eks.amazonaws.com/capacityType", {"spot": "spot", "on_demand": "on-demand"}),
    ("cloud.google.com/gke-spot", {"true": "spot"}),
    ("cloud.google.com/gke-preemptible", {"true": "spot"}),
    ("kubernetes.azure.com/scalesetpriority", {"spot": "spot", "regular": "on-demand"}),
    ("node.kubernetes.io/lifecycle", {"spot": "spot", "normal": "on-demand"}),
)
_GPU_MODEL = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "amd.com/gpu.product-name",
)


def capacity_type(node: Obj | None) -> str:
    """spot, on-demand, or unknown (no node, or no label a provider sets)."""
    if node is None:
        return "unknown"
    lab = labels(node)
    for key, values in _CAPACITY:
        if key in lab:
            return values.get(lab[key].lower(), "on-demand")
    return "on-demand" if lab else "unknown"


def instance_type(node: Obj | None) -> str:
    lab = labels(node) if node else {}
    return lab.get("node.kubernetes.io/instance-type") or lab.get(
        "beta.kubernetes.io/instance-type", "unknown"
    )


def gpu_model(node: Obj | None) -> str:
    lab = labels(node) if node else {}
    return next((lab[k] for k in _GPU_MODEL if lab.get(k)), "")


def gpus(node: Obj | None) -> int:
    """GPUs the node offers (its capacity), 0 for a CPU node or none known."""
    if node is None:
        return 0
    capacity = (node.get("status") or {}).get("capacity") or {}
    total = 0
    for key in ("nvidia.com/gpu", "amd.com/gpu"):
        value = str(capacity.get(key, "0"))
        total += int(value) if value.isdigit() else 0
    if total == 0:
        count = labels(node).get("nvidia.com/gpu.count", "")
        total = int(count) if count.isdigit() else 0
    return total


def node_ready(node: Obj) -> tuple[bool, str]:
    """(Ready, the condition's lastTransitionTime)."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True", str(c.get("lastTransitionTime") or "")
    return False, ""


# -- pods --------------------------------------------------------------------------------


def worker_status(pod: Obj) -> Obj:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next(
        (s for s in statuses if s.get("name") == WORKER_CONTAINER), statuses[0] if statuses else {}
    )


def restarts(pod: Obj) -> int:
    return int(worker_status(pod).get("restartCount") or 0)


def display_phase(pod: Obj) -> str:
    """What `kubectl get pods` shows in STATUS."""
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    state = worker_status(pod).get("state") or {}
    if "waiting" in state and state["waiting"].get("reason") not in (None, "ContainerCreating"):
        return str(state["waiting"]["reason"])
    return str((pod.get("status") or {}).get("phase") or "Unknown")


def ready(pod: Obj) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def condition(pod: Obj, kind: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None
