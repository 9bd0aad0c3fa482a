"""The fake API server's reads of pods, their logs and metrics, events, and watches.

    GET  /api/v1/namespaces/{ns}/pods[?labelSelector=&fieldSelector=&watch=true]   PodList
    GET  /api/v1/pods                                            every namespace's pods
    GET  /api/v1/namespaces/{ns}/pods/{name}                     Pod
    GET  /api/v1/namespaces/{ns}/pods/{name}/log                 container=, previous=,
                                                                 follow=, tailLines=
    GET  /api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/{path} the pod's HTTP endpoint
    GET  /api/v1/namespaces/{ns}/events[?watch=true]             EventList
    POST /api/v1/namespaces/{ns}/events                          create a core/v1 Event
    GET  /api/v1/nodes?watch=true, /apis/apps/v1/namespaces/{ns}/statefulsets[?watch=true]

A watch streams one JSON object per line, `{"type": "ADDED|MODIFIED|DELETED", "object":
...}`, from the list's resourceVersion (or every current object as ADDED first), until
`timeoutSeconds` (default 1800 s) or the server stops; a resourceVersion older than the
store's history gets an ERROR event holding a 410 Status, as from kube-apiserver.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from localrun.cluster import podlogs
from localrun.cluster.apistore import Change, SelectorError, Store, TooOld, selected

JsonObject = dict[str, Any]
Query = dict[str, list[str]]
#: (namespace, pod, container) -> the log file and the pod's incarnation; None: no pod.
LogSource = Callable[[str, str, str], "tuple[Path, int] | None"]

WATCH_TIMEOUT = 1800.0
PROXY_TIMEOUT = 5.0
_KINDS = {"pods": "Pod", "events": "Event", "nodes": "Node", "statefulsets": "StatefulSet"}
_LIST_VERSION = {"statefulsets": "apps/v1"}


@dataclass
class Reply:
    code: int
    payload: JsonObject


@dataclass
class Raw:
    code: int
    content_type: str
    data: bytes


@dataclass
class Stream:
    content_type: str
    chunks: Iterator[bytes]
    code: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Answer = Reply | Raw | Stream
Status = Callable[..., JsonObject]


def _flag(query: Query, key: str) -> bool:
    return (query.get(key) or ["false"])[-1].lower() in {"true", "1"}


def _one(query: Query, key: str) -> str:
    return (query.get(key) or [""])[-1]


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CoreRoutes:
    """Pods, logs, proxy, events and watches over a Store; `status` makes Status bodies."""

    def __init__(self, store: Store, status: Status, stopping: threading.Event) -> None:
        self.store = store
        self.status = status
        self.stopping = stopping
        self.log_source: LogSource | None = None

    # -- lists and watches ------------------------------------------------------------------

    def list_or_watch(
        self,
        resource: str,
        namespace: str,
        query: Query,
        kept: list[JsonObject] | None = None,
    ) -> Answer:
        """A List object, or a watch stream when `watch=true`; `kept` are the objects of a
        resource kept outside the store (nodes, StatefulSets), else the store's."""
        labels, fields = _one(query, "labelSelector"), _one(query, "fieldSelector")
        try:
            if kept is None:
                items, version = self.store.list_objects(
                    resource, namespace, label_selector=labels, field_selector=fields
                )
            else:
                items = [o for o in kept if selected(o, labels, fields)]
                version = str(self.store.version)
        except SelectorError as exc:
            return Reply(400, self.status(400, str(exc)))
        if _flag(query, "watch"):
            timeout = float(_one(query, "timeoutSeconds") or WATCH_TIMEOUT)
            return Stream(
                "application/json",
                self._watch(
                    resource,
                    namespace=namespace,
                    query=query,
                    labels=labels,
                    fields=fields,
                    kept=kept,
                    timeout=timeout,
                ),
            )
        kind = _KINDS[resource] + "List"
        api_version = _LIST_VERSION.get(resource, "v1")
        meta = {"resourceVersion": version}
        return Reply(
            200, {"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items}
        )

    def _watch(
        self,
        resource: str,
        *,
        namespace: str,
        query: Query,
        labels: str,
        fields: str,
        kept: list[JsonObject] | None,
        timeout: float,
    ) -> Iterator[bytes]:
        try:
            changes = self.store.watch(
                resource,
                namespace,
                since=_one(query, "resourceVersion"),
                label_selector=labels,
                field_selector=fields,
                initial=kept,
                stop=self.stopping,
                timeout=timeout,
            )
            for change in changes:
                yield _event_line(change)
        except TooOld as exc:
            status = self.status(410, str(exc))
            status["reason"] = "Expired"
            yield (json.dumps({"type": "ERROR", "object": status}) + "\n").encode()

    # -- pods -------------------------------------------------------------------------------

    def pod(self, namespace: str, name: str, not_found: JsonObject) -> Reply:
        obj = self.store.get("pods", namespace, name)
        return Reply(200, obj) if obj is not None else Reply(404, not_found)

    def log(self, namespace: str, name: str, query: Query, not_found: JsonObject) -> Answer:
        obj = self.store.get("pods", namespace, name)
        if obj is None:
            return Reply(404, not_found)
        names = [c["name"] for c in obj["spec"].get("containers", [])]
        container = _one(query, "container")
        if not container:
            if len(names) != 1:
                message = (
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(names)}]"
                )
                return Reply(400, self.status(400, message))
            container = names[0]
        if container not in names:
            return Reply(
                400, self.status(400, f'container "{container}" in pod "{name}" is not valid')
            )
        found = self.log_source(namespace, name, container) if self.log_source else None
        if found is None:
            return Reply(404, not_found)
        return self._log_text(obj, container, found, query)

    def _log_text(
        self, obj: JsonObject, container: str, found: tuple[Path, int], query: Query
    ) -> Answer:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        path, incarnation = found
        previous = _flag(query, "previous")
        try:
            text, offset = podlogs.read(path, incarnation, previous)
        except podlogs.NoLog as exc:
            message = f'{exc} for pod {namespace}/{name} container "{container}"'
            return Reply(400, self.status(400, message))
        state = _container_state(obj, container)
        if not previous and "waiting" in state and not text:
            reason = state["waiting"].get("reason", "ContainerCreating")
            message = f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            return Reply(400, self.status(400, message))
        tail = _one(query, "tailLines")
        if tail.isdigit():
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) else ""
        if not (_flag(query, "follow") and not previous):
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

    def proxy(
        self,
        namespace: str,
        name: str,
        *,
        port: str,
        rest: str,
        query: Query,
        not_found: JsonObject,
    ) -> Answer:
        obj = self.store.get("pods", namespace, name)
        if obj is None:
            return Reply(404, not_found)
        ip = (obj.get("status") or {}).get("podIP")
        number = _port_number(obj, port)
        if number is None:
            message = f'no such port "{port}" on pod {name}' if port else f"pod {name} has no port"
            return Reply(503, self.status(503, message))
        if not ip:
            return Reply(503, self.status(503, f'pod "{name}" has no IP address'))
        url = f"http://{ip}:{number}/{rest.lstrip('/')}"
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
            return Reply(503, self.status(503, message))

    # -- events -----------------------------------------------------------------------------

    def create_event(self, namespace: str, body: Any) -> Reply:
        if not isinstance(body, dict):
            return Reply(400, self.status(400, "the body must be a JSON object"))
        meta = dict(body.get("metadata") or {})
        if meta.get("namespace", namespace) != namespace:
            message = (
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
            return Reply(400, self.status(400, message))
        if not meta.get("name"):
            if not meta.get("generateName"):
                return Reply(
                    422, self.status(422, "Event is invalid: metadata.name: Required value")
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        involved = body.get("involvedObject") or {}
        if not involved.get("name") or not involved.get("kind"):
            message = f'Event "{meta["name"]}" is invalid: involvedObject: Required value'
            return Reply(422, self.status(422, message))
        if involved.get("namespace", namespace) != namespace:
            message = (
                f'Event "{meta["name"]}" is invalid: involvedObject.namespace: Invalid value: '
                f'"{involved.get("namespace")}": does not match event.namespace'
            )
            return Reply(422, self.status(422, message))
        if self.store.get("events", namespace, meta["name"]) is not None:
            message = f'events "{meta["name"]}" already exists'
            return Reply(409, self.status(409, message, {"name": meta["name"], "kind": "events"}))
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        event = {**body, "apiVersion": "v1", "kind": "Event", "metadata": meta}
        change = self.store.put("events", event)
        assert change is not None
        return Reply(201, change.obj)

    def add_event(self, event: JsonObject) -> JsonObject:
        """An event recorded by a cluster component (scheduler, kubelet) rather than POSTed."""
        meta = event.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault(
            "name", f"{event.get('involvedObject', {}).get('name', 'x')}.{uuid.uuid4().hex[:16]}"
        )
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        event.update(apiVersion="v1", kind="Event")
        change = self.store.put("events", event)
        assert change is not None
        return change.obj


def _event_line(change: Change) -> bytes:
    return (json.dumps({"type": change.type, "object": change.obj}) + "\n").encode()


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
