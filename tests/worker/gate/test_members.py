"""This pod's member key (gate/members.py) against a real etcd, on both backends: its value
says which incarnation wrote it; the gate writes it over anything there (the newest
incarnation is the pod), later writes and the removal only while it is this pod's, so an
old incarnation never takes it back; nothing is written or removed once the job is done."""

from __future__ import annotations

import json

import pytest
from elastic_worker.gate.members import Member, Registration
from elastic_worker.gate.topology import Kind
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings import config
from testlib import EtcdServer

from worker.worker_helpers import keystore_fixtures

JOB = "members42"
POD = "w-1"

backend, etcd, client = keystore_fixtures(JOB)


def cfg(etcd: EtcdServer, uid: str, **extra: str) -> config.Config:
    env = {
        "ELASTIC_JOB_ID": JOB,
        "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
        "ELASTIC_RDZV_BACKEND": "etcd-v2" if etcd.v2 else "etcd-v3",
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "2",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": POD,
        "POD_UID": uid,
        "NODE_NAME": f"node-of-{uid}",
        **extra,
    }
    return config.load(["train.py"], env)


KEY = f"/elastic-job/{JOB}/members/{POD}"


def test_the_value_names_the_incarnation_its_node_and_kind(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    c = cfg(etcd, "uid-a", NODE_GPU_MODEL="NVIDIA-H100-80GB-HBM3", NODE_GPU_COUNT="8")
    reg = Registration(client, c, "10.0.0.5", addr="10.8.0.5")
    assert reg.probe() == (True, "")
    value = json.loads(client.get_value(KEY) or "")
    assert value == {
        "ip": "10.0.0.5",
        "addr": "10.8.0.5",
        "uid": "uid-a",
        "node": "node-of-uid-a",
        "gpu_model": "NVIDIA-H100-80GB-HBM3",
        "gpu_count": "8",
        "fabric": "",
    }
    assert reg.kinds() == [Kind("NVIDIA-H100-80GB-HBM3", "8", "")]
    assert reg.member_at("10.8.0.5") is None  # its own: not a peer
    # a bare address (an older worker) still reads as a member
    assert Member.decode("w-0", "10.0.0.4") == Member("w-0", "10.0.0.4")


def test_an_old_incarnation_never_takes_the_key_back_and_learns_it_was_replaced(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    old = Registration(client, cfg(etcd, "uid-old"), "10.0.0.5")
    old.register()
    replaced: list[str] = []
    old.on_replaced = replaced.append
    new = Registration(client, cfg(etcd, "uid-new"), "10.0.0.9")
    new.register()  # the gate of the pod made again: the newest incarnation is the pod
    old.refresh()  # the old one, back with its node
    assert json.loads(client.get_value(KEY) or "")["uid"] == "uid-new"
    assert replaced == ["uid-new"] and old.replaced_by == "uid-new"
    old.stop()  # its removal is a compare-and-swap too
    assert json.loads(client.get_value(KEY) or "")["uid"] == "uid-new"
    new.refresh()
    new.stop()
    assert client.get_value(KEY) is None


def test_a_lapsed_key_is_written_again_by_its_own_pod(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    reg = Registration(client, cfg(etcd, "uid-a"), "10.0.0.5")
    reg.register()
    client.delete(KEY)  # as the TTL would
    reg.refresh()
    assert json.loads(client.get_value(KEY) or "")["uid"] == "uid-a"
    assert reg.replaced_by is None


def test_nothing_is_removed_once_the_job_is_complete(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    # At the end the bundled etcd goes to 0 replicas: the key expires with it. Removing it
    # would fail and print a warning on every pod of a job that succeeded.
    reg = Registration(client, cfg(etcd, "uid-a"), "10.0.0.5", complete=lambda: True)
    reg.register()
    reg.stop()
    assert client.get_value(KEY) is not None


def test_a_failed_removal_says_nothing_when_the_job_turns_out_complete(
    etcd: EtcdServer, client: kvstore.KeyStore, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registration(client, cfg(etcd, "uid-a"), "10.0.0.5", confirm=lambda: True)
    reg.register()
    etcd.stop()
    with caplog.at_level("INFO"):
        reg.stop()
    assert "could not remove" not in caplog.text
    reg2 = Registration(client, cfg(etcd, "uid-b"), "10.0.0.6", confirm=lambda: False)
    with caplog.at_level("INFO"):
        reg2.stop()
    assert "could not remove" in caplog.text


def test_a_fenced_incarnation_writes_nothing_not_even_a_lapsed_key(
    etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    reg = Registration(client, cfg(etcd, "uid-old"), "10.0.0.5")
    reg.register()
    client.delete(KEY)  # lapsed; the new incarnation has not passed its gate yet
    reg.fenced = lambda: True
    assert reg.tick() is False
    reg.stop()
    assert client.get_value(KEY) is None
    reg.fenced = lambda: False
    assert reg.tick() is True  # unfenced, it would take it back
    assert client.get_value(KEY) is not None
