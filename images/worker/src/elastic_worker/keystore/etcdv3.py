"""The project's own keys on etcd's v3 API, for the etcd-v3 backend (kvstore.KeyStore).

Built on torch_etcd_v3's EtcdClient (the JSON gateway, standard library only), the client
torchrun's etcd-v3 handler uses, so that both speak to etcd the same way. v3 has no TTL
on keys: a key written with `ttl` is attached to a lease of that TTL, one per key, which
each later write of the key renews (keep-alive) before writing. A key whose lease lapsed
is gone, exactly like a v2 key whose TTL ran out. "Directories" are key prefixes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from torch_etcd_v3 import client as v3

from elastic_worker import timings
from elastic_worker.keystore.interface import (
    CompareFailed,
    Entry,
    EtcdError,
    KeyNotFound,
    KeyStore,
    NoApi,
    NodeExists,
    Unavailable,
    Write,
    tls_refusal,
)
from elastic_worker.settings.config import Config, ConfigError

T = TypeVar("T")


class Client(KeyStore):
    """One etcd; thread-safe (EtcdClient opens a connection per request)."""

    api = "v3"

    def __init__(self, settings: v3.ClientSettings) -> None:
        self._etcd = v3.EtcdClient(settings)
        scheme = "https" if settings.tls is not None else "http"
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.base_url = f"{scheme}://{host}:{settings.port}"
        self._leases: dict[str, tuple[int, int]] = {}  # key -> (lease id, its ttl)
        self._lock = threading.Lock()

    @property
    def settings(self) -> v3.ClientSettings:
        return self._etcd.settings

    def with_timeout(self, timeout: float) -> KeyStore:
        return Client(dataclasses.replace(self._etcd.settings, read_timeout=timeout))

    def _call(self, op: Callable[[], T]) -> T:
        """Run one request; torch_etcd_v3's errors as the worker's (kvstore)."""
        try:
            return op()
        except v3.EtcdNoGateway as exc:
            raise NoApi(str(exc)) from None
        except v3.EtcdConnectionError as exc:
            refusal = tls_refusal(exc.__cause__) if self._etcd.settings.tls else None
            raise refusal or Unavailable(str(exc)) from None
        except v3.EtcdError as exc:
            raise EtcdError(str(exc)) from None

    def get_value(self, key: str) -> str | None:
        kv, _ = self._call(lambda: self._etcd.get(key.encode()))
        return None if kv is None else kv.value.decode()

    def _lease(self, key: str, ttl: int) -> int:
        """The key's lease, renewed; a new one when it had none, another TTL, or lapsed."""
        with self._lock:
            held = self._leases.get(key)
        if (
            held is not None
            and held[1] == ttl
            and self._call(lambda: self._etcd.lease_keepalive(held[0])) > 0
        ):
            return held[0]
        lease = self._call(lambda: self._etcd.lease_grant(ttl))
        with self._lock:
            self._leases[key] = (lease, ttl)
        return lease

    def _write(self, key: str, value: str, how: Write) -> object:
        ttl, prev_exist, prev_value = how.ttl, how.prev_exist, how.prev_value
        raw = key.encode()
        lease = self._lease(key, ttl) if ttl else 0
        if not ttl:
            with self._lock:
                self._leases.pop(key, None)
        compare: list[dict[str, Any]] = []
        if prev_exist is not None or prev_value is not None:
            exists = prev_exist is not False
            compare.append(
                {
                    "key": v3.b64(raw),
                    "target": "CREATE",
                    "result": "GREATER" if exists else "EQUAL",
                    "create_revision": "0",
                }
            )
        if prev_value is not None:
            compare.append(
                {
                    "key": v3.b64(raw),
                    "target": "VALUE",
                    "result": "EQUAL",
                    "value": v3.b64(prev_value.encode()),
                }
            )
        if not compare:
            return self._call(lambda: self._etcd.put(raw, value.encode(), lease))
        put: dict[str, Any] = {"key": v3.b64(raw), "value": v3.b64(value.encode())}
        if lease:
            put["lease"] = str(lease)
        reply = self._call(
            lambda: self._etcd.txn(
                compare=compare,
                success=[{"request_put": put}],
                failure=[{"request_range": {"key": v3.b64(raw)}}],
            )
        )
        if reply.get("succeeded", False):
            return int(reply["header"]["revision"])
        responses = reply.get("responses") or [{}]
        found = responses[0].get("response_range", {}).get("kvs") or []
        if not found:
            raise KeyNotFound(f"key not found ({key})")
        if prev_exist is False:
            raise NodeExists(f"key already exists ({key})")
        raise CompareFailed(f"compare failed ({key}: not {prev_value!r})")

    def delete(self, key: str, *, prev_value: str | None = None) -> None:
        raw = key.encode()
        if prev_value is None:
            self._call(lambda: self._etcd.delete(raw))
        else:
            reply = self._call(
                lambda: self._etcd.txn(
                    compare=[
                        {
                            "key": v3.b64(raw),
                            "target": "VALUE",
                            "result": "EQUAL",
                            "value": v3.b64(prev_value.encode()),
                        }
                    ],
                    success=[{"request_delete_range": {"key": v3.b64(raw)}}],
                    failure=[{"request_range": {"key": v3.b64(raw)}}],
                )
            )
            if not reply.get("succeeded", False):
                responses = reply.get("responses") or [{}]
                if responses[0].get("response_range", {}).get("kvs"):
                    raise CompareFailed(f"compare failed ({key}: not {prev_value!r})")
                return  # gone already
        with self._lock:
            held = self._leases.pop(key, None)
        if held is not None:
            # Its lease holds no other key: end it now rather than at its TTL.
            with contextlib.suppress(EtcdError):
                self._call(lambda: self._etcd.lease_revoke(held[0]))

    def list_dir(self, key: str) -> list[Entry]:
        prefix = key.rstrip("/").encode() + b"/"
        body = {"key": v3.b64(prefix), "range_end": v3.b64(v3.prefix_end(prefix))}
        reply = self._call(lambda: self._etcd.post("/v3/kv/range", body))
        nodes = []
        for raw in reply.get("kvs") or []:
            name = v3.unb64(raw["key"])
            if b"/" in name[len(prefix) :]:
                continue  # deeper than a direct child
            nodes.append(Entry(name.decode(), v3.unb64(raw.get("value", "")).decode()))
        return nodes

    def check_api(self) -> None:
        self._call(lambda: self._etcd.post("/v3/maintenance/status", {}))

    def server_version(self) -> str:
        tls = self._etcd.settings.tls
        try:
            with urllib.request.urlopen(
                f"{self.base_url}/version", timeout=self._etcd.settings.read_timeout, context=tls
            ) as resp:
                return str(json.loads(resp.read()).get("etcdserver", ""))
        except (urllib.error.URLError, OSError, ValueError):
            return ""


def connect(config: Config, timeout: float = timings.ETCD_TIMEOUT) -> Client:
    """The v3 client for the job's etcd. TLS as the worker's v2 client builds it (the same
    rdzv-conf keys, read the same way, with the worker's error lines); user and
    password_file as torch_etcd_v3 reads them, after the whole rdzv-conf is checked by
    the handler's own parser, so that a mistake fails here, before torchrun starts."""
    from torch_etcd_v3 import config as v3config  # noqa: PLC0415

    tls = config.tls.ssl_context() if config.tls else None
    try:
        checked = v3config.from_conf(
            str(config.endpoint), config.job_id, dict(config.rdzv_conf), config.max_nodes
        )
    except v3config.ConfigError as exc:
        raise ConfigError(f"ELASTIC_RDZV_CONF: {exc}") from None
    settings = dataclasses.replace(checked.client, tls=tls, read_timeout=timeout)
    return Client(settings)
