"""The `torchrun.handlers` entry point of `etcd-lease`, and register() for a torch older
than 2.5 (whose registry loads no entry points).

torch's rendezvous package loads the entry points while it is itself being imported, so
this module imports torch only inside its functions (as ../handler.py does for etcd-v3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousHandler,
        RendezvousParameters,
    )

NAME = "etcd-lease"  # handler.NAME, without importing torch


def create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    from .handler import create_handler  # noqa: PLC0415 - see the module docstring

    return create_handler(params)


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """torch's registry calls the entry point with no arguments and registers what it
    returns as the backend's creator."""
    return create_rdzv_handler


def register() -> None:
    """Register `etcd-lease` in torch's registry (its public `register`) where the entry
    point was not loaded (torch 2.1-2.4); where it was, the same creator is registered
    again, which torch allows."""
    from torch.distributed.elastic.rendezvous import (  # noqa: PLC0415
        rendezvous_handler_registry,
    )

    rendezvous_handler_registry.register(NAME, create_rdzv_handler)
