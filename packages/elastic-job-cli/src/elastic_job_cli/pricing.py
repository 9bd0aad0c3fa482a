"""What a job cost: node-hours and GPU-hours by instance type and capacity type, priced
from the user's prices file, and the share lost to re-forms. Pure.

Prices file (YAML), per node-hour:

    currency: USD                 # optional, shown as given
    prices:
      a3-highgpu-8g:              # node.kubernetes.io/instance-type
        spot: 29.39
        on-demand: 88.25

Lifetimes: one interval per pod incarnation on a node, from when it was placed to when it
went (or now): from the scheduler's `Scheduled` Events where the API still has them, else
from the pod's startTime. Lost to re-forms: the seconds each pod's `Reformed` Events (or,
without them, its re-form histogram) report, priced at its node's rate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import yaml

from elastic_job_cli import objects as o

Obj = dict[str, Any]
CAPACITY_TYPES = ("spot", "on-demand")
_ASSIGNED = re.compile(r"Successfully assigned (?P<ns>[^/\s]+)/(?P<pod>\S+) to (?P<node>\S+)")
_REFORMED = re.compile(r"after (?P<s>\d+(?:\.\d+)?) s")


class PricesError(ValueError):
    """The prices file cannot be used; the message names the entry and the fix."""


@dataclass(frozen=True)
class Prices:
    currency: str
    per_hour: dict[tuple[str, str], float]  # (instance type, capacity type) -> price


def load_prices(text: str, source: str) -> Prices:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PricesError(f"{source}: not YAML: {exc}") from None
    example = "e.g. prices: {a3-highgpu-8g: {spot: 29.39, on-demand: 88.25}}"
    if not isinstance(data, dict) or not isinstance(data.get("prices"), dict):
        raise PricesError(f"{source}: needs a `prices` map of instance types ({example})")
    per_hour: dict[tuple[str, str], float] = {}
    for itype, by_capacity in data["prices"].items():
        if not isinstance(by_capacity, dict):
            raise PricesError(
                f"{source}: prices.{itype} must map spot/on-demand to a price ({example})"
            )
        for capacity, price in by_capacity.items():
            if capacity not in CAPACITY_TYPES:
                raise PricesError(
                    f"{source}: prices.{itype}.{capacity}: capacity type must be spot or on-demand"
                )
            if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
                raise PricesError(
                    f"{source}: prices.{itype}.{capacity}={price!r}: give a price per "
                    "node-hour >= 0"
                )
            per_hour[(str(itype), capacity)] = float(price)
    return Prices(str(data.get("currency") or ""), per_hour)


@dataclass(frozen=True)
class Interval:
    pod: str
    node: str
    start: datetime
    end: datetime

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds()) / 3600


def intervals(pods: list[Obj], events: list[Obj], now: datetime) -> list[Interval]:
    """Each incarnation's time on its node: a `Scheduled` Event opens one, the pod's next
    `Scheduled` (or `Killing`) closes it; the current pod runs until now."""
    names = {o.name(p) for p in pods}
    names |= {m["pod"] for e in events if (m := _ASSIGNED.search(str(e.get("message") or "")))}
    by_pod: dict[str, list[tuple[datetime, str, str]]] = {}  # time, what, node
    for e in events:
        involved = (e.get("involvedObject") or {}).get("name")
        when = o.parse_time(
            str(e.get("lastTimestamp") or e["metadata"].get("creationTimestamp") or "")
        )
        if when is None or involved not in names:
            continue
        if e.get("reason") == "Scheduled" and (m := _ASSIGNED.search(str(e.get("message") or ""))):
            by_pod.setdefault(str(involved), []).append((when, "start", m["node"]))
        elif e.get("reason") == "Killing":
            by_pod.setdefault(str(involved), []).append((when, "stop", ""))
    current = {o.name(p): p for p in pods}
    out: list[Interval] = []
    for pod_name in sorted(names):
        # At equal times the end of one incarnation comes before the start of the next.
        marks = sorted(by_pod.get(pod_name, []), key=lambda m: (m[0], m[1] == "start"))
        open_: tuple[datetime, str] | None = None
        for when, what, node in marks:
            if open_ is not None:
                out.append(Interval(pod_name, open_[1], open_[0], when))
                open_ = None
            if what == "start":
                open_ = (when, node)
        pod = current.get(pod_name)
        if open_ is not None:
            # Still open: the pod of that incarnation runs now (or the Events stop here).
            out.append(Interval(pod_name, open_[1], open_[0], now))
        elif pod is not None and pod["spec"].get("nodeName"):
            start = o.parse_time((pod.get("status") or {}).get("startTime"))
            if start is not None and not any(i.pod == pod_name and i.start >= start for i in out):
                out.append(Interval(pod_name, str(pod["spec"]["nodeName"]), start, now))
    return out


def reform_seconds(
    events: list[Obj], metrics: Mapping[str, Mapping[str, float] | None]
) -> dict[str, float]:
    """Seconds each pod spent re-forming: its Reformed Events, else its histogram's sum."""
    out: dict[str, float] = {}
    for e in events:
        if e.get("reason") != "Reformed":
            continue
        if m := _REFORMED.search(str(e.get("message") or "")):
            pod = str((e.get("involvedObject") or {}).get("name"))
            out[pod] = out.get(pod, 0.0) + float(m["s"])
    if not out:
        for pod, m2 in metrics.items():
            if m2 and m2.get("elastic_job_reform_rendezvous_seconds_sum"):
                out[pod] = float(m2["elastic_job_reform_rendezvous_seconds_sum"])
    return out


@dataclass
class Line:
    instance_type: str
    capacity_type: str
    gpus_per_node: int
    node_hours: float
    gpu_hours: float
    price_per_hour: float | None
    cost: float | None


@dataclass
class Cost:
    currency: str
    lines: list[Line] = field(default_factory=list)
    total: float = 0.0
    node_hours: float = 0.0
    gpu_hours: float = 0.0
    reform_node_hours: float = 0.0
    reform_cost: float = 0.0
    reform_share: float = 0.0
    unpriced: list[str] = field(default_factory=list)  # "type/capacity" without a price

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cost(
    spans: list[Interval],
    nodes: dict[str, Obj],
    prices: Prices,
    reforms: dict[str, float],
) -> Cost:
    result = Cost(prices.currency)
    table: dict[tuple[str, str, int], Line] = {}
    rate_of_pod: dict[str, float] = {}
    for span in spans:
        node = nodes.get(span.node)
        key = (o.instance_type(node), o.capacity_type(node), o.gpus(node))
        price = prices.per_hour.get(key[:2])
        line = table.setdefault(key, Line(key[0], key[1], key[2], 0.0, 0.0, price, None))
        line.node_hours += span.hours
        line.gpu_hours += span.hours * key[2]
        if price is None:
            tag = f"{key[0]}/{key[1]}"
            if tag not in result.unpriced:
                result.unpriced.append(tag)
        else:
            rate_of_pod[span.pod] = price  # the latest incarnation's rate
    for line in sorted(table.values(), key=lambda x: (x.instance_type, x.capacity_type)):
        line.node_hours = round(line.node_hours, 4)
        line.gpu_hours = round(line.gpu_hours, 4)
        if line.price_per_hour is not None:
            line.cost = round(line.node_hours * line.price_per_hour, 4)
            result.total += line.cost
        result.node_hours += line.node_hours
        result.gpu_hours += line.gpu_hours
        result.lines.append(line)
    for pod, seconds in reforms.items():
        result.reform_node_hours += seconds / 3600
        result.reform_cost += seconds / 3600 * rate_of_pod.get(pod, 0.0)
    result.total = round(result.total, 4)
    result.node_hours = round(result.node_hours, 4)
    result.gpu_hours = round(result.gpu_hours, 4)
    result.reform_node_hours = round(result.reform_node_hours, 4)
    result.reform_cost = round(result.reform_cost, 4)
    if result.total:
        result.reform_share = round(result.reform_cost / result.total, 4)
    elif result.node_hours:
        result.reform_share = round(result.reform_node_hours / result.node_hours, 4)
    return result
