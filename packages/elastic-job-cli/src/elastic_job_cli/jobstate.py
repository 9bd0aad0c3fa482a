"""The job at a glance, derived from its StatefulSets, pods, nodes, the workers' metrics
(when on) and their Events: pure, so every rule is tested without a cluster.

States: gating (pods wait in the readiness gate or the rendezvous), re-forming (pods that
trained wait for the next round), training (a round at world size >= min), below-min
(fewer than min nodes train, or can run), complete, failed.
Without metrics the state comes from the API alone: pods running and ready stand for
nodes, and "training" reads "running".
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from elastic_job_cli import objects as o

Obj = dict[str, Any]
#: Per pod: metric name (with `{label=value}` for the state set) -> value.
Metrics = dict[str, float]

_REFORMED = re.compile(r"after (?P<s>\d+(?:\.\d+)?) s")


@dataclass
class PodView:
    name: str
    group: str
    phase: str
    node: str
    capacity_type: str
    instance_type: str
    gpu_model: str
    restarts: int
    state: str  # from the worker's metrics; "" when they are off or unreachable
    group_rank: int | None
    world_size: int | None
    round: int | None
    last_step: int | None
    restarts_left: int | None  # the running torchrun's, from the metrics


@dataclass
class JobView:
    release: str
    namespace: str
    state: str
    world_size: int
    min_nodes: int
    max_nodes: int
    round: int | None
    reforms: int | None
    last_reform_seconds: float | None
    last_step: int | None
    #: The fewest torchrun restarts any pod has left (--max-restarts less those used): the
    #: first agent to run out ends the job. None without metrics.
    restarts_left: int | None
    metrics: str  # "on", "off" (no metrics port), or why they could not be read
    groups: dict[str, dict[str, int]] = field(default_factory=dict)  # replicas, ready
    pods: list[PodView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pod_state(metrics: Metrics | None) -> str:
    if not metrics:
        return ""
    for key, value in metrics.items():
        if key.startswith("elastic_job_pod_state{") and value == 1:
            return key.split("=", 1)[1].rstrip("}")
    return ""


def _int(metrics: Metrics | None, key: str) -> int | None:
    if not metrics or key not in metrics:
        return None
    return int(metrics[key])


def pod_view(pod: Obj, nodes: dict[str, Obj], metrics: Metrics | None) -> PodView:
    node_name = str(pod["spec"].get("nodeName") or "")
    node = nodes.get(node_name)
    state = pod_state(metrics)
    rank = _int(metrics, "elastic_job_group_rank")
    world = _int(metrics, "elastic_job_world_size_nodes")
    return PodView(
        name=o.name(pod),
        group=o.labels(pod).get(o.GROUP, ""),
        phase=o.display_phase(pod),
        node=node_name,
        capacity_type=o.capacity_type(node) if node_name else "",
        instance_type=o.instance_type(node) if node_name else "",
        gpu_model=o.gpu_model(node),
        restarts=o.restarts(pod),
        state=state,
        group_rank=rank if rank is not None and rank >= 0 else None,
        world_size=world if world else None,
        round=_int(metrics, "elastic_job_rendezvous_round") or None,
        last_step=_int(metrics, "elastic_job_last_step"),
        restarts_left=_int(metrics, "elastic_job_torchrun_restarts_remaining"),
    )


def last_reform_seconds(events: list[Obj]) -> float | None:
    """The seconds of the newest `Reformed` Event of the workers (events.py's message)."""
    reformed = [e for e in events if e.get("reason") == "Reformed"]
    reformed.sort(
        key=lambda e: str(e.get("lastTimestamp") or e["metadata"].get("creationTimestamp") or "")
    )
    for e in reversed(reformed):
        if m := _REFORMED.search(str(e.get("message") or "")):
            return float(m["s"])
    return None


def _max(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _min(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def metrics_note(
    statefulsets: list[Obj], pods: list[Obj], read: list[tuple[Metrics | None, str]]
) -> str:
    """What the job's metrics column says, from each pod's (metrics, note) as
    Kube.metrics returns them: "on", "off", or why none could be read."""
    notes = {note for _, note in read}
    if not pods:
        return "on" if any(o.has_metrics_port(s) for s in statefulsets) else "off"
    if "on" in notes and any(m for m, _ in read):
        return "on"
    if notes == {"off"}:
        return "off"
    return next((n for n in notes if n not in ("on", "off")), "on, but no pod answered")


def derive(
    release: str,
    namespace: str,
    *,
    statefulsets: list[Obj],
    pods: list[Obj],
    nodes: dict[str, Obj],
    metrics: dict[str, Metrics | None],
    events: list[Obj],
    metrics_note: str,
) -> JobView:
    """`metrics`: per pod name, None where they could not be read; `metrics_note`: "on",
    "off", or why not."""
    lim = o.limits(statefulsets)
    views = [pod_view(p, nodes, metrics.get(o.name(p))) for p in pods]
    by_metrics = any(v.state for v in views)
    training = [v for v in views if v.state == "training"]
    world = max((v.world_size or 0 for v in training), default=0)
    if not by_metrics:
        world = sum(1 for p in pods if o.ready(p) and not p["metadata"].get("deletionTimestamp"))
    replicas = {o.name(s): int((s.get("spec") or {}).get("replicas") or 0) for s in statefulsets}
    completed = any(v.state == "completed" for v in views) or any(
        e.get("reason") == o.JOB_COMPLETED for e in events
    )
    scaled_to_zero = bool(replicas) and all(r == 0 for r in replicas.values())
    notes: list[str] = []
    if completed or (scaled_to_zero and not pods):
        state = "complete"
        if not completed:
            notes.append(
                "every worker StatefulSet is at 0 replicas (a finished job scales itself to 0)"
            )
    elif (
        views
        and all(v.state == "failed" or v.phase == "CrashLoopBackOff" for v in views)
        and any(v.state == "failed" for v in views)
    ):
        state = "failed"
    elif by_metrics and training and world >= lim.min_nodes:
        state = "training"
    elif by_metrics and all(
        v.state in ("gating", "waiting_rendezvous", "spare", "") for v in views
    ):
        enough = len([v for v in views if v.state]) >= lim.min_nodes
        # Pods that trained before and wait for the rendezvous again: a re-form.
        again = any((v.round or 0) >= 1 and v.state == "waiting_rendezvous" for v in views)
        state = ("re-forming" if again else "gating") if enough else "below-min"
    elif not by_metrics and world >= lim.min_nodes:
        state = "running"
    else:
        state = "below-min"
    groups: dict[str, dict[str, int]] = {}
    for s in statefulsets:
        group = o.labels(s).get(o.GROUP, o.name(s))
        mine = [p for p in pods if o.owned_by(p, {o.name(s)})]
        groups[group] = {"replicas": replicas[o.name(s)], "ready": sum(o.ready(p) for p in mine)}
    reforms = _max([_int(metrics.get(v.name), "elastic_job_reforms_total") for v in views])
    last = last_reform_seconds(events)
    if last is None:
        last = _mean_reform(metrics)
    return JobView(
        release=release,
        namespace=namespace,
        state=state,
        world_size=world,
        min_nodes=lim.min_nodes,
        max_nodes=lim.max_nodes,
        round=_max([v.round for v in views]),
        reforms=reforms,
        last_reform_seconds=last,
        last_step=_max([v.last_step for v in views]),
        restarts_left=_min([v.restarts_left for v in views]),
        metrics=metrics_note,
        groups=groups,
        pods=views,
        notes=notes,
    )


def _mean_reform(metrics: dict[str, Metrics | None]) -> float | None:
    """Without Events: the mean re-form time over the pods' histograms."""
    total = count = 0.0
    for m in metrics.values():
        if m:
            total += m.get("elastic_job_reform_rendezvous_seconds_sum", 0.0)
            count += m.get("elastic_job_reform_rendezvous_seconds_count", 0.0)
    return round(total / count, 1) if count else None
