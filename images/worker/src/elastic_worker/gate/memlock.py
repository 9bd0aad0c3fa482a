"""RDMA needs locked memory: say so at start when the node's limit will get in the way.

NCCL and libfabric register host buffers with the RDMA device (ibv_reg_mr), which the
kernel counts against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. A container
inherits the limit from the node's runtime (often 8 MiB); a non-root process never has
CAP_IPC_LOCK in its effective set (docs/rdma.md). With RDMA devices in the container and
a finite limit, training silently falls back to TCP or fails at the first collective, so
the worker raises its soft limit to the hard one and, if that is still finite, warns once.
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path

logger = logging.getLogger(__name__)

RDMA_DEVICES = Path("/dev/infiniband")
CAP_IPC_LOCK = 14  # linux/capability.h


def _has_ipc_lock(status: Path) -> bool:
    """Whether CAP_IPC_LOCK is in this process's effective set (/proc/self/status CapEff)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else f"{value // 1024} KiB"


def check(devices: Path = RDMA_DEVICES, status: Path = Path("/proc/self/status")) -> str | None:
    """Raise the soft memlock limit to the hard one when RDMA devices are present; return
    the warning to log when locked memory is still bounded (None: nothing to say)."""
    if not any(devices.glob("uverbs*")) or _has_ipc_lock(status):
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        except (OSError, ValueError) as exc:
            logger.debug("could not raise RLIMIT_MEMLOCK to its hard limit: %s", exc)
        else:
            logger.info("raised RLIMIT_MEMLOCK from %s to %s", _limit(soft), _limit(hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return None
    return (
        f"RLIMIT_MEMLOCK is {_limit(soft)} with RDMA devices in {devices}: NCCL/libfabric "
        "cannot register enough memory (they fall back to TCP or fail); set memlock "
        "unlimited in the node's container runtime (docs/rdma.md) or use "
        "values-examples/overlays/rdma-root-ipc-lock.yaml"
    )
