"""python-etcd 0.4.5 (torch's etcd-v2 transport) works with the urllib3 the image pins.

python-etcd calls HTTPResponse.getheader() on every answer when allow_reconnect is on
(etcd/client.py _check_cluster_id), as torch's etcd-v2 backend sets it, and getheaders()
on every result (etcd/__init__.py parse_headers). urllib3 2.6.0 removed both; 2.6.1
restored them, not deprecated ("methods used by dependent libraries", urllib3 #3732), so
the image takes a current urllib3 (requirements/advisories.toml) with no shim. These tests
go through that path against a real etcd, and a real torchrun forms a group on it; they fail
loudly if a urllib3 release takes the methods away again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path

import etcd as python_etcd
import pytest
import urllib3
from testlib import EtcdServer
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend

from worker.worker_helpers import ROOT

PINS = {"python-etcd": "0.4.5", "urllib3": "2.8.0"}


def test_the_installed_versions_are_the_pinned_ones() -> None:
    assert version("python-etcd") == PINS["python-etcd"]
    assert urllib3.__version__ == PINS["urllib3"], (
        f"urllib3 {urllib3.__version__} is installed but {PINS['urllib3']} is pinned "
        "(requirements/dev.txt): run scripts/bootstrap"
    )


def test_urllib3_keeps_the_methods_python_etcd_calls_without_deprecation() -> None:
    """The fence: were a urllib3 release to drop getheader()/getheaders() again (as 2.6.0
    did), or deprecate them towards a removal, this names it before a rendezvous breaks."""
    response = urllib3.HTTPResponse(body=b"", headers={"X-Etcd-Cluster-Id": "c1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert response.getheader("x-etcd-cluster-id") == "c1", (
            f"urllib3 {urllib3.__version__}: HTTPResponse.getheader() is gone or changed; "
            "python-etcd 0.4.5 needs it: pin a urllib3 that has it or give python-etcd a shim"
        )
        assert response.getheaders()["x-etcd-cluster-id"] == "c1"


def test_the_package_and_the_image_pin_the_same_versions() -> None:
    pyproject = (ROOT / "images/worker/pyproject.toml").read_text()
    dockerfile = (ROOT / "images/worker/Dockerfile").read_text()
    for name, ver in PINS.items():
        assert f'"{name}=={ver}"' in pyproject, f"pyproject.toml must pin {name}=={ver}"
        arg = name.replace("-", "_").upper() + "_VERSION"
        assert re.search(rf"^ARG {arg}={re.escape(ver)}$", dockerfile, re.M), (
            f"Dockerfile must pin {name} with ARG {arg}={ver}"
        )
        assert f'"{name}==${{{arg}}}"' in dockerfile


def test_python_etcd_reads_the_cluster_id_header_through_urllib3(etcd: EtcdServer) -> None:
    host, port = etcd.endpoint.rsplit(":", 1)
    client = python_etcd.Client(host=host, port=int(port), allow_reconnect=True, read_timeout=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no deprecated path either
        client.write("/pin-test/key", "value", ttl=60)
        assert client.read("/pin-test/key").value == "value"
        with pytest.raises(python_etcd.EtcdKeyNotFound):
            client.read("/pin-test/absent")
        with pytest.raises(python_etcd.EtcdWatchTimedOut):
            client.watch("/pin-test/key", timeout=0.5)
    # Set from the x-etcd-cluster-id header by response.getheader().
    assert client.expected_cluster_id, "python-etcd did not read the cluster id header"


def test_torchs_etcd_v2_backend_and_store_work_against_real_etcd(etcd: EtcdServer) -> None:
    params = RendezvousParameters(
        backend="etcd-v2", endpoint=etcd.endpoint, run_id="pin-test", min_nodes=1, max_nodes=1
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        backend, store = create_backend(params)
        assert backend.get_state() is None
        state, _token, ok = backend.set_state(b"state-1")  # type: ignore[misc]
        assert ok and state == b"state-1"
        store.set_timeout(timedelta(seconds=5))
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert store.add("n", 2) == 2


TRAIN = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} world {dist.get_world_size()} sum {int(t.item())}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_forms_a_two_node_group_on_etcd_v2_with_the_pinned_urllib3(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """Two real torchrun agents rendezvous through torch's etcd-v2 backend (python-etcd on
    this urllib3) and run a gloo all-reduce; a DeprecationWarning from python-etcd's calls
    into urllib3 is an error."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONWARNINGS": "error::DeprecationWarning:etcd.client,error::DeprecationWarning:etcd",
    }
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=etcd-v2",
        f"--rdzv-endpoint={etcd.endpoint}", "--rdzv-id=urllib3-pin", "--nnodes=2",
        "--nproc-per-node=1", "--local-addr=127.0.0.1", "--max-restarts=0", str(script),
    ]  # fmt: skip
    agents = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=240)
            outs.append(out)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    for agent, out in zip(agents, outs, strict=True):
        assert agent.returncode == 0, out[-4000:]
    joined = "".join(outs)
    assert "world 2 sum 3" in joined and "rank 0" in joined and "rank 1" in joined, joined[-4000:]
    assert "getheader" not in joined, joined[-4000:]
