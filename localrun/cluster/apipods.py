"""The fake API server's Pods: what the cluster publishes (`publish`, podobject.py), their
logs (from `log_source`, podlogs.py), their HTTP endpoints, and evictions.

    GET  /api/v1/namespaces/{ns}/pods[?labelSelector=&fieldSelector=&watch=true]   PodList
    GET  /api/v1/pods                                            every namespace's pods
    GET  /api/v1/namespaces/{ns}/pods/{name}                     Pod
    GET  /api/v1/namespaces/{ns}/pods/{name}/log                 container=, previous=,
                                                                 follow=, tailLines=
    GET  /api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/{path} the pod's HTTP endpoint
    POST /api/v1/namespaces/{ns}/pods/{name}/eviction            what `kubectl drain` sends
    DELETE /api/v1/namespaces/{ns}/pods/{name}                   DeleteOptions:
                                                                 gracePeriodSeconds (0: force),
                                                                 preconditions uid and
                                                                 resourceVersion (409 when
                                                                 the object differs)
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from localrun.cluster import podlogs
from localrun.cluster.apilist import Lists
from localrun.cluster.apirequest import (
    Answer,
    JsonObject,
    Query,
    Raw,
    Reply,
    Request,
    Stream,
    Target,
    flag,
    one,
)
from localrun.cluster.apistatus import not_allowed, not_found, status_object
from localrun.cluster.apistore import Store
from localrun.cluster.podobject import rfc3339

#: (namespace, pod, container) -> the log file and the pod's incarnation; None: no pod.
LogSource = Callable[[str, str, str], "tuple[Path, int] | None"]
#: (namespace, pod, grace period or None for the pod's own, uid of the object deleted).
DeleteCallback = Callable[[str, str, "int | None", str], None]
PROXY_TIMEOUT = 5.0


class Pods:
    resource = "pods"

    def __init__(self, store: Store, lists: Lists) -> None:
        self.store = store
        self.lists = lists
        self.stopping = lists.stopping
        self.log_source: LogSource | None = None
        #: Called as on_evict(namespace, pod) for an accepted POST of pods/NAME/eviction
        #: (what `kubectl drain` sends); the cluster deletes the pod. None: 404.
        self.on_evict: Callable[[str, str], None] | None = None
        #: Called for an accepted DELETE of a pod; the cluster deletes it. None: 405.
        self.on_delete: DeleteCallback | None = None

    def publish(self, namespace: str, pods: list[JsonObject]) -> None:
        """The pods of `namespace` as they are now: new ones ADDED, changed ones MODIFIED
        (a new resourceVersion), those not given any more DELETED."""
        present = set()
        for pod in pods:
            present.add(pod["metadata"]["name"])
            self.store.put("pods", pod)
        for ns, name in self.store.names("pods"):
            if ns == namespace and name not in present:
                self.store.delete("pods", ns, name)

    def handle(self, req: Request) -> Answer:
        target = req.target
        if target.subresource == "eviction":
            return self._evict(req.method, target)
        if req.method == "DELETE" and target.name and not target.subresource:
            return self._delete(target, req)
        if req.method != "GET":
            return Reply(405, not_allowed(req.method))
        if not target.name:
            return self.lists.list_or_watch("pods", target.namespace, req.query)
        if target.subresource == "log":
            return self.log(target, req.query)
        if target.subresource == "proxy":
            return self.proxy(target, dict(req.query))
        obj = self.store.get("pods", target.namespace, target.name)
        return Reply(200, obj) if obj is not None else Reply(404, not_found(target))

    def _evict(self, method: str, target: Target) -> Answer:
        """POST pods/NAME/eviction: 201 and a Success Status, then on_evict (the cluster
        marks the pod DisruptionTarget EvictionByEvictionAPI and deletes it)."""
        if method != "POST":
            return Reply(405, not_allowed(method))
        if self.store.get("pods", target.namespace, target.name) is None or self.on_evict is None:
            return Reply(404, not_found(target))
        self.on_evict(target.namespace, target.name)
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
        return Reply(201, body)

    def _delete(self, target: Target, req: Request) -> Answer:
        """DELETE pods/NAME with DeleteOptions (body, or gracePeriodSeconds in the query):
        409 when a precondition (uid, resourceVersion) does not hold, in the real server's
        words; else 200 with the pod as the deletion leaves it, then on_delete."""
        if self.on_delete is None:
            return Reply(405, not_allowed(req.method))
        obj = self.store.get("pods", target.namespace, target.name)
        if obj is None:
            return Reply(404, not_found(target))
        opts = req.body if isinstance(req.body, dict) else {}
        grace = opts.get("gracePeriodSeconds")
        if one(req.query, "gracePeriodSeconds").lstrip("-").isdigit():
            grace = int(one(req.query, "gracePeriodSeconds"))
        meta = obj["metadata"]
        pre = opts.get("preconditions") or {}
        for field, have in (("uid", meta["uid"]), ("resourceVersion", meta["resourceVersion"])):
            want = pre.get(field)
            if want is not None and str(want) != str(have):
                shown = "UID" if field == "uid" else "ResourceVersion"
                message = (
                    f'Operation cannot be fulfilled on pods "{target.name}": Precondition '
                    f"failed: {shown} in precondition: {want}, {shown} in object meta: {have}"
                )
                return Reply(409, status_object(409, message, target.details))
        grace = None if grace is None else max(0, int(grace))
        answer = dict(obj, metadata=dict(meta))
        if grace != 0 and "deletionTimestamp" not in meta:
            seconds = grace
            if seconds is None:
                seconds = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
            answer["metadata"]["deletionTimestamp"] = rfc3339(time.time() + seconds)
            answer["metadata"]["deletionGracePeriodSeconds"] = seconds
        self.on_delete(target.namespace, target.name, grace, str(meta["uid"]))
        return Reply(200, answer)

    # -- logs -------------------------------------------------------------------------------

    def log(self, target: Target, query: Query) -> Answer:
        name = target.name
        obj = self.store.get("pods", target.namespace, name)
        if obj is None:
            return Reply(404, not_found(target))
        names = [c["name"] for c in obj["spec"].get("containers", [])]
        container = one(query, "container")
        if not container:
            if len(names) != 1:
                message = (
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(names)}]"
                )
                return Reply(400, status_object(400, message))
            container = names[0]
        if container not in names:
            return Reply(
                400, status_object(400, f'container "{container}" in pod "{name}" is not valid')
            )
        found = self.log_source(target.namespace, name, container) if self.log_source else None
        if found is None:
            return Reply(404, not_found(target))
        return self._log_text(obj, container, found, query)

    def _log_text(
        self, obj: JsonObject, container: str, found: tuple[Path, int], query: Query
    ) -> Answer:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        path, incarnation = found
        previous = flag(query, "previous")
        try:
            text, offset = podlogs.read(path, incarnation, previous)
        except podlogs.NoLog as exc:
            message = f'{exc} for pod {namespace}/{name} container "{container}"'
            return Reply(400, status_object(400, message))
        state = _container_state(obj, container)
        if not previous and "waiting" in state and not text:
            reason = state["waiting"].get("reason", "ContainerCreating")
            message = f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            return Reply(400, status_object(400, message))
        tail = one(query, "tailLines")
        if tail.isdigit():
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) else ""
        if not (flag(query, "follow") and not previous):
            return Raw(200, "text/plain", text.encode())
        uid = obj["metadata"]["uid"]

        def running() -> bool:
            now = self.store.get("pods", namespace, name)
            return (
                now is not None
                and now["metadata"]["uid"] == uid
                and "running" in _container_state(now, container)
            )

        def chunks() -> Iterator[bytes]:
            if text:
                yield text.encode()
            for line in podlogs.follow(path, offset, running=running, stopped=self.stopping.is_set):
                yield line.encode()

        return Stream("text/plain", chunks())

    # -- the pod's HTTP endpoint --------------------------------------------------------------

    def proxy(self, target: Target, query: Query) -> Answer:
        name = target.name
        obj = self.store.get("pods", target.namespace, name)
        if obj is None:
            return Reply(404, not_found(target))
        ip = (obj.get("status") or {}).get("podIP")
        number = _port_number(obj, target.port)
        if number is None:
            port = target.port
            message = f'no such port "{port}" on pod {name}' if port else f"pod {name} has no port"
            return Reply(503, status_object(503, message))
        if not ip:
            return Reply(503, status_object(503, f'pod "{name}" has no IP address'))
        url = f"http://{ip}:{number}/{target.rest.lstrip('/')}"
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=PROXY_TIMEOUT) as resp:
                ctype = resp.headers.get("Content-Type", "text/plain")
                return Raw(resp.status, ctype, resp.read())
        except urllib.error.HTTPError as exc:
            return Raw(exc.code, exc.headers.get("Content-Type", "text/plain"), exc.read())
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            message = f"error trying to reach service: dial tcp {ip}:{number}: {why}"
            return Reply(503, status_object(503, message))


def _container_state(pod: JsonObject, container: str) -> JsonObject:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s.get("name") == container:
            state = s.get("state") or {}
            return state if isinstance(state, dict) else {}
    return {"waiting": {"reason": "ContainerCreating"}}


def _port_number(pod: JsonObject, port: str) -> int | None:
    """A port number as given, or the number of the container port of that name."""
    if port.isdigit():
        return int(port)
    for c in pod["spec"].get("containers") or []:
        for p in c.get("ports") or []:
            if port and p.get("name") == port:
                return int(p["containerPort"])
    return None
