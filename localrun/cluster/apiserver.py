"""A fake Kubernetes API server over real HTTPS, for tests and the local runner.

It serves the few endpoints this project's containers call, with the objects, headers and
error bodies a real kube-apiserver returns, so the official `kubernetes` client runs
unchanged against it (in-cluster config, bearer token, CA verification). This module is
the generic part (kwok's layout): authentication, faults, routing, the record of requests.
Each resource has its own handler, which holds its objects and answers its paths:

    apinodes.py         nodes: get, list, watch; set and removed by the cluster
    apistatefulsets.py  statefulsets: get, list, watch; the scale subresource (on_scale)
    apipods.py          pods: get, list, watch, log, proxy, eviction (on_evict), delete
                        (on_delete)
    apievents.py        events: get, list, watch, create; those the cluster records

with apirequest.py (what a path names, the answers), apistatus.py (Status bodies in the
real server's words), apilist.py (lists and watches), apistore.py (objects, versions,
history), apihttp.py (the transport) and apipki.py (certificates, the service account).

Every request must carry `Authorization: Bearer <token>` with the token written to the
service-account dir, else 401 as the real server answers. Faults make any path answer
403/404/500/... (a real `Status` object, with the message the real server writes) or
hang without answering (for client timeouts).

Usage (the API is stable; the local runner and tests/init_topology rely on it):

    from localrun.cluster.apiserver import FakeApiServer
    from localrun.cluster.nodes import load_nodes

    with FakeApiServer(load_nodes("local"), workdir=tmp_path) as api:
        api.env()                 # {"KUBERNETES_SERVICE_HOST": ..., "KUBERNETES_SERVICE_PORT": ...}
        api.serviceaccount_dir    # token, ca.crt, namespace (podspec.SERVICEACCOUNT_PATH)
        api.set_fault(r"^/api/v1/nodes/", 403)      # or 404, 500, 429, 503, "hang"
        api.clear_faults()
        api.add_statefulset("default", "run42-worker", replicas=3)
        api.on_scale = lambda namespace, name, replicas: ...   # act as the controller
        api.requests              # what was asked: RecordedRequest(method, path, status, ...)
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from localrun.cluster import apipki
from localrun.cluster.apievents import Events
from localrun.cluster.apihttp import Handler, HttpsServer, https_server, send_answer, send_json
from localrun.cluster.apilist import Lists
from localrun.cluster.apinodes import Nodes
from localrun.cluster.apipods import DeleteCallback, LogSource, Pods
from localrun.cluster.apirequest import JsonObject, Reply, Request, Resource, target
from localrun.cluster.apistatefulsets import ScaleCallback, StatefulSets
from localrun.cluster.apistatus import NO_SUCH_RESOURCE, fault_body, status_object
from localrun.cluster.apistore import Store

log = logging.getLogger(__name__)

Fault = int | Literal["hang"]

__all__ = ["FakeApiServer", "Fault", "JsonObject", "RecordedRequest", "status_object"]


@dataclass(frozen=True)
class FaultRule:
    pattern: re.Pattern[str]
    fault: Fault
    method: str | None
    remaining: list[int] | None  # shared counter; None = for ever


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    status: int | Literal["hang"]
    authorization: str | None
    content_type: str | None
    body: Any = None
    time: float = field(default_factory=time.time)


class FakeApiServer:
    """kube-apiserver stand-in over HTTPS; see the module docstring for the API."""

    def __init__(
        self,
        nodes: Mapping[str, JsonObject] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        workdir: Path | None = None,
        *,
        namespace: str = "default",
        serviceaccount: str = "default",
        token: str | None = None,
        extra_ips: Iterable[str] = (),
        hang_seconds: float = 300.0,
    ) -> None:
        #: Every request answered (or hung), in order.
        self.requests: list[RecordedRequest] = []
        self.namespace = namespace
        self.serviceaccount = serviceaccount
        self.token = token or f"fake-{secrets.token_urlsafe(32)}"
        self.hang_seconds = hang_seconds
        self._bind_host = host
        self._bind_port = port
        self._extra_ips = tuple(extra_ips)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fake-api-"))
        self.serviceaccount_dir = self.workdir / "serviceaccount"
        self._faults: list[FaultRule] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._server: HttpsServer | None = None
        self._thread: threading.Thread | None = None
        self.store = Store()
        lists = Lists(self.store, self._stopping)
        self.node_api = Nodes(nodes or {}, self.store, lists)
        self.statefulset_api = StatefulSets(self.store, lists)
        #: add_statefulset(namespace, name, replicas=1, manifest=None): StatefulSets.add.
        self.add_statefulset = self.statefulset_api.add
        self.pod_api = Pods(self.store, lists)
        self.event_api = Events(self.store, lists)
        #: The handler of each resource, by the name its paths use.
        self.resources: dict[str, Resource] = {
            r.resource: r
            for r in (self.node_api, self.statefulset_api, self.pod_api, self.event_api)
        }

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        if self._server is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        apipki.make_certificates(pki, self._bind_host, self._extra_ips)
        self._server = https_server(
            self._bind_host, self._bind_port, self.handle, pki / "apiserver.crt",
            pki / "apiserver.key",
        )  # fmt: skip
        apipki.write_serviceaccount(
            self.serviceaccount_dir, pki / "ca.crt", self.token, self.namespace
        )
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        log.info("fake API server on %s", self.url)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return self._bind_host

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeApiServer is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    @property
    def ca_path(self) -> Path:
        return self.serviceaccount_dir / "ca.crt"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.serviceaccount}"

    def kubeconfig(self, namespace: str | None = None, name: str = "elastic-local") -> JsonObject:
        """A kubeconfig for this server (its CA inline, the service-account token), for
        kubectl and the `kubernetes` client on the host."""
        import base64  # noqa: PLC0415 - only here

        ca = base64.b64encode(self.ca_path.read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": name, "cluster": {"server": self.url, "certificate-authority-data": ca}}
            ],
            "users": [{"name": name, "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": name,
                    "context": {
                        "cluster": name,
                        "user": name,
                        "namespace": namespace or self.namespace,
                    },
                }
            ],
            "current-context": name,
            "preferences": {},
        }

    def env(self) -> dict[str, str]:
        """The variables the kubelet sets for the `kubernetes` Service in every container."""
        return {
            "KUBERNETES_SERVICE_HOST": self.host,
            "KUBERNETES_SERVICE_PORT": str(self.port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.port),
        }

    # -- faults ----------------------------------------------------------------------------

    def set_fault(
        self, path_regex: str, fault: Fault, *, method: str | None = None, times: int | None = None
    ) -> None:
        """Answer requests whose path matches `path_regex` (re.search) with `fault`.

        `fault` is an HTTP status (a Status object in the real server's words is the body) or
        "hang" (read the request, never answer, close when the server stops or after
        `hang_seconds`). `method` limits it to one verb; `times` to the next N requests.
        Rules are tried in the order they were set; use ".*" for every path.
        """
        if fault != "hang" and not (isinstance(fault, int) and 400 <= fault <= 599):
            raise ValueError(f"fault must be an HTTP error status or 'hang', not {fault!r}")
        rule = FaultRule(
            re.compile(path_regex),
            fault,
            method.upper() if method else None,
            None if times is None else [times],
        )
        with self._lock:
            self._faults.append(rule)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for rule in self._faults:
                if rule.method not in (None, method) or not rule.pattern.search(path):
                    continue
                if rule.remaining is not None:
                    if rule.remaining[0] <= 0:
                        continue
                    rule.remaining[0] -= 1
                return rule.fault
        return None

    # -- request handling ------------------------------------------------------------------

    def handle(self, req: Handler) -> None:
        """One request: authenticated, then faulted or routed to its resource's handler."""
        path, _, query_text = req.path.partition("?")
        path = urllib.parse.unquote(path)  # clients escape the ":" of pods/NAME:PORT/proxy
        query = urllib.parse.parse_qs(query_text)
        watch = (query.get("watch") or ["false"])[-1].lower() in {"true", "1"}
        method = req.command
        auth = req.headers.get("Authorization")
        ctype = req.headers.get("Content-Type")
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")

        def record(status: int | Literal["hang"]) -> None:
            with self._lock:
                self.requests.append(RecordedRequest(method, path, status, auth, ctype, body))

        if not self._authorized(auth):
            record(401)
            send_json(req, 401, status_object(401, "Unauthorized"))
            return
        fault = self._fault_for(method, path)
        if fault == "hang":
            record("hang")
            self._stopping.wait(self.hang_seconds)
            req.close_connection = True
            return
        named = target(method, path, watch)
        if fault is not None:
            record(fault)
            body_ = fault_body(fault, named, path, self.user)
            send_json(req, fault, body_, retry_after=fault == 429)
            return
        if named is None:
            record(404)
            send_json(req, 404, status_object(404, NO_SUCH_RESOURCE))
            return
        request = Request(method, path, query, body, ctype, named)
        answer = self.resources[named.resource].handle(request)
        record(answer.code)
        send_answer(req, answer)
        if isinstance(answer, Reply) and answer.after is not None:
            answer.after()

    def _authorized(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, credential = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(credential.strip(), self.token)

    # -- the resources' objects, as the cluster changes them ---------------------------------

    @property
    def nodes(self) -> dict[str, JsonObject]:
        """Nodes by name (changed in place by tests: what the next GET answers)."""
        return self.node_api.objects

    @property
    def statefulsets(self) -> dict[tuple[str, str], JsonObject]:
        """StatefulSets by (namespace, name); add with add_statefulset()."""
        return self.statefulset_api.objects

    @property
    def on_scale(self) -> ScaleCallback | None:
        """Called as on_scale(namespace, name, replicas) after a scale PATCH/PUT was applied
        (once answered; exceptions are logged, the client still gets 200)."""
        return self.statefulset_api.on_scale

    @on_scale.setter
    def on_scale(self, callback: ScaleCallback | None) -> None:
        self.statefulset_api.on_scale = callback

    @property
    def on_evict(self) -> Callable[[str, str], None] | None:
        """Called as on_evict(namespace, pod) for an accepted POST of pods/NAME/eviction
        (what `kubectl drain` sends); the cluster deletes the pod. None: 404."""
        return self.pod_api.on_evict

    @on_evict.setter
    def on_evict(self, callback: Callable[[str, str], None] | None) -> None:
        self.pod_api.on_evict = callback

    @property
    def on_delete(self) -> DeleteCallback | None:
        """Called as on_delete(namespace, pod, grace, uid) for an accepted DELETE of a pod
        (grace None: the pod's own; 0: force); the cluster deletes it. None: 405."""
        return self.pod_api.on_delete

    @on_delete.setter
    def on_delete(self, callback: DeleteCallback | None) -> None:
        self.pod_api.on_delete = callback

    @property
    def log_source(self) -> LogSource | None:
        return self.pod_api.log_source

    @log_source.setter
    def log_source(self, source: LogSource | None) -> None:
        self.pod_api.log_source = source

    def replicas(self, namespace: str, name: str) -> int:
        return self.statefulset_api.replicas(namespace, name)

    def publish_pods(self, namespace: str, pods: list[JsonObject]) -> None:
        """The pods of `namespace` as they are now: new ones ADDED, changed ones MODIFIED
        (a new resourceVersion), those not given any more DELETED."""
        self.pod_api.publish(namespace, pods)

    def add_event(self, event: JsonObject) -> JsonObject:
        """Record a core/v1 Event as a cluster component would (the kubelet, the scheduler)."""
        return self.event_api.add(event)

    def events(self, namespace: str = "") -> list[JsonObject]:
        return self.event_api.list(namespace)

    def set_node(self, node: JsonObject) -> None:
        """Add or replace a Node (e.g. its Ready condition False): watches see it."""
        self.node_api.set(node)

    def remove_node(self, name: str) -> None:
        """A node leaves the cluster (scaled down, reclaimed): watches see it DELETED."""
        self.node_api.remove(name)
