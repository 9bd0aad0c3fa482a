"""One local run: render, start the fake API server and the pods, inject faults, feed the
run state, decide when the run is over, clean up everything, write the summary.

The run ends when
- the job is complete (the worker's marker in etcd) and every worker pod that ran has
  exited 0 since then (a pod restarted after completion exits 0 at once), or every worker
  StatefulSet was scaled to 0 and its pods are gone;
- or every worker pod failed `give_up_after` times in a row (the last worker lines say why);
- or `timeout` seconds passed; or the runner got SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from elastic_worker import completion
from elastic_worker.config import KubeApi

from localrun import chart, prometheus
from localrun.cluster import certmanager, podspec
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.apiserver import Fault as ApiFault
from localrun.cluster.cluster import Cluster
from localrun.cluster.kubelet import KubeletConfig, PodEvents
from localrun.cluster.nodes import internal_ip, load_nodes
from localrun.cluster.pod import Phase, Pod
from localrun.cluster.podobject import lifecycle_events, pod_object
from localrun.cluster.podspec import Container
from localrun.cluster.statefulset import StatefulSet
from localrun.cluster.volumes import VolumeSources
from localrun.faults import Fault, Injector
from localrun.host.mountpoints import Mountpoints
from localrun.host.network import LoopbackNetwork, Network, NetworkError
from localrun.host.runtime import HostRuntime
from localrun.kubestate import KubeState
from localrun.render import ROOT, Rendered, RenderError, render
from localrun.state import RunState
from localrun.view import Progress, summary_text

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Seconds between reads of the completion marker while the job runs.
COMPLETION_POLL = 2.0


@dataclass
class RunConfig:
    chart: Path
    values: list[Path]
    sets: list[str]
    release: str = "demo"
    namespace: str = "default"
    profile: str = "local"
    cluster_domain: str = "cluster.local"
    faults: list[Fault] = field(default_factory=list)
    api_faults: list[tuple[str, ApiFault]] = field(default_factory=list)
    json_path: Path | None = None
    output: Path | None = None
    timeout: float = 1800.0
    backoff_base: float = 10.0
    backoff_cap: float = 300.0
    give_up_after: int = 5
    live: bool | None = None  # None: live view when stdout is a terminal
    loopback: bool = False  # force the no-root fallback
    linger: float = 0.0  # seconds the API server stays up after the end
    prometheus: bool = False  # run Debian's prometheus on the pods (localrun/prometheus.py)
    cluster_sets: list[str] = field(default_factory=list)  # --cluster-set, with --prometheus


class Interrupted(Exception):
    pass


class SetupError(Exception):
    """Setup failed; the message is the run's error, the code its exit."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Runner:
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

    # -- setup ---------------------------------------------------------------------------

    def _setup(self) -> None:
        cfg = self.cfg
        self.outdir.mkdir(parents=True, exist_ok=True)
        sets = cfg.sets
        if cfg.prometheus:
            # Ours first: a user's own --set of the same key wins.
            sets = [*prometheus.LOCAL_VALUES, *cfg.sets]
            self.event("--prometheus: rendering with " + ", ".join(prometheus.LOCAL_VALUES))
        try:
            rendered = render(
                cfg.chart, cfg.values, sets, release=cfg.release, namespace=cfg.namespace
            )
        except RenderError as exc:
            raise SetupError(str(exc), EXIT_USAGE) from None
        (self.outdir / "rendered.json").write_text(json.dumps(rendered.objects, indent=1))
        if not rendered.statefulsets:
            raise SetupError("the chart rendered no StatefulSet", EXIT_USAGE)
        self._issue_certificates(rendered)
        self.network = self._network()
        nodes = load_nodes(cfg.profile)
        self.api = self._api_server(rendered, nodes, self.network.host_ip)
        self.cluster = self._cluster(rendered, nodes, self.network, self.api)
        if cfg.prometheus:
            self.prometheus = self._prometheus(rendered, self._render_cluster(), nodes)
        self.injector = Injector(
            cfg.faults,
            self.cluster,
            self.network,
            event=self.event,
            scale=self._scale_via_api,
        )
        for name in self.injector.unknown_pods():
            self.event(f"warning: no StatefulSet makes a pod named {name!r}")

    def _issue_certificates(self, rendered: Rendered) -> None:
        """The cluster's CA (made per run) issues every Certificate's Secret, as
        cert-manager would, and the TLS Secrets a user would bring; the run keeps a client
        certificate of its own for etcd."""
        present = set(rendered.secrets) | {
            c.get("spec", {}).get("secretName", "") for c in rendered.certificates
        }
        certificates = rendered.certificates + chart.brought_certificates(
            rendered.statefulsets, present
        )
        if not certificates:
            return
        try:
            ca = certmanager.CertificateAuthority(self.workdir / "pki")
            issued = certmanager.issue_all(ca, certificates)
            own = ca.sign("elastic-local", "elastic-local", [], ["client auth"])
        except certmanager.CertificateError as exc:
            raise SetupError(str(exc), EXIT_FAILED) from None
        for name, secret in issued.items():
            rendered.secrets.setdefault(name, secret)
            self.event(f"certificate issued: Secret {name}")
        self.client_tls = chart.ClientTls(ca.crt, own.crt, own.key)

    def _render_cluster(self) -> list[dict[str, Any]]:
        """charts/elastic-job-cluster as an admin installs it once: the PodMonitor and the
        alerts for every job."""
        sets = self.cfg.cluster_sets
        self.event(
            f"--prometheus: {prometheus.CLUSTER_RELEASE} in {prometheus.CLUSTER_NAMESPACE} with "
            + ", ".join([*prometheus.LOCAL_CLUSTER_VALUES, *sets])
        )
        try:
            objects = prometheus.render_cluster(sets)
        except RenderError as exc:
            raise SetupError(f"charts/elastic-job-cluster: {exc}", EXIT_USAGE) from None
        (self.outdir / "rendered-cluster.json").write_text(json.dumps(objects, indent=1))
        return objects

    def _prometheus(
        self, rendered: Rendered, cluster: list[dict[str, Any]], nodes: dict[str, Any]
    ) -> prometheus.Prometheus:
        """Debian's prometheus on 127.0.0.1, scraping the pods over the run's bridge (the
        cluster chart's PodMonitor, and the release's own if it has one) with the cluster
        chart's alerts, and a kube-state-metrics stand-in for the pods and Nodes the API
        server serves."""
        if isinstance(self.network, LoopbackNetwork):
            raise SetupError(
                "--prometheus needs network namespaces (run as root, without --loopback): "
                "without them every pod would serve its metrics on this machine's one port",
                EXIT_USAGE,
            )
        self.kubestate = KubeState(nodes)
        try:
            prometheus.check_metrics_served(rendered.statefulsets)
            prom = prometheus.Prometheus(
                self.outdir / "prometheus",
                prometheus.scrape_endpoints([*cluster, *rendered.objects]),
                prometheus.rule_groups([*cluster, *rendered.objects]),
                static={"kube-state-metrics": self.kubestate.start()},
            )
            self.prometheus = prom  # stopped at the end even if it fails to get ready
            prom.start()
        except prometheus.PrometheusError as exc:
            raise SetupError(str(exc), EXIT_FAILED) from None
        rules = sum(len(g.get("rules") or []) for g in prom.groups)
        self.state.prometheus_url = prom.url
        self.event(f"prometheus {prom.url} ({rules} alert rules; data in {prom.directory})")
        return prom

    def _network(self) -> Network:
        isolated = (
            not self.cfg.loopback
            and os.geteuid() == 0
            and shutil.which("unshare")
            and shutil.which("ip")
        )
        prefix = f"e{os.getpid()}"
        domain = self.cfg.cluster_domain
        network = Network(prefix, domain) if isolated else LoopbackNetwork(prefix, domain)
        self.network = network  # torn down at the end even if setup fails half-way
        try:
            network.setup()
        except NetworkError as exc:
            raise SetupError(f"network setup failed: {exc}", EXIT_FAILED) from None
        self.event(network.describe())
        return network

    def _api_server(self, rendered: Rendered, nodes: dict[str, Any], host: str) -> FakeApiServer:
        cfg = self.cfg
        api = FakeApiServer(
            nodes,
            host=host,
            port=0,
            workdir=self.workdir / "api",
            namespace=cfg.namespace,
            serviceaccount=chart.service_account(rendered.statefulsets),
        )
        self.api = api
        api.start()
        for path, status in cfg.api_faults:
            api.set_fault(path, status)
        for sts in rendered.statefulsets:
            meta = sts["metadata"]
            replicas = int(sts["spec"].get("replicas", 1))
            api.add_statefulset(meta.get("namespace", cfg.namespace), meta["name"], replicas, sts)
        api.on_scale = lambda ns, name, replicas: self.events.put(("scale", ns, name, replicas))
        api.log_source = self._log_source
        api.on_evict = lambda ns, name: self.events.put(("evict", ns, name))
        self.event(f"fake API server {api.url} with {len(nodes)} nodes ({cfg.profile})")
        # For kubectl and elastic-job on this machine: KUBECONFIG=<out>/kubeconfig.
        kubeconfig = self.outdir / "kubeconfig"
        kubeconfig.write_text(json.dumps(api.kubeconfig(cfg.namespace), indent=1))
        kubeconfig.chmod(0o600)
        self.event(f"kubeconfig for this run's API server: {kubeconfig}")
        return api

    def _cluster(
        self, rendered: Rendered, nodes: dict[str, Any], network: Network, api: FakeApiServer
    ) -> Cluster:
        cfg = self.cfg
        path = [str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin"), SYSTEM_PATH]
        base_env = {"PATH": ":".join(path), "HOME": "/root", "LANG": "C.UTF-8", **api.env()}
        sources = VolumeSources(
            workdir=self.workdir,
            configmaps={n: podspec.configmap_data(o) for n, o in rendered.configmaps.items()},
            secrets={n: podspec.secret_data(o) for n, o in rendered.secrets.items()},
            service_accounts=rendered.service_accounts,
            serviceaccount_dir=api.serviceaccount_dir,
            image_mounts=chart.image_mounts(ROOT),
        )
        kubelet = KubeletConfig(
            workdir=self.workdir,
            logdir=self.outdir / "logs",
            base_env=base_env,
            backoff_base=cfg.backoff_base,
            backoff_cap=cfg.backoff_cap,
        )
        events = PodEvents(
            event=self.event,
            line=lambda pod, c, line, t: self.events.put(("line", pod, c, line, t)),
            container_started=self._container_started,
            container_exited=self._container_exited,
        )
        return Cluster(
            statefulsets=rendered.statefulsets,
            services=rendered.services,
            nodes=nodes,
            runtime=HostRuntime(network, self.mountpoints),
            kubelet=kubelet,
            sources=sources,
            events=events,
            namespace=cfg.namespace,
            domain=cfg.cluster_domain,
        )

    # -- the loop ------------------------------------------------------------------------

    def _loop(self) -> int:
        assert self.cluster is not None and self.injector is not None
        while True:
            if self._stop_signal is not None:
                raise Interrupted
            now = time.monotonic()
            self._drain()
            for f in self.injector.due(now, self._rel(now), self.state.step):
                self.state.fault(self._rel(now), f.describe())
            for pod in self.injector.healed(now):
                self.state.pod_started(pod, self._rel(now), "link up")
            self.cluster.reconcile(now)
            self._publish_pods()
            self._poll_completion(now)
            self.state.observe(self.cluster.pods(), self._partitioned)
            self.progress.draw()
            done = self._finished(now)
            if done is not None:
                return done
            time.sleep(0.1)

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

    def _partitioned(self, pod: str) -> bool:
        pn = self.network.pods.get(pod) if self.network is not None else None
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

    # -- completion ----------------------------------------------------------------------

    def _completion_target(self) -> tuple[chart.Marker, str] | None:
        """The marker's URL on the running rendezvous pod and the name its certificate
        covers (None: no such pod, or no job id known yet)."""
        assert self.cluster is not None
        if not self.job_id:
            return None
        for p in self.cluster.pods():
            if chart.is_rendezvous(p.labels) and p.ip and p.phase == Phase.RUNNING:
                spec = p.sts.pod_spec
                ep = chart.client_endpoint(spec)
                port = chart.client_port(spec)
                marker = chart.completion_url(p.ip, port, self.job_id, ep.scheme, self.rdzv_backend)
                return marker, ep.server_name
        return None

    def _read_completion(self, timeout: float = 2.0) -> bool | None:
        """None also when no rendezvous pod runs."""
        target = self._completion_target()
        if target is None:
            return None
        url, name = target
        return chart.read_completion(url, timeout, tls=self.client_tls, server_name=name)

    def _check_completion(self, now: float) -> bool | None:
        running = self._completion_target() is not None
        found = self._read_completion()
        if found:
            self.state.etcd_complete = True
            self.state.complete(now, "completion marker set in etcd")
        elif not running and self._rendezvous_scaled_to_zero():
            # The worker that set the marker scales the etcd StatefulSet to 0 last (the
            # chart's scale-down), as elastic-worker itself reads it: the job is complete.
            found = True
            self.state.complete(now, "the job scaled its rendezvous StatefulSet to 0")
        return found

    def _rendezvous_scaled_to_zero(self) -> bool:
        assert self.cluster is not None
        sets = [s for s in self.cluster.sets.values() if chart.is_rendezvous(s.labels)]
        return bool(sets) and all(s.replicas == 0 for s in sets)

    def _poll_completion(self, now: float) -> None:
        if self.state.completed or now < self._next_completion_check:
            return
        self._next_completion_check = now + COMPLETION_POLL
        self._check_completion(now)

    # -- the end -------------------------------------------------------------------------

    def _finished(self, now: float) -> int | None:
        assert self.cluster is not None
        if self._rel(now) > self.cfg.timeout:
            return self._end(End(EXIT_FAILED, f"timed out after {self.cfg.timeout:g}s"))
        worker_sets = [s for s in self.cluster.sets.values() if chart.is_worker(s.labels)]
        workers = [p for p in self.cluster.pods() if chart.is_worker(p.labels)]
        scaled_to_zero = bool(worker_sets) and all(s.replicas == 0 for s in worker_sets)
        if scaled_to_zero and not workers and not self.state.completed:
            self._check_completion(now)  # the marker may be set since the last poll
        end = end_of_run(
            worker_sets,
            workers,
            self.state.completed_at,
            self.cfg.give_up_after,
            lambda pod: (self.state.pod(pod).last_lines or ["(no worker line)"])[-1],
        )
        return None if end is None else self._end(end)

    def _end(self, end: End) -> int:
        if end.code != EXIT_OK:
            self.state.error = end.message
        self.event(end.message)
        return end.code

    def _scale_via_api(self, ns: str, name: str, replicas: int) -> bool:
        """As `kubectl scale` would, with the worker's own request (elastic_worker.completion)."""
        assert self.api is not None
        api = KubeApi(base_url=self.api.url, token=self.api.token, ca_file=str(self.api.ca_path))
        try:
            completion.set_replicas(api, ns, name, replicas, timeout=10)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.event(f"scale through the API failed ({exc}); scaling directly")
            return False
        return True

    def _linger(self) -> None:
        """Keep serving the API (every pod gone) for `linger` seconds after the end, so
        that a client watching the job (elastic-job logs --save) sees how it ended, and
        Prometheus (its series and alerts) with it."""
        if self.cfg.linger > 0 and self.api is not None:
            self._publish_pods()
            also = " and prometheus" if self.prometheus is not None else ""
            self.event(f"the API server{also} stay up {self.cfg.linger:g}s (--linger)")
            time.sleep(self.cfg.linger)

    def _stop_monitoring(self) -> None:
        for part in (self.prometheus, self.kubestate):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()

    def _cleanup(self) -> None:
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.state.rendezvous_scaled_to_zero = self._rendezvous_scaled_to_zero()
                # A marker seen earlier stands: at the end etcd may be scaled to 0 already.
                found = self._read_completion(timeout=3)
                if found is not None or self.state.etcd_complete is None:
                    self.state.etcd_complete = found
            self.state.observe(self.cluster.pods(), self._partitioned)
            try:
                for name, rc in self.cluster.stop(grace=3.0).items():
                    self.state.exited(name, rc)
                self._linger()
            except Exception:  # cleanup goes on whatever failed
                log.exception("stopping pods failed")
        for item in self._pending():
            if item[0] == "line":
                _, pod, container, line, t = item
                self.state.line(pod, container, line, self._rel(t))
        if self.network is not None:
            try:
                self.network.teardown()
            except Exception:
                log.exception("network teardown failed")
        try:
            self.mountpoints.release_all()
        except Exception:
            log.exception("releasing mountpoints failed")
        if self.api is not None:
            with contextlib.suppress(Exception):
                self.api.stop()
        self._stop_monitoring()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_summary(self) -> None:
        self.state.duration = self._rel()
        self.progress.finish()
        if self.cfg.json_path is not None:
            self.state.write(self.cfg.json_path)
        with contextlib.suppress(OSError):
            self.state.write(self.outdir / "summary.json")
        sys.stdout.write(summary_text(self.state.as_dict(), self.outdir))
        sys.stdout.flush()


@dataclass(frozen=True)
class End:
    code: int  # the run's exit code
    message: str  # the last event; the summary's error when code is not EXIT_OK


def end_of_run(
    worker_sets: list[StatefulSet],
    workers: list[Pod],
    completed_at: float | None,
    give_up_after: int,
    last_line: Callable[[str], str],
) -> End | None:
    """Whether the run is over, from the worker StatefulSets and pods and the time the job
    was seen complete (time.monotonic(), None: not yet); None goes on."""
    scaled_to_zero = bool(worker_sets) and all(s.replicas == 0 for s in worker_sets)
    if completed_at is not None:
        if scaled_to_zero and not workers:
            return End(EXIT_OK, "training complete; every worker StatefulSet scaled to 0")
        ran = [p for p in workers if p.main_started or p.proc is not None]
        if ran and all(
            p.zero_exit_at is not None and p.zero_exit_at >= completed_at and p.proc is None
            for p in ran
        ):
            return End(EXIT_OK, "training complete; every worker pod exited 0")
        return None
    if scaled_to_zero and not workers:
        return End(
            EXIT_FAILED, "every worker StatefulSet was scaled to 0 before training completed"
        )
    placed = [p for p in workers if p.node]
    n = give_up_after
    if n <= 0 or not placed or any(p.failures_in_row < n for p in placed):
        return None
    last = "; ".join(f"{p.name}: {last_line(p.name)}" for p in placed)
    error = f"every worker pod failed {n} times in a row; last: {last}"
    pending = [f"{p.name}: {p.message}" for p in workers if not p.node]
    if pending:
        error += "; pending: " + "; ".join(pending)
    return End(EXIT_FAILED, error)


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
