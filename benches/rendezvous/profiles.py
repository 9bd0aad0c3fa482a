"""The backends the rendezvous figure compares, each with the chart's settings for a job of
its size (elastic-worker's defaults: elastic_worker.settings.schema.rdzv_conf_default)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benches.worker import rdzv_conf_default

#: torchrun's --monitor-interval as the chart sets it (rendezvous.monitorInterval):
#: how often torch's agent asks num_nodes_waiting while its workers run.
MONITOR_INTERVAL = 0.1


@dataclass(frozen=True)
class Profile:
    label: str
    backend: str
    conf: Callable[[int], dict[str, str]]
    monitor: float = MONITOR_INTERVAL


def chart_conf(backend: str) -> Callable[[int], dict[str, str]]:
    """The --rdzv-conf the chart gives a job of `n` nodes on `backend`, as pairs."""

    def conf(n: int) -> dict[str, str]:
        pairs = (kv.split("=", 1) for kv in rdzv_conf_default(n, backend).split(","))
        return dict(pairs)

    return conf


#: In the order a run alternates them.
PROFILES = (
    Profile("etcd-v2", "etcd-v2", chart_conf("etcd-v2")),
    Profile("etcd-v3", "etcd-v3", chart_conf("etcd-v3")),
    Profile("etcd-lease", "etcd-lease", chart_conf("etcd-lease")),
)
LABELS = tuple(p.label for p in PROFILES)


def profile(label: str) -> Profile:
    return next(p for p in PROFILES if p.label == label)
