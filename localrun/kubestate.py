"""A stand-in for kube-state-metrics on a local run (`--prometheus`): two of its standard
series, from the pods and Nodes the fake API server serves, for the chart's alerts that
join on them (ElasticJobRendezvousOnGpuNode; the `node` of ElasticJobRankRestartStorm).

- `kube_pod_info{namespace, pod, uid, host_ip, pod_ip, node, created_by_kind,
  created_by_name, priority_class, host_network} 1` for every pod placed on a node;
- `kube_node_status_capacity{node, resource, unit}`: each capacity entry, the resource name
  with `.`, `/` and `-` as `_` and the unit kube-state-metrics gives it (core, byte,
  integer).

Served by prometheus-client (a custom collector) on 127.0.0.1, scraped with honorLabels
as kube-prometheus-stack scrapes kube-state-metrics.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from localrun.cluster.podspec import quantity

Obj = dict[str, Any]

POD_INFO_LABELS = (
    "namespace",
    "pod",
    "uid",
    "host_ip",
    "pod_ip",
    "node",
    "created_by_kind",
    "created_by_name",
    "priority_class",
    "host_network",
)


def resource_name(name: str) -> str:
    """`nvidia.com/gpu` -> `nvidia_com_gpu`, as kube-state-metrics writes it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def unit(resource: str) -> str:
    if resource == "cpu":
        return "core"
    if resource in {"memory", "ephemeral-storage"} or resource.startswith("hugepages-"):
        return "byte"
    return "integer"


def pod_info(pods: Iterable[Obj]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "kube_pod_info", "Information about pod.", labels=list(POD_INFO_LABELS)
    )
    for p in pods:
        meta, spec, status = p.get("metadata") or {}, p.get("spec") or {}, p.get("status") or {}
        if not spec.get("nodeName"):
            continue
        owner: Obj = next(iter(meta.get("ownerReferences") or []), {})
        family.add_metric(
            [
                str(meta.get("namespace", "")),
                str(meta.get("name", "")),
                str(meta.get("uid", "")),
                str(status.get("hostIP", "")),
                str(status.get("podIP", "")),
                str(spec["nodeName"]),
                str(owner.get("kind", "")),
                str(owner.get("name", "")),
                str(spec.get("priorityClassName", "")),
                str(bool(spec.get("hostNetwork", False))).lower(),
            ],
            1.0,
        )
    return family


def node_capacity(nodes: Mapping[str, Obj]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "kube_node_status_capacity",
        "The capacity for different resources of a node.",
        labels=["node", "resource", "unit"],
    )
    for name, node in sorted(nodes.items()):
        for res, qty in sorted(((node.get("status") or {}).get("capacity") or {}).items()):
            family.add_metric([name, resource_name(res), unit(res)], float(quantity(str(qty))))
    return family


class KubeState(Collector):
    """The series of the pods and Nodes as last given (`update`), served over HTTP."""

    def __init__(self, nodes: Mapping[str, Obj]) -> None:
        self.nodes = dict(nodes)
        self._pods: list[Obj] = []
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.server: WSGIServer | None = None

    def update(self, pods: list[Obj]) -> None:
        with self._lock:
            self._pods = pods

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            pods = self._pods
        yield pod_info(pods)
        yield node_capacity(self.nodes)

    def start(self, host: str = "127.0.0.1") -> str:
        """Serve /metrics on a free port of `host`; the address to scrape."""
        self.server, _thread = start_http_server(0, addr=host, registry=self.registry)
        return f"{host}:{self.server.server_port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
