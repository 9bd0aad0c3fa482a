"""What the elastic-job tests put in the fake API server: a release's worker StatefulSet and
pods as the chart labels them, workers' real metrics servers (elastic_worker.metrics) for
the pod proxy, and the kubeconfig the command reads."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from elastic_job_cli import cli
from elastic_worker.attempt_line import AttemptLine as Attempt
from elastic_worker.observe.metrics import Identity, JobMetrics, Tracker, serve

from localrun.cluster.apiserver import FakeApiServer

NS = "ml"


def labels(release: str, group: str = "default") -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "elastic-job",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "elastic-job",
        "elastic-job.pytorch.org/group": group,
    }


def statefulset(
    release: str,
    *,
    min_nodes: int = 2,
    max_nodes: int = 3,
    max_restarts: int = 20,
    created: str | None = None,
    metrics: bool = False,
) -> dict[str, Any]:
    """A worker StatefulSet's manifest as the chart renders it (the part the command reads)."""
    env = [
        {"name": "ELASTIC_MIN_NODES", "value": str(min_nodes)},
        {"name": "ELASTIC_MAX_NODES", "value": str(max_nodes)},
        {"name": "ELASTIC_MAX_RESTARTS", "value": str(max_restarts)},
    ]
    container: dict[str, Any] = {"name": "worker", "image": "w:1", "env": env}
    if metrics:
        container["ports"] = [{"name": "metrics", "containerPort": 9400}]
    sts: dict[str, Any] = {
        "metadata": {"labels": labels(release)},
        "spec": {
            "selector": {"matchLabels": labels(release)},
            "template": {
                "metadata": {"labels": labels(release)},
                "spec": {"containers": [container]},
            },
        },
    }
    if created:
        sts["metadata"]["creationTimestamp"] = created
    return sts


def pod(
    name: str,
    node: str,
    *,
    release: str = "run42",
    namespace: str = NS,
    disruption: bool = False,
    metrics_port: int | None = None,
) -> dict[str, Any]:
    """A running, ready worker pod of `release`'s default group; with `metrics_port`, its
    metrics port is served on 127.0.0.1 (the pod proxy reaches it there)."""
    conditions = [{"type": "Ready", "status": "True"}]
    if disruption:
        conditions.append(
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
             "message": "Pod was terminated in response to imminent node shutdown.",
             "lastTransitionTime": "2026-11-23T10:05:00Z"}
        )  # fmt: skip
    container: dict[str, Any] = {"name": "worker", "image": "w:1"}
    status: dict[str, Any] = {
        "phase": "Running", "startTime": "2026-11-23T10:00:00Z", "conditions": conditions,
        "containerStatuses": [{"name": "worker", "image": "w:1", "imageID": "", "ready": True,
                               "restartCount": 0, "state": {"running": {}}}],
    }  # fmt: skip
    if metrics_port is not None:
        container["ports"] = [{"name": "metrics", "containerPort": metrics_port}]
        status["podIP"] = "127.0.0.1"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
            "labels": labels(release),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                 "name": f"{release}-elastic-job-default", "uid": "u"}],
        },
        "spec": {"nodeName": node, "containers": [container]},
        "status": status,
    }  # fmt: skip


def add_release(api: FakeApiServer, namespace: str, release: str, replicas: int, **sts: Any) -> str:
    """The release's default worker StatefulSet; its name."""
    name = f"{release}-elastic-job-default"
    api.add_statefulset(namespace, name, replicas, copy.deepcopy(statefulset(release, **sts)))
    return name


class Worker:
    """One pod's real metrics (elastic_worker.metrics), served on 127.0.0.1."""

    def __init__(self, release: str, *, min_nodes: int, max_nodes: int,
                 max_restarts: int) -> None:  # fmt: skip
        self.metrics = JobMetrics(Identity(release, "default"))
        self.tracker = Tracker(self.metrics, min_nodes, max_nodes, max_restarts, clock=lambda: 0.0)
        self.tracker.torchrun_started()
        self.server = serve(self.metrics, 0, addr="127.0.0.1")

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def train(self, *, restart: int, group_rank: int, nodes: int) -> None:
        """A round: the attempt line torchrun's workers start with."""
        self.tracker.attempt(Attempt("run", restart, group_rank, nodes, nodes, 1))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def workers(n: int, release: str, **limits: int) -> Iterator[list[Worker]]:
    # The metrics carry no pod label: the pod serving each is named where it is made.
    started = [Worker(release, **limits) for _ in range(n)]
    try:
        yield started
    finally:
        for w in started:
            w.close()


def write_kubeconfig(api: FakeApiServer, path: Path, namespace: str = NS) -> str:
    path.write_text(json.dumps(api.kubeconfig(namespace)))
    return str(path)


def run(kubeconfig: str, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["--kubeconfig", kubeconfig, *args])
    out, err = capsys.readouterr()
    return code, out, err
