"""`torchrun --rdzv-backend=etcd-v3`: the entry point torch's registry loads."""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from . import config
from .backend import EtcdV3RendezvousBackend
from .client import EtcdClient
from .lease import AgentLease
from .store import EtcdV3Store


def create_backend(params: RendezvousParameters) -> tuple[EtcdV3RendezvousBackend, EtcdV3Store]:
    """The backend and store for `params`, sharing one client and one lease."""
    cfg = config.load(params)
    client = EtcdClient(cfg.client)
    lease = AgentLease(client, cfg.lease_ttl)
    backend = EtcdV3RendezvousBackend(client, cfg.state_key, lease, cfg.backoff)
    store = EtcdV3Store(client, cfg.store_prefix, lease)
    return backend, store


def create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    backend, store = create_backend(params)
    return create_handler(store, backend, params)


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """torch's registry calls the `torchrun.handlers` entry point with no arguments and
    registers what it returns as the backend's creator."""
    return create_rdzv_handler
