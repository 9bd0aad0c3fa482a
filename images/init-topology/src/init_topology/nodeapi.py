"""Read this pod's Node from the API server: one HTTPS GET with the standard library.

In-cluster config as the kubelet provides it (KUBERNETES_SERVICE_HOST/PORT, the
service-account token and CA), bounded retries with jittered exponential backoff, all inside
one time budget (TOPOLOGY_TIMEOUT_SECONDS). Transient failures (connection refused or reset,
timeouts, 429, 5xx) are retried; permanent ones (401, 403, 404, other 4xx, TLS verification)
end at once. Every failure ends in NodeUnavailable with a cause and a fix a person can act on.

http.client rather than urllib.request (the worker's choice for its scale calls) only to keep
separate connect and read timeouts; `transport` lets tests inject another.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from init_topology.config import Config

log = logging.getLogger(__name__)

FIRST_BACKOFF_SECONDS = 0.2
MAX_BACKOFF_SECONDS = 2.0
CONNECT_TIMEOUT_SECONDS = 3.0
READ_TIMEOUT_SECONDS = 5.0
MIN_ATTEMPT_SECONDS = 0.1
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})

NodeObject = dict[str, Any]


class NodeUnavailable(Exception):
    """The Node could not be read: `cause` says why, `fix` what to change."""

    def __init__(self, cause: str, fix: str) -> None:
        cause, fix = _one_line(cause), _one_line(fix)
        super().__init__(f"{cause} -- {fix}")
        self.cause = cause
        self.fix = fix


@dataclass(frozen=True)
class _Failure:
    retry: bool
    cause: str
    fix: str


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    body: bytes


class ConnectError(OSError):
    """The TCP connection could not be made (as opposed to a failure once connected)."""


#: One GET of the Node: (connect timeout, read timeout) -> Response, or an OSError /
#: http.client.HTTPException (ssl.SSLError, TimeoutError, ConnectError, ...).
Transport = Callable[[tuple[float, float]], Response]


def fetch_node(
    config: Config,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    transport: Callable[[Config], Transport] | None = None,
) -> NodeObject:
    """GET /api/v1/nodes/{NODE_NAME}; the Node as the API's JSON, or NodeUnavailable.

    `transport(config)` returns the function making one attempt; by default HTTPS with the
    in-cluster token and CA.
    """
    start = clock()
    deadline = start + config.timeout_seconds
    get = (transport or _https_transport)(config)
    attempt = 0
    backoff = FIRST_BACKOFF_SECONDS
    while True:
        attempt += 1
        # Never a timeout <= 0 (a socket would not wait at all): a late wake-up may have
        # eaten the rest.
        remaining = max(deadline - clock(), MIN_ATTEMPT_SECONDS)
        timeout = (min(remaining, CONNECT_TIMEOUT_SECONDS), min(remaining, READ_TIMEOUT_SECONDS))
        failure = _attempt(get, config, timeout)
        if isinstance(failure, dict):
            return failure
        elapsed = clock() - start
        pause = random.uniform(backoff / 2, backoff)
        if not failure.retry or clock() + pause + MIN_ATTEMPT_SECONDS >= deadline:
            tries = f"{attempt} attempt{'s' if attempt > 1 else ''} in {elapsed:.1f}s"
            cause = f"{failure.cause} ({tries})" if failure.retry else failure.cause
            raise NodeUnavailable(cause, failure.fix)
        log.debug("attempt %d: %s; retrying in %.2fs", attempt, failure.cause, pause)
        sleep(pause)
        backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


def _https_transport(config: Config) -> Transport:
    if not config.api_host or not config.api_port:
        raise NodeUnavailable(
            "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set (not in a pod?)",
            "run it as the chart's init container, where the kubelet sets them",
        )
    token_path = config.serviceaccount_dir / "token"
    ca = config.serviceaccount_dir / "ca.crt"
    for path in (token_path, ca):
        if not path.is_file() or path.stat().st_size == 0:
            raise NodeUnavailable(
                f"no service-account {path.name} at {path}",
                "mount the token: leave automountServiceAccountToken on for the worker pods "
                "(the chart's service account)",
            )
    server = f"{config.api_host}:{config.api_port}"
    token = token_path.read_text().strip()
    try:
        context = ssl.create_default_context(cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        failure = _tls_failure(server, f"cannot load {ca}: {_reason(exc)}")
        raise NodeUnavailable(failure.cause, failure.fix) from exc
    if not config.api_port.isdigit():
        raise NodeUnavailable(
            f"KUBERNETES_SERVICE_PORT {config.api_port!r} is not a port number",
            "leave it to the kubelet, which sets it from the kubernetes Service",
        )
    host, port = config.api_host, int(config.api_port)
    url_path = "/api/v1/nodes/" + urllib.parse.quote(config.node_name, safe="")
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def get(timeout: tuple[float, float]) -> Response:
        connect_timeout, read_timeout = timeout
        conn = http.client.HTTPSConnection(host, port, timeout=connect_timeout, context=context)
        try:
            try:
                conn.connect()  # TCP, then the TLS handshake
            except OSError as exc:
                if isinstance(exc, (ssl.SSLError, TimeoutError)):
                    raise
                raise ConnectError(exc.errno, _reason(exc)) from exc
            assert conn.sock is not None
            conn.sock.settimeout(read_timeout)
            conn.request("GET", url_path, headers=headers)
            response = conn.getresponse()
            return Response(response.status, response.reason, response.read())
        finally:
            conn.close()

    return get


def _attempt(get: Transport, config: Config, timeout: tuple[float, float]) -> NodeObject | _Failure:
    server = f"{config.api_host}:{config.api_port}"
    try:
        response = get(timeout)
    except ssl.SSLError as exc:
        return _tls_failure(server, _reason(exc))
    except ConnectError as exc:
        return _Failure(
            True,
            f"cannot connect to the API server {server}: {_reason(exc)}",
            "check egress from the pod to the API server (NetworkPolicy) and that it is up",
        )
    except TimeoutError as exc:
        return _Failure(
            True,
            f"no answer from the API server {server} in time: {_reason(exc)}",
            "check egress to the API server (NetworkPolicy), or raise topology.timeoutSeconds",
        )
    except (http.client.HTTPException, OSError) as exc:
        return _Failure(
            True,
            f"request to the API server {server} failed: {_reason(exc)}",
            "check egress to the API server (NetworkPolicy) and its health",
        )
    if response.status != 200:
        return _status_failure(response.status, response.reason, response.body, config)
    try:
        node = json.loads(response.body)
    except ValueError:
        node = None
    if not isinstance(node, dict) or node.get("kind", "Node") != "Node":
        return _Failure(
            True,
            f"the API server {server} answered with something that is not a Node",
            "check that KUBERNETES_SERVICE_HOST/PORT point at the API server",
        )
    return node


def _tls_failure(server: str, reason: str) -> _Failure:
    return _Failure(
        False,
        f"TLS verification of the API server {server} failed: {_one_line(reason)}",
        "the service account's ca.crt must be the cluster CA that signed the API server",
    )


def _status_failure(status: int, reason: str, body: Any, config: Config) -> _Failure:
    message = _status_message(body)
    what = f"{status} {reason}".strip() + (f": {message}" if message else "")
    if status == 401:
        return _Failure(
            False,
            f"{what} (the service-account token was rejected)",
            "check the pod's service-account token (automountServiceAccountToken, expiry)",
        )
    if status == 403:
        return _Failure(
            False,
            what,
            "a cluster admin grants get on nodes to this namespace's service accounts once "
            "(installing the cluster chart, or adding the namespace to its release, values kept): "
            "helm upgrade --install --reuse-values elastic-job-cluster "
            "charts/elastic-job-cluster -n <its namespace, e.g. monitoring> "
            f"--set nodeReader.namespaces.{_namespace(config)}=true (Nodes are cluster-scoped, "
            "so no namespaced Role can grant it)",
        )
    if status == 404:
        return _Failure(
            False,
            what,
            f"NODE_NAME ({config.node_name}) must be this pod's node: set it from "
            "fieldRef spec.nodeName, as the chart does",
        )
    if status in RETRYABLE_STATUS:
        return _Failure(
            True,
            what,
            "the API server is failing or overloaded: check its health, or raise "
            "topology.timeoutSeconds to wait longer",
        )
    return _Failure(False, what, "unexpected answer from the API server: check its logs")


def _namespace(config: Config) -> str:
    """This pod's namespace, from its service-account volume; a placeholder if unreadable."""
    try:
        return (config.serviceaccount_dir / "namespace").read_text(encoding="utf-8").strip()
    except OSError:
        return "<namespace>"


def _status_message(body: Any) -> str:
    """The `message` of a Kubernetes Status body, else the body's first line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return str(status["message"])
    return str(body).strip().splitlines()[0][:200] if str(body).strip() else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _reason(exc: BaseException) -> str:
    """A one-line reason from a socket or TLS error."""
    text = str(getattr(exc, "strerror", None) or exc)
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    return " ".join(text.split())[:200]
