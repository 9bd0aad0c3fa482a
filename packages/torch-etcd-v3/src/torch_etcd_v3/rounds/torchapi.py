"""What this backend takes from torch, in one place, by release (2.1 to 2.14): public names
of torch.distributed.elastic.rendezvous only.

- `RendezvousHandler`, its errors, `RendezvousParameters`: every release.
- `next_rendezvous()` returns `RendezvousInfo(store, rank, world_size,
  RendezvousStoreInfo(master_addr, master_port))` from 2.4 on; a tuple
  `(store, rank, world_size)` before (2.1-2.3), whose agent of rank 0 picks the master's
  port and writes it to the round's store itself.
- `RendezvousGracefulExitError` (2.3+): a spare's end when the job closes; before, the
  rendezvous's closed error.
- `use_agent_store` (2.5+): a property of the base class; False here (the workers'
  own TCPStore on the master's port, as torch's with TORCH_DISABLE_SHARE_RDZV_TCP_STORE).

tests/etcd_v3/test_etcd_lease_torch_api.py checks these against each release's
dynamic_rendezvous.py (tests/worker/torch_sources) and runs the handler with the shapes of
2.1-2.3 as well as the installed torch's.
"""

from __future__ import annotations

from typing import Any

from torch._C._distributed_c10d import Store  # torch.distributed's, typed (re-export is not)
from torch.distributed.elastic.rendezvous import api


def returns_info(module: Any = None) -> bool:
    """This torch's next_rendezvous returns RendezvousInfo (2.4+), not a tuple (`module`:
    a torch's rendezvous api module; by default the installed one's)."""
    module = api if module is None else module
    return hasattr(module, "RendezvousInfo") and hasattr(module, "RendezvousStoreInfo")


def rendezvous_result(
    store: Store, rank: int, world_size: int, master: tuple[str, int], module: Any = None
) -> Any:
    """What next_rendezvous returns in this torch (`module`: its rendezvous api)."""
    module = api if module is None else module
    if returns_info(module):
        info = module.RendezvousStoreInfo(master[0], master[1])
        return module.RendezvousInfo(store, rank, world_size, info)
    return store, rank, world_size


def closed_error(spare: bool, run_id: str, module: Any = None) -> Exception:
    """The error a node waiting in a closed rendezvous ends with: a spare's is torch's
    graceful exit (2.3+: its agent exits without failing), anyone else's RendezvousClosedError."""
    module = api if module is None else module
    graceful = getattr(module, "RendezvousGracefulExitError", None)
    error: Exception
    if spare and graceful is not None:
        error = graceful(f"The rendezvous '{run_id}' is closed, terminating pending rendezvous.")
    else:
        error = module.RendezvousClosedError()
    return error
