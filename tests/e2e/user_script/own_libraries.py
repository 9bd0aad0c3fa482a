"""A user's training script whose image pins libraries of its own (urllib3 here, as an
experiment tracker's client would bring): local rank 0 prints one line of its own, `[probe]`
and what it sees, then it trains as multinode.py does (same arguments). The line says which
urllib3 it imported, whether any library of the worker's is in reach, and where its python
and torch are: tests/e2e/test_e2e_own_image.py reads it from the pods' logs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from importlib import metadata

import multinode
import torch
import urllib3

#: The worker's own libraries (its bundle's deps/ and lib/, the warm server's elastic_worker):
#: none may be importable here.
WORKERS = ("etcd", "dns", "prometheus_client", "torch_etcd_v3", "elastic_worker")


def seen() -> dict[str, object]:
    return {
        "python": sys.executable,
        "torch": torch.__file__,
        "urllib3": [urllib3.__version__, urllib3.__file__],
        "workers_libraries": [m for m in WORKERS if importlib.util.find_spec(m) is not None],
        "torchrun_handlers": sorted(
            e.name for e in metadata.entry_points(group="torchrun.handlers")
        ),
        "sys_path": sys.path,
        "PYTHONPATH": os.environ.get("PYTHONPATH"),
    }


if __name__ == "__main__":
    if os.environ.get("LOCAL_RANK") == "0":
        print("[probe] " + json.dumps(seen()), flush=True)
    multinode.cli()
