"""What each part of torch-etcd-v3 imports: the key-value client, its configuration and the
worker's etcd-v3 key store import no torch (a process that only reads and writes keys does
not pay for it); the backend and store do; torch's registry still finds the handler
whichever is imported first. Each check in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "torch-etcd-v3"


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize(
    "module",
    [
        "torch_etcd_v3",
        "torch_etcd_v3.client",
        "torch_etcd_v3.lease",
        "torch_etcd_v3.backoff",
        "torch_etcd_v3.config",
        "torch_etcd_v3.handler",
        "torch_etcd_v3.ops",
        "torch_etcd_v3.watch",
        "torch_etcd_v3.rounds",
        "torch_etcd_v3.rounds.protocol",
        "torch_etcd_v3.rounds.view",
        "torch_etcd_v3.rounds.entry",
        "elastic_worker.keystore.etcdv3",
    ],
)
def test_the_key_value_client_imports_no_torch(module: str) -> None:
    _run(f"import sys, {module}\nassert 'torch' not in sys.modules, '{module} imported torch'")


def test_the_worker_key_store_reaches_etcd_without_torch(etcd3: object) -> None:
    """The worker's etcd-v3 key store, made from its settings as elastic-worker makes it
    (the whole rdzv-conf checked by torch-etcd-v3's parser), writes and reads a key, and
    torch is still not imported."""
    endpoint = getattr(etcd3, "endpoint")  # noqa: B009 - the fixture's EtcdServer
    code = f"""
import sys
from elastic_worker.settings import config
from elastic_worker.keystore import interface as kvstore
env = {{
    "ELASTIC_JOB_ID": "kv", "ELASTIC_RDZV_ENDPOINT": "{endpoint}",
    "ELASTIC_RDZV_BACKEND": "etcd-v3", "ELASTIC_RDZV_CONF": "lease_ttl=30,key_prefix=/",
    "ELASTIC_MIN_NODES": "1", "ELASTIC_MAX_NODES": "1", "ELASTIC_INJECT_ENV": "/nonexistent",
}}
store = kvstore.connect(config.load(["train.py"], env))
store.set("/elastic-job/kv/k", "v")
assert store.get_value("/elastic-job/kv/k") == "v"
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    _run(code)


def test_the_backend_and_store_are_there_when_asked_for() -> None:
    """`from torch_etcd_v3 import EtcdV3Store` (the package's names that need torch) still
    works, importing torch then."""
    _run(
        "import sys\n"
        "from torch_etcd_v3 import EtcdV3RendezvousBackend, EtcdV3Store, create_backend\n"
        "assert 'torch' in sys.modules\n"
    )


@pytest.mark.parametrize(
    "first",
    [
        "torch_etcd_v3",
        "torch_etcd_v3.handler",
        "torch_etcd_v3.backend",
        "torch_etcd_v3.store",
        "torch_etcd_v3.rounds.entry",
        "torch_etcd_v3.rounds.handler",
    ],
)
def test_torch_registry_finds_etcd_v3_whichever_is_imported_first(first: str) -> None:
    """torch loads the `torchrun.handlers` entry points while importing its rendezvous
    package; importing a part of this package first must not leave it half-initialised
    for that (it did: a circular import, logged and swallowed by torch)."""
    stderr = _run(
        f"import {first}\n"
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r\n"
        "assert {'etcd-v3', 'etcd-lease'} <= set(r._registry), sorted(r._registry)\n"
    )
    assert "Exception while registering" not in stderr, stderr


def test_the_package_declares_torch_for_its_torchrun_part_only() -> None:
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    assert [r.split(">=")[0] for r in project["optional-dependencies"]["torchrun"]] == ["torch"]
    handlers = project["entry-points"]["torchrun.handlers"]
    assert handlers == {
        "etcd-v3": "torch_etcd_v3.handler:handler_creator",
        "etcd-lease": "torch_etcd_v3.rounds.entry:handler_creator",
    }
