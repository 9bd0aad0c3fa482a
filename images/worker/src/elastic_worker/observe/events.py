"""Kubernetes Events on the worker's pod (and its StatefulSet where the fact is the job's),
for `kubectl describe pod`, `kubectl get events` and `elastic-job events`.

Best effort and never in training's way: `record` only queues; one daemon thread POSTs
each Event with a short timeout; a refusal or an unreachable API server costs that Event
and one log line (the first 403 says which RBAC grant is missing, then the recorder stops
trying). `close` gives what is queued a bounded time to go out before the pod exits.

Every reason the worker records is a `Reason` below, in REASONS: its name, type, the
objects it is recorded on and when. docs/contracts.md's Events table is checked against it
(tests/worker/observe/test_events.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.error
from dataclasses import dataclass
from datetime import datetime, timezone

from elastic_worker import kubeapi, timings
from elastic_worker.settings.config import Config, ConfigError, KubeApi, read_statefulsets

logger = logging.getLogger(__name__)

COMPONENT = "elastic-worker"

NORMAL = "Normal"
WARNING = "Warning"
POD = "pod"
STATEFULSET = "StatefulSet"


@dataclass(frozen=True)
class Reason:
    """An Event's reason: `name`, its `type` (Normal or Warning), the objects it is
    recorded on (`on`) and `when`, as docs/contracts.md says it."""

    name: str
    type: str
    on: tuple[str, ...]
    when: str


GATE_TIMEOUT = Reason("GateTimeout", WARNING, (POD,), "the readiness gate gave up (exit 3)")
REFORMED = Reason("Reformed", NORMAL, (POD,), "a round after this pod's first")
WAITING_AS_SPARE = Reason(
    "WaitingAsSpare", NORMAL, (POD,), "more pods registered than job.maxNodes: this one waits"
)
SPARE_JOINED = Reason("SpareJoined", NORMAL, (POD,), "a pod that waited as a spare joined a round")
LEFT_ON_SIGNAL = Reason(
    "LeftOnSignal", NORMAL, (POD,), "SIGTERM: training stopped at its checkpoint, the pod left"
)
JOB_COMPLETED = Reason("JobCompleted", NORMAL, (POD, STATEFULSET), "training succeeded")
RENDEZVOUS_REOPENED = Reason(
    "RendezvousReopened",
    WARNING,
    (STATEFULSET,),
    "torch closed the rendezvous early: the pods join the next generation",
)
STATE_RESTORED = Reason(
    "StateRestored", NORMAL, (POD,), "a script that keeps snapshots loaded its state"
)
PEER_GONE = Reason(
    "PeerGone", WARNING, (POD,), "a peer's torchrun is gone: this pod took its node out"
)
EXIT_BARRIER = Reason(
    "ExitBarrier", NORMAL, (POD,), "this pod's training exited 0; torchrun waits for the others"
)
TORCHRUN_RELAUNCHED = Reason(
    "TorchrunRelaunched",
    WARNING,
    (POD,),
    "torchrun waited for a node that left its just-completed round: launched again",
)
PEER_RECLAIMED = Reason(
    "PeerReclaimed", WARNING, (POD,), "a lost peer's node stayed NotReady: its pod was deleted"
)
RANK_HUNG = Reason(
    "RankHung",
    WARNING,
    (POD,),
    "no rank of the round stepped for the hang bound and this pod's rank holds it: its "
    "training processes were stopped",
)
ROUND_HUNG = Reason(
    "RoundHung",
    WARNING,
    (POD,),
    "no rank of the round stepped for the hang bound and no single rank holds it: the "
    "round restarts",
)

#: Every reason the worker records.
REASONS: tuple[Reason, ...] = (
    GATE_TIMEOUT,
    REFORMED,
    WAITING_AS_SPARE,
    SPARE_JOINED,
    LEFT_ON_SIGNAL,
    JOB_COMPLETED,
    RENDEZVOUS_REOPENED,
    STATE_RESTORED,
    PEER_GONE,
    EXIT_BARRIER,
    TORCHRUN_RELAUNCHED,
    PEER_RECLAIMED,
    RANK_HUNG,
    ROUND_HUNG,
)


@dataclass(frozen=True)
class Target:
    """What an Event is about (its involvedObject)."""

    api_version: str
    kind: str
    name: str
    uid: str = ""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    target: Target, namespace: str, reason: str, message: str, *, kind: str, pod: str, node: str
) -> dict[str, object]:
    """A core/v1 Event as client-go's recorder writes it (name `<object>.<hex time>`)."""
    now = _now()
    involved: dict[str, str] = {
        "apiVersion": target.api_version,
        "kind": target.kind,
        "name": target.name,
        "namespace": namespace,
    }
    if target.uid:
        involved["uid"] = target.uid
    source = {"component": COMPONENT, **({"host": node} if node else {})}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{target.name}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": source,
        "reportingComponent": COMPONENT,
        "reportingInstance": pod,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class Recorder:
    """Records Events about this pod (`pod`) and its StatefulSet (`job`); a Recorder
    made without API access (`disabled()`) records nothing."""

    def __init__(
        self,
        api: KubeApi | None,
        namespace: str,
        pod: Target | None,
        statefulset: Target | None = None,
        *,
        node: str = "",
        timeout: float = timings.EVENT_POST_TIMEOUT,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.pod = pod
        self.statefulset = statefulset
        self.node = node
        self.timeout = timeout
        self._queue: queue.Queue[dict[str, object] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._forbidden = False

    @classmethod
    def disabled(cls) -> Recorder:
        return cls(None, "", None)

    @property
    def enabled(self) -> bool:
        return self.api is not None and self.pod is not None and bool(self.namespace)

    def record(self, reason: Reason, message: str, *, job: bool = False) -> None:
        """Queue an Event on the pod, or with `job` on its StatefulSet (else the pod)."""
        target = self.statefulset if job and self.statefulset is not None else self.pod
        if not self.enabled or target is None or self._forbidden:
            return
        pod = self.pod.name if self.pod else ""
        body = event_body(
            target, self.namespace, reason.name, message, kind=reason.type, pod=pod, node=self.node
        )
        self._queue.put(body)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="events", daemon=True)
            self._thread.start()

    def close(self, wait: float = timings.EVENTS_CLOSE_WAIT) -> None:
        """Let queued Events go out for at most `wait` seconds."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(wait)

    def _run(self) -> None:
        while (body := self._queue.get()) is not None:
            if not self._forbidden:
                self._post(body)

    def _post(self, body: dict[str, object]) -> None:
        assert self.api is not None
        path = f"/api/v1/namespaces/{self.namespace}/events"
        try:
            kubeapi.request(self.api, "POST", path, body, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 403:
                self._forbidden = True
                logger.warning(
                    "not allowed to create events in %s (403): the Role lacks create on "
                    "events (chart: events.enabled); recording no more events",
                    self.namespace,
                )
            else:
                logger.info("recording event %s failed: HTTP %d", body.get("reason"), exc.code)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            logger.info("recording event %s failed: %s", body.get("reason"), exc)


def recorder(config: Config) -> Recorder:
    """The pod's recorder when ELASTIC_EVENTS is on and the API is reachable; else one
    that records nothing (said once)."""
    if not config.events:
        return Recorder.disabled()
    if config.kube_api is None or not config.pod_namespace:
        logger.warning(
            "ELASTIC_EVENTS is true but there is no in-cluster API access (token) or "
            "POD_NAMESPACE: recording no events"
        )
        return Recorder.disabled()
    pod = Target("v1", "Pod", config.pod_name, config.pod_uid)
    base, _, ordinal = config.pod_name.rpartition("-")
    sts = None
    try:
        release = read_statefulsets(config.statefulsets_file)
    except ConfigError as exc:
        logger.warning("%s: recording Events on the pod only", exc)
        release = ()
    if ordinal.isdigit() and base in release:
        sts = Target("apps/v1", "StatefulSet", base)
    return Recorder(config.kube_api, config.pod_namespace, pod, sts, node=config.node_name)
