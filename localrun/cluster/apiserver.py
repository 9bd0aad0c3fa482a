"""A fake Kubernetes API server over real HTTPS, for tests and the local runner.

It serves the few endpoints this project's containers call, with the objects, headers and
error bodies a real kube-apiserver returns, so the official `kubernetes` client runs
unchanged against it (in-cluster config, bearer token, CA verification):

    GET   /api/v1/nodes[?watch=true]                               NodeList
    GET   /api/v1/nodes/{name}                                     Node
    GET   /apis/apps/v1/namespaces/{ns}/statefulsets/{name}        StatefulSet
    GET   /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale  autoscaling/v1 Scale
    PATCH /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale  merge, strategic or JSON patch
    PUT   /apis/apps/v1/namespaces/{ns}/statefulsets/{name}/scale  replace
    GET   /apis/apps/v1/namespaces/{ns}/statefulsets[?watch=true]  StatefulSetList
    GET   /apis/apps/v1/statefulsets[?watch=true]                 every namespace's
    pods (list, watch, get), pods/log (follow, previous), pods/proxy, events (list, watch,
    create): apiroutes.py, over the objects of apistore.py

Pods are what the cluster publishes (`publish_pods`, podobject.py); their logs come from
`log_source` (podlogs.py).

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

The certificate chain is made with the `openssl` CLI: a cluster CA (`ca.crt`, as the
kubelet mounts it) and a serving certificate whose SANs hold the listen IP, 127.0.0.1,
`extra_ips` and the `kubernetes.default.svc` names.
"""

from __future__ import annotations

import copy
import http.server
import ipaddress
import json
import logging
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from localrun.cluster.apiroutes import Answer, CoreRoutes, LogSource, Raw, Reply
from localrun.cluster.apistore import Store

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Fault = int | Literal["hang"]
ScaleCallback = Callable[[str, str, int], None]

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_NODE_PATH = re.compile(r"^/api/v1/nodes(?:/(?P<name>[^/]+))?$")
_STS_PATH = re.compile(
    r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/statefulsets/(?P<name>[^/]+)(?P<scale>/scale)?$"
)
_STS_LIST = re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/statefulsets$")
_STS_ALL = re.compile(r"^/apis/apps/v1/statefulsets$")
_CORE_ALL = re.compile(r"^/api/v1/(?P<res>pods|events)$")
_CORE_NS = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|events)"
    r"(?:/(?P<name>[^/:]+)(?::(?P<port>[^/]+))?(?:/(?P<sub>log|proxy|eviction)(?P<rest>/.*)?)?)?$"
)


def status_object(code: int, message: str, details: JsonObject | None = None) -> JsonObject:
    """A `Status` body as kube-apiserver writes it for a failed request."""
    body: JsonObject = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "InternalError" if code >= 500 else "BadRequest"),
    }
    if details:
        body["details"] = details
    body["code"] = code
    return body


@dataclass(frozen=True)
class _Target:
    """What a request path names, for error messages in the real server's words."""

    verb: str  # get, list, watch, create, patch, update
    group: str  # "" for the core group
    resource: str  # nodes, statefulsets, pods, events
    subresource: str  # "", "scale", "log" or "proxy"
    namespace: str  # "" when cluster-scoped
    name: str
    port: str = ""  # pods/NAME:PORT/proxy
    rest: str = ""  # the path after .../proxy

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def details(self) -> JsonObject:
        details: JsonObject = {"name": self.name} if self.name else {}
        if self.group:
            details["group"] = self.group
        details["kind"] = self.resource
        return details


def _target(method: str, path: str, watch: bool = False) -> _Target | None:
    verb = {"GET": "get", "PATCH": "patch", "PUT": "update", "POST": "create"}.get(
        method, method.lower()
    )
    collection = "watch" if watch else "list"
    if m := _NODE_PATH.match(path):
        name = m["name"] or ""
        return _Target(verb if name else collection, "", "nodes", "", "", name)
    if m := _STS_PATH.match(path):
        scale = "scale" if m["scale"] else ""
        return _Target(verb, "apps", "statefulsets", scale, m["ns"], m["name"])
    if m := _STS_LIST.match(path):
        return _Target(
            collection if method == "GET" else verb, "apps", "statefulsets", "", m["ns"], ""
        )
    if _STS_ALL.match(path):
        return _Target(collection if method == "GET" else verb, "apps", "statefulsets", "", "", "")
    if m := _CORE_ALL.match(path):
        return _Target(collection if method == "GET" else verb, "", m["res"], "", "", "")
    if m := _CORE_NS.match(path):
        name = m["name"] or ""
        if not name and method == "GET":
            verb = collection
        return _Target(
            verb, "", m["res"], m["sub"] or "", m["ns"], name, m["port"] or "", m["rest"] or ""
        )
    return None


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


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HttpsServer
    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver-fake"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self.server.api.handle(self)

    def do_PATCH(self) -> None:
        self.server.api.handle(self)

    def do_PUT(self) -> None:
        self.server.api.handle(self)

    def do_POST(self) -> None:
        self.server.api.handle(self)

    def do_DELETE(self) -> None:
        self.server.api.handle(self)


class _HttpsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: FakeApiServer
    ssl_context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        # The handshake runs in the handler thread: a client that never completes it
        # must not stall the accept loop.
        tls = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return tls, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class _HttpsServer6(_HttpsServer):
    address_family = socket.AF_INET6


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
        self.nodes: dict[str, JsonObject] = {k: copy.deepcopy(v) for k, v in (nodes or {}).items()}
        #: StatefulSets by (namespace, name); add with add_statefulset().
        self.statefulsets: dict[tuple[str, str], JsonObject] = {}
        #: Called as on_scale(namespace, name, replicas) after a scale PATCH/PUT was applied
        #: (outside the server's lock; exceptions are logged, the client still gets 200).
        self.on_scale: ScaleCallback | None = None
        #: Called as on_evict(namespace, pod) for an accepted POST of pods/NAME/eviction
        #: (what `kubectl drain` sends); the cluster deletes the pod. None: 404.
        self.on_evict: Callable[[str, str], None] | None = None
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
        self._server: _HttpsServer | None = None
        self._thread: threading.Thread | None = None
        self.store = Store()
        self.routes = CoreRoutes(self.store, status_object, self._stopping)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        if self._server is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        cls = _HttpsServer6 if ":" in self._bind_host else _HttpsServer
        server = cls((self._bind_host, self._bind_port), _Handler)
        server.api = self
        self._server = server
        self._make_certificates()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(
            self.workdir / "pki" / "apiserver.crt", self.workdir / "pki" / "apiserver.key"
        )
        server.ssl_context = ctx
        self._write_serviceaccount()
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.serve_forever,
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

    # -- faults and state ------------------------------------------------------------------

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

    def add_statefulset(
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
            meta["resourceVersion"] = self._next_version()
            sts["status"] = {
                "observedGeneration": meta["generation"],
                "replicas": replicas,
                "availableReplicas": replicas,
                "readyReplicas": replicas,
                "currentReplicas": replicas,
                "updatedReplicas": replicas,
            }
            self.statefulsets[(namespace, name)] = sts
            self.store.note("statefulsets", "ADDED", sts)
        return sts

    def replicas(self, namespace: str, name: str) -> int:
        with self._lock:
            return int(self.statefulsets[(namespace, name)]["spec"]["replicas"])

    # -- request handling ------------------------------------------------------------------

    def handle(self, req: _Handler) -> None:
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
            self._send(req, 401, status_object(401, "Unauthorized"))
            return
        fault = self._fault_for(method, path)
        if fault == "hang":
            record("hang")
            self._stopping.wait(self.hang_seconds)
            req.close_connection = True
            return
        target = _target(method, path, watch)
        if fault is not None:
            record(fault)
            self._send(req, fault, self._fault_body(fault, target, path), retry_after=fault == 429)
            return
        if target is not None and (
            target.resource in ("pods", "events")
            or target.verb == "watch"
            or (target.resource == "statefulsets" and not target.name)
        ):
            answer = self._route_core(method, path, target, query, body)
            record(answer.code)
            self._answer(req, answer)
            return
        code, payload, scaled = self._route(method, path, target, ctype, body)
        record(code)
        self._send(req, code, payload)
        if scaled is not None and self.on_scale is not None:
            try:
                self.on_scale(*scaled)
            except Exception:  # the callback is the runner's code: report it, keep serving
                log.exception("on_scale%r raised", scaled)

    def _authorized(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, credential = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(credential.strip(), self.token)

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

    def _fault_body(self, code: int, target: _Target | None, path: str) -> JsonObject:
        if target is None:
            return status_object(code, "the server could not find the requested resource")
        resource = (
            f"{target.resource}/{target.subresource}" if target.subresource else target.resource
        )
        if code == 401:
            return status_object(401, "Unauthorized")
        if code == 403:
            subject = f'{target.qualified} "{target.name}"' if target.name else target.qualified
            scope = (
                f'in the namespace "{target.namespace}"'
                if target.namespace
                else "at the cluster scope"
            )
            message = (
                f'{subject} is forbidden: User "{self.user}" cannot {target.verb} resource '
                f'"{resource}" in API group "{target.group}" {scope}'
            )
            return status_object(403, message, target.details)
        if code == 404:
            return status_object(
                404, f'{target.qualified} "{target.name}" not found', target.details
            )
        if code == 409:
            message = (
                f'Operation cannot be fulfilled on {target.qualified} "{target.name}": the object '
                "has been modified; please apply your changes to the latest version and try again"
            )
            return status_object(409, message, target.details)
        if code == 429:
            return status_object(
                429, "Too many requests, please try again later.", {"retryAfterSeconds": 1}
            )
        if code == 500:
            cause = "etcdserver: request timed out"
            return status_object(
                500, f"Internal error occurred: {cause}", {"causes": [{"message": cause}]}
            )
        if code == 503:
            return status_object(503, "the server is currently unable to handle the request")
        if code == 504:
            return status_object(504, "Timeout: request did not complete within requested timeout")
        return status_object(code, f"fault injected on {path}")

    def _route(
        self, method: str, path: str, target: _Target | None, ctype: str | None, body: Any
    ) -> tuple[int, JsonObject, tuple[str, str, int] | None]:
        if target is None:
            return 404, status_object(404, "the server could not find the requested resource"), None
        with self._lock:
            if target.resource == "nodes":
                return self._route_nodes(method, path, target)
            return self._route_statefulset(method, path, target, ctype, body)

    def _route_core(
        self, method: str, path: str, target: _Target, query: dict[str, list[str]], body: Any
    ) -> Answer:
        """Pods, logs, proxy, events, StatefulSet lists and every watch (apiroutes.py)."""
        routes = self.routes
        not_found = self._fault_body(404, target, path)
        allowed = {"events": ("GET", "POST")}.get(target.resource, ("GET",))
        if target.subresource == "eviction":
            return self._evict(method, target, not_found)
        if method not in allowed or (method == "POST" and target.name):
            return Reply(405, status_object(405, f"{method} is not supported here"))
        if target.resource == "nodes":
            with self._lock:
                kept = [copy.deepcopy(n) for n in self.nodes.values()]
            return routes.list_or_watch("nodes", "", query, kept)
        if target.resource == "statefulsets":
            with self._lock:
                kept = [
                    copy.deepcopy(o)
                    for (ns, _), o in sorted(self.statefulsets.items())
                    if ns == target.namespace or not target.namespace
                ]
            return routes.list_or_watch("statefulsets", target.namespace, query, kept)
        if method == "POST":
            return routes.create_event(target.namespace, body)
        if not target.name:
            return routes.list_or_watch(target.resource, target.namespace, query)
        if target.resource == "events":
            obj = self.store.get("events", target.namespace, target.name)
            return Reply(200, obj) if obj is not None else Reply(404, not_found)
        if target.subresource == "log":
            return routes.log(target.namespace, target.name, query, not_found)
        if target.subresource == "proxy":
            rest_query = {k: v for k, v in query.items()}
            return routes.proxy(
                target.namespace,
                target.name,
                port=target.port,
                rest=target.rest,
                query=rest_query,
                not_found=not_found,
            )
        return routes.pod(target.namespace, target.name, not_found)

    def _evict(self, method: str, target: _Target, not_found: JsonObject) -> Answer:
        """POST pods/NAME/eviction: 201 and a Success Status, then on_evict (the cluster
        marks the pod DisruptionTarget EvictionByEvictionAPI and deletes it)."""
        if method != "POST":
            return Reply(405, status_object(405, f"{method} is not supported here"))
        if self.store.get("pods", target.namespace, target.name) is None or self.on_evict is None:
            return Reply(404, not_found)
        self.on_evict(target.namespace, target.name)
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
        return Reply(201, body)

    def _answer(self, req: _Handler, answer: Answer) -> None:
        if isinstance(answer, Reply):
            self._send(req, answer.code, answer.payload)
            return
        req.send_response(answer.code)
        req.send_header("Audit-Id", str(uuid.uuid4()))
        req.send_header("Cache-Control", "no-cache, private")
        req.send_header("Content-Type", answer.content_type)
        if isinstance(answer, Raw):
            req.send_header("Content-Length", str(len(answer.data)))
            req.end_headers()
            req.wfile.write(answer.data)
            return
        # A stream (watch, log follow): chunked, flushed per chunk, ended by a last chunk.
        req.send_header("Transfer-Encoding", "chunked")
        req.end_headers()
        try:
            for chunk in answer.chunks:
                if chunk:
                    req.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    req.wfile.flush()
            req.wfile.write(b"0\r\n\r\n")
            req.wfile.flush()
        except (OSError, ssl.SSLError):
            req.close_connection = True  # the client went away

    # -- what the cluster publishes ----------------------------------------------------------

    @property
    def log_source(self) -> LogSource | None:
        return self.routes.log_source

    @log_source.setter
    def log_source(self, source: LogSource | None) -> None:
        self.routes.log_source = source

    def publish_pods(self, namespace: str, pods: list[JsonObject]) -> None:
        """The pods of `namespace` as they are now: new ones ADDED, changed ones MODIFIED
        (a new resourceVersion), those not given any more DELETED."""
        present = set()
        for pod in pods:
            present.add(pod["metadata"]["name"])
            self.store.put("pods", pod)
        for ns, name in self.store.names("pods"):
            if ns == namespace and name not in present:
                self.store.delete("pods", ns, name)

    def add_event(self, event: JsonObject) -> JsonObject:
        """Record a core/v1 Event as a cluster component would (the kubelet, the scheduler)."""
        return self.routes.add_event(event)

    def events(self, namespace: str = "") -> list[JsonObject]:
        return self.store.list_objects("events", namespace)[0]

    def set_node(self, node: JsonObject) -> None:
        """Add or replace a Node (e.g. its Ready condition False): watches see it."""
        with self._lock:
            name = node["metadata"]["name"]
            kind = "MODIFIED" if name in self.nodes else "ADDED"
            node = copy.deepcopy(node)
            node["metadata"]["resourceVersion"] = self._next_version()
            self.nodes[name] = node
            self.store.note("nodes", kind, node)

    def remove_node(self, name: str) -> None:
        """A node leaves the cluster (scaled down, reclaimed): watches see it DELETED."""
        with self._lock:
            node = self.nodes.pop(name, None)
            if node is not None:
                node["metadata"]["resourceVersion"] = self._next_version()
                self.store.note("nodes", "DELETED", node)

    def _route_nodes(
        self, method: str, path: str, target: _Target
    ) -> tuple[int, JsonObject, tuple[str, str, int] | None]:
        if method != "GET":
            return 405, status_object(405, f"{method} is not supported here"), None
        if not target.name:
            items = [copy.deepcopy(n) for n in self.nodes.values()]
            meta = {"resourceVersion": str(self.store.version)}
            return (
                200,
                {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items},
                None,
            )
        node = self.nodes.get(target.name)
        if node is None:
            return 404, self._fault_body(404, target, path), None
        return 200, copy.deepcopy(node), None

    def _route_statefulset(
        self, method: str, path: str, target: _Target, ctype: str | None, body: Any
    ) -> tuple[int, JsonObject, tuple[str, str, int] | None]:
        """A StatefulSet or its scale subresource; the third item names a replica change."""
        sts = self.statefulsets.get((target.namespace, target.name))
        if sts is None:
            return 404, self._fault_body(404, target, path), None
        if not target.subresource:
            if method != "GET":
                return 405, status_object(405, f"{method} is not supported here"), None
            return 200, copy.deepcopy(sts), None
        if method == "GET":
            return 200, self._scale(sts), None
        if method not in ("PATCH", "PUT"):
            return 405, status_object(405, f"{method} is not supported here"), None
        replicas = _replicas_from(method, ctype, body)
        if isinstance(replicas, tuple):
            code, message = replicas
            return code, status_object(code, message), None
        if replicas != sts["spec"]["replicas"]:
            sts["spec"]["replicas"] = replicas
            sts["metadata"]["generation"] = int(sts["metadata"].get("generation", 1)) + 1
            sts["metadata"]["resourceVersion"] = self._next_version()
            sts["status"]["replicas"] = replicas
            self.store.note("statefulsets", "MODIFIED", sts)
        return 200, self._scale(sts), (target.namespace, target.name, replicas)

    def _scale(self, sts: JsonObject) -> JsonObject:
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

    def _next_version(self) -> str:
        return self.store.next_version()

    def _send(
        self, req: _Handler, code: int, payload: JsonObject, *, retry_after: bool = False
    ) -> None:
        data = json.dumps(payload).encode()
        req.send_response(code)
        req.send_header("Audit-Id", str(uuid.uuid4()))
        req.send_header("Cache-Control", "no-cache, private")
        req.send_header("Content-Type", "application/json")
        req.send_header("X-Kubernetes-Pf-Flowschema-Uid", "f2d1b2a0-6d0e-4c55-9f3e-0a1b2c3d4e5f")
        req.send_header("X-Kubernetes-Pf-Prioritylevel-Uid", "0d6c3b5e-2f4a-4b8e-8c1d-5e6f7a8b9c0d")
        if retry_after:
            req.send_header("Retry-After", "1")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    # -- files -----------------------------------------------------------------------------

    def _make_certificates(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ips = {"127.0.0.1", *self._extra_ips}
        if self.host not in ("0.0.0.0", "::"):
            ips.add(self.host)
        dns = ["kubernetes", "kubernetes.default", "kubernetes.default.svc"]
        dns += ["kubernetes.default.svc.cluster.local", "localhost"]
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{ipaddress.ip_address(i)}" for i in sorted(ips)]
        (pki / "apiserver.ext").write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            f"subjectAltName={','.join(sans)}\n",
            encoding="utf-8",
        )
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        steps = [
            ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
             "-subj", "/CN=kubernetes", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign"],
            ["req", "-new", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver"],
            ["x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-set_serial", str(int.from_bytes(secrets.token_bytes(8), "big")), "-days", "365",
             "-extfile", "apiserver.ext", "-out", "apiserver.crt"],
        ]  # fmt: skip
        for step in steps:
            done = subprocess.run(
                ["openssl", *step], cwd=pki, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"openssl {step[0]} failed: {done.stderr.strip()}")

    def _write_serviceaccount(self) -> None:
        sa = self.serviceaccount_dir
        sa.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.workdir / "pki" / "ca.crt", sa / "ca.crt")
        # The kubelet writes both without a trailing newline.
        (sa / "token").write_text(self.token, encoding="utf-8")
        (sa / "namespace").write_text(self.namespace, encoding="utf-8")
        for item in sa.iterdir():
            item.chmod(0o644)


def _replicas_from(method: str, ctype: str | None, body: Any) -> int | tuple[int, str]:
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
