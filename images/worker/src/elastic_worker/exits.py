"""elastic-worker's exit codes (docs/contracts.md), in one place."""

from __future__ import annotations

OK = 0
#: A setting is missing or wrong (one line names it), TLS to etcd included.
CONFIG = 2
GATE_TIMEOUT = 3
#: The endpoint answers HTTP but lacks the etcd API of the rendezvous backend: v2 for
#: etcd-v2 (etcd 3.6, --enable-v2=false), v3 for etcd-v3 (etcd before 3.4).
NO_API = 4


def from_returncode(returncode: int) -> int:
    """A child's end as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def signalled(signum: int) -> int:
    return 128 + signum
