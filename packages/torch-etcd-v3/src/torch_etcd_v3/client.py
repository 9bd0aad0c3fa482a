"""A small etcd v3 client over etcd's JSON gateway (grpc-gateway, `/v3/...`, etcd 3.4+).

Only the standard library: the worker image gets no gRPC stack. Keys and values travel
base64-encoded; int64 fields (revisions, lease ids) come back as JSON strings.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

JSON = dict[str, Any]
T = TypeVar("T")

_UNAVAILABLE = 14  # gRPC status code, as the gateway reports it


class EtcdError(Exception):
    """etcd refused a request (the gateway's error, e.g. permission denied)."""


class EtcdConnectionError(EtcdError):
    """etcd could not be reached or did not answer in time."""


class EtcdNoGateway(EtcdError):
    """The server answers HTTP but has no v3 JSON gateway at the path (404)."""


class EtcdAuthError(EtcdError):
    """etcd refused the user name or password."""


#: What etcd answers when it is overloaded or between leaders, not when a request is wrong:
#: the request may succeed if sent again a moment later.
_PASSING = ("timed out", "unavailable", "too many requests", "leader", "took too long")


def passing(exc: EtcdError) -> bool:
    """`exc` says etcd could not answer now (unreachable, overloaded, electing a leader),
    not that the request is refused: worth sending again."""
    if isinstance(exc, EtcdConnectionError):
        return True
    if isinstance(exc, (EtcdNoGateway, EtcdAuthError)):
        return False
    text = str(exc).lower()
    return any(word in text for word in _PASSING)


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    lease: int
    #: Writes to the key since it was created (1 after the first).
    version: int = 0
    create_revision: int = 0


@dataclass(frozen=True)
class ClientSettings:
    """How to reach etcd: one endpoint, plain HTTP or HTTPS, optional user/password."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    read_timeout: float
    user: str | None = None
    password: str | None = None


# etcd refuses a transaction of more operations than --max-txn-ops, 128 by default: a
# multi_get over the agents of a large job is split.
TXN_OPS = 128


def chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), TXN_OPS):
        yield items[start : start + TXN_OPS]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with `prefix` (etcd's convention)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def kv_of(raw: Mapping[str, Any]) -> KeyValue:
    """A key-value as the gateway writes one (in a range answer or a watch event)."""
    return KeyValue(
        key=unb64(raw["key"]),
        value=unb64(raw.get("value", "")),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
        version=int(raw.get("version", 0)),
        create_revision=int(raw.get("create_revision", 0)),
    )


_kv = kv_of


#: Idle connections a client keeps for its next requests. A lease keep-alive a second per
#: agent over a fresh TCP connection each time cost 1.6x the CPU of a kept one here (0.21
#: against 0.13 ms per request, etcd 3.4 on localhost); an agent makes one request at a
#: time but for its watches, so a few suffice.
POOL = 4
#: Errors of a kept connection that the server closed while it was idle: the request is
#: sent again once on a fresh connection (it never reached etcd, or reached it with no
#: answer read; every request this client sends is idempotent or guarded by a compare).
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class EtcdClient:
    """Thread-safe. Requests go over kept HTTP/1.1 connections (at most POOL idle, each
    used by one request at a time); watches open their own."""

    def __init__(self, settings: ClientSettings) -> None:
        self._settings = settings
        self._token: str | None = None
        self._token_lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._idle_lock = threading.Lock()

    @property
    def settings(self) -> ClientSettings:
        return self._settings

    # -- transport ------------------------------------------------------------------

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        s = self._settings
        if s.tls is not None:
            return http.client.HTTPSConnection(s.host, s.port, timeout=timeout, context=s.tls)
        return http.client.HTTPConnection(s.host, s.port, timeout=timeout)

    def _kept(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle kept connection (True) or a new one (False), with `timeout` set."""
        with self._idle_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return self._connection(timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _keep(self, conn: http.client.HTTPConnection) -> None:
        with self._idle_lock:
            if len(self._idle) < POOL:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the kept connections (a client in use opens new ones)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _authenticate(self) -> str:
        s = self._settings
        assert s.user is not None and s.password is not None
        try:
            reply = self._post_raw(
                "/v3/auth/authenticate", {"name": s.user, "password": s.password}, None
            )
        except EtcdError as exc:
            if "authentication failed" in str(exc):
                raise EtcdAuthError(
                    f"etcd refused user {s.user!r}: wrong user or password "
                    "(rdzv-conf user / password_file)"
                ) from exc
            raise
        return str(reply["token"])

    def _auth_header(self, renew: bool) -> str | None:
        if self._settings.user is None:
            return None
        with self._token_lock:
            if self._token is None or renew:
                self._token = self._authenticate()
            return self._token

    def _post_raw(
        self, path: str, body: JSON, token: str | None, timeout: float | None = None
    ) -> JSON:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        payload = json.dumps(body)
        wait = self._settings.read_timeout if timeout is None else timeout
        conn, kept = self._kept(wait)
        while True:
            try:
                conn.request("POST", path, payload, headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except _STALE as exc:
                conn.close()
                if not kept:
                    raise EtcdConnectionError(
                        f"etcd at {self._settings.host}:{self._settings.port} did not answer "
                        f"{path}: {exc}"
                    ) from exc
                conn, kept = self._connection(wait), False
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise EtcdConnectionError(
                    f"etcd at {self._settings.host}:{self._settings.port} did not answer "
                    f"{path}: {exc}"
                ) from exc
        if resp.will_close:
            conn.close()
        else:
            self._keep(conn)
        if resp.status == 404:
            # etcd's own plain-text 404: a server without the gateway (or not etcd).
            raise EtcdNoGateway(
                f"etcd at {self._settings.host}:{self._settings.port} has no v3 JSON gateway "
                f"at {path} (HTTP 404: {data[:80].decode(errors='replace').strip()}): etcd 3.4 "
                "or newer is needed"
            )
        try:
            reply: JSON = json.loads(data) if data else {}
        except ValueError as exc:
            raise EtcdError(
                f"etcd answered {path} with non-JSON ({resp.status}): {data[:200]!r}"
            ) from exc
        if resp.status != 200:
            message = (
                reply.get("message") or reply.get("error") or data[:200].decode(errors="replace")
            )
            if self._settings.tls is not None and reply.get("code") == _UNAVAILABLE:
                # The gateway reaches etcd's gRPC side with etcd's own server certificate
                # as client certificate; under --client-cert-auth that needs clientAuth.
                message = (
                    f"{message} (etcd's gateway could not reach etcd itself: with "
                    "--client-cert-auth, etcd's server certificate needs extendedKeyUsage "
                    "clientAuth as well as serverAuth)"
                )
            raise EtcdError(f"etcd refused {path}: {message}")
        error = reply.get("error")
        if isinstance(error, dict):
            # A streaming call (lease keep-alive) that failed after its headers: 200 and
            # {"error": {...}}, e.g. "waiting for the applied index took too long". Read
            # as a keep-alive's missing TTL it would pass for an expired lease.
            raise EtcdError(f"etcd refused {path}: {error.get('message') or error}")
        return reply

    def post(self, path: str, body: JSON, timeout: float | None = None) -> JSON:
        """POST to the gateway, authenticating first if a user is set; a token etcd has
        expired (simple tokens live 5 minutes idle) is renewed once."""
        token = self._auth_header(renew=False)
        try:
            return self._post_raw(path, body, token, timeout)
        except EtcdError as exc:
            if token is None or "token" not in str(exc).lower():
                raise
        return self._post_raw(path, body, self._auth_header(renew=True), timeout)

    # -- KV -------------------------------------------------------------------------

    def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        """The key (or None) and the store's revision at the time of the read."""
        reply = self.post("/v3/kv/range", {"key": b64(key)})
        kvs = reply.get("kvs") or []
        return (_kv(kvs[0]) if kvs else None), int(reply["header"]["revision"])

    def get_many(self, keys: Sequence[bytes]) -> tuple[dict[bytes, KeyValue], int]:
        """Several keys, in transactions of at most TXN_OPS reads; the revision returned is
        the first transaction's, so a watch from it misses no change to any of them."""
        found: dict[bytes, KeyValue] = {}
        first = 0
        for chunk in chunks(keys):
            reply = self.txn(
                compare=[], success=[{"request_range": {"key": b64(k)}} for k in chunk], failure=[]
            )
            first = first or int(reply["header"]["revision"])
            for response in reply.get("responses") or []:
                for raw in response.get("response_range", {}).get("kvs") or []:
                    kv = _kv(raw)
                    found[kv.key] = kv
        return found, first

    def count(self, prefix: bytes) -> int:
        reply = self.post(
            "/v3/kv/range",
            {"key": b64(prefix), "range_end": b64(prefix_end(prefix)), "count_only": True},
        )
        return int(reply.get("count", 0))

    def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write the key; returns the revision of the write."""
        body: JSON = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        reply = self.post("/v3/kv/put", body)
        return int(reply["header"]["revision"])

    def delete(self, key: bytes) -> int:
        """Delete the key; returns how many keys were deleted (0 or 1)."""
        reply = self.post("/v3/kv/deleterange", {"key": b64(key)})
        return int(reply.get("deleted", 0))

    def delete_prefix(self, prefix: bytes) -> int:
        reply = self.post(
            "/v3/kv/deleterange", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
        )
        return int(reply.get("deleted", 0))

    def txn(self, compare: list[JSON], success: list[JSON], failure: list[JSON]) -> JSON:
        return self.post("/v3/kv/txn", {"compare": compare, "success": success, "failure": failure})

    def put_if(
        self, key: bytes, value: bytes, lease: int, mod_revision: int | None
    ) -> tuple[bool, KeyValue | None, int]:
        """Write the key only if its mod_revision is still `mod_revision` (None: only if
        absent). Returns (written, the key as it is when not written, the txn's revision)."""
        if mod_revision is None:
            compare = {"target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        else:
            compare = {"target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}
        put: JSON = {"key": b64(key), "value": b64(value)}
        if lease:
            put["lease"] = str(lease)
        reply = self.txn(
            compare=[{"key": b64(key), **compare}],
            success=[{"request_put": put}],
            failure=[{"request_range": {"key": b64(key)}}],
        )
        revision = int(reply["header"]["revision"])
        if reply.get("succeeded", False):
            return True, None, revision
        kvs = (reply.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
        return False, (_kv(kvs[0]) if kvs else None), revision

    # -- leases ---------------------------------------------------------------------

    def lease_grant(self, ttl: int) -> int:
        reply = self.post("/v3/lease/grant", {"TTL": str(ttl)})
        return int(reply["ID"])

    def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew the lease once; returns its TTL, 0 if etcd no longer knows it. `timeout`:
        seconds to wait for the answer (else the client's read timeout)."""
        reply = self.post("/v3/lease/keepalive", {"ID": str(lease)}, timeout)
        return int(reply.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        self.post("/v3/lease/revoke", {"ID": str(lease)})

    def lease_ttl(self, lease: int) -> int:
        """Seconds the lease has left, -1 if etcd no longer knows it."""
        reply = self.post("/v3/lease/timetolive", {"ID": str(lease)})
        return int(reply.get("TTL", -1))

    # -- watch ----------------------------------------------------------------------

    def wait_for_change(
        self, prefix: bytes, after_revision: int, timeout: float, *, exact: bool = False
    ) -> bool:
        """Block until a key under `prefix` (`exact`: the key `prefix` alone) changes after
        `after_revision`, or `timeout` seconds pass (False). A watch stream, not polling:
        waiters cost etcd nothing."""
        if timeout <= 0:
            return False
        request = {"key": b64(prefix), "start_revision": str(after_revision + 1)}
        if not exact:
            request["range_end"] = b64(prefix_end(prefix))
        body = {"create_request": request}
        deadline = time.monotonic() + timeout
        for message in self._stream("/v3/watch", body, timeout):
            result = message.get("result", {})
            if result.get("events"):
                return True
            if result.get("compact_revision") and int(result["compact_revision"]) > 0:
                return True  # history compacted past our revision: re-read
            if time.monotonic() >= deadline:
                break
        return False

    def open_stream(
        self, path: str, body: JSON, timeout: float | None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A streaming request (a watch): its own connection, never kept, and the answer
        once its status is read; then reads wait up to `timeout` (None: until the
        connection is closed, e.g. from another thread)."""
        token = self._auth_header(renew=False)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        conn = self._connection(self._settings.read_timeout if timeout is None else timeout)
        try:
            conn.request("POST", path, json.dumps(body), headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise EtcdConnectionError(
                f"etcd at {self._settings.host}:{self._settings.port} did not answer {path}: {exc}"
            ) from exc
        if resp.status != 200:
            data = resp.read()[:200]
            conn.close()
            raise EtcdError(f"etcd refused {path}: {data!r}")
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, resp

    def _stream(self, path: str, body: JSON, timeout: float) -> Iterator[JSON]:
        conn, resp = self.open_stream(path, body, timeout)
        try:
            while True:
                try:
                    line = resp.readline()
                except TimeoutError:
                    return
                except (OSError, http.client.HTTPException) as exc:
                    raise EtcdConnectionError(f"etcd watch stream broke: {exc}") from exc
                if not line:
                    return
                message: JSON = json.loads(line)
                if "error" in message:
                    raise EtcdError(f"etcd watch failed: {message['error']}")
                yield message
        finally:
            conn.close()
