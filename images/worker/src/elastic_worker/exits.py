"""elastic-worker's exit codes (docs/contracts.md), in one place: the codes, what each
means (MEANINGS, the table images/worker/README.md shows and a test checks) and the exit
a step raises to leave the pod's run with one."""

from __future__ import annotations

OK = 0
#: A setting is missing or wrong (one line names it), TLS to etcd included.
CONFIG = 2
#: The readiness gate timed out, or etcd failed for good after it (one line says which).
GATE_TIMEOUT = 3
#: The endpoint answers HTTP but lacks the etcd API of the rendezvous backend: v2 for
#: etcd-v2 (etcd 3.6, --enable-v2=false), v3 for etcd-v3 (etcd before 3.4).
NO_API = 4
#: The image cannot run the worker: no python on PATH, Python or torch too old, torch
#: without torch.distributed (image.py; an injected worker's bin/elastic-worker says it too).
IMAGE = 5

MEANINGS = {
    OK: "training succeeded, the job was already complete, or the pod was stopped after "
    "it completed",
    CONFIG: "a setting is missing or wrong, TLS to etcd that cannot work included "
    "(one line names it)",
    GATE_TIMEOUT: "the readiness gate timed out, or etcd failed after it",
    NO_API: "the endpoint lacks the etcd API of the rendezvous backend (v2 for etcd-v2, "
    "v3 for etcd-v3)",
    IMAGE: "the image cannot run the worker: no python3 or python on PATH, Python older than "
    "3.10, no torch or one older than 2.1, or torch without torch.distributed (one line "
    "names it)",
}


def from_returncode(returncode: int) -> int:
    """A child's end as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def signalled(signum: int) -> int:
    return 128 + signum


class Exit(Exception):
    """Leave the pod's run with `code`; the step that raises it has logged why."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
