"""`elastic-local run --prometheus`: Debian's real `prometheus` scraping the run's pods as
a cluster's prometheus-operator would, evaluating the project's own alert rules.

- The run renders the job's chart with its metrics on (`LOCAL_VALUES`, before the user's
  --set so that a user can change any of them) and, as a cluster admin would install it
  once, charts/elastic-job-cluster (`render_cluster`: `LOCAL_CLUSTER_VALUES`, then the
  user's --cluster-set) with its PodMonitor for every job's workers and its PrometheusRule,
  the alerts' `for:` and windows shortened by values, never by editing rendered text.
- `scrape_endpoints` reads the rendered PodMonitors (the cluster chart's, and a release's
  own if it has one); `targets` is what prometheus-operator's pod discovery would keep of
  the pods running now (selector, namespaces, the named container port, not
  Succeeded/Failed), with its target labels (namespace, pod, container, endpoint, job); the
  runner writes them to a file_sd file as pods start and stop.
- `rule_groups` are the rendered PrometheusRules' groups, written as a rules file.
- `Prometheus` runs the binary on 127.0.0.1 (the host reaches every pod's address over the
  run's bridge) with its data in the run's output directory, and stops it with the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localrun import chart
from localrun.host import process
from localrun.render import ROOT, render

log = logging.getLogger(__name__)

Obj = dict[str, Any]

#: Values of the job's chart the run adds before the user's own --set (a later --set wins):
#: the workers serve their metrics. Scraping them is the cluster chart's PodMonitor, as on a
#: shared cluster where a team's release has none of its own.
LOCAL_VALUES: tuple[str, ...] = ("monitoring.enabled=true",)
#: charts/elastic-job-cluster, what an admin installs once for every job; the run renders it
#: as release CLUSTER_RELEASE in CLUSTER_NAMESPACE.
CLUSTER_CHART = ROOT / "charts" / "elastic-job-cluster"
CLUSTER_RELEASE = "elastic-job-cluster"
CLUSTER_NAMESPACE = "monitoring"
#: Its values before the user's --cluster-set: the PodMonitor and the PrometheusRule
#: rendered, a 1 s scrape, and the alerts' durations cut from the minutes a cluster needs to
#: the seconds a local run lasts.
LOCAL_CLUSTER_VALUES: tuple[str, ...] = (
    "podMonitor.enabled=true",
    "podMonitor.interval=1s",
    "prometheusRule.enabled=true",
    "prometheusRule.rendezvousOnGpuNode.for=5s",
    "prometheusRule.worldSizeBelowMin.for=10s",
    "prometheusRule.restartStorm.window=2m",
    "prometheusRule.rendezvousFlapping.window=5m",
    "prometheusRule.trainingStalled.window=30s",
    "prometheusRule.trainingStalled.for=10s",
)
#: Rule evaluation interval (the scrape interval is the PodMonitor's).
EVALUATION_INTERVAL = "1s"
#: prometheus-operator drops pods in these phases from a PodMonitor's targets.
_DONE_PHASES = frozenset({"Succeeded", "Failed"})
READY_TIMEOUT = 30.0


class PrometheusError(RuntimeError):
    """Prometheus cannot run; the message says why and what to do."""


@dataclass(frozen=True)
class ScrapeEndpoint:
    """One podMetricsEndpoint of a rendered PodMonitor."""

    job: str  # "<namespace>/<name>": the target's job label, as prometheus-operator sets it
    # namespaceSelector.matchNames (none: the PodMonitor's own); () with `any: true`: all
    namespaces: tuple[str, ...]
    match_labels: Mapping[str, str]
    port: str
    path: str
    scheme: str
    interval: str
    honor_labels: bool

    @property
    def scrape_job(self) -> str:
        """The scrape config's name, one per endpoint (as the operator names them)."""
        return f"podMonitor/{self.job}"

    @property
    def targets_file(self) -> str:
        return self.job.replace("/", "_") + ".json"


@dataclass(frozen=True)
class PodView:
    """What pod discovery sees of a pod."""

    name: str
    namespace: str
    phase: str  # the Kubernetes phase (Pending, Running, Succeeded, Failed)
    ip: str
    labels: Mapping[str, str]
    containers: tuple[Obj, ...]  # the pod spec's containers


def pod_view(obj: Obj) -> PodView:
    """A pod as the API server serves it (`kubectl get pod -o json`)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return PodView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        phase=str(status.get("phase", "")),
        ip=str(status.get("podIP", "")),
        labels=dict(meta.get("labels") or {}),
        containers=tuple(spec.get("containers") or ()),
    )


def scrape_endpoints(objects: Iterable[Obj], interval: str = "30s") -> list[ScrapeEndpoint]:
    """Every podMetricsEndpoint of every rendered PodMonitor (monitoring.coreos.com)."""
    found: list[ScrapeEndpoint] = []
    for o in objects:
        if o.get("kind") != "PodMonitor" or not str(o.get("apiVersion", "")).startswith(
            "monitoring.coreos.com/"
        ):
            continue
        meta, spec = o.get("metadata") or {}, o.get("spec") or {}
        namespace = str(meta.get("namespace", "default"))
        selector = spec.get("namespaceSelector") or {}
        names = [] if selector.get("any") else selector.get("matchNames") or [namespace]
        labels = (spec.get("selector") or {}).get("matchLabels") or {}
        for ep in spec.get("podMetricsEndpoints") or []:
            found.append(
                ScrapeEndpoint(
                    job=f"{namespace}/{meta.get('name', '')}",
                    namespaces=tuple(str(n) for n in names),
                    match_labels={str(k): str(v) for k, v in labels.items()},
                    port=str(ep.get("port", "")),
                    path=str(ep.get("path", "/metrics")),
                    scheme=str(ep.get("scheme", "http")),
                    interval=str(ep.get("interval", interval)),
                    honor_labels=bool(ep.get("honorLabels", False)),
                )
            )
    return found


def render_cluster(sets: Iterable[str] = ()) -> list[Obj]:
    """charts/elastic-job-cluster's objects with LOCAL_CLUSTER_VALUES, then `sets`."""
    return render(
        CLUSTER_CHART,
        [],
        [*LOCAL_CLUSTER_VALUES, *sets],
        release=CLUSTER_RELEASE,
        namespace=CLUSTER_NAMESPACE,
    ).objects


def rule_groups(objects: Iterable[Obj]) -> list[Obj]:
    """The groups of every rendered PrometheusRule, as a Prometheus rules file holds them."""
    groups: list[Obj] = []
    for o in objects:
        if o.get("kind") == "PrometheusRule":
            groups += (o.get("spec") or {}).get("groups") or []
    return groups


def check_metrics_served(statefulsets: Iterable[Obj]) -> None:
    """PrometheusError unless the rendered workers serve a `metrics` port (the release's
    monitoring.enabled): without one Prometheus would scrape nothing, the whole run long."""
    for sts in statefulsets:
        template = (sts.get("spec") or {}).get("template") or {}
        if not chart.is_worker((template.get("metadata") or {}).get("labels") or {}):
            continue  # the etcd pod serves metrics of its own
        if _port((template.get("spec") or {}).get("containers") or (), "metrics") is not None:
            return
    raise PrometheusError(
        "--prometheus: no pod serves metrics (monitoring.enabled=false): drop that --set, "
        "or drop --prometheus"
    )


def _port(containers: Iterable[Obj], name: str) -> tuple[str, int] | None:
    for c in containers:
        for p in c.get("ports") or []:
            if p.get("name") == name:
                return str(c.get("name", "")), int(p["containerPort"])
    return None


def targets(ep: ScrapeEndpoint, pods: Iterable[PodView]) -> list[Obj]:
    """The file_sd target groups of `ep` for the pods as they are now."""
    groups: list[Obj] = []
    for p in sorted(pods, key=lambda p: p.name):
        if not p.ip or p.phase in _DONE_PHASES:
            continue
        if ep.namespaces and p.namespace not in ep.namespaces:
            continue
        if any(p.labels.get(k) != v for k, v in ep.match_labels.items()):
            continue
        port = _port(p.containers, ep.port)
        if port is None:
            continue
        container, number = port
        labels = {
            "namespace": p.namespace,
            "pod": p.name,
            "container": container,
            "endpoint": ep.port,
            "job": ep.job,
        }
        groups.append({"targets": [f"{p.ip}:{number}"], "labels": labels})
    return groups


def config(
    endpoints: Iterable[ScrapeEndpoint],
    targets_dir: Path,
    rules_file: Path,
    static: Mapping[str, str] | None = None,
) -> Obj:
    """prometheus.yml: one scrape job per endpoint, its targets from a file_sd file; one per
    `static` entry (job name -> address, e.g. the kube-state-metrics stand-in), honorLabels."""
    fixed = [
        {
            "job_name": job,
            "honor_labels": True,
            "scrape_interval": EVALUATION_INTERVAL,
            "static_configs": [{"targets": [address]}],
        }
        for job, address in sorted((static or {}).items())
    ]
    return {
        "global": {"evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [str(rules_file)],
        "scrape_configs": fixed
        + [
            {
                "job_name": ep.scrape_job,
                "honor_labels": ep.honor_labels,
                "metrics_path": ep.path,
                "scheme": ep.scheme,
                "scrape_interval": ep.interval,
                "scrape_timeout": ep.interval,
                "file_sd_configs": [
                    {"files": [str(targets_dir / ep.targets_file)], "refresh_interval": "1s"}
                ],
            }
            for ep in endpoints
        ],
    }


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Prometheus:
    """The `prometheus` binary for one run: config, rules and targets under `directory`."""

    def __init__(
        self,
        directory: Path,
        endpoints: list[ScrapeEndpoint],
        groups: list[Obj],
        *,
        host: str = "127.0.0.1",
        binary: str | None = None,
        static: Mapping[str, str] | None = None,
    ) -> None:
        found = binary or shutil.which("prometheus")
        if found is None:
            raise PrometheusError(
                "--prometheus: the prometheus binary is not installed: "
                "apt-get install prometheus (or run scripts/bootstrap)"
            )
        if not endpoints:
            raise PrometheusError(
                "--prometheus: no PodMonitor was rendered: keep elastic-job-cluster's "
                "podMonitor.enabled=true (elastic-local sets it; --cluster-set), or set the "
                "release's monitoring.podMonitor.enabled=true"
            )
        self.binary = found
        self.directory = directory
        self.endpoints = endpoints
        self.groups = groups
        self.host = host
        self.static = dict(static or {})
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._written: dict[str, list[Obj]] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        d = self.directory
        (d / "targets").mkdir(parents=True, exist_ok=True)
        rules = d / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": self.groups}, sort_keys=False))
        for ep in self.endpoints:
            self._write(ep, [])
        cfg = d / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config(self.endpoints, d / "targets", rules, self.static)))
        self.port = _free_port(self.host)
        argv = [
            self.binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=1d",
        ]
        with open(d / "prometheus.log", "ab") as logfile:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                # Killed with the runner, even by SIGKILL, as its containers are.
                preexec_fn=process._die_with(os.getpid()),  # noqa: PLW1509 - prctl, getppid
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.directory / "prometheus.log").read_text(errors="replace")[-600:]
                raise PrometheusError(
                    f"--prometheus: prometheus exited {self.proc.returncode}: {tail.strip()}"
                )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise PrometheusError(f"--prometheus: not ready after {READY_TIMEOUT:g}s ({self.url})")

    def update(self, pods: list[PodView]) -> None:
        """Rewrite each endpoint's targets file when its targets changed."""
        for ep in self.endpoints:
            groups = targets(ep, pods)
            if self._written.get(ep.targets_file) != groups:
                self._write(ep, groups)

    def _write(self, ep: ScrapeEndpoint, groups: list[Obj]) -> None:
        # Write then rename: file_sd never reads half a file.
        path = self.directory / "targets" / ep.targets_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        os.replace(tmp, path)
        self._written[ep.targets_file] = groups

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
