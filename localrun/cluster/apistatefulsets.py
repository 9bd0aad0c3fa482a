"""The fake API server's StatefulSets and their scale subresource, as the workers' scale-down
and `kubectl scale` use them; `on_scale` lets the local run act as the controller.

    GET   /apis/apps/v1/namespaces/{ns}/statefulsets[?watch=true]  StatefulSetList
    GET   /apis/apps/v1/statefulsets[?watch=true]                 every namespace's
    GET   /apis/apps/v1/namespaces/{ns}/statefulsets/{name}        StatefulSet
    GET   /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale  autoscaling/v1 Scale
    PATCH /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale  merge, strategic or JSON patch
    PUT   /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale  replace
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from localrun.cluster.apilist import Lists
from localrun.cluster.apirequest import Answer, JsonObject, Reply, Request
from localrun.cluster.apistatus import not_allowed, not_found, status_object
from localrun.cluster.apistore import Store

log = logging.getLogger(__name__)

ScaleCallback = Callable[[str, str, int], None]


class StatefulSets:
    resource = "statefulsets"

    def __init__(self, store: Store, lists: Lists) -> None:
        #: By (namespace, name); the same dict the server's `statefulsets` gives.
        self.objects: dict[tuple[str, str], JsonObject] = {}
        #: Called as on_scale(namespace, name, replicas) after a scale PATCH/PUT was applied
        #: and answered (exceptions are logged, the client still gets 200).
        self.on_scale: ScaleCallback | None = None
        self.store = store
        self.lists = lists
        self._lock = threading.RLock()

    def add(
        self,
        namespace: str,
        name: str,
        replicas: int = 1,
        manifest: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        """Register a StatefulSet (e.g. the rendered manifest) as the API server would store it."""
        sts: JsonObject = copy.deepcopy(dict(manifest)) if manifest else {}
        sts.setdefault("apiVersion", "apps/v1")
        sts.setdefault("kind", "StatefulSet")
        meta = sts.setdefault("metadata", {})
        meta["name"] = name
        meta["namespace"] = namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", _now())
        spec = sts.setdefault("spec", {})
        spec["replicas"] = replicas
        selector = spec.setdefault("selector", {"matchLabels": {"app.kubernetes.io/name": name}})
        spec.setdefault("serviceName", name)
        # The typed client refuses a StatefulSet without a pod template: give it one.
        spec.setdefault(
            "template",
            {
                "metadata": {"labels": dict(selector.get("matchLabels", {}))},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/main:0"}]},
            },
        )
        with self._lock:
            meta["resourceVersion"] = self.store.next_version()
            sts["status"] = {
                "observedGeneration": meta["generation"],
                "replicas": replicas,
                "availableReplicas": replicas,
                "readyReplicas": replicas,
                "currentReplicas": replicas,
                "updatedReplicas": replicas,
            }
            self.objects[(namespace, name)] = sts
            self.store.note("statefulsets", "ADDED", sts)
        return sts

    def replicas(self, namespace: str, name: str) -> int:
        with self._lock:
            return int(self.objects[(namespace, name)]["spec"]["replicas"])

    def handle(self, req: Request) -> Answer:
        target = req.target
        if not target.name:  # the namespace's (or every namespace's) list, or a watch
            if req.method != "GET":
                return Reply(405, not_allowed(req.method))
            with self._lock:
                kept = [
                    copy.deepcopy(o)
                    for (ns, _), o in sorted(self.objects.items())
                    if ns == target.namespace or not target.namespace
                ]
            return self.lists.list_or_watch("statefulsets", target.namespace, req.query, kept)
        with self._lock:
            return self._one(req)

    def _one(self, req: Request) -> Reply:
        """A StatefulSet or its scale subresource."""
        target, method = req.target, req.method
        sts = self.objects.get((target.namespace, target.name))
        if sts is None:
            return Reply(404, not_found(target))
        if not target.subresource:
            if method != "GET":
                return Reply(405, not_allowed(method))
            return Reply(200, copy.deepcopy(sts))
        if method == "GET":
            return Reply(200, _scale(sts))
        if method not in ("PATCH", "PUT"):
            return Reply(405, not_allowed(method))
        replicas = replicas_from(method, req.content_type, req.body)
        if isinstance(replicas, tuple):
            code, message = replicas
            return Reply(code, status_object(code, message))
        if replicas != sts["spec"]["replicas"]:
            sts["spec"]["replicas"] = replicas
            sts["metadata"]["generation"] = int(sts["metadata"].get("generation", 1)) + 1
            sts["metadata"]["resourceVersion"] = self.store.next_version()
            sts["status"]["replicas"] = replicas
            self.store.note("statefulsets", "MODIFIED", sts)
        scaled = (target.namespace, target.name, replicas)
        return Reply(200, _scale(sts), after=lambda: self._scaled(scaled))

    def _scaled(self, scaled: tuple[str, str, int]) -> None:
        if self.on_scale is None:
            return
        try:
            self.on_scale(*scaled)
        except Exception:  # the callback is the runner's code: report it, keep serving
            log.exception("on_scale%r raised", scaled)


def _scale(sts: JsonObject) -> JsonObject:
    meta = sts["metadata"]
    labels = sts["spec"].get("selector", {}).get("matchLabels", {})
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": sts["spec"]["replicas"]},
        "status": {
            "replicas": sts["status"].get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


def replicas_from(method: str, ctype: str | None, body: Any) -> int | tuple[int, str]:
    """The new spec.replicas from a scale PATCH/PUT body, or (status, message)."""
    kind = (ctype or "").split(";")[0].strip().lower()
    value: Any = None
    if kind == "application/json-patch+json":
        if not isinstance(body, list):
            return 400, "the body of a JSON patch must be a list of operations"
        for op in body:
            if isinstance(op, dict) and op.get("path") == "/spec/replicas":
                if op.get("op") not in ("replace", "add"):
                    return 422, f"unsupported JSON patch op {op.get('op')!r} on /spec/replicas"
                value = op.get("value")
    elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json") or (
        method == "PUT" and kind == "application/json"
    ):
        if not isinstance(body, dict):
            return 400, "the body must be a JSON object"
        value = (body.get("spec") or {}).get("replicas")
    else:
        return 415, f"the body of the request was in an unknown format: {ctype}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        message = f"spec.replicas: Invalid value: {value!r}: must be greater than or equal to 0"
        return 422, f'Scale.autoscaling "" is invalid: {message}'
    return int(value)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
