"""Helpers of the etcd-lease tests: handlers made as torch's registry makes them, their
joins in threads, and their leases revoked at the end of each test."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from typing import Any

from testlib import EtcdServer
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from torch_etcd_v3.rounds.handler import EtcdLeaseRendezvousHandler

# Handlers a test made: they leave at its end (their leases revoked, their threads stopped).
HANDLERS: list[EtcdLeaseRendezvousHandler] = []
#: The rendezvous settings of these tests (the chart's, a 1 s heartbeat: a 3 s lease).
CONF = {"last_call_timeout": "1", "keep_alive_interval": "1", "join_timeout": "60"}


def handler(
    etcd: EtcdServer, run_id: str = "job", min_nodes: int = 1, max_nodes: int = 3, **conf: str
) -> EtcdLeaseRendezvousHandler:
    params = RendezvousParameters(
        "etcd-lease", etcd.endpoint, run_id, min_nodes, max_nodes, local_addr="127.0.0.1",
        **{**CONF, **conf},
    )  # fmt: skip
    made = get_rendezvous_handler(params)
    assert isinstance(made, EtcdLeaseRendezvousHandler)
    HANDLERS.append(made)
    return made


class Join:
    """next_rendezvous of one handler in a thread: its result or its error."""

    def __init__(self, h: EtcdLeaseRendezvousHandler) -> None:
        self.handler = h
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.handler.next_rendezvous()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def wait(self, timeout: float = 30) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "next_rendezvous did not return"
        if self.error is not None:
            raise self.error
        return self.result


def join_all(handlers: list[EtcdLeaseRendezvousHandler], timeout: float = 30) -> list[Any]:
    joins = [Join(h) for h in handlers]
    return [j.wait(timeout) for j in joins]


def revision(etcd: EtcdServer) -> int:
    """etcd's revision now (each write, and only a write, moves it), read with plain HTTP."""
    body = json.dumps({"key": base64.b64encode(b"\0").decode()}).encode()
    req = urllib.request.Request(f"{etcd.url}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.load(resp)["header"]["revision"])


def keys_under(etcd: EtcdServer, prefix: bytes) -> list[bytes]:
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    body = json.dumps(
        {
            "key": base64.b64encode(prefix).decode(),
            "range_end": base64.b64encode(end).decode(),
            "keys_only": True,
        }
    ).encode()
    req = urllib.request.Request(f"{etcd.url}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return [base64.b64decode(kv["key"]) for kv in json.load(resp).get("kvs") or []]
