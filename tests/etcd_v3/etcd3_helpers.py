"""Helpers of the etcd v3 backend's tests."""

from __future__ import annotations

import base64
import json
import urllib.request

from testlib import EtcdServer
from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch_etcd_v3 import EtcdV3RendezvousBackend, EtcdV3Store, create_backend
from torch_etcd_v3.lease import AgentLease

# Leases of the agents a test made: their keep-alive threads stop when it ends (in an
# agent they end with the process).
LEASES: list[AgentLease] = []


def params(endpoint: str, run_id: str = "job", **conf: str) -> RendezvousParameters:
    return RendezvousParameters("etcd-v3", endpoint, run_id, 1, 3, **conf)


def connect(
    endpoint: str, run_id: str = "job", **conf: str
) -> tuple[EtcdV3RendezvousBackend, EtcdV3Store]:
    """What one agent makes: a backend and a store sharing a client and a lease."""
    backend, store = create_backend(params(endpoint, run_id, **conf))
    LEASES.append(store.lease)
    return backend, store


def count_keys(etcd: EtcdServer, prefix: bytes) -> int:
    """Keys under `prefix`, read with plain HTTP (not the code under test)."""
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    body = json.dumps(
        {
            "key": base64.b64encode(prefix).decode(),
            "range_end": base64.b64encode(end).decode(),
            "count_only": True,
        }
    ).encode()
    req = urllib.request.Request(f"{etcd.url}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.load(resp).get("count", 0))
