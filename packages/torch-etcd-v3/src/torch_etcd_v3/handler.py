"""`torchrun --rdzv-backend=etcd-v3`: the entry point torch's registry loads, and the
backend and store it makes for each agent.

torch's rendezvous package loads the `torchrun.handlers` entry points (this module's
`handler_creator`) while it is itself being imported. So this module imports torch only
inside its functions: were `import torch_etcd_v3.handler` to import torch's rendezvous at
the top, torch would load the entry point from this module half-initialised, and the
registration would fail (logged and swallowed by torch).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import config
from .client import EtcdClient, EtcdConnectionError, EtcdError
from .lease import AgentLease

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousHandler,
        RendezvousParameters,
    )

    from .backend import EtcdV3RendezvousBackend
    from .store import EtcdV3Store

log = logging.getLogger(__name__)

#: torch's switch for its agent-shared TCPStore, read by its dynamic rendezvous handler
#: (torch 2.4+) each round. Shared (torch's default), a node joining a later round waits in
#: RendezvousStoreInfo.build for a MASTER_ADDR that the round's rank 0, holding its store
#: from an earlier round, never writes; and an agent whose rank changed keeps an old
#: master's address. Off, each round's rank 0 writes its address through this store.
SHARED_STORE_SWITCH = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def create_backend(params: RendezvousParameters) -> tuple[EtcdV3RendezvousBackend, EtcdV3Store]:
    """The backend and store for `params`, sharing one client and one lease. etcd is asked
    once here, as torch's etcd-v2 create_backend does, so that an endpoint nothing answers
    on, wrong credentials or a user without access to the keys fail now, with torch's
    RendezvousConnectionError, rather than in the middle of the first round."""
    from torch.distributed.elastic.rendezvous.api import (  # noqa: PLC0415 - see the docstring
        RendezvousConnectionError,
    )

    from .backend import EtcdV3RendezvousBackend  # noqa: PLC0415
    from .store import EtcdV3Store  # noqa: PLC0415

    cfg = config.load(params)
    client = EtcdClient(cfg.client)
    try:
        client.get(cfg.state_key)
    except EtcdError as exc:
        hint = (
            " (--rdzv-endpoint: is etcd running, and reachable from this node?)"
            if isinstance(exc, EtcdConnectionError)
            else ""
        )
        raise RendezvousConnectionError(f"etcd-v3 rendezvous: {exc}{hint}") from exc
    lease = AgentLease(client, cfg.lease_ttl)
    backend = EtcdV3RendezvousBackend(client, cfg.state_key, lease, cfg.backoff)
    store = EtcdV3Store(client, cfg.store_prefix, lease)
    return backend, store


def _agent_store_off() -> None:
    """Turn torch's shared TCPStore off in this agent unless the user chose it (see
    SHARED_STORE_SWITCH); torch reads the switch after the handler is made."""
    chosen = os.environ.setdefault(SHARED_STORE_SWITCH, "1")
    if chosen != "1":
        log.warning(
            "%s=%s: torch's shared TCPStore is on; a node that joins a later round can wait "
            "for MASTER_ADDR until the store times out (unset it to let etcd-v3 turn it off)",
            SHARED_STORE_SWITCH,
            chosen,
        )


def create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (  # noqa: PLC0415
        create_handler,
    )

    _agent_store_off()
    backend, store = create_backend(params)
    return create_handler(store, backend, params)


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """torch's registry calls the `torchrun.handlers` entry point with no arguments and
    registers what it returns as the backend's creator."""
    return create_rdzv_handler
