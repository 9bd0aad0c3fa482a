"""etcd v3 rendezvous backend and store for torchrun (`--rdzv-backend=etcd-v3`)."""

from .backend import EtcdV3RendezvousBackend
from .config import Config, ConfigError
from .handler import create_backend, create_rdzv_handler
from .store import EtcdV3Store

__all__ = [
    "Config",
    "ConfigError",
    "EtcdV3RendezvousBackend",
    "EtcdV3Store",
    "create_backend",
    "create_rdzv_handler",
]
