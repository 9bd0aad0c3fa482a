"""etcd v3 rendezvous for torchrun: `--rdzv-backend=etcd-v3` (a backend of torch's dynamic
rendezvous) and `--rdzv-backend=etcd-lease` (rounds/: a rendezvous of per-node leased keys).

The map, by what each part imports:

- standard library only (no torch): `client` (etcd's v3 JSON gateway: keys, transactions,
  leases), `ops` (a transaction's operations and answers), `watch` (a long-lived watch read
  by a thread), `lease` (one lease per agent, kept alive), `backoff` (the wait after a lost
  compare-and-set), `config` (`--rdzv-endpoint`/`--rdzv-conf` -> `Config`), `handler` (the
  `torchrun.handlers` entry point; torch imported inside its functions), and `rounds/` but
  its torchapi.py and handler.py (etcd-lease; its map in rounds/__init__.py).
- torch (`pip install 'torch-etcd-v3[torchrun]'`, or the host's torch): `backend` (torch's
  `RendezvousBackend`: the state by compare-and-set) and `store` (torch's `Store`).

`import torch_etcd_v3` imports no torch; the names below that need it are imported when
first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import Config, ConfigError

if TYPE_CHECKING:
    from .backend import EtcdV3RendezvousBackend
    from .handler import create_backend, create_rdzv_handler
    from .store import EtcdV3Store

_LAZY = {
    "EtcdV3RendezvousBackend": "backend",
    "EtcdV3Store": "store",
    "create_backend": "handler",
    "create_rdzv_handler": "handler",
}

__all__ = [
    "Config",
    "ConfigError",
    "EtcdV3RendezvousBackend",
    "EtcdV3Store",
    "create_backend",
    "create_rdzv_handler",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
