"""What an agent asks of etcd, counted in the agents' process (here only): requests and the
bytes of the writes, by what the agent was doing (its thread's role), and heartbeats.

Both clients are wrapped where every request passes: python-etcd's `Client.api_execute`
(torch's etcd-v2 backend) and torch_etcd_v3's `EtcdClient._post_raw` and `open_stream`
(etcd-v3 and etcd-lease; a watch counts as one request when it opens). A write is a
request that changes etcd (v2: PUT, POST, DELETE; v3: put, delete, txn, lease grant,
keep-alive, revoke); its bytes are the request's body as sent (the v2 form, the v3 JSON),
so that a rewrite of torch's whole state and a lease keep-alive compare as they travel;
of a v3 transaction, only its compares and writes count (not the reads it carries).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

#: A thread's role, from its name: what the requests it makes are counted as.
ROLES = (
    ("join-", "join"),  # an agent's next_rendezvous (agents.py names these threads)
    ("RendezvousKeepAliveTimer", "heartbeat"),  # torch's keep-alive timer
    ("etcd-lease-keepalive", "heartbeat"),  # etcd-lease's lease keep-alive
    ("etcd-v3-lease", "heartbeat"),  # torch-etcd-v3's store lease (etcd-v3, etcd-lease)
    ("monitor", "monitor"),  # torch's agent asking num_nodes_waiting (agents.py)
    ("takeout", "takeout"),  # the worker's take-out of a dead node (lifelines)
)
V3_WRITES = ("/v3/kv/put", "/v3/kv/deleterange", "/v3/lease/")


def role() -> str:
    name = threading.current_thread().name
    return next((r for prefix, r in ROLES if name.startswith(prefix)), "other")


class Counts:
    """Totals by role: requests, writes, bytes written; and heartbeats (torch's keep-alive
    calls, etcd-lease's lease keep-alives)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.written: Counter[str] = Counter()
        self.heartbeats = 0
        #: The longest a heartbeat took to be answered (s): a lease lapses past its TTL.
        self.slowest_beat = 0.0

    def add(self, write: bool, size: int) -> None:
        """One request; `size`: the bytes it writes, when it is a write."""
        r = role()
        with self._lock:
            self.requests[r] += 1
            if write:
                self.writes[r] += 1
                self.written[r] += size

    def beat(self, took: float = 0.0) -> None:
        with self._lock:
            self.heartbeats += 1
            self.slowest_beat = max(self.slowest_beat, took)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "writes": dict(self.writes),
                "written": dict(self.written),
                "heartbeats": self.heartbeats,
                "slowest_beat": round(self.slowest_beat, 2),
            }


COUNTS = Counts()


def _v3_written(path: str, body: dict[str, Any]) -> int | None:
    """The bytes of a v3 request that change etcd (None: it changes nothing): the whole
    body of a put, a delete or a lease request; of a transaction, its compares and its
    writes (not the reads it carries)."""
    if path.startswith(V3_WRITES):
        return len(json.dumps(body))
    if path != "/v3/kv/txn":
        return None
    ops = [*body.get("success", []), *body.get("failure", [])]
    writes = [op for op in ops if "request_put" in op or "request_delete_range" in op]
    if not writes:
        return None
    return len(json.dumps({"compare": body.get("compare", []), "writes": writes}))


def wrap_clients() -> None:
    """Count every request of both clients in this process."""
    import etcd  # type: ignore[import-untyped]  # noqa: PLC0415 - python-etcd: torch's etcd-v2
    from torch_etcd_v3.client import EtcdClient  # noqa: PLC0415

    execute = etcd.Client.api_execute

    def api_execute(self: Any, path: str, method: str, params: Any = None, timeout: Any = None):  # type: ignore[no-untyped-def]
        write = method in ("PUT", "POST", "DELETE")
        size = len(urllib.parse.urlencode(params or {}))
        COUNTS.add(write, size)
        return execute(self, path, method, params, timeout)

    etcd.Client.api_execute = api_execute

    post_raw = EtcdClient._post_raw
    open_stream = EtcdClient.open_stream

    def counted_post(
        self: EtcdClient, path: str, body: dict[str, Any], token: str | None, timeout: Any = None
    ) -> Any:
        written = _v3_written(path, body)
        COUNTS.add(written is not None, written or 0)
        started = time.monotonic()
        try:
            return post_raw(self, path, body, token, timeout)
        finally:
            if path == "/v3/lease/keepalive" and threading.current_thread().name.startswith(
                "etcd-lease-keepalive"
            ):
                # etcd-lease's heartbeat (not a store lease's keep-alive)
                COUNTS.beat(time.monotonic() - started)

    def counted_stream(self: EtcdClient, path: str, body: dict[str, Any], timeout: Any) -> Any:
        COUNTS.add(False, len(json.dumps(body)))
        return open_stream(self, path, body, timeout)

    EtcdClient._post_raw = counted_post  # type: ignore[method-assign]
    EtcdClient.open_stream = counted_stream  # type: ignore[method-assign]


def count_torch_heartbeats(handler: Any) -> None:
    """Count the keep-alives of torch's dynamic rendezvous handler `handler` (its timer
    calls `handler._keep_alive()`; read here only, to count them)."""
    keep_alive: Callable[[], None] = handler._keep_alive

    def counted() -> None:
        COUNTS.beat()
        keep_alive()

    handler._keep_alive = counted
