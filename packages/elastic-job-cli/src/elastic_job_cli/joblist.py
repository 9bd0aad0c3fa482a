"""`elastic-job list`: every release in a namespace (or in all, -A), one row each, from the
worker StatefulSets, their pods, the workers' JobCompleted Events and the pods' metrics.
Pure: the grouping, the state and the columns are tested without a cluster.

A release is the StatefulSets that share a namespace and an `app.kubernetes.io/instance`
label (one per worker group); its state, world size, rounds and restarts left are the ones
`status` derives (jobstate.derive), its age that of its oldest StatefulSet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from elastic_job_cli import jobstate, output, timeline
from elastic_job_cli import objects as o

Obj = dict[str, Any]
#: Per pod uid: what Kube.metrics read (None where not readable) and its note.
Read = dict[str, tuple[jobstate.Metrics | None, str]]

COLUMNS = ["NAME", "STATE", "WORLD", "MIN", "MAX", "ROUNDS", "RESTARTS-LEFT", "AGE"]
WIDE = ["READY", "REFORMS", "STEP", "GROUPS", "METRICS"]


@dataclass
class JobRow:
    namespace: str
    name: str
    state: str
    world_size: int
    min_nodes: int
    max_nodes: int
    #: Rendezvous rounds the job has run (the most any pod joined); None without metrics.
    rounds: int | None
    restarts_left: int | None
    created: str  # the oldest StatefulSet's creationTimestamp
    age_seconds: float | None
    ready: int
    replicas: int
    reforms: int | None
    last_step: int | None
    metrics: str
    groups: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def releases(statefulsets: list[Obj], pods: list[Obj]) -> list[o.Release]:
    """The releases the worker StatefulSets make, each with the pods they own, in the order
    kubectl lists: by namespace, then name."""
    grouped: dict[tuple[str, str], list[Obj]] = {}
    for s in statefulsets:
        grouped.setdefault((o.namespace(s), o.release_of(s)), []).append(s)
    out = []
    for (ns, name), sts in sorted(grouped.items()):
        owners = {o.name(s) for s in sts}
        mine = [p for p in pods if o.namespace(p) == ns and o.owned_by(p, owners)]
        out.append(o.Release(name, ns, sorted(sts, key=o.name), sorted(mine, key=o.name)))
    return out


def row(rel: o.Release, read: Read, events: list[Obj], now: datetime) -> JobRow:
    """One release's row; `events` are every JobCompleted Event listed (any release's)."""
    mine = [e for e in events if o.namespace(e) in ("", rel.namespace)]
    metrics = {o.name(p): read.get(p["metadata"]["uid"], (None, "on"))[0] for p in rel.pods}
    note = jobstate.metrics_note(
        rel.statefulsets, rel.pods, [read.get(p["metadata"]["uid"], (None, "on")) for p in rel.pods]
    )
    view = jobstate.derive(
        rel.name,
        rel.namespace,
        statefulsets=rel.statefulsets,
        pods=rel.pods,
        nodes={},
        metrics=metrics,
        events=timeline.job_events(mine, rel.names),
        metrics_note=note,
    )
    created = min(
        (str(s["metadata"].get("creationTimestamp") or "") for s in rel.statefulsets), default=""
    )
    born = o.parse_time(created)
    return JobRow(
        namespace=rel.namespace,
        name=rel.name,
        state=view.state,
        world_size=view.world_size,
        min_nodes=view.min_nodes,
        max_nodes=view.max_nodes,
        rounds=view.round,
        restarts_left=view.restarts_left,
        created=created,
        age_seconds=(now - born).total_seconds() if born else None,
        ready=sum(g["ready"] for g in view.groups.values()),
        replicas=sum(g["replicas"] for g in view.groups.values()),
        reforms=view.reforms,
        last_step=view.last_step,
        metrics=view.metrics,
        groups=view.groups,
    )


def _dash(value: Any) -> str:
    return "-" if value in (None, "") else str(value)


def metrics_word(note: str) -> str:
    """The METRICS column: on, off, forbidden (pods/proxy refused) or no-answer."""
    if note in ("on", "off"):
        return note
    return "forbidden" if note.startswith("metrics not readable") else "no-answer"


def table(rows: list[JobRow], *, all_namespaces: bool, wide: bool) -> str:
    """kubectl's layout: NAMESPACE first with -A; `wide` adds READY (ready/replicas),
    REFORMS, STEP, GROUPS and METRICS."""
    header = (["NAMESPACE"] if all_namespaces else []) + COLUMNS + (WIDE if wide else [])
    lines = [header]
    for r in rows:
        age = output.age(r.age_seconds) if r.age_seconds is not None else "<unknown>"
        cells = [r.name, r.state, str(r.world_size), str(r.min_nodes), str(r.max_nodes),
                 _dash(r.rounds), _dash(r.restarts_left), age]  # fmt: skip
        if all_namespaces:
            cells.insert(0, r.namespace)
        if wide:
            cells += [f"{r.ready}/{r.replicas}", _dash(r.reforms), _dash(r.last_step),
                      ",".join(sorted(r.groups)), metrics_word(r.metrics)]  # fmt: skip
        lines.append(cells)
    return output.table(lines)
