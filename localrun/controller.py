"""The StatefulSet controller and the kubelet, for the rendered StatefulSets.

StatefulSet: Parallel pod management (every missing ordinal is created at once, extra ones
deleted at once, highest first), replicas changeable while running, a deleted pod is
recreated with the same name. Kubelet: init containers in order, then the container;
restartPolicy Always with exponential back-off (base, 2*base, ... capped, reset after the
container ran long enough); deletion is SIGTERM to PID 1, then SIGKILL after
terminationGracePeriodSeconds.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from localrun import podspec
from localrun.network import Network, PodNet, PodRecord, ServiceRecord, dns_table
from localrun.podspec import SERVICEACCOUNT_PATH, Container, PodIdentity, Volume
from localrun.process import BindMount, ContainerProcess, Mountpoints, container_argv
from localrun.scheduler import choose_node

log = logging.getLogger(__name__)

Obj = dict[str, Any]

COMPONENT = "app.kubernetes.io/component"
GROUP = "elastic-job.pytorch.org/group"
IMAGE_EXAMPLES = "/opt/elastic-worker/examples"


@dataclass
class Backoff:
    """CrashLoopBackOff: base, 2*base, 4*base ... up to cap; reset after a long run."""

    base: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0
    failures: int = 0

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.reset_after:
            self.failures = 0
        delay = float(min(self.cap, self.base * (2.0**self.failures)))
        self.failures += 1
        return delay


class Phase(str, Enum):
    PENDING = "Pending"
    INIT = "Init"
    RUNNING = "Running"
    BACKOFF = "CrashLoopBackOff"
    TERMINATING = "Terminating"
    GONE = "Gone"


@dataclass
class Pod:
    name: str
    sts: StatefulSet
    ordinal: int
    incarnation: int
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    phase: Phase = Phase.PENDING
    node: str = ""
    net: PodNet | None = None
    dir: Path | None = None
    proc: ContainerProcess | None = None
    step: int = 0  # index into init containers, then len(init) for the main container
    restarts: int = 0
    last_exit: int | None = None
    zero_exit_at: float | None = None  # last time the main container exited 0
    failures_in_row: int = 0
    main_started: bool = False
    next_start: float = 0.0
    deleting: bool = False
    kill_at: float | None = None
    recreate: bool = True
    down_until: float = 0.0
    message: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_worker(self) -> bool:
        return self.sts.is_worker

    @property
    def current(self) -> Container:
        init = self.sts.init_containers
        return init[self.step] if self.step < len(init) else self.sts.containers[0]

    @property
    def in_init(self) -> bool:
        return self.step < len(self.sts.init_containers)


class StatefulSet:
    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        meta = obj["metadata"]
        spec = obj["spec"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        self.replicas: int = int(spec.get("replicas", 1))
        self.service_name: str = spec.get("serviceName", "")
        self.template: Obj = spec["template"]
        self.pod_spec: Obj = self.template["spec"]
        self.labels: dict[str, str] = dict(self.template.get("metadata", {}).get("labels") or {})
        self.annotations: dict[str, str] = dict(
            self.template.get("metadata", {}).get("annotations") or {}
        )
        self.init_containers = [
            Container.from_obj(c) for c in self.pod_spec.get("initContainers") or []
        ]
        self.containers = [Container.from_obj(c) for c in self.pod_spec.get("containers") or []]
        if len(self.containers) > 1:
            log.warning(
                "StatefulSet %s has %d containers; the runner runs the first (%s)",
                self.name,
                len(self.containers),
                self.containers[0].name,
            )
        self.volumes = podspec.parse_volumes(self.pod_spec, spec.get("volumeClaimTemplates") or [])
        self.grace = podspec.grace_period(self.pod_spec)
        self.pods: dict[int, Pod] = {}
        self.incarnations: dict[int, int] = {}

    @property
    def is_worker(self) -> bool:
        return self.labels.get(COMPONENT) != "rendezvous" and (
            self.labels.get(COMPONENT) == "worker" or GROUP in self.labels
        )

    @property
    def is_rendezvous(self) -> bool:
        return self.labels.get(COMPONENT) == "rendezvous"

    @property
    def group(self) -> str:
        return self.labels.get(GROUP, self.name)


@dataclass
class Hooks:
    """What the controller tells the rest of the runner."""

    event: Callable[[str], None]
    line: Callable[[str, str, str, float], None]
    container_started: Callable[[Pod, Container], None]
    container_exited: Callable[[Pod, Container, int], None]


@dataclass
class ClusterConfig:
    namespace: str
    domain: str
    workdir: Path
    logdir: Path
    repo_root: Path
    path_env: str
    api_env: dict[str, str]
    serviceaccount_dir: Path | None
    backoff_base: float
    backoff_cap: float


class Cluster:
    """All StatefulSets with their pods on the nodes of a profile."""

    def __init__(
        self,
        cfg: ClusterConfig,
        *,
        statefulsets: list[Obj],
        services: list[Obj],
        configmaps: dict[str, dict[str, str]],
        secrets: dict[str, dict[str, str]],
        service_accounts: dict[str, Obj],
        nodes: dict[str, Obj],
        network: Network,
        mountpoints: Mountpoints,
        hooks: Hooks,
    ) -> None:
        self.cfg = cfg
        self.sets = {s["metadata"]["name"]: StatefulSet(s) for s in statefulsets}
        self.services = services
        self.configmaps = configmaps
        self.secrets = secrets
        self.service_accounts = service_accounts
        self.nodes = nodes
        self.network = network
        self.mountpoints = mountpoints
        self.hooks = hooks
        self._dns_dirty = True
        self.backoffs: dict[str, Backoff] = {}
        self._down: dict[str, float] = {}  # pod name -> no recreation before this time

    # -- queries ---------------------------------------------------------------------------

    def pods(self) -> list[Pod]:
        return [p for s in self.sets.values() for _, p in sorted(s.pods.items())]

    def pod(self, name: str) -> Pod | None:
        return next((p for p in self.pods() if p.name == name), None)

    def find_set(self, name_or_group: str) -> StatefulSet | None:
        if name_or_group in self.sets:
            return self.sets[name_or_group]
        matches = [s for s in self.sets.values() if s.group == name_or_group and s.is_worker]
        if len(matches) == 1:
            return matches[0]
        suffix = [s for s in self.sets.values() if s.name.endswith("-" + name_or_group)]
        return suffix[0] if len(suffix) == 1 else None

    # -- StatefulSet controller ------------------------------------------------------------

    def scale(self, name: str, replicas: int) -> None:
        sts = self.sets.get(name)
        if sts is None or sts.replicas == replicas:
            return
        self.hooks.event(f"statefulset {name}: replicas {sts.replicas} -> {replicas}")
        sts.replicas = replicas

    def reconcile(self, now: float) -> None:
        for sts in self.sets.values():
            for ordinal in range(sts.replicas):
                if ordinal not in sts.pods:
                    inc = sts.incarnations.get(ordinal, 0) + 1
                    sts.incarnations[ordinal] = inc
                    pod = Pod(f"{sts.name}-{ordinal}", sts, ordinal, inc)
                    if inc > 1:
                        pod.down_until = self._down.pop(pod.name, 0.0)
                    sts.pods[ordinal] = pod
                    self._dns_dirty = True
            for ordinal in sorted(sts.pods, reverse=True):
                pod = sts.pods[ordinal]
                if ordinal >= sts.replicas and not pod.deleting:
                    self.delete(pod, now, recreate=False)
        for pod in self.pods():
            self._sync(pod, now)
        if self._dns_dirty:
            self._write_dns()
            self._dns_dirty = False

    def delete(self, pod: Pod, now: float, recreate: bool = True, down: float = 0.0) -> None:
        """`kubectl delete pod`: SIGTERM now, SIGKILL after the grace period; the StatefulSet
        recreates it (after `down` seconds, e.g. while a reclaimed node is replaced)."""
        if pod.deleting:
            return
        pod.deleting = True
        pod.recreate = recreate
        if down:
            self._down[pod.name] = now + down
        pod.kill_at = now + pod.sts.grace
        if pod.proc is not None:
            pod.phase = Phase.TERMINATING
            pod.proc.terminate()
            self.hooks.event(f"{pod.name}: deleting (SIGTERM, grace {pod.sts.grace:g}s)")

    def kill(self, pod: Pod, now: float, down: float = 0.0) -> None:
        """SIGKILL every process of the pod's running container; the kubelet restarts it."""
        pod.down_until = max(pod.down_until, now + down)
        if pod.proc is not None:
            pod.proc.kill()

    # -- kubelet ---------------------------------------------------------------------------

    def _sync(self, pod: Pod, now: float) -> None:
        if pod.proc is not None:
            rc = pod.proc.poll()
            if rc is None:
                if pod.deleting and pod.kill_at is not None and now >= pod.kill_at:
                    self.hooks.event(f"{pod.name}: grace period over, SIGKILL")
                    pod.proc.kill()
                    pod.kill_at = None
                return
            self._exited(pod, rc, now)
        if pod.deleting:
            self._remove(pod)
            return
        if pod.phase == Phase.PENDING:
            if now < pod.down_until:
                pod.message = f"waiting for a node ({pod.down_until - now:.0f}s)"
                return
            if not self._schedule(pod):
                return
            self._start(pod, now)
            return
        if pod.phase == Phase.BACKOFF and now >= max(pod.next_start, pod.down_until):
            self._start(pod, now)

    def _schedule(self, pod: Pod) -> bool:
        placed: dict[str, list[Obj]] = {}
        for p in self.pods():
            if p.node and p is not pod:
                placed.setdefault(p.node, []).append(p.sts.pod_spec)
        node, why = choose_node(pod.sts.pod_spec, self.nodes, placed)
        if node is None:
            if pod.message != why:
                self.hooks.event(f"{pod.name}: unschedulable: {why}")
            pod.message = why
            return False
        pod.node = node
        pod.net = self.network.add_pod(pod.name, pod.incarnation)
        pod.dir = self.cfg.workdir / "pods" / f"{pod.name}-{pod.incarnation}"
        pod.dir.mkdir(parents=True, exist_ok=True)
        self._dns_dirty = True
        self._write_dns()
        self._dns_dirty = False
        self.hooks.event(f"{pod.name}: scheduled on {node}, ip {pod.net.ip}")
        return True

    def _exited(self, pod: Pod, rc: int, now: float) -> None:
        assert pod.proc is not None
        ran_for = now - pod.proc.started
        c = pod.current
        pod.proc = None
        self.hooks.container_exited(pod, c, rc)
        if pod.in_init:
            if rc == 0:
                pod.step += 1
                if not pod.deleting:
                    self._start(pod, now)
                return
            pod.failures_in_row += 1
            self.hooks.event(f"{pod.name}: init container {c.name} exited {rc}")
        else:
            pod.last_exit = rc
            if rc == 0:
                pod.zero_exit_at = now
                pod.failures_in_row = 0
            else:
                pod.failures_in_row += 1
        if pod.deleting:
            return
        backoff = self.backoffs.setdefault(
            pod.name, Backoff(self.cfg.backoff_base, self.cfg.backoff_cap)
        )
        delay = backoff.next_delay(ran_for)
        pod.next_start = now + delay
        pod.phase = Phase.BACKOFF
        wait = max(pod.next_start, pod.down_until) - now
        pod.message = f"{c.name} exited {rc}; restart in {wait:.0f}s"
        self.hooks.event(f"{pod.name}: {c.name} exited {rc}; back-off {wait:.0f}s")

    def _remove(self, pod: Pod) -> None:
        sts = pod.sts
        self.network.remove_pod(pod.name)
        if pod.dir is not None:
            _rmtree(pod.dir)
        pod.phase = Phase.GONE
        if sts.pods.get(pod.ordinal) is pod:
            del sts.pods[pod.ordinal]
        self.backoffs.pop(pod.name, None)
        self._dns_dirty = True
        self.hooks.event(f"{pod.name}: deleted")

    # -- starting containers ---------------------------------------------------------------

    def _identity(self, pod: Pod) -> PodIdentity:
        node = self.nodes.get(pod.node, {})
        host_ip = next(
            (
                a["address"]
                for a in (node.get("status") or {}).get("addresses") or []
                if a.get("type") == "InternalIP"
            ),
            self.network.host_ip,
        )
        labels = {**pod.sts.labels, "statefulset.kubernetes.io/pod-name": pod.name}
        labels["apps.kubernetes.io/pod-index"] = str(pod.ordinal)
        assert pod.net is not None
        return PodIdentity(
            name=pod.name,
            namespace=pod.sts.namespace,
            uid=pod.uid,
            node_name=pod.node,
            pod_ip=pod.net.ip,
            host_ip=host_ip,
            service_account=pod.sts.pod_spec.get("serviceAccountName") or "default",
            labels=labels,
            annotations=pod.sts.annotations,
            node_allocatable=(node.get("status") or {}).get("allocatable") or {},
        )

    def _start(self, pod: Pod, now: float) -> None:
        c = pod.current
        ident = self._identity(pod)
        base = {
            "PATH": self.cfg.path_env,
            "HOSTNAME": pod.name,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            **self.cfg.api_env,
        }
        containers = {x.name: x for x in pod.sts.init_containers + pod.sts.containers}
        try:
            env = podspec.resolve_env(
                c, ident, containers, configmaps=self.configmaps, secrets=self.secrets, base=base
            )
            argv = podspec.command_line(c, env)
            mounts = self._mounts(pod, c)
        except podspec.PodSpecError as exc:
            pod.phase = Phase.BACKOFF
            pod.next_start = now + 3600
            pod.message = f"CreateContainerConfigError: {exc}"
            self.hooks.event(f"{pod.name}: {pod.message}")
            return
        if self.network.isolated:
            for m in mounts:
                self.mountpoints.ensure(m.target)
        else:
            env, argv = _loopback_rewrite(env, argv, mounts, self._dns_table())
        full = container_argv(
            self.network.exec_prefix(pod.name), mounts, pod.name, c.working_dir, argv
        )
        if not pod.in_init and pod.main_started:
            pod.restarts += 1  # restartCount: counted when the container starts again
        logfile = self.cfg.logdir / pod.name / f"{c.name}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "a") as fh:
            fh.write(
                f"==== elastic-local: {c.name} start (pod incarnation {pod.incarnation}, "
                f"restarts {pod.restarts}) at {time.strftime('%H:%M:%S')} ====\n"
            )
        pod.proc = ContainerProcess(
            pod.name,
            c.name,
            full,
            env=env,
            log_path=logfile,
            on_line=self.hooks.line,
            namespaced=self.network.isolated,
        )
        pod.phase = Phase.INIT if pod.in_init else Phase.RUNNING
        pod.message = ""
        if not pod.in_init:
            pod.main_started = True
            pod.env = env
        self.hooks.container_started(pod, c)

    def _mounts(self, pod: Pod, c: Container) -> list[BindMount]:
        assert pod.dir is not None
        out: list[BindMount] = []
        targets: set[str] = set()
        for m in c.mounts:
            vol = pod.sts.volumes.get(m.volume)
            if vol is None:
                raise podspec.PodSpecError(f"volumeMount {m.volume!r} names no volume")
            src, tmpfs = self._volume_source(pod, vol)
            if m.sub_path and not tmpfs:
                src = src / m.sub_path
                src.mkdir(parents=True, exist_ok=True)
            out.append(BindMount(str(src) if not tmpfs else "", m.path, m.read_only, tmpfs))
            targets.add(m.path.rstrip("/"))
        wants_sa = podspec.wants_serviceaccount(pod.sts.pod_spec, self.service_accounts)
        if wants_sa and self.cfg.serviceaccount_dir and SERVICEACCOUNT_PATH not in targets:
            out.append(BindMount(str(self.cfg.serviceaccount_dir), SERVICEACCOUNT_PATH, True))
        examples = self.cfg.repo_root / "images" / "worker" / "examples"
        if examples.is_dir() and IMAGE_EXAMPLES not in targets:
            out.append(BindMount(str(examples), IMAGE_EXAMPLES, True))
        return out

    def _volume_source(self, pod: Pod, vol: Volume) -> tuple[Path, str]:
        assert pod.dir is not None
        if vol.kind == "emptyDir":
            if vol.medium == "Memory":
                size = podspec.quantity(vol.size_limit) if vol.size_limit else 2**30
                return Path(), str(int(size))
            d = pod.dir / "volumes" / vol.name
        elif vol.kind == "pvc":
            d = self.cfg.workdir / "pvc" / vol.claim
        elif vol.kind == "claimTemplate":
            d = self.cfg.workdir / "pvc" / f"{vol.claim}-{pod.name}"
        elif vol.kind == "hostPath":
            return Path(vol.source.get("path", "/")), ""
        elif vol.kind in ("configMap", "secret", "projected"):
            d = pod.dir / "volumes" / vol.name
            d.mkdir(parents=True, exist_ok=True)
            self._write_projection(vol, d)
            return d, ""
        else:
            raise podspec.PodSpecError(f"volume {vol.name!r}: kind not supported by the runner")
        d.mkdir(parents=True, exist_ok=True)
        return d, ""

    def _write_projection(self, vol: Volume, d: Path) -> None:
        sources: list[tuple[str, Obj]] = []
        if vol.kind in ("configMap", "secret"):
            sources.append((vol.kind, vol.source))
        else:
            for s in vol.source.get("sources") or []:
                sources.extend((k, v) for k, v in s.items())
        for kind, src in sources:
            if kind == "serviceAccountToken" and self.cfg.serviceaccount_dir:
                tok = self.cfg.serviceaccount_dir / "token"
                (d / src.get("path", "token")).write_text(tok.read_text())
                continue
            if kind not in ("configMap", "secret"):
                continue
            name = src.get("name") or src.get("secretName", "")
            data = (self.configmaps if kind == "configMap" else self.secrets).get(name)
            if data is None:
                if src.get("optional"):
                    continue
                raise podspec.PodSpecError(f"{kind} {name!r} is not rendered")
            items = src.get("items")
            pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
            for key, path in pairs:
                target = d / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data.get(key, ""))

    # -- DNS -------------------------------------------------------------------------------

    def _dns_table(self) -> dict[str, list[str]]:
        return dns_table(self._pod_records(), self._service_records(), self.cfg.domain)

    def _pod_records(self) -> list[PodRecord]:
        return [
            PodRecord(p.name, p.sts.namespace, p.net.ip, p.sts.service_name)
            for p in self.pods()
            if p.net is not None and p.phase != Phase.GONE
        ]

    def _service_records(self) -> list[ServiceRecord]:
        out = []
        for svc in self.services:
            sel = (svc.get("spec") or {}).get("selector") or {}
            if not sel:
                continue
            names = [
                p.name
                for p in self.pods()
                if p.net is not None
                and all(
                    {**p.sts.labels, "statefulset.kubernetes.io/pod-name": p.name}.get(k) == v
                    for k, v in sel.items()
                )
            ]
            out.append(
                ServiceRecord(
                    svc["metadata"]["name"],
                    svc["metadata"].get("namespace", self.cfg.namespace),
                    (svc.get("spec") or {}).get("clusterIP") == "None",
                    tuple(names),
                )
            )
        return out

    def _write_dns(self) -> None:
        table = self._dns_table()
        for rec in self._pod_records():
            self.network.write_hosts(rec, table, rec.namespace)

    # -- shutdown --------------------------------------------------------------------------

    def stop_all(self, grace: float = 5.0) -> dict[str, int | None]:
        """SIGTERM every container, SIGKILL what is left after `grace`, remove the pods.
        Returns the exit code of each main container that was running."""
        running = [p for p in self.pods() if p.proc is not None]
        codes: dict[str, int | None] = {}
        for p in running:
            p.proc.terminate()  # type: ignore[union-attr]
        deadline = time.monotonic() + grace
        for p in running:
            assert p.proc is not None
            rc = p.proc.wait(max(0.0, deadline - time.monotonic()))
            if rc is None:
                p.proc.kill()
                rc = p.proc.wait(5)
            if not p.in_init:
                codes[p.name] = rc
        for p in self.pods():
            p.deleting = True
            p.proc = None
            self._remove_quiet(p)
        return codes

    def _remove_quiet(self, pod: Pod) -> None:
        self.network.remove_pod(pod.name)
        if pod.dir is not None:
            _rmtree(pod.dir)
        pod.sts.pods.pop(pod.ordinal, None)


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _loopback_rewrite(
    env: dict[str, str], argv: list[str], mounts: list[BindMount], table: dict[str, list[str]]
) -> tuple[dict[str, str], list[str]]:
    """Without namespaces: DNS names in values become addresses, mount paths host paths.
    Only the forms with `.svc` are replaced: a bare pod or Service name is also part of
    other values (etcd's --name, the pod name itself)."""
    names = [(n, ips[0]) for n, ips in table.items() if ips and ".svc" in n]
    subs = sorted(names, key=lambda kv: -len(kv[0]))
    subs += [(m.target, m.source) for m in mounts if m.source]

    def fix(v: str) -> str:
        for a, b in subs:
            v = v.replace(a, b)
        return v

    return {k: fix(v) for k, v in env.items()}, [fix(a) for a in argv]
