"""A dead node's pod slot given back to the job (ELASTIC_RECLAIM, chart nodeLoss.reclaim).

When a node dies the job re-forms without its pod in seconds, but Kubernetes keeps the
pod: NotReady after its node-monitor-grace-period, then (after the pod's toleration) a
deletionTimestamp nobody can carry out, so Terminating until the node returns or is
deleted. A StatefulSet never makes a pod again while it exists, so the job stays a node
short. A worker that took that peer out of the round may end it:

- one worker acts for each lost peer: the first survivor of the round after it in name
  order (`elect`), so a large job asks the API server once per lost pod, not once per pod;
- it reads the peer's pod every RECLAIM_POLL (`get` on pods, by name): its node is NotReady when
  the pod's Ready condition is False while ContainersReady is True, which only the node
  lifecycle controller writes (MarkPodsNotReady; a kubelet sets both together). No
  cluster-scoped read of Nodes is needed; when this pod may read Nodes anyway (the cluster
  chart's node reader) the Node's own Ready condition must say not Ready too;
- seen so for ELASTIC_RECLAIM_AFTER s on end, the pod is deleted with grace 0 and
  preconditions on its UID and resourceVersion: a pod made again meanwhile, or one whose
  kubelet has reported since (a new resourceVersion), is never deleted (409);
- its StatefulSet then makes it again at once, on a node without the NotReady taints.

The old pod may come back with its node before its kubelet stops it: recovery/fence.py
keeps it out of the job. The node-loss policy (policy.py) says when this pod may act.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from elastic_worker import kubeapi, timings
from elastic_worker.observe import events
from elastic_worker.settings.config import Config, KubeApi

logger = logging.getLogger(__name__)


def elect(lost: str, survivors: Iterable[str]) -> str | None:
    """The survivor that acts for `lost`: the first after it in name order, wrapping."""
    names = sorted(set(survivors) - {lost})
    if not names:
        return None
    return next((n for n in names if n > lost), names[0])


def _conditions(pod: dict[str, Any]) -> dict[str, str]:
    status = pod.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    return {str(c.get("type")): str(c.get("status")) for c in conds or [] if isinstance(c, dict)}


def node_not_ready(pod: dict[str, Any]) -> bool:
    """The node lifecycle controller's mark on a pod whose node is not Ready."""
    c = _conditions(pod)
    return c.get("Ready") == "False" and c.get("ContainersReady") == "True"


def node_name(pod: dict[str, Any]) -> str:
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, dict) else ""


def node_ready(node: dict[str, Any]) -> bool:
    status = node.get("status")
    for c in (status.get("conditions") if isinstance(status, dict) else None) or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


@dataclass
class Lost:
    """A peer this pod watches: the pod UID it lost (None: read at the first look)."""

    uid: str | None
    since: float  # monotonic: when it was lost
    not_ready_since: float | None = None  # monotonic: first seen on a NotReady node


class Reclaimer:
    """Watches the peers this pod was elected for; deletes their pods once their node has
    been NotReady for `config.reclaim_after` s, while `may_act()` (the node-loss policy:
    not while this pod is held by its fence, nor once the job is complete)."""

    def __init__(
        self,
        config: Config,
        api: KubeApi,
        *,
        may_act: Callable[[], bool] = lambda: True,
        record: Callable[[str], None] | None = None,
        poll: float = timings.RECLAIM_POLL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.api = api
        self.may_act = may_act
        self.record = record  # (message): the PeerReclaimed Event on this pod
        self.poll = poll
        self.clock = clock
        self.watching: dict[str, Lost] = {}
        self._read_nodes = True  # False once Nodes turned out not readable (403)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lost(self, peer: str, survivors: Iterable[str] | None, uid: str | None = None) -> None:
        """`peer` was taken out of the round: by this pod (`survivors` None: it acts), or
        seen lapsed by every survivor (`survivors`: the round's members still there; the
        one `elect` names acts). `uid`: the pod UID that was lost, when known."""
        me = self.config.pod_name
        if survivors is not None and elect(peer, [*survivors, me]) != me:
            return
        with self._lock:
            if peer not in self.watching:
                self.watching[peer] = Lost(uid, self.clock())
                logger.info(
                    "reclaim: watching lost peer %s: its pod is deleted if its node stays "
                    "NotReady for %g s",
                    peer,
                    self.config.reclaim_after,
                )

    def lapsed(self, peers: list[str], survivors: set[str]) -> None:
        """Loss detection's lapsed members of a round and its members still there."""
        for peer in peers:
            self.lost(peer, survivors)

    def alive(self, names: Iterable[str]) -> None:
        """Members seen alive in a round again: their pods are not watched any more."""
        back = set(names)
        with self._lock:
            for peer in [p for p in self.watching if p in back]:
                del self.watching[peer]
                logger.info("reclaim: lost peer %s is back in the job: not watched any more", peer)

    def start(self) -> Reclaimer:
        self._thread = threading.Thread(target=self._run, name="reclaim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timings.RECLAIM_API_TIMEOUT * 2)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.check_all()

    def check_all(self) -> None:
        with self._lock:
            peers = list(self.watching.items())
        for peer, lost in peers:
            if not self.may_act():
                return
            try:
                done = self.check(peer, lost)
            except Exception as exc:  # noqa: BLE001 - the API's errors: ask again next time
                logger.debug("reclaim: reading %s: %s", peer, exc)
                done = False
            if done or self.clock() - lost.since > timings.RECLAIM_WATCH_FOR:
                with self._lock:
                    self.watching.pop(peer, None)

    def _path(self, peer: str) -> str:
        return f"/api/v1/namespaces/{self.config.pod_namespace}/pods/{peer}"

    def check(self, peer: str, lost: Lost) -> bool:
        """One look at the peer's pod; True when there is nothing more to watch."""
        try:
            pod = kubeapi.request(
                self.api, "GET", self._path(peer), timeout=timings.RECLAIM_API_TIMEOUT
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return True  # gone from the API: its StatefulSet makes it again
            if exc.code == 403:
                logger.warning(
                    "reclaim: not allowed to read pod %s (403): the Role of nodeLoss.reclaim "
                    "names only the pods of the chart's replicas; not watching it",
                    peer,
                )
                return True
            raise
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        uid = str(meta.get("uid", ""))
        if lost.uid is None:
            lost.uid = uid
        if uid != lost.uid:
            return True  # made again: not the pod that was lost
        if not node_not_ready(pod) or not self._node_not_ready(pod):
            # Ready or not, as its kubelet last said (the node is not called NotReady until
            # its grace period has passed): watched until it is back in a round (alive).
            lost.not_ready_since = None
            return False
        now = self.clock()
        if lost.not_ready_since is None:
            lost.not_ready_since = now
            node = node_name(pod) or "?"
            logger.info(
                "reclaim: lost peer %s is on NotReady node %s: deleting its pod in %g s "
                "unless the node reports again",
                peer,
                node,
                self.config.reclaim_after,
            )
        if now - lost.not_ready_since < self.config.reclaim_after:
            return False
        return self._delete(peer, pod, uid, str(meta.get("resourceVersion", "")))

    def _node_not_ready(self, pod: dict[str, Any]) -> bool:
        """The Node says so too when this pod may read it (else the pod's mark stands)."""
        name = node_name(pod)
        if not self._read_nodes or not name:
            return True
        try:
            node = kubeapi.request(
                self.api, "GET", f"/api/v1/nodes/{name}", timeout=timings.RECLAIM_API_TIMEOUT
            )
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                self._read_nodes = False
                return True
            return exc.code == 404  # deleted: pod GC follows, or this delete does
        except (urllib.error.URLError, OSError, ValueError):
            return False  # not known: wait
        return not node_ready(node)

    def _delete(self, peer: str, pod: dict[str, Any], uid: str, version: str) -> bool:
        if not self.may_act():
            return False
        node = node_name(pod) or "?"
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid, "resourceVersion": version},
        }
        try:
            kubeapi.request(
                self.api, "DELETE", self._path(peer), body, timeout=timings.RECLAIM_API_TIMEOUT
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return True
            if exc.code == 409:
                logger.info("reclaim: pod %s changed since it was read (409): reading again", peer)
                return False
            if exc.code == 403:
                logger.warning(
                    "reclaim: not allowed to delete pod %s (403): the Role of "
                    "nodeLoss.reclaim names only the pods of the chart's replicas",
                    peer,
                )
                return True
            raise
        message = (
            f"force-deleted lost peer {peer} (UID {uid}) on node {node}, NotReady for "
            f"{self.config.reclaim_after:g} s: its StatefulSet makes it again on a healthy node"
        )
        logger.warning("reclaim: %s", message)
        if self.record is not None:
            self.record(message)
        return True


def start(
    config: Config,
    may_act: Callable[[], bool],
    recorder: events.Recorder,
) -> Reclaimer | None:
    """The reclaim of dead nodes' pods (ELASTIC_RECLAIM), started when this pod can ask the
    API server; None when it is off or cannot."""
    if not config.reclaim:
        return None
    if config.kube_api is None or not config.pod_namespace:
        logger.warning(
            "ELASTIC_RECLAIM is true but this pod has no API access (token, namespace): "
            "a dead node's pod is not reclaimed"
        )
        return None

    def record(message: str) -> None:
        recorder.record(events.PEER_RECLAIMED, message)

    return Reclaimer(config, config.kube_api, may_act=may_act, record=record).start()
