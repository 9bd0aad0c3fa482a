"""Helpers of the etcd v3 backend's tests."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import RendezvousParameters


def params(endpoint: str, run_id: str = "job", **conf: str) -> RendezvousParameters:
    return RendezvousParameters("etcd-v3", endpoint, run_id, 1, 3, **conf)
