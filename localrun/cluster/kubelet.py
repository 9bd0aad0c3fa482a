"""The kubelet: one pod's containers through their lifecycle (pod.py), on an injected
container runtime (runtime.py).

Init containers in order, then the container; restartPolicy Always with exponential
back-off (base, 2*base, ... capped, reset after the container ran long enough); deletion
is SIGTERM to PID 1, then SIGKILL after terminationGracePeriodSeconds.

One kubelet object stands for every node's: a node whose kubelet is stopped (`stop_node`:
the node froze or lost its network) has its pods' processes frozen and cut off, and
nothing of theirs changes: no restart, no deletion carried out, no status. When it comes
back (`start_node`) the processes go on at once and the kubelet acts RELIST seconds later
(its first list of the API's pods): it carries out deletions made meanwhile, and stops the
containers of pods the API no longer has (`orphans`: force-deleted while it was away),
with their spec's grace period, which is all it knows of them.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from localrun.cluster import podlogs, podspec, volumes
from localrun.cluster.nodes import allocatable, internal_ip
from localrun.cluster.pod import Backoff, Phase, Pod, Termination
from localrun.cluster.podspec import Container, PodIdentity
from localrun.cluster.runtime import ContainerRuntime, ContainerSpec, LineSink

#: How long a pod whose container config cannot be built waits before the next try.
CONFIG_ERROR_RETRY = 3600.0
#: Seconds from a stopped kubelet's return to its first sync of the pods (a relist).
RELIST = 1.0


@dataclass
class PodEvents:
    """What the kubelet tells its owner, besides the lines of the containers."""

    event: Callable[[str], None]
    line: LineSink
    container_started: Callable[[Pod, Container], None]
    container_exited: Callable[[Pod, Container, int, float], None]


@dataclass(frozen=True)
class KubeletConfig:
    workdir: Path  # pod directories live under workdir/pods
    logdir: Path  # logs/<pod>/<container>.log
    base_env: Mapping[str, str]  # what the runtime sets (KUBERNETES_*); an image adds its own
    backoff_base: float = 10.0
    backoff_cap: float = 300.0


class Kubelet:
    def __init__(
        self,
        cfg: KubeletConfig,
        runtime: ContainerRuntime,
        sources: volumes.VolumeSources,
        nodes: Mapping[str, podspec.Obj],
        events: PodEvents,
    ) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.sources = sources
        self.nodes = nodes
        self.events = events
        self.backoffs: dict[str, Backoff] = {}
        self.stopped: set[str] = set()  # nodes whose kubelet is stopped
        self.back_at: dict[str, float] = {}  # node -> its first sync after it came back
        #: Pods gone from the API whose containers still run (or are frozen) on their node.
        self.orphans: list[Pod] = []

    def active(self, node: str, now: float) -> bool:
        """Whether the kubelet of `node` acts now ("": an unplaced pod, nobody's)."""
        return not node or (node not in self.stopped and now >= self.back_at.get(node, 0.0))

    # -- what a user or a controller asks ------------------------------------------------

    def delete(self, pod: Pod, now: float, grace: float | None = None) -> None:
        """`kubectl delete pod`: the API sets its deletionTimestamp; its kubelet sends
        SIGTERM now (or once it is back) and SIGKILL after the grace period."""
        if pod.deleting:
            return
        pod.deleting = True
        pod.deleted_at = time.time()
        pod.grace = pod.sts.grace if grace is None else grace
        if self.active(pod.node, now):
            self._terminate(pod, now)

    def orphan(self, pod: Pod, now: float) -> None:
        """The pod is gone from the API (grace 0): its kubelet stops what still runs, now
        or when it is back, and removes the sandbox."""
        if pod in self.orphans:
            return
        if not pod.deleting:
            pod.deleting = True
            pod.deleted_at = time.time()
        self.orphans.append(pod)
        if self.active(pod.node, now) and not pod.killing:
            self._terminate(pod, now)

    def _terminate(self, pod: Pod, now: float) -> None:
        grace = pod.sts.grace if pod.grace is None else pod.grace
        pod.killing = True
        pod.kill_at = now + grace
        if pod.proc is not None:
            pod.enter(Phase.TERMINATING)
            pod.proc.terminate()
            self.events.event(f"{pod.name}: deleting (SIGTERM, grace {grace:g}s)")

    def stop_node(self, node: str, pods: list[Pod]) -> None:
        """The node's kubelet stops, and with it the node: its pods' processes freeze where
        they are and their sandboxes lose the network."""
        self.stopped.add(node)
        for pod in pods:
            if pod.node != node:
                continue
            if pod.proc is not None:
                pod.proc.freeze()
            if pod.ip:
                self.runtime.set_link(pod.name, pod.incarnation, False)
        self.events.event(f"node {node}: kubelet stopped; its pods frozen and cut off")

    def start_node(self, node: str, pods: list[Pod], now: float) -> None:
        """The node is back: its processes go on, its pods' network is up; the kubelet
        syncs RELIST s later."""
        if node not in self.stopped:
            return
        self.stopped.discard(node)
        self.back_at[node] = now + RELIST
        for pod in pods:
            if pod.node != node:
                continue
            if pod.ip:
                self.runtime.set_link(pod.name, pod.incarnation, True)
            if pod.proc is not None:
                pod.proc.thaw()
            pod.node_not_ready_at = None  # its status is the kubelet's again
        self.events.event(f"node {node}: back; kubelet syncs in {RELIST:g}s")

    def kill(self, pod: Pod, now: float, down: float = 0.0) -> None:
        """SIGKILL every process of the pod's running container; restarted after back-off,
        not before `down` seconds."""
        pod.down_until = max(pod.down_until, now + down)
        if pod.proc is not None:
            pod.proc.kill()

    def placed(self, pod: Pod, node: str) -> None:
        """The scheduler bound the pod to `node`: make its sandbox and directory."""
        pod.node = node
        pod.scheduled_at = time.time()
        pod.ip = self.runtime.run_sandbox(pod.name, pod.incarnation)
        pod.dir = self.cfg.workdir / "pods" / f"{pod.name}-{pod.incarnation}"
        pod.dir.mkdir(parents=True, exist_ok=True)
        self.events.event(f"{pod.name}: scheduled on {node}, ip {pod.ip}")

    # -- the sync loop -------------------------------------------------------------------

    def sync(self, pod: Pod, now: float) -> bool:
        """One step of the pod's lifecycle; True when the pod was removed."""
        if not self.active(pod.node, now):
            return False  # its kubelet is stopped, or not synced yet since it came back
        if pod.deleting and not pod.killing:
            self._terminate(pod, now)  # deleted while its kubelet was away
        if pod.proc is not None:
            rc = pod.proc.poll()
            if rc is None:
                if pod.deleting and pod.kill_at is not None and now >= pod.kill_at:
                    self.events.event(f"{pod.name}: grace period over, SIGKILL")
                    pod.proc.kill()
                    pod.kill_at = None
                return False
            self._exited(pod, rc, now)
        if pod.deleting:
            self.remove(pod)
            self.events.event(f"{pod.name}: deleted")
            return True
        if pod.phase == Phase.PENDING:
            if now < pod.down_until:
                pod.message = f"waiting for a node ({pod.down_until - now:.0f}s)"
            elif pod.node:
                self._start(pod, now)
        elif pod.phase == Phase.BACKOFF and now >= max(pod.next_start, pod.down_until):
            self._start(pod, now)
        return False

    def _exited(self, pod: Pod, rc: int, now: float) -> None:
        assert pod.proc is not None
        ran_for = now - pod.proc.started
        c = pod.current
        pod.proc = None
        if pod.in_init:
            self.events.container_exited(pod, c, rc, now)
            if rc == 0:
                pod.step += 1
                if not pod.deleting:
                    self._start(pod, now)
                return
            pod.failures_in_row += 1
            self.events.event(f"{pod.name}: init container {c.name} exited {rc}")
        else:
            pod.last_exit = rc
            pod.last_run = Termination(rc, pod.started_at or time.time(), time.time())
            if rc == 0:
                pod.zero_exit_at = now
                pod.failures_in_row = 0
            else:
                pod.failures_in_row += 1
            self.events.container_exited(pod, c, rc, now)
        if pod.deleting:
            return
        backoff = self.backoffs.setdefault(
            pod.name, Backoff(self.cfg.backoff_base, self.cfg.backoff_cap)
        )
        delay = backoff.next_delay(ran_for)
        pod.next_start = now + delay
        pod.enter(Phase.BACKOFF)
        wait = max(pod.next_start, pod.down_until) - now
        pod.message = f"{c.name} exited {rc}; restart in {wait:.0f}s"
        self.events.event(f"{pod.name}: {c.name} exited {rc}; back-off {wait:.0f}s")

    def remove(self, pod: Pod) -> None:
        """The pod's sandbox and directory go; the pod is Gone."""
        self.runtime.remove_sandbox(pod.name, pod.incarnation)
        if pod.dir is not None:
            shutil.rmtree(pod.dir, ignore_errors=True)
        pod.enter(Phase.GONE)
        self.backoffs.pop(pod.name, None)

    # -- starting containers -------------------------------------------------------------

    def _identity(self, pod: Pod) -> PodIdentity:
        node = self.nodes.get(pod.node, {})
        labels = {**pod.sts.labels, "statefulset.kubernetes.io/pod-name": pod.name}
        labels["apps.kubernetes.io/pod-index"] = str(pod.ordinal)
        return PodIdentity(
            name=pod.name,
            namespace=pod.sts.namespace,
            uid=pod.uid,
            node_name=pod.node,
            pod_ip=pod.ip,
            host_ip=internal_ip(node) or self.runtime.host_ip,
            service_account=pod.sts.pod_spec.get("serviceAccountName") or "default",
            labels=labels,
            annotations=pod.sts.annotations,
            node_allocatable=allocatable(node),
        )

    def _spec(self, pod: Pod, c: Container) -> ContainerSpec:
        image = self.sources.images.resolve(c.image)
        base = {**self.cfg.base_env, **image.env, "HOSTNAME": pod.name}
        containers = {x.name: x for x in pod.sts.init_containers + pod.sts.containers}
        env = podspec.resolve_env(
            c,
            self._identity(pod),
            containers,
            configmaps=self.sources.configmaps,
            secrets=self.sources.secrets,
            base=base,
        )
        return ContainerSpec(
            pod=pod.name,
            container=c.name,
            argv=podspec.command_line(c, env),
            env=env,
            mounts=volumes.mounts(pod, c, self.sources),
            working_dir=c.working_dir,
            log_path=self.cfg.logdir / pod.name / f"{c.name}.log",
            incarnation=pod.incarnation,
        )

    def _start(self, pod: Pod, now: float) -> None:
        c = pod.current
        try:
            spec = self._spec(pod, c)
        except podspec.PodSpecError as exc:
            pod.enter(Phase.BACKOFF)
            pod.next_start = now + CONFIG_ERROR_RETRY
            pod.message = f"CreateContainerConfigError: {exc}"
            self.events.event(f"{pod.name}: {pod.message}")
            return
        if not pod.in_init and pod.main_started:
            pod.restarts += 1  # restartCount: counted when the container starts again
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "a") as fh:
            fh.write(
                podlogs.start_line(c.name, pod.incarnation, pod.restarts, time.strftime("%H:%M:%S"))
            )
        pod.proc = self.runtime.start(spec, self.events.line)
        pod.enter(Phase.INIT if pod.in_init else Phase.RUNNING)
        pod.started_at = time.time()
        pod.message = ""
        if not pod.in_init:
            pod.main_started = True
            pod.env = spec.env
        self.events.container_started(pod, c)

    # -- shutdown ------------------------------------------------------------------------

    def stop(self, pods: list[Pod], grace: float) -> dict[str, int | None]:
        """SIGTERM every container, SIGKILL what is left after `grace`, remove the pods.
        Returns the exit code of each main container that was running."""
        running = [(p, p.proc) for p in pods if p.proc is not None]
        codes: dict[str, int | None] = {}
        for p, proc in running:
            if p.node in self.stopped:
                proc.thaw()  # a frozen one would not act on SIGTERM
            proc.terminate()
        deadline = time.monotonic() + grace
        for p, proc in running:
            rc = proc.wait(max(0.0, deadline - time.monotonic()))
            if rc is None:
                proc.kill()
                rc = proc.wait(5)
            if not p.in_init and p not in self.orphans:
                codes[p.name] = rc
        for p in pods:
            p.deleting = True
            p.proc = None
            self.remove(p)
        return codes
