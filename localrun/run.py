"""One local run: render, start the fake API server and the pods, inject faults, feed the
run state, decide when the run is over, clean up everything, write the summary.

The run ends when
- the job is complete (the worker's marker in etcd) and every worker pod that ran has
  exited 0 since then (a pod restarted after completion exits 0 at once), or every worker
  StatefulSet was scaled to 0 and its pods are gone;
- or every worker pod failed `give_up_after` times in a row (the last worker lines say why);
- or `timeout` seconds passed; or the runner got SIGINT/SIGTERM.

The parts: runbase.py (configuration, exit codes, what the parts share), runsetup.py (the
setup), this module (the run and its loop), runend.py (completion, the end, the cleanup,
the summary).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from localrun import chart, prometheus
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.cluster import Cluster
from localrun.cluster.nodelifecycle import node_events
from localrun.cluster.nodes import internal_ip
from localrun.cluster.pod import Phase, Pod
from localrun.cluster.podobject import lifecycle_events, pod_object
from localrun.cluster.podspec import Container
from localrun.faults import Injector
from localrun.host.mountpoints import Mountpoints
from localrun.host.network import Network
from localrun.kubestate import KubeState
from localrun.render import ROOT
from localrun.runbase import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    RunConfig,
    SetupError,
)
from localrun.runend import End, Ending, end_of_run
from localrun.runsetup import Setup
from localrun.state import RunState
from localrun.view import Progress

log = logging.getLogger(__name__)

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "End",
    "RunConfig",
    "Runner",
    "SetupError",
    "end_of_run",
]


class Runner(Setup, Ending):
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.start = time.monotonic()
        self.progress = Progress(live=cfg.live, start=self.start)
        self.state = RunState(say=self.event, step_lines=not self.progress.live)
        self.progress.state = self.state
        self.job_id = ""
        self.rdzv_backend = "etcd-v2"
        self._stop_signal: int | None = None
        self._next_completion_check = 0.0
        self.api: FakeApiServer | None = None
        self.network: Network | None = None
        self.cluster: Cluster | None = None
        self.injector: Injector | None = None
        self.mountpoints = Mountpoints()
        self.client_tls: chart.ClientTls | None = None
        self.prometheus: prometheus.Prometheus | None = None
        self.kubestate: KubeState | None = None
        self._incarnations: dict[str, int] = {}
        self._published: dict[str, dict[str, Any]] = {}  # pods as last served, by name
        _remove_stale_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"elastic-local-e{os.getpid()}-"))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.outdir = cfg.output or ROOT / "out" / "elastic-local" / f"{stamp}-{os.getpid()}"

    def _rel(self, t: float | None = None) -> float:
        return (time.monotonic() if t is None else t) - self.start

    def event(self, text: str) -> None:
        log.debug("%s", text)
        self.progress.event(text)
        with contextlib.suppress(OSError), open(self.outdir / "events.log", "a") as fh:
            fh.write(f"{self._rel():8.2f} {text}\n")

    # -- the whole run -------------------------------------------------------------------

    def run(self) -> int:
        old = {
            s: signal.signal(s, self._on_signal)
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            self._setup()
            return self._loop()
        except SetupError as exc:
            self.state.error = str(exc)
            print(f"elastic-local: {exc}", file=sys.stderr)
            return exc.code
        except Interrupted:
            self.state.error = f"interrupted by signal {self._stop_signal}"
            return 128 + (self._stop_signal or 2)
        finally:
            for s in old:
                signal.signal(s, signal.SIG_IGN)  # no second interruption during cleanup
            self._cleanup()
            for s, h in old.items():
                signal.signal(s, h)
            self._write_summary()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    # -- the loop ------------------------------------------------------------------------

    def _loop(self) -> int:
        assert self.cluster is not None and self.injector is not None
        while True:
            if self._stop_signal is not None:
                raise Interrupted
            now = time.monotonic()
            self._drain()
            for f in self.injector.due(
                now, self._rel(now), self.state.step, self.state.step_world_size
            ):
                self.state.fault(self._rel(now), f.describe())
            for pod in self.injector.healed(now):
                self.state.pod_started(pod, self._rel(now), "link up")
            for node in self.injector.nodes_back(now):
                self.state.node(self._rel(now), node, "back")
            self.cluster.reconcile(now)
            self._publish_nodes()
            self._publish_pods()
            self._poll_completion(now)
            self.state.observe(self.cluster.pods(), self._partitioned, self.cluster.node_down)
            self.progress.draw()
            done = self._finished(now)
            if done is not None:
                return done
            time.sleep(0.1)

    def _publish_nodes(self) -> None:
        """The API server serves the Nodes as the control plane changed them."""
        assert self.cluster is not None and self.api is not None
        changed, deleted = self.cluster.node_lifecycle.take_changed()
        for event in node_events(self.api.nodes, changed):
            self.api.add_event(event)
            self.state.node(self._rel(), event["involvedObject"]["name"], event["reason"])
        for node in changed:
            self.api.set_node(node)
        for name in deleted:
            self.api.remove_node(name)
            self.state.node(self._rel(), name, "deleted")

    def _publish_pods(self) -> None:
        """The API server serves the pods as they are now (podobject.py)."""
        assert self.cluster is not None and self.api is not None
        owners = {n: s["metadata"]["uid"] for (_, n), s in self.api.statefulsets.items()}
        nodes = self.cluster.nodes
        pods = [
            pod_object(p, owners.get(p.sts.name, ""), internal_ip(nodes.get(p.node, {})))
            for p in self.cluster.pods()
            if p.phase != Phase.GONE
        ]
        for event in lifecycle_events(self._published, pods):
            self.api.add_event(event)
        self._published = {p["metadata"]["name"]: p for p in pods}
        self.api.publish_pods(self.cfg.namespace, pods)
        if self.prometheus is not None:
            # Pod discovery as a PodMonitor's: the pods as the API server serves them.
            self.prometheus.update([prometheus.pod_view(p) for p in pods])
        if self.kubestate is not None:
            self.kubestate.update(pods)
        # Read by the API server's threads: replaced whole, never changed in place.
        self._incarnations = {p.name: p.incarnation for p in self.cluster.pods()}

    def _log_source(self, namespace: str, pod: str, container: str) -> tuple[Path, int] | None:
        """The log file of a pod's container and the pod's incarnation (the API server's
        pods/log reads the current incarnation's runs from it)."""
        incarnation = self._incarnations.get(pod)
        if incarnation is None or namespace != self.cfg.namespace:
            return None
        return self.outdir / "logs" / pod / f"{container}.log", incarnation

    def _pending(self) -> Iterator[tuple[Any, ...]]:
        """The events queued so far, without waiting for more."""
        while True:
            try:
                yield self.events.get_nowait()
            except queue.Empty:
                return

    def _drain(self) -> None:
        assert self.cluster is not None
        for item in self._pending():
            if item[0] == "line":
                _, pod, container, line, t = item
                self.state.line(pod, container, line, self._rel(t))
            elif item[0] == "evict":
                self._evict(item[2])
            elif item[0] == "delete":
                _, _ns, name, grace, uid = item
                self._delete(name, grace, uid)
            elif item[0] == "scale":
                _, _ns, name, replicas = item
                self.event(f"API: scale statefulset {name} to {replicas}")
                self.cluster.scale(name, int(replicas))

    def _evict(self, name: str) -> None:
        """An eviction through the API (kubectl drain): the pod is deleted, with the
        DisruptionTarget condition the eviction API sets; its StatefulSet recreates it."""
        assert self.cluster is not None
        pod = self.cluster.pod(name)
        if pod is None or pod.deleting:
            return
        self.event(f"API: evict pod {name}")
        self.state.fault(self._rel(), f"evict {name}")
        why = ("EvictionByEvictionAPI", "Eviction API: evicting")
        self.cluster.delete(pod, time.monotonic(), why=why)

    def _delete(self, name: str, grace: int | None, uid: str) -> None:
        """A DELETE through the API (the incarnation it named: a newer one is left alone);
        grace 0 removes it from the API at once, as `kubectl delete --force --grace-period=0`."""
        assert self.cluster is not None
        pod = self.cluster.pod(name)
        if pod is None or pod.uid != uid:
            return
        how = "force " if grace == 0 else ""
        self.event(f"API: {how}delete pod {name} (on {pod.node or 'no node'})")
        self.state.fault(self._rel(), f"{how}delete {name}")
        self.cluster.delete(pod, time.monotonic(), why=None, grace=grace)

    def _partitioned(self, pod: str) -> bool:
        pn = self.network.sandbox(pod) if self.network is not None else None
        return pn is not None and not pn.up

    def _container_started(self, pod: Pod, c: Container) -> None:
        if not pod.in_init and chart.is_worker(pod.labels):
            self.state.pod_started(pod.name, self._rel())
            self.job_id = self.job_id or chart.job_id(pod.env)
            self.rdzv_backend = chart.rdzv_backend(pod.env)
        what = "init container" if pod.in_init else "container"
        self.event(f"{pod.name}: {what} {c.name} started on {pod.node} ({pod.ip})")

    def _container_exited(self, pod: Pod, c: Container, rc: int, now: float) -> None:
        if not pod.in_init:
            self.state.exited(pod.name, rc)
            # The worker sets the marker before it exits 0: read it now, so that this
            # exit counts as one after completion.
            if rc == 0 and chart.is_worker(pod.labels) and not self.state.completed:
                self._check_completion(now)
        if pod.deleting:
            self.event(f"{pod.name}: {c.name} exited {rc}")


def _remove_stale_workdirs() -> None:
    """Temporary directories of runs that were SIGKILLed (their pid is gone)."""
    for d in Path(tempfile.gettempdir()).glob("elastic-local-e*-*"):
        pid = d.name.split("-")[2][1:]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            continue
