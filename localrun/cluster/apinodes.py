"""The fake API server's Nodes: get, list and watch; the cluster adds, changes and removes
them (the node fixtures, a node made NotReady, a reclaimed node), and watches see it.

    GET /api/v1/nodes[?watch=true]    NodeList, or a watch stream
    GET /api/v1/nodes/{name}          Node
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping

from localrun.cluster.apilist import Lists
from localrun.cluster.apirequest import Answer, JsonObject, Reply, Request
from localrun.cluster.apistatus import not_allowed, not_found
from localrun.cluster.apistore import Store


class Nodes:
    resource = "nodes"

    def __init__(self, nodes: Mapping[str, JsonObject], store: Store, lists: Lists) -> None:
        #: By name; the same dict the server's `nodes` gives (tests change labels in place).
        self.objects: dict[str, JsonObject] = {k: copy.deepcopy(v) for k, v in nodes.items()}
        self.store = store
        self.lists = lists
        self._lock = threading.RLock()

    def handle(self, req: Request) -> Answer:
        target = req.target
        if req.method != "GET":
            return Reply(405, not_allowed(req.method))
        if target.verb == "watch":
            with self._lock:
                kept = [copy.deepcopy(n) for n in self.objects.values()]
            return self.lists.list_or_watch("nodes", "", req.query, kept)
        with self._lock:
            if not target.name:
                items = [copy.deepcopy(n) for n in self.objects.values()]
                meta = {"resourceVersion": str(self.store.version)}
                body = {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items}
                return Reply(200, body)
            node = self.objects.get(target.name)
            if node is None:
                return Reply(404, not_found(target))
            return Reply(200, copy.deepcopy(node))

    def set(self, node: JsonObject) -> None:
        """Add or replace a Node (e.g. its Ready condition False): watches see it."""
        with self._lock:
            name = node["metadata"]["name"]
            kind = "MODIFIED" if name in self.objects else "ADDED"
            node = copy.deepcopy(node)
            node["metadata"]["resourceVersion"] = self.store.next_version()
            self.objects[name] = node
            self.store.note("nodes", kind, node)

    def remove(self, name: str) -> None:
        """A node leaves the cluster (scaled down, reclaimed): watches see it DELETED."""
        with self._lock:
            node = self.objects.pop(name, None)
            if node is not None:
                node["metadata"]["resourceVersion"] = self.store.next_version()
                self.store.note("nodes", "DELETED", node)
