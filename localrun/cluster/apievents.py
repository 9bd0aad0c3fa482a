"""The fake API server's core/v1 Events: those the workers POST (elastic-worker's events
recorder) and those the cluster records (the scheduler, the kubelet, the StatefulSet
controller: podobject.lifecycle_events).

    GET  /api/v1/namespaces/{ns}/events[?watch=true]   EventList, or a watch stream
    GET  /api/v1/events                                every namespace's events
    GET  /api/v1/namespaces/{ns}/events/{name}         Event
    POST /api/v1/namespaces/{ns}/events                create a core/v1 Event
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from localrun.cluster.apilist import Lists
from localrun.cluster.apirequest import Answer, JsonObject, Reply, Request
from localrun.cluster.apistatus import not_allowed, not_found, status_object
from localrun.cluster.apistore import Store


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Events:
    resource = "events"

    def __init__(self, store: Store, lists: Lists) -> None:
        self.store = store
        self.lists = lists

    def handle(self, req: Request) -> Answer:
        target = req.target
        if target.subresource:  # events have none
            return Reply(404, not_found(target))
        if req.method not in ("GET", "POST") or (req.method == "POST" and target.name):
            return Reply(405, not_allowed(req.method))
        if req.method == "POST":
            return self.create(target.namespace, req.body)
        if not target.name:
            return self.lists.list_or_watch("events", target.namespace, req.query)
        obj = self.store.get("events", target.namespace, target.name)
        return Reply(200, obj) if obj is not None else Reply(404, not_found(target))

    def list(self, namespace: str = "") -> list[JsonObject]:
        return self.store.list_objects("events", namespace)[0]

    def create(self, namespace: str, body: Any) -> Reply:
        """An Event POSTed by a client, checked as the real server checks one."""
        if not isinstance(body, dict):
            return Reply(400, status_object(400, "the body must be a JSON object"))
        meta = dict(body.get("metadata") or {})
        if meta.get("namespace", namespace) != namespace:
            message = (
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
            return Reply(400, status_object(400, message))
        if not meta.get("name"):
            if not meta.get("generateName"):
                return Reply(
                    422, status_object(422, "Event is invalid: metadata.name: Required value")
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        involved = body.get("involvedObject") or {}
        if not involved.get("name") or not involved.get("kind"):
            message = f'Event "{meta["name"]}" is invalid: involvedObject: Required value'
            return Reply(422, status_object(422, message))
        if involved.get("namespace", namespace) != namespace:
            message = (
                f'Event "{meta["name"]}" is invalid: involvedObject.namespace: Invalid value: '
                f'"{involved.get("namespace")}": does not match event.namespace'
            )
            return Reply(422, status_object(422, message))
        if self.store.get("events", namespace, meta["name"]) is not None:
            message = f'events "{meta["name"]}" already exists'
            return Reply(409, status_object(409, message, {"name": meta["name"], "kind": "events"}))
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        event = {**body, "apiVersion": "v1", "kind": "Event", "metadata": meta}
        change = self.store.put("events", event)
        assert change is not None
        return Reply(201, change.obj)

    def add(self, event: JsonObject) -> JsonObject:
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
