"""Lists and watches, the same for every resource: a List object, or a watch stream.

A watch streams one JSON object per line, `{"type": "ADDED|MODIFIED|DELETED", "object":
...}`, from the list's resourceVersion (or every current object as ADDED first), until
`timeoutSeconds` (default 1800 s) or the server stops; a resourceVersion older than the
store's history gets an ERROR event holding a 410 Status, as from kube-apiserver.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

from localrun.cluster.apirequest import Answer, JsonObject, Query, Reply, Stream, flag, one
from localrun.cluster.apistatus import status_object
from localrun.cluster.apistore import Change, SelectorError, Store, TooOld, selected

WATCH_TIMEOUT = 1800.0
_KINDS = {"pods": "Pod", "events": "Event", "nodes": "Node", "statefulsets": "StatefulSet"}
_LIST_VERSION = {"statefulsets": "apps/v1"}


class Lists:
    """Lists and watches over a Store; a watch ends when `stopping` is set."""

    def __init__(self, store: Store, stopping: threading.Event) -> None:
        self.store = store
        self.stopping = stopping

    def list_or_watch(
        self,
        resource: str,
        namespace: str,
        query: Query,
        kept: list[JsonObject] | None = None,
    ) -> Answer:
        """A List object, or a watch stream when `watch=true`; `kept` are the objects of a
        resource kept outside the store (nodes, StatefulSets), else the store's."""
        labels, fields = one(query, "labelSelector"), one(query, "fieldSelector")
        try:
            if kept is None:
                items, version = self.store.list_objects(
                    resource, namespace, label_selector=labels, field_selector=fields
                )
            else:
                items = [o for o in kept if selected(o, labels, fields)]
                version = str(self.store.version)
        except SelectorError as exc:
            return Reply(400, status_object(400, str(exc)))
        if flag(query, "watch"):
            timeout = float(one(query, "timeoutSeconds") or WATCH_TIMEOUT)
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
                since=one(query, "resourceVersion"),
                label_selector=labels,
                field_selector=fields,
                initial=kept,
                stop=self.stopping,
                timeout=timeout,
            )
            for change in changes:
                yield _event_line(change)
        except TooOld as exc:
            status = status_object(410, str(exc))
            status["reason"] = "Expired"
            yield (json.dumps({"type": "ERROR", "object": status}) + "\n").encode()


def _event_line(change: Change) -> bytes:
    return (json.dumps({"type": change.type, "object": change.obj}) + "\n").encode()
