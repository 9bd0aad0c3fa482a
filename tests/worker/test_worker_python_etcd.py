"""python-etcd 0.4.5 (torch's etcd-v2 transport) works with the urllib3 the image pins.

urllib3 2.6 removed HTTPResponse.getheader(), which python-etcd calls on every answer
when allow_reconnect is on (etcd/client.py _check_cluster_id), as torch's etcd-v2 backend
sets it. These tests go through that path against a real etcd and fail loudly if the
pinned urllib3 breaks it.
"""

from __future__ import annotations

import re
import warnings
from datetime import timedelta
from importlib.metadata import version

import etcd as python_etcd
import pytest
import urllib3
from testlib import EtcdServer
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend
from worker_helpers import ROOT

PINS = {"python-etcd": "0.4.5", "urllib3": "2.5.0"}


def test_the_installed_versions_are_the_pinned_ones() -> None:
    assert version("python-etcd") == PINS["python-etcd"]
    assert urllib3.__version__ == PINS["urllib3"], (
        f"urllib3 {urllib3.__version__} is installed but {PINS['urllib3']} is pinned: "
        "python-etcd 0.4.5 needs HTTPResponse.getheader() (removed in urllib3 2.6)"
    )


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
        warnings.simplefilter("ignore", DeprecationWarning)  # getheader is deprecated in 2.x
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
