"""Kubernetes Events on the worker's pod (and its StatefulSet where the fact is the job's),
for `kubectl describe pod`, `kubectl get events` and `elastic-job events`.

Best effort and never in training's way: `record` only queues; one daemon thread POSTs
each Event with a short timeout; a refusal or an unreachable API server costs that Event
and one log line (the first 403 says which RBAC grant is missing, then the recorder stops
trying). `close` gives what is queued a bounded time to go out before the pod exits.

The reasons (docs/contracts.md, "Events"):

    GateTimeout          Warning  the readiness gate gave up
    Reformed             Normal   re-formed at world size N (round R) after S s
    SpareJoined          Normal   a pod that waited as a spare joined a round
    WaitingAsSpare       Normal   the round is full: this pod waits as a spare
    LeftOnSignal         Normal   SIGTERM: training stopped (checkpointed) and the pod left
    JobCompleted         Normal   training succeeded (on the StatefulSet: once per job)
    RendezvousReopened   Warning  torch closed the rendezvous early; a fresh one is joined
    PeerGone             Warning  a peer's processes died: this pod took its node out of the round
    TorchrunRestarted    Warning  torchrun waited for a node that left its new round: started again
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.error
from dataclasses import dataclass
from datetime import datetime, timezone

from elastic_worker.observe import kubeapi
from elastic_worker.settings.config import Config, ConfigError, KubeApi, read_statefulsets

logger = logging.getLogger(__name__)

COMPONENT = "elastic-worker"
TIMEOUT = 3.0  # seconds per POST: an Event is worth less than a stalled worker
CLOSE_WAIT = 3.0  # seconds `close` waits for queued Events

NORMAL = "Normal"
WARNING = "Warning"


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
        timeout: float = TIMEOUT,
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

    def record(self, reason: str, message: str, kind: str = NORMAL, *, job: bool = False) -> None:
        """Queue an Event on the pod, or with `job` on its StatefulSet (else the pod)."""
        target = self.statefulset if job and self.statefulset is not None else self.pod
        if not self.enabled or target is None or self._forbidden:
            return
        pod = self.pod.name if self.pod else ""
        body = event_body(
            target, self.namespace, reason, message, kind=kind, pod=pod, node=self.node
        )
        self._queue.put(body)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="events", daemon=True)
            self._thread.start()

    def close(self, wait: float = CLOSE_WAIT) -> None:
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
