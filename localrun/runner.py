"""One local run: render, start the fake API server and the pods, inject faults, watch the
training log lines, decide when the run is over, clean up everything, write the summary.

The run ends when
- training completed (a `[train] done` line) and every worker pod that ran has exited 0
  since then (a pod restarted after completion exits 0 at once: the job is complete), or
  every worker StatefulSet was scaled to 0 and its pods are gone;
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
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from localrun import podspec
from localrun.apiserver import FakeApiServer, load_nodes
from localrun.controller import Cluster, ClusterConfig, Hooks, Phase, Pod
from localrun.faults import Fault, FaultKind, schedule
from localrun.network import LoopbackNetwork, Network, NetworkError
from localrun.podspec import Container
from localrun.process import Mountpoints
from localrun.progress import PodRow, Progress, parse_train_line
from localrun.render import ROOT, RenderError, render
from localrun.summary import PodSummary, Summary

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
    api_faults: list[tuple[str, int | str]] = field(default_factory=list)
    json_path: Path | None = None
    output: Path | None = None
    timeout: float = 1800.0
    backoff_base: float = 10.0
    backoff_cap: float = 300.0
    give_up_after: int = 5
    live: bool | None = None  # None: live view when stdout is a terminal
    loopback: bool = False  # force the no-root fallback


class Interrupted(Exception):
    pass


class Runner:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.summary = Summary()
        self.progress = Progress(live=cfg.live)
        self.start = time.monotonic()
        self.completed_at: float | None = None
        self.stop_reason = ""
        self.pod_last_lines: dict[str, list[str]] = {}
        self.job_id = ""
        self._stop_signal: int | None = None
        self._partitions: list[tuple[float, str]] = []
        self.api: FakeApiServer | None = None
        self.network: Network | None = None
        self.cluster: Cluster | None = None
        self.mountpoints = Mountpoints()
        _remove_stale_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"elastic-local-e{os.getpid()}-"))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.outdir = cfg.output or ROOT / "out" / "elastic-local" / f"{stamp}-{os.getpid()}"

    # -- setup -----------------------------------------------------------------------------

    def _rel(self, t: float | None = None) -> float:
        return (time.monotonic() if t is None else t) - self.start

    def event(self, text: str) -> None:
        log.debug("%s", text)
        self.progress.event(text)
        with contextlib.suppress(OSError), open(self.outdir / "events.log", "a") as fh:
            fh.write(f"{self._rel():8.2f} {text}\n")

    def run(self) -> int:
        old = {
            s: signal.signal(s, self._on_signal)
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            return self._run()
        except Interrupted:
            self.summary.error = f"interrupted by signal {self._stop_signal}"
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

    def _check_signal(self) -> None:
        if self._stop_signal is not None:
            raise Interrupted

    def _run(self) -> int:
        cfg = self.cfg
        self.outdir.mkdir(parents=True, exist_ok=True)
        try:
            rendered = render(
                cfg.chart, cfg.values, cfg.sets, release=cfg.release, namespace=cfg.namespace
            )
        except RenderError as exc:
            self.summary.error = str(exc)
            print(f"elastic-local: {exc}", file=sys.stderr)
            return EXIT_USAGE
        (self.outdir / "rendered.json").write_text(json.dumps(rendered.objects, indent=1))
        if not rendered.statefulsets:
            self.summary.error = "the chart rendered no StatefulSet"
            print(f"elastic-local: {self.summary.error}", file=sys.stderr)
            return EXIT_USAGE

        isolated = (
            not cfg.loopback
            and os.geteuid() == 0
            and shutil.which("unshare")
            and shutil.which("ip")
        )
        prefix = f"e{os.getpid()}"
        self.network = (
            Network(prefix, cfg.cluster_domain)
            if isolated
            else LoopbackNetwork(prefix, cfg.cluster_domain)
        )
        try:
            self.network.setup()
        except NetworkError as exc:
            self.summary.error = f"network setup failed: {exc}"
            print(f"elastic-local: {self.summary.error}", file=sys.stderr)
            return EXIT_FAILED
        self.event(self.network.describe())

        nodes = load_nodes(cfg.profile)
        # The token the pods get is the worker's service account (the fake has one identity).
        sa = next(
            (
                s["spec"]["template"]["spec"].get("serviceAccountName")
                for s in rendered.statefulsets
                if s["spec"]["template"]["spec"].get("serviceAccountName")
            ),
            "default",
        )
        self.api = FakeApiServer(
            nodes,
            host=self.network.host_ip,
            port=0,
            workdir=self.workdir / "api",
            namespace=cfg.namespace,
            serviceaccount=sa,
        )
        self.api.start()
        for code_path, status in cfg.api_faults:
            self.api.set_fault(code_path, status)  # type: ignore[arg-type]
        for sts in rendered.statefulsets:
            meta = sts["metadata"]
            self.api.add_statefulset(
                meta.get("namespace", cfg.namespace),
                meta["name"],
                int(sts["spec"].get("replicas", 1)),
                sts,
            )
        self.api.on_scale = lambda ns, name, replicas: self.events.put(
            ("scale", ns, name, replicas)
        )
        self.event(f"fake API server {self.api.url} with {len(nodes)} nodes ({cfg.profile})")

        ccfg = ClusterConfig(
            namespace=cfg.namespace,
            domain=cfg.cluster_domain,
            workdir=self.workdir,
            logdir=self.outdir / "logs",
            repo_root=ROOT,
            path_env=":".join(
                [str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin"), SYSTEM_PATH]
            ),
            api_env=self.api.env(),
            serviceaccount_dir=self.api.serviceaccount_dir,
            backoff_base=cfg.backoff_base,
            backoff_cap=cfg.backoff_cap,
        )
        hooks = Hooks(
            event=self.event,
            line=lambda pod, c, line, t: self.events.put(("line", pod, c, line, t)),
            container_started=self._container_started,
            container_exited=self._container_exited,
        )
        self.cluster = Cluster(
            ccfg,
            statefulsets=rendered.statefulsets,
            services=rendered.services,
            configmaps={n: podspec.configmap_data(o) for n, o in rendered.configmaps.items()},
            secrets={n: podspec.secret_data(o) for n, o in rendered.secrets.items()},
            service_accounts=rendered.service_accounts,
            nodes=nodes,
            network=self.network,
            mountpoints=self.mountpoints,
            hooks=hooks,
        )
        for pod_name in [
            f.target
            for f in cfg.faults
            if f.kind in (FaultKind.KILL, FaultKind.PREEMPT, FaultKind.PARTITION)
        ]:
            if not self._known_pod(pod_name):
                self.event(f"warning: no StatefulSet makes a pod named {pod_name!r}")
        return self._loop()

    def _known_pod(self, name: str) -> bool:
        assert self.cluster is not None
        for sts in self.cluster.sets.values():
            if name.startswith(sts.name + "-") and name[len(sts.name) + 1 :].isdigit():
                return True
        return False

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> int:
        assert self.cluster is not None
        pending = schedule(self.cfg.faults)
        while True:
            self._check_signal()
            now = time.monotonic()
            self._drain()
            step = self.progress.state.step
            for f in list(pending):
                due = (
                    step is not None and step >= f.at_step
                    if f.at_step is not None
                    else self._rel(now) >= f.at
                )
                if due:
                    pending.remove(f)
                    self._fire(f, now)
            for heal_at, pod in list(self._partitions):
                if now >= heal_at:
                    self._partitions.remove((heal_at, pod))
                    assert self.network is not None
                    self.network.set_link(pod, True)
                    self.event(f"{pod}: link up (partition over)")
                    self.summary.pod_started(pod, self._rel(now), "link up")
            self.cluster.reconcile(now)
            self._refresh_view()
            done = self._finished(now)
            if done is not None:
                return done
            time.sleep(0.1)

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
                self._line(*item[1:])
            elif item[0] == "scale":
                _, _ns, name, replicas = item
                self.event(f"API: scale statefulset {name} to {replicas}")
                self.cluster.scale(name, int(replicas))

    def _line(self, pod: str, container: str, line: str, t: float) -> None:
        ev = parse_train_line(line)
        st = self.progress.state
        row = st.pods.get(pod)
        if ev is None:
            text = line.strip()
            if text.startswith("elastic-worker:") or (
                container not in {"worker", "etcd"}
                and any(w in text.lower() for w in ("warn", "error", "fail"))
            ):
                last = self.pod_last_lines.setdefault(pod, [])
                last.append(text)
                del last[:-5]
                if row is not None:
                    row.message = text[:80]
                self.event(f"{pod}: {text}")
            elif container == "worker" and ("Error" in text or "error:" in text):
                last = self.pod_last_lines.setdefault(pod, [])
                last.append(text)
                del last[:-5]
            return
        self.summary.train(pod, self._rel(t), ev)
        if row is not None and ev.kind == "step":
            row.step = ev.step
        if ev.kind == "step":
            if ev.world_size is not None and ev.world_size != st.world_size:
                was = "-" if st.world_size is None else st.world_size
                self.event(f"world size {was} -> {ev.world_size} (step {ev.step})")
                st.world_size = ev.world_size
            if st.step is None or ev.step > st.step:
                st.step = ev.step
                if not self.progress.live:
                    self.event(f"step {ev.step} world size {ev.world_size} round {st.round}")
        elif ev.kind == "checkpoint":
            if st.checkpoint != ev.step:
                self.event(f"checkpoint at step {ev.step}")
            st.checkpoint = ev.step
        elif ev.kind == "start":
            # train.py's rank 0 says it once per group; the agents start workers only
            # after a completed rendezvous round, restart or not (a node joining is not
            # a restart), so the summary counts these as the rounds.
            st.round = self.summary.rendezvous_rounds
            self.event(
                f"rendezvous round {st.round}: world size {ev.world_size}, "
                f"training from step {ev.step}"
            )
        elif ev.kind == "resumed":
            self.event(f"{pod}: resumed from step {ev.step}")
        elif ev.kind == "sigterm":
            self.event(f"{pod}: SIGTERM handled at step {ev.step} (checkpoint taken)")
        elif ev.kind == "done" and self.completed_at is None:
            self.completed_at = t
            st.completed = True
            self.event(f"training complete at step {ev.step}")

    def _container_started(self, pod: Pod, c: Container) -> None:
        if not pod.in_init and pod.is_worker:
            self.summary.pod_started(pod.name, self._rel())
            self.job_id = self.job_id or pod.env.get("ELASTIC_JOB_ID", "")
        what = "init container" if pod.in_init else "container"
        self.event(
            f"{pod.name}: {what} {c.name} started on {pod.node} ({pod.net.ip if pod.net else ''})"
        )

    def _container_exited(self, pod: Pod, c: Container, rc: int) -> None:
        ps = self.summary.pods.setdefault(pod.name, _pod_summary())
        ps.node = pod.node
        if not pod.in_init:
            ps.exit_code = rc
            row = self.progress.state.pods.get(pod.name)
            if row is not None:
                row.last_exit = rc
        if pod.deleting:
            self.event(f"{pod.name}: {c.name} exited {rc}")

    def _fire(self, f: Fault, now: float) -> None:
        assert self.cluster is not None and self.network is not None
        desc = f.describe()
        self.event(f"FAULT {desc} (at {f.when()})")
        self.summary.fault(self._rel(now), desc)
        if f.kind is FaultKind.SCALE:
            sts = self.cluster.find_set(f.target)
            if sts is None:
                self.event(f"fault {desc}: no StatefulSet or worker group named {f.target!r}")
                return
            assert f.replicas is not None
            if not self._scale_via_api(sts.namespace, sts.name, f.replicas):
                self.cluster.scale(sts.name, f.replicas)
            return
        if f.kind is FaultKind.RESTART_RENDEZVOUS:
            targets = [p for p in self.cluster.pods() if p.sts.is_rendezvous]
            if not targets:
                self.event("fault restart-rendezvous: no rendezvous pod")
            for p in targets:
                self.cluster.delete(p, now, recreate=True)
            return
        pod = self._find_pod(f.target)
        if pod is None:
            self.event(f"fault {desc}: no pod {f.target!r} exists now")
            return
        if f.kind is FaultKind.KILL:
            self.cluster.kill(pod, now, down=f.duration or 0.0)
        elif f.kind is FaultKind.PREEMPT:
            self.cluster.delete(pod, now, recreate=True, down=f.duration or 0.0)
        elif f.kind is FaultKind.PARTITION:
            self.network.set_link(pod.name, False)
            self.event(f"{pod.name}: link down")
            if f.duration is not None:
                self._partitions.append((now + f.duration, pod.name))

    def _find_pod(self, name: str) -> Pod | None:
        assert self.cluster is not None
        pod = self.cluster.pod(name)
        if pod is not None:
            return pod
        cands = [p for p in self.cluster.pods() if p.name.endswith("-" + name)]
        return cands[0] if len(cands) == 1 else None

    def _scale_via_api(self, ns: str, name: str, replicas: int) -> bool:
        """As `kubectl scale` would: a merge PATCH of the scale subresource."""
        assert self.api is not None
        ctx = ssl.create_default_context(cafile=str(self.api.ca_path))
        req = urllib.request.Request(
            f"{self.api.url}/apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale",
            data=json.dumps({"spec": {"replicas": replicas}}).encode(),
            method="PATCH",
            headers={
                "Authorization": f"Bearer {self.api.token}",
                "Content-Type": "application/merge-patch+json",
            },
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError) as exc:
            self.event(f"scale through the API failed ({exc}); scaling directly")
            return False

    def _refresh_view(self) -> None:
        assert self.cluster is not None
        st = self.progress.state
        names = set()
        for p in self.cluster.pods():
            names.add(p.name)
            row = st.pods.get(p.name)
            if row is None:
                row = st.pods[p.name] = PodRow(p.name)
            phase = p.phase.value
            if p.net is not None and not p.net.up:
                phase = "Partitioned"
            row.phase = phase
            row.node = p.node
            row.ip = p.net.ip if p.net else ""
            row.restarts = p.restarts
            row.last_exit = p.last_exit
            if p.message:
                row.message = p.message
            ps = self.summary.pods.setdefault(p.name, _pod_summary())
            ps.restarts = p.restarts
            ps.recreated = p.incarnation - 1
            ps.node = p.node or ps.node
        for name in list(st.pods):
            if name not in names:
                st.pods[name].phase = "Deleted"
        self.progress.draw()

    def _finished(self, now: float) -> int | None:
        assert self.cluster is not None
        if self._rel(now) > self.cfg.timeout:
            self.summary.error = f"timed out after {self.cfg.timeout:g}s"
            self.event(self.summary.error)
            return EXIT_FAILED
        worker_sets = [s for s in self.cluster.sets.values() if s.is_worker]
        workers = [p for p in self.cluster.pods() if p.is_worker]
        if self.completed_at is not None:
            ran = [p for p in workers if p.main_started or p.proc is not None]
            if all(s.replicas == 0 for s in worker_sets) and not workers:
                self.event("training complete; every worker StatefulSet scaled to 0")
                return EXIT_OK
            if ran and all(
                p.zero_exit_at is not None
                and p.zero_exit_at >= self.completed_at
                and p.proc is None
                for p in ran
            ):
                self.event("training complete; every worker pod exited 0")
                return EXIT_OK
            return None
        if worker_sets and all(s.replicas == 0 for s in worker_sets) and not workers:
            self.summary.error = (
                "every worker StatefulSet was scaled to 0 before training completed"
            )
            self.event(self.summary.error)
            return EXIT_FAILED
        n = self.cfg.give_up_after
        placed = [p for p in workers if p.node]
        if n > 0 and placed and all(p.failures_in_row >= n for p in placed):
            last = {
                p.name: (self.pod_last_lines.get(p.name) or ["(no worker line)"])[-1]
                for p in placed
            }
            self.summary.error = f"every worker pod failed {n} times in a row; last: " + "; ".join(
                f"{k}: {v}" for k, v in last.items()
            )
            pending = [f"{p.name}: {p.message}" for p in workers if not p.node]
            if pending:
                self.summary.error += "; pending: " + "; ".join(pending)
            self.event(self.summary.error)
            return EXIT_FAILED
        return None

    # -- the end ---------------------------------------------------------------------------

    def _etcd_complete(self) -> bool | None:
        assert self.cluster is not None
        if not self.job_id:
            return None
        for p in self.cluster.pods():
            if p.sts.is_rendezvous and p.net is not None and p.phase == Phase.RUNNING:
                url = f"http://{p.net.ip}:2379/v2/keys/elastic-job/{self.job_id}/complete"
                try:
                    with urllib.request.urlopen(url, timeout=3) as resp:
                        return bool(resp.status == 200)
                except urllib.error.HTTPError as exc:
                    return False if exc.code == 404 else None
                except OSError:
                    return None
        return None

    def _cleanup(self) -> None:
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.summary.etcd_complete = self._etcd_complete()
            for p in self.cluster.pods():
                ps = self.summary.pods.setdefault(p.name, _pod_summary())
                ps.restarts = p.restarts
            try:
                for name, rc in self.cluster.stop_all(grace=3.0).items():
                    self.summary.pods.setdefault(name, _pod_summary()).exit_code = rc
            except Exception:  # cleanup goes on whatever failed
                log.exception("stopping pods failed")
        self._drain_lines_only()
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
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _drain_lines_only(self) -> None:
        for item in self._pending():
            if item[0] == "line":
                ev = parse_train_line(item[3])
                if ev is not None:
                    self.summary.train(item[1], self._rel(item[4]), ev)

    def _write_summary(self) -> None:
        self.summary.duration = self._rel()
        self.progress.finish()
        d = self.summary.as_dict()
        if self.cfg.json_path is not None:
            self.summary.write(self.cfg.json_path)
        with contextlib.suppress(OSError):
            self.summary.write(self.outdir / "summary.json")
        out = sys.stdout
        out.write("\n")
        out.write(f"completed:    {d['completed']}\n")
        out.write(f"final step:   {d['final_step']}\n")
        out.write(f"world sizes:  {' -> '.join(str(w) for w in d['world_sizes']) or '-'}\n")
        out.write(f"rounds:       {d['rendezvous_rounds']} (groups formed)\n")
        for r in d["reforms"]:
            secs = "-" if r["seconds"] is None else f"{r['seconds']:.1f}s"
            out.write(
                f"re-form:      {r['cause']}: world size {r['world_size']} after {secs}"
                f" (resumed at step {r['resumed_step']}, steps lost {r['steps_lost']})\n"
            )
        out.write(f"checkpoints:  {', '.join(str(s) for s in d['checkpoint_steps']) or '-'}\n")
        for name, p in d["pods"].items():
            out.write(f"pod:          {name}: exit {p['exit_code']}, restarts {p['restarts']}\n")
        if d["error"]:
            out.write(f"error:        {d['error']}\n")
        out.write(f"logs:         {self.outdir}\n")
        out.flush()


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


def _pod_summary() -> PodSummary:
    return PodSummary()
