"""The command's access to the API server, on the official `kubernetes` client: kubeconfig
(kubeconfig.py: `--kubeconfig`, `KUBECONFIG` merged, ~/.kube/config; `--context`) or
in-cluster config, the namespace as kubectl picks it, `--request-timeout` on every
request, and every failure turned into one line that says what to do.

Objects are read as plain JSON dicts (`_preload_content=False`), the shapes the API serves,
so the pure modules (jobstate, timeline, pricing, joblist) take exactly what a cluster
returns. The client is untyped: what it answers is checked once (responses.py) into the
shapes the command reads (ObjectList, WatchEvent); a body of another shape is one error
here, not a KeyError later.

Timeouts: every request gets (connect, read) = (t, t) through the client's documented
`_request_timeout` (a float alone is ignored by clients before 36, so the tuple is the
form every supported client honours): the TCP connect and the TLS handshake within t, and
no wait longer than t for an answer. A stream (a watch, a followed log) waits t for its
headers and then as long as it lasts: a quiet watch is not a hung server. A request that
timed out is not sent again (urllib3 would retry it once: twice the wait).

A connection that could not be made is told apart from one that timed out (failure()):
urllib3 raises NewConnectionError, a subclass of ConnectTimeoutError, for a refusal as for
a host name that does not resolve, so the class alone would call both a timeout.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import urllib3
from kubernetes import client, config, watch  # type: ignore[import-untyped]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]
from kubernetes.config.config_exception import ConfigException  # type: ignore[import-untyped]

from elastic_job_cli import kubeconfig, promtext
from elastic_job_cli import objects as o
from elastic_job_cli.objects import Obj, Release
from elastic_job_cli.options import Access, seconds_text
from elastic_job_cli.responses import ObjectList, WatchEvent, object_list, watch_event

if TYPE_CHECKING:
    from typing import Self

    from urllib3.connectionpool import ConnectionPool
    from urllib3.response import BaseHTTPResponse

    from elastic_job_cli.responses import RawCall

_T = TypeVar("_T")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_FORBIDDEN = 4
EXIT_UNREACHABLE = 5

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: A pod's /metrics through the API server's proxy: at most this long (seconds), whatever
#: --request-timeout says; a pod that does not answer leaves its columns empty.
METRICS_TIMEOUT = 5.0
#: Pods whose metrics are read at once (`list` reads every pod of every job); below the
#: client's connection pool (5 per CPU) so that no connection is thrown away.
METRICS_PARALLEL = 8


class CommandError(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)


#: What failure() finds when a connection or a request fails.
REFUSED = "refused"  # nothing listens at the server's address and port
NO_HOST = "no such host"  # the server's host name does not resolve
TIMEOUT = "timeout"  # no connection or no answer within --request-timeout
OTHER = "other"  # no route, reset, a TLS error, ...


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """exc, what it wraps (urllib3's `reason`) and what it was raised from, each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop(0)
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        reason = getattr(cur, "reason", None)
        todo += [reason if isinstance(reason, BaseException) else None]
        todo += [cur.__cause__, cur.__context__]


def failure(exc: BaseException) -> str:
    """Why a request failed below HTTP: REFUSED, NO_HOST, TIMEOUT or OTHER. The socket's own
    error decides, since urllib3's NewConnectionError (a refusal, an unknown host) is a
    subclass of its ConnectTimeoutError (urllib3 1.26 and 2.x alike)."""
    chain = list(_chain(exc))
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or any(
        isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in chain
    ):
        return REFUSED
    if any(isinstance(e, (socket.gaierror, urllib3.exceptions.NameResolutionError)) for e in chain):
        return NO_HOST
    if any(isinstance(e, urllib3.exceptions.NewConnectionError) for e in chain):
        return OTHER
    if any(isinstance(e, (urllib3.exceptions.TimeoutError, TimeoutError)) for e in chain):
        return TIMEOUT
    return OTHER


class _Retry(urllib3.Retry):
    """urllib3's retries less the one after a timeout: a server that did not answer within
    --request-timeout is not asked again (kubectl does not ask again either), so that the
    command ends within the timeout and not twice it. A refused or dropped connection (a
    pooled one the server closed) is still tried once more: it costs no wait."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if error is not None and failure(error) == TIMEOUT:
            raise urllib3.exceptions.MaxRetryError(_pool, url, error) from error  # type: ignore[arg-type]
        return super().increment(method, url, response, error, _pool, _stacktrace)


def body_text(resp: BaseHTTPResponse) -> str:
    """A raw response's body as text: the client's own decoding differs by version (36
    returns the text "b'...'" for pods/log and pods/proxy), and a log may hold bytes that
    are not UTF-8, which are replaced as a terminal shows them."""
    body: bytes = resp.data
    return body.decode("utf-8", errors="replace")


def _no_read_timeout(resp: BaseHTTPResponse) -> BaseHTTPResponse:
    """A stream's response once its headers came: its reads wait as long as the stream
    lasts (the socket's timeout was the read timeout, t)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(None)
    return resp


class Kube:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        server: str,
        *,
        timeout: float | None,
        all_namespaces: bool = False,
        origin: str = "",
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.namespace = namespace
        self.server = server
        #: Where the server came from, for messages: "KUBECONFIG=..., context c" or
        #: "in-cluster config".
        self.origin = origin
        #: Seconds to wait for the API server (--request-timeout); None: for ever.
        self.timeout = timeout
        self.all_namespaces = all_namespaces

    @property
    def request_timeout(self) -> tuple[float, float] | None:
        """The client's `_request_timeout`: (connect, read)."""
        return None if self.timeout is None else (self.timeout, self.timeout)

    @property
    def metrics_timeout(self) -> tuple[float, float]:
        t = min(METRICS_TIMEOUT, self.timeout or METRICS_TIMEOUT)
        return (t, t)

    # -- errors ------------------------------------------------------------------------------

    def call(
        self, verb: str, resource: str, fn: Callable[..., _T], *args: object, **kwargs: object
    ) -> _T:
        """`fn(*args, **kwargs)` within the request timeout; a refusal becomes a
        CommandError naming the RBAC verb, a timeout or a lost server one line (exit 5)."""
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise self.error(exc, verb, resource) from None
        except urllib3.exceptions.HTTPError as exc:
            raise self.unreachable(exc) from None

    def unreachable(self, exc: urllib3.exceptions.HTTPError) -> CommandError:
        """One line for a request that failed below HTTP: a refusal is not a timeout."""
        kind = failure(exc)
        where = f" ({self.origin})" if self.origin else ""
        if kind == REFUSED:
            # kubectl: "The connection to the server HOST:PORT was refused - did you
            # specify the right host or port?"
            return CommandError(
                f"connection refused: is the API server at {self.server} up?{where}: check "
                "--context and --kubeconfig (kubectl cluster-info)",
                EXIT_UNREACHABLE,
            )
        if kind == NO_HOST:
            return CommandError(
                f"no such host: the API server's name in {self.server} does not resolve"
                f"{where}: check --context and --kubeconfig, and the DNS or VPN it needs",
                EXIT_UNREACHABLE,
            )
        if kind == TIMEOUT:
            return CommandError(
                f"the API server at {self.server} did not answer within "
                f"{seconds_text(self.timeout)} (--request-timeout): check that it is up "
                "(kubectl cluster-info), or pass a longer --request-timeout",
                EXIT_UNREACHABLE,
            )
        reason = getattr(exc, "reason", None) or exc
        return CommandError(
            f"cannot reach the API server at {self.server}{where}: {reason}; check --context "
            "and --kubeconfig (kubectl cluster-info)",
            EXIT_UNREACHABLE,
        )

    def error(self, exc: ApiException, verb: str, resource: str) -> CommandError:
        message = _status_message(exc)
        scope = (
            "" if resource == "nodes" else " -A" if self.all_namespaces else f" -n {self.namespace}"
        )
        if exc.status == 403:
            return CommandError(
                f"{message}: ask for a Role granting {verb} on {resource} "
                f"(check with: kubectl auth can-i {verb} {resource}{scope})",
                EXIT_FORBIDDEN,
            )
        if exc.status == 401:
            return CommandError(
                f"the API server refused the credentials ({message}): log in again or pick "
                "another --context",
                EXIT_FORBIDDEN,
            )
        return CommandError(f"{verb} {resource}: HTTP {exc.status}: {message}")

    def json(
        self, verb: str, resource: str, fn: RawCall, *args: object, **kwargs: object
    ) -> ObjectList:
        """A list request (`fn`, a client list method): its body as the command reads it."""
        resp = self.call(verb, resource, fn, *args, _preload_content=False, **kwargs)
        try:
            body = resp.data  # the body is read here, within the same timeout
        except urllib3.exceptions.HTTPError as exc:
            raise self.unreachable(exc) from None
        try:
            found = object_list(json.loads(body))
        except ValueError:
            found = None
        if found is None:
            raise CommandError(
                f"{verb} {resource}: the API server at {self.server} answered "
                f"{body[:80]!r}, not a list of {resource}; is --context a Kubernetes cluster?"
            )
        return found

    def text(self, verb: str, resource: str, fn: RawCall, *args: object, **kwargs: object) -> str:
        """A body that is text (pods/log), read raw (body_text)."""
        resp = self.call(verb, resource, fn, *args, _preload_content=False, **kwargs)
        try:
            return body_text(resp)  # read here, within the same timeout
        except urllib3.exceptions.HTTPError as exc:
            raise self.unreachable(exc) from None

    def open_stream(self, fn: RawCall, *args: object, **kwargs: object) -> BaseHTTPResponse:
        """`fn` for a stream (`follow=True`): the urllib3 response once the server
        answered within the timeout, its reads then unbounded."""
        resp = fn(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs)
        return _no_read_timeout(resp)

    # -- reads -------------------------------------------------------------------------------

    def release(self, name: str) -> Release:
        ns = self.namespace
        sel = o.worker_selector(name)
        sts = self.json(
            "list",
            "statefulsets.apps",
            self.apps.list_namespaced_stateful_set,
            ns,
            label_selector=sel,
        )["items"]
        if not sts:
            raise CommandError(
                f"no elastic-job release {name!r} in namespace {ns!r} (no StatefulSet labelled "
                f"{sel}): `helm list -n {ns}` lists the releases; pass -n NAMESPACE",
                EXIT_NOT_FOUND,
            )
        return Release(name, ns, sts, self.pods(name, sts))

    def pods(self, name: str, statefulsets: list[Obj]) -> list[Obj]:
        items = self.json(
            "list", "pods", self.core.list_namespaced_pod, self.namespace,
            label_selector=o.worker_selector(name),
        )["items"]  # fmt: skip
        owners = {o.name(s) for s in statefulsets}
        return sorted((p for p in items if o.owned_by(p, owners)), key=o.name)

    def nodes(self) -> tuple[dict[str, Obj], str]:
        """Nodes by name, and a note when they cannot be read (403: a namespaced user)."""
        try:
            items = self.json("list", "nodes", self.core.list_node)["items"]
        except CommandError as exc:
            if exc.code == EXIT_FORBIDDEN:
                return {}, f"nodes not readable ({exc}); capacity and GPU columns are empty"
            raise
        return {o.name(n): n for n in items}, ""

    def events(self) -> list[Obj]:
        return self.json("list", "events", self.core.list_namespaced_event, self.namespace)["items"]

    # -- every release (list) ----------------------------------------------------------------

    def workers(self) -> tuple[list[Obj], list[Obj], list[Obj]]:
        """Every elastic-job worker StatefulSet and pod in the namespace (every namespace
        with -A), and the workers' JobCompleted Events: three list requests, whatever the
        number of jobs."""
        workers = {"label_selector": o.all_workers_selector()}
        done = {"field_selector": f"reason={o.JOB_COMPLETED}"}
        if self.all_namespaces:
            sts = self.json(
                "list", "statefulsets.apps", self.apps.list_stateful_set_for_all_namespaces,
                **workers,
            )  # fmt: skip
            pods = self.json("list", "pods", self.core.list_pod_for_all_namespaces, **workers)
            events = self.json("list", "events", self.core.list_event_for_all_namespaces, **done)
        else:
            ns = self.namespace
            sts = self.json(
                "list", "statefulsets.apps", self.apps.list_namespaced_stateful_set, ns, **workers
            )
            pods = self.json("list", "pods", self.core.list_namespaced_pod, ns, **workers)
            events = self.json("list", "events", self.core.list_namespaced_event, ns, **done)
        return sts["items"], pods["items"], events["items"]

    def metrics(self, pod: Obj) -> tuple[dict[str, float] | None, str]:
        """The worker's /metrics through the pod proxy; (None, why) when not readable."""
        if not o.has_metrics_port(pod):
            return None, "off"
        if (pod.get("status") or {}).get("phase") != "Running":
            return None, "on"
        try:
            text = body_text(
                self.core.connect_get_namespaced_pod_proxy_with_path(
                    f"{o.name(pod)}:{o.METRICS_PORT}",
                    o.namespace(pod) or self.namespace,
                    "metrics",
                    _request_timeout=self.metrics_timeout,
                    _preload_content=False,
                )
            )
        except ApiException as exc:
            if exc.status == 403:
                return None, f"metrics not readable: {self.error(exc, 'get', 'pods/proxy')}"
            return None, "on"
        except urllib3.exceptions.HTTPError:
            return None, "on"
        return promtext.parse(text), "on"

    def metrics_of(self, pods: list[Obj]) -> dict[str, tuple[dict[str, float] | None, str]]:
        """metrics() of many pods, METRICS_PARALLEL at a time, by pod uid."""
        if not pods:
            return {}
        with ThreadPoolExecutor(min(METRICS_PARALLEL, len(pods))) as pool:
            found = list(pool.map(self.metrics, pods))
        return {p["metadata"]["uid"]: m for p, m in zip(pods, found, strict=True)}

    def stream(
        self, resource: str, fn: RawCall, *args: object, **kwargs: object
    ) -> Iterator[WatchEvent]:
        """Watch changes, each object as the server sent it."""

        @functools.wraps(fn)  # the client's Watch reads fn's docstring
        def opened(*a: object, **kw: object) -> BaseHTTPResponse:
            return _no_read_timeout(fn(*a, **kw))

        w = watch.Watch()
        try:
            for raw in w.stream(
                opened,
                *args,
                _preload_content=False,
                _request_timeout=self.request_timeout,
                **kwargs,
            ):
                change = watch_event(raw)
                if change is None:
                    raise CommandError(
                        f"watching {resource} stopped: the API server sent {raw!r:.80}, "
                        "not a change",
                        EXIT_UNREACHABLE,
                    )
                yield change
        except ApiException as exc:
            raise self.error(exc, "watch", resource) from None
        except urllib3.exceptions.HTTPError as exc:
            if failure(exc) != OTHER:
                raise self.unreachable(exc) from None
            raise CommandError(f"watching {resource} stopped: {exc}", EXIT_UNREACHABLE) from None


def connect(access: Access) -> Kube:
    """kubectl's rules: --kubeconfig, else KUBECONFIG (merged), else ~/.kube/config, else
    in-cluster; the namespace from -n, else the context's, else the pod's, else default."""
    cfg = client.Configuration()
    ctx_namespace = ""
    origin = "in-cluster config"
    try:
        found = kubeconfig.load(access.kubeconfig, os.environ.get("KUBECONFIG"), Path.home())
    except kubeconfig.KubeconfigError as exc:
        raise CommandError(
            f"no cluster access: {exc}; fix it or pass another --kubeconfig (`kubectl config "
            "view` shows what kubectl reads)",
            EXIT_USAGE,
        ) from None
    if found is None and access.context:
        raise CommandError(
            f"--context {access.context}: no kubeconfig to find it in (--kubeconfig, KUBECONFIG "
            "or ~/.kube/config)",
            EXIT_USAGE,
        )
    if found is not None:
        ctx_namespace, context = _load_kubeconfig(found, access.context, cfg)
        origin = f"kubeconfig {found.source}, context {context}"
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException as exc:
            env = os.environ.get("KUBECONFIG")
            none = f"KUBECONFIG={env} names no file that exists" if env else "no kubeconfig"
            raise CommandError(
                f"no cluster access: {none} (--kubeconfig, KUBECONFIG, ~/.kube/config) "
                f"and not in a pod ({exc}); pass --kubeconfig or --context "
                "(kubectl config get-contexts)",
                EXIT_USAGE,
            ) from None
        if _SA_NAMESPACE.exists():
            ctx_namespace = _SA_NAMESPACE.read_text().strip()
    cfg.retries = _Retry(total=1)
    return Kube(
        client.ApiClient(cfg),
        access.namespace or ctx_namespace or "default",
        cfg.host,
        timeout=access.request_timeout,
        all_namespaces=access.all_namespaces,
        origin=origin,
    )


def _load_kubeconfig(
    found: kubeconfig.Kubeconfig, context: str | None, cfg: client.Configuration
) -> tuple[str, str]:
    """Load `found` into `cfg` for `context` (else its current context); that context's
    namespace and name."""
    name = context or found.config.get("current-context")
    if not name:
        raise CommandError(
            f"no cluster access: {found.source} sets no current-context: pass --context "
            f"(its contexts: {', '.join(found.context_names) or 'none'}) or run kubectl "
            "config use-context",
            EXIT_USAGE,
        )
    body = found.context(name)
    if body is None:
        flag = "--context" if context else "current-context"
        raise CommandError(
            f"no cluster access: {flag} {name!r} is not a context of {found.source} (its contexts: "
            f"{', '.join(found.context_names) or 'none'}): kubectl config get-contexts",
            EXIT_USAGE,
        )
    try:
        config.load_kube_config_from_dict(
            found.config, context=name, client_configuration=cfg, persist_config=False
        )
    # What the client raises for an entry it cannot use: a missing cluster or user, a
    # certificate file that is not there, data that is not base64, a field of a wrong type.
    except (ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CommandError(
            f"no cluster access: {found.source}, context {name!r}: {exc or type(exc).__name__}; "
            "fix it or pass another --context (kubectl config view --minify)",
            EXIT_USAGE,
        ) from None
    return str(body.get("namespace") or ""), str(name)
