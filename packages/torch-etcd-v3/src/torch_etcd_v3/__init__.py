"""etcd v3 rendezvous backend and store for torchrun (`--rdzv-backend=etcd-v3`)."""

# torch's rendezvous package loads the `torchrun.handlers` entry points (this package's
# handler module among them) when it is first imported. Imported here first, so that
# `import torch_etcd_v3` before torch's rendezvous does not have torch load our handler
# while this package is half initialized (the registration then failed: circular import).
import torch.distributed.elastic.rendezvous  # noqa: F401  # isort: skip

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
