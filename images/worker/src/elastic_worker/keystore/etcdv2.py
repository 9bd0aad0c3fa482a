"""A minimal etcd v2 keys client for the project's own keys (stdlib HTTP, bounded waits),
the etcd-v2 backend's kvstore.KeyStore.

torch's etcd-v2 rendezvous talks to etcd through python-etcd; the entrypoint only
needs get/set/delete/list with a short timeout on every call, so it speaks the v2
HTTP API directly and can tell "no v2 API" (a plain-text 404, etcd 3.6 or
--enable-v2=false) from "key not found" (a JSON 404, errorCode 100).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from elastic_worker import timings
from elastic_worker.keystore.interface import (
    CompareFailed,
    Entry,
    EtcdError,
    KeyNotFound,
    KeyStore,
    NoApi,
    NodeExists,
    TlsRefused,
    Unavailable,
    Write,
)
from elastic_worker.keystore.interface import tls_refusal as _tls_refusal
from elastic_worker.settings.config import Config

__all__ = [
    "Client",
    "CompareFailed",
    "Entry",
    "EtcdError",
    "KeyNotFound",
    "NoApi",
    "NodeExists",
    "TlsRefused",
    "Unavailable",
    "connect",
]

logger = logging.getLogger(__name__)

_KEY_NOT_FOUND = 100
_COMPARE_FAILED = 101
_NODE_EXISTS = 105

#: How long a TLS server must drop every connection the same way (and at least 3 times)
#: before it counts as a refusal: one drop without an alert can be a restart or a proxy
#: starting up; the same drop for seconds on end is not.
TLS_DROPS_TO_REFUSE = 3


def _entry(data: dict[str, Any]) -> Entry:
    return Entry(
        key=str(data.get("key", "")),
        value=data.get("value"),
        children=tuple(_entry(child) for child in data.get("nodes", ())),
    )


class Client(KeyStore):
    """The v2 keys API (kvstore.KeyStore). `context` is the TLS context for an https
    `base_url` (config.RdzvTls.context)."""

    api = "v2"

    def __init__(
        self,
        base_url: str,
        timeout: float = timings.ETCD_TIMEOUT,
        *,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.context = context
        self._drops: tuple[str, int, float] = ("", 0, 0.0)  # side, count, first drop

    def _tls_drop(self, exc: BaseException, reason: object) -> TlsRefused | None:
        """Connections closed without a word, counted; a refusal after a streak.

        Whether the alert of a refused client certificate reaches us depends on timing
        (the server closes while our request is in flight), so a drop right after the
        handshake is counted as one: `client`. A drop during the handshake is a server
        that does not answer TLS: `protocol`. urlopen wraps errors of the connection
        (handshake) in URLError, not those of the response.
        """
        if self.context is None or not isinstance(
            reason, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionResetError
        ):
            self._drops = ("", 0, 0.0)
            return None
        side = "protocol" if isinstance(exc, urllib.error.URLError) else "client"
        now = time.monotonic()
        last_side, count, first = self._drops
        self._drops = (side, count + 1, first) if last_side == side else (side, 1, now)
        _, count, first = self._drops
        if count < TLS_DROPS_TO_REFUSE or now - first < timings.TLS_DROP_SECONDS:
            return None
        seconds = f"{now - first:.0f} s"
        if side == "protocol":
            what = f"the server closed every TLS handshake for {seconds}: it seems not to speak TLS"
            return TlsRefused(side, what)
        what = f"the server closed every connection after the handshake for {seconds}"
        return TlsRefused(side, what)

    def _open(self, req: urllib.request.Request | str) -> http.client.HTTPResponse:
        resp: http.client.HTTPResponse = urllib.request.urlopen(
            req, timeout=self.timeout, context=self.context
        )
        return resp

    def _request(
        self,
        method: str,
        key: str,
        query: dict[str, str] | None = None,
        form: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        url = f"{self.base_url}/v2/keys{urllib.parse.quote(key)}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        body = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(url, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self._open(req) as resp:
                self._drops = ("", 0, 0.0)
                return dict(json.loads(resp.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            self._drops = ("", 0, 0.0)
            raise self._http_error(exc, key) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise self._connection_error(exc) from None

    def _http_error(self, exc: urllib.error.HTTPError, key: str) -> EtcdError:
        """etcd's JSON error as its exception; a 404 without one means no v2 API."""
        try:
            data = json.loads(exc.read())
        except ValueError:
            data = None
        if not isinstance(data, dict) or "errorCode" not in data:
            if exc.code in (404, 405):
                return NoApi(f"{self.base_url} has no etcd v2 API (HTTP {exc.code})")
            return Unavailable(f"{self.base_url}: HTTP {exc.code}")
        code = int(data["errorCode"])
        message = f"{data.get('message', '')} ({data.get('cause', key)})"
        known: dict[int, type[EtcdError]] = {
            _KEY_NOT_FOUND: KeyNotFound,
            _NODE_EXISTS: NodeExists,
            _COMPARE_FAILED: CompareFailed,
        }
        if code in known:
            return known[code](message)
        return EtcdError(f"etcd error {code}: {message}")

    def _connection_error(self, exc: Exception) -> EtcdError:
        # urlopen wraps errors of the request (the TLS handshake) in URLError, not
        # those of the response (a TLS 1.3 alert after the handshake).
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        refusal = _tls_refusal(reason) or self._tls_drop(exc, reason)
        if refusal is not None:
            return refusal
        if isinstance(reason, http.client.RemoteDisconnected) and self.context is None:
            # What a TLS-only etcd does to plain HTTP: say so while the gate waits.
            reason = f"{reason} (does etcd serve only HTTPS? then enable TLS)"
        return Unavailable(f"{self.base_url}: {reason}")

    def get(self, key: str, *, recursive: bool = False) -> Entry:
        query = {"recursive": "true"} if recursive else None
        return _entry(self._request("GET", key, query)["node"])

    def get_value(self, key: str) -> str | None:
        try:
            return self.get(key).value
        except KeyNotFound:
            return None

    def _write(self, key: str, value: str, how: Write) -> Entry:
        form = {"value": value}
        if how.ttl is not None:
            form["ttl"] = str(how.ttl)
        query: dict[str, str] = {}
        if how.prev_exist is not None:
            query["prevExist"] = str(how.prev_exist).lower()
        if how.prev_value is not None:
            query["prevValue"] = how.prev_value
        return _entry(self._request("PUT", key, query or None, form)["node"])

    def delete(self, key: str, *, prev_value: str | None = None) -> None:
        query = {"prevValue": prev_value} if prev_value is not None else None
        with contextlib.suppress(KeyNotFound):
            self._request("DELETE", key, query)

    def list_dir(self, key: str) -> list[Entry]:
        try:
            return list(self.get(key).children)
        except KeyNotFound:
            return []

    def check_api(self) -> None:
        """Raise NoApi or Unavailable unless the v2 keys API answers."""
        with contextlib.suppress(KeyNotFound):
            self._request("GET", "/")

    def with_timeout(self, timeout: float) -> KeyStore:
        return Client(self.base_url, timeout, context=self.context)

    def server_version(self) -> str:
        try:
            with self._open(f"{self.base_url}/version") as r:
                return str(json.loads(r.read()).get("etcdserver", ""))
        except (urllib.error.URLError, OSError, ValueError):
            return ""


def connect(config: Config, timeout: float = timings.ETCD_TIMEOUT) -> Client:
    """The worker's client for the job's etcd: https with the CA and client certificate
    torch's handler is given (config.RdzvTls), plain http when torch's is. Raises
    config.ConfigError when a TLS file cannot be used."""
    return Client(
        config.rdzv_url, timeout, context=config.tls.ssl_context() if config.tls else None
    )
