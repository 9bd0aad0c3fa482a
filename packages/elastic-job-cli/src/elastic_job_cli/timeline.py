"""What happened to a job, in time order, merged from what the API keeps:

    pods       DisruptionTarget conditions (preemption, eviction, node shutdown), the
               worker container's last termination (exit code: a kill is 137), deletion
    nodes      not ready (Ready False/Unknown) under the job's pods; removed (watch)
    Events     the workers' (Reformed, JobCompleted, GateTimeout, ...), the cluster's on
               the job's pods and StatefulSets (Scheduled, Killing, SuccessfulCreate ...)

Pure: entries from objects; `entries_for_change` turns one watch change into entries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from elastic_job_cli import objects as o

Obj = dict[str, Any]


@dataclass(frozen=True, order=True)
class Entry:
    time: str  # RFC 3339, UTC
    kind: str  # disruption, exit, deleted, node, event, warning
    object: str  # pod/NAME, node/NAME, statefulset/NAME
    reason: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.time}  {self.object:<36} {self.reason:<20} {self.message}"


def from_pod(pod: Obj) -> list[Entry]:
    out = []
    ref = f"pod/{o.name(pod)}"
    d = o.condition(pod, "DisruptionTarget")
    if d is not None:
        out.append(
            Entry(str(d.get("lastTransitionTime") or ""), "disruption", ref,
                  str(d.get("reason") or "DisruptionTarget"), str(d.get("message") or ""))
        )  # fmt: skip
    last = (o.worker_status(pod).get("lastState") or {}).get("terminated")
    if last:
        code = last.get("exitCode")
        what = "killed (SIGKILL)" if code == 137 else "terminated (SIGTERM)" if code == 143 else ""
        message = f"container {o.WORKER_CONTAINER} exited {code}" + (f": {what}" if what else "")
        message += f", restart {o.restarts(pod)}"
        out.append(
            Entry(str(last.get("finishedAt") or ""), "exit", ref, "ContainerExited", message)
        )
    return out


def from_node(node: Obj, pods_on: list[str]) -> list[Entry]:
    ok, since = o.node_ready(node)
    if ok:
        return []
    message = f"node not ready under {', '.join(sorted(pods_on))}" if pods_on else "node not ready"
    return [Entry(since, "node", f"node/{o.name(node)}", "NodeNotReady", message)]


def from_event(event: Obj) -> Entry:
    involved = event.get("involvedObject") or {}
    when = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or event["metadata"].get("creationTimestamp")
        or ""
    )
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    kind = "warning" if event.get("type") == "Warning" else "event"
    message = str(event.get("message") or "")
    if source:
        message = f"{message} [{source}]"
    return Entry(
        str(when)[:19] + "Z" if when else "",
        kind,
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        str(event.get("reason") or ""),
        message,
    )


def job_events(events: list[Obj], names: set[str]) -> list[Obj]:
    """The Events about the job's pods and StatefulSets (`names`)."""
    return [e for e in events if (e.get("involvedObject") or {}).get("name") in names]


def merge(
    pods: list[Obj], nodes: dict[str, Obj], events: list[Obj], names: set[str]
) -> list[Entry]:
    """Every entry, oldest first (ties in a stable order)."""
    out: list[Entry] = []
    for p in pods:
        out += from_pod(p)
    under: dict[str, list[str]] = {}
    for p in pods:
        if p["spec"].get("nodeName"):
            under.setdefault(str(p["spec"]["nodeName"]), []).append(o.name(p))
    for node_name, on in under.items():
        if node_name in nodes:
            out += from_node(nodes[node_name], on)
    out += [from_event(e) for e in job_events(events, names)]
    return sorted(set(out))


def entries_for_change(
    resource: str, change: str, obj: Obj, *, seen: set[Entry], names: set[str], now: str
) -> list[Entry]:
    """New entries from one watch change (those in `seen` are said already)."""
    new: list[Entry] = []
    if resource == "pods":
        if o.name(obj) not in names:
            return []
        new = from_pod(obj)
        if change == "DELETED":
            new.append(Entry(now, "deleted", f"pod/{o.name(obj)}", "PodDeleted", "pod deleted"))
    elif resource == "events":
        new = [from_event(e) for e in job_events([obj], names)]
    elif resource == "nodes":
        if change == "DELETED":
            new = [
                Entry(
                    now,
                    "node",
                    f"node/{o.name(obj)}",
                    "NodeRemoved",
                    "node removed from the cluster",
                )
            ]
        else:
            new = from_node(obj, [])
    fresh = [e for e in new if e not in seen]
    seen.update(fresh)
    return fresh
