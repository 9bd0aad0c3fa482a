"""torch's rendezvous through its public API: the handler torchrun makes for an id (torch's
registry, so the same backend and settings), and whether that rendezvous is closed.
Its internals are read in torchcompat.py only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_worker.settings.config import Config

if TYPE_CHECKING:  # torch is imported only when a rendezvous must be asked
    from torch.distributed.elastic.rendezvous import RendezvousHandler


def handler(config: Config, rdzv_id: str) -> RendezvousHandler:
    """The rendezvous handler torchrun creates for `rdzv_id` (torch's public registry)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.registry import (  # noqa: PLC0415
        get_rendezvous_handler,
    )

    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=str(config.endpoint),
        run_id=rdzv_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        **dict(config.rdzv_conf),
    )
    return get_rendezvous_handler(params)


def closed(config: Config, rdzv_id: str) -> bool:
    """torch's own answer (`RendezvousHandler.is_closed`) for `rdzv_id`. Raises whatever
    torch raises when etcd cannot answer (the caller then leaves the failure to the
    kubelet)."""
    return bool(handler(config, rdzv_id).is_closed())
