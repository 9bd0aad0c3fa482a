"""The job's kind of node (gate/topology.py) against a real etcd: the first
ELASTIC_MIN_NODES registered pods of one kind make it the job's; a pod of another kind is
refused with one line naming both sides (`refuse`), or joins after saying so (`warn`);
values unknown on either side are not compared; when the kind's pods are all gone the key
lapses and another kind may be the job's."""

from __future__ import annotations

import pytest
from elastic_worker import timings
from elastic_worker.gate.members import Registration
from elastic_worker.gate.topology import Gate, Kind
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings import config
from testlib import EtcdServer

from worker.worker_helpers import keystore_fixtures

JOB = "kinds42"
H100 = ("NVIDIA-H100-80GB-HBM3", "8", "infiniband")
A100 = ("NVIDIA-A100-SXM4-80GB", "8", "infiniband")

backend, etcd, client = keystore_fixtures(JOB, "etcd-v2")


def pod(
    etcd: EtcdServer,
    client: kvstore.KeyStore,
    name: str,
    kind: tuple[str, str, str],
    mode: str = "refuse",
) -> tuple[Registration, Gate]:
    env = {
        "ELASTIC_JOB_ID": JOB,
        "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
        "ELASTIC_MIN_NODES": "2",
        "ELASTIC_MAX_NODES": "3",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": name,
        "POD_UID": f"uid-{name}",
        "NODE_NAME": f"node-{name}",
        "NODE_GPU_MODEL": kind[0],
        "NODE_GPU_COUNT": kind[1],
        "NODE_FABRIC": kind[2],
        "ELASTIC_TOPOLOGY_MISMATCH": mode,
    }
    cfg = config.load(["train.py"], env)
    reg = Registration(client, cfg, f"10.0.0.{len(name)}")
    reg.register()
    return reg, Gate(client, cfg, reg.kinds, timings.MEMBER_TTL)


def test_the_first_min_nodes_of_one_kind_make_it_the_jobs_and_another_is_refused(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    _, a100 = pod(etcd, client, "w-0", A100)
    _, h100a = pod(etcd, client, "w-1", H100)
    ok, why = a100.probe()
    assert not ok and "1 of 2 registered pods on nodes of this kind" in why
    assert not h100a.probe()[0]
    _, h100b = pod(etcd, client, "w-2", H100)
    assert h100b.probe() == (True, "")  # two H100: the job's kind
    assert h100a.probe() == (True, "")
    ok, line = a100.probe()
    assert not ok
    assert line == (
        "refused: this pod's node node-w-0 (NVIDIA-A100-SXM4-80GB x8, infiniband) differs "
        "in gpu model from the job's nodes (NVIDIA-H100-80GB-HBM3 x8, infiniband, as on "
        "node-w-2): NCCL would run the group at its slowest; place the pods on one kind of "
        "node (nodeSelector, affinity), or set topology.mismatch=warn to train on mixed nodes"
    )


def test_warn_joins_after_saying_so_and_off_does_not_look(
    etcd: EtcdServer, client: kvstore.KeyStore, caplog: pytest.LogCaptureFixture
) -> None:
    pod(etcd, client, "w-1", H100)[1].probe()
    pod(etcd, client, "w-2", H100)[1].probe()
    assert pod(etcd, client, "w-0", A100, mode="warn")[1].probe() == (True, "")
    assert "differs in gpu model" in caplog.text and "joining anyway" in caplog.text
    assert pod(etcd, client, "w-3", A100, mode="off")[1].probe() == (True, "")


def test_what_either_side_does_not_know_is_not_compared() -> None:
    assert Kind("NVIDIA-H100-80GB-HBM3", "8", "unknown").matches(Kind("", "8", "infiniband"))
    assert Kind("m", "8", "roce").differences(Kind("m", "4", "infiniband")) == [
        "gpu_count",
        "fabric",
    ]
    assert not Kind("", "", "unknown").known()
    assert Kind("", "0", "unknown").describe() == "no GPU"


def test_the_kind_lapses_with_its_pods_and_another_may_be_the_jobs(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    regs = [pod(etcd, client, f"w-{n}", H100) for n in (1, 2)]
    assert regs[0][1].probe()[0]
    regs[1][1].refresh()  # a pod of the kind keeps it
    assert client.get_value(f"/elastic-job/{JOB}/topology") is not None
    for reg, _ in regs:
        reg.stop()
    client.delete(f"/elastic-job/{JOB}/topology")  # its TTL, with no pod of it to refresh
    pod(etcd, client, "w-5", A100)
    assert pod(etcd, client, "w-6", A100)[1].probe() == (True, "")
