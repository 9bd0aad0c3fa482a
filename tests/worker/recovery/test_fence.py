"""This incarnation's fence (recovery/fence.py): at the first sign the pod was replaced its
torchrun's process group is stopped, then the pod asks who it is (the API server's pod when
it may read it, else its member key in a real etcd): replaced, torchrun's group is killed
and the pod acts on nothing more; this pod, torchrun goes on; not known, it stays stopped.
And loss detection asks at once, on the local clock, when its key has not been refreshed
for longer than its TTL (a process that was frozen), before any request."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elastic_worker.gate.members import Registration
from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import lossdetect
from elastic_worker.recovery.fence import Fence, Who
from elastic_worker.settings import config
from elastic_worker.settings.config import KubeApi
from testlib import EtcdServer

from localrun.cluster.apiserver import FakeApiServer
from worker.worker_helpers import keystore_fixtures, wait_until

JOB = "fence42"
NS = "ml"
POD = "w-1"

backend, etcd, client = keystore_fixtures(JOB, "etcd-v2")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer({}, workdir=tmp_path / "api", namespace=NS) as server:
        yield server


@pytest.fixture
def torchrun() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in torchrun in a session of its own (as the supervisor starts it), with a
    child, so that its whole process group counts."""
    proc = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def state(pid: int) -> str:
    """The process's state letter (T: stopped), or "" once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rsplit(")", 1)[1].split()[0]


def cfg(etcd: EtcdServer, uid: str = "uid-old", api: FakeApiServer | None = None) -> config.Config:
    env = {
        "ELASTIC_JOB_ID": JOB,
        "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "2",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": POD,
        "POD_NAMESPACE": NS,
        "POD_UID": uid,
    }
    c = config.load(["train.py"], env)
    if api is not None:
        c = dataclasses.replace(c, kube_api=KubeApi(api.url, api.token, str(api.ca_path)))
    return c


def served(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": NS, "uid": uid, "labels": {}},
        "spec": {"containers": [{"name": "worker"}]},
        "status": {"phase": "Running"},
    }


def test_the_api_servers_pod_of_another_uid_fences_this_one_and_kills_torchrun(
    etcd: EtcdServer,
    client: kvstore.KeyStore,
    api: FakeApiServer,
    torchrun: subprocess.Popen[bytes],
) -> None:
    c = cfg(etcd, api=api)
    api.publish_pods(NS, [served("uid-new")])  # the pod made again
    fence = Fence(c, client, Registration(client, c, "10.0.0.5"), lambda: torchrun.pid)
    assert fence.suspect("its key lapsed") is False
    assert fence.fenced.is_set() and fence.holding
    assert torchrun.wait(5) == -signal.SIGKILL
    assert fence.suspect("again") is False  # fenced for good


def test_this_pod_goes_on_its_torchrun_stopped_only_while_it_asked(
    etcd: EtcdServer,
    client: kvstore.KeyStore,
    api: FakeApiServer,
    torchrun: subprocess.Popen[bytes],
) -> None:
    c = cfg(etcd, api=api)
    api.publish_pods(NS, [served("uid-old")])
    fence = Fence(c, client, None, lambda: torchrun.pid)
    assert fence.suspect("its key lapsed") is True
    assert not fence.holding and torchrun.poll() is None
    assert state(torchrun.pid) in ("S", "R")


def test_a_pod_gone_from_the_api_server_is_replaced(
    etcd: EtcdServer, client: kvstore.KeyStore, api: FakeApiServer
) -> None:
    fence = Fence(cfg(etcd, api=api), client, None, lambda: None)
    assert fence.who()[0] is Who.REPLACED  # 404: force-deleted, its new one not made yet


def test_without_api_access_the_member_key_tells(
    etcd: EtcdServer, client: kvstore.KeyStore, torchrun: subprocess.Popen[bytes]
) -> None:
    old_cfg = cfg(etcd, "uid-old")
    old = Registration(client, old_cfg, "10.0.0.5")
    old.register()
    fence = Fence(old_cfg, client, old, lambda: torchrun.pid)
    assert fence.who()[0] is Who.THIS
    client.delete(old.key)  # lapsed while the node was away: taken back, create-only
    assert fence.who() == (Who.THIS, "its member key had lapsed and is this pod's again")
    assert json.loads(client.get_value(old.key) or "")["uid"] == "uid-old"
    Registration(client, cfg(etcd, "uid-new"), "10.0.0.9").register()  # the new one's gate
    assert fence.suspect("its key lapsed") is False
    assert fence.fenced.is_set()
    assert torchrun.wait(5) == -signal.SIGKILL


def test_not_known_keeps_torchrun_stopped_and_asks_again(
    etcd: EtcdServer, client: kvstore.KeyStore, torchrun: subprocess.Popen[bytes]
) -> None:
    c = cfg(etcd)
    reg = Registration(client, c, "10.0.0.5")
    reg.register()
    etcd.stop()  # cut off: neither etcd nor (here) the API answers
    fence = Fence(c, client.with_timeout(0.5), reg, lambda: torchrun.pid)
    assert fence.suspect("its key has not been refreshed") is False
    assert not fence.fenced.is_set() and fence.holding
    wait_until("torchrun stopped", lambda: state(torchrun.pid) == "T", 5, 0.05)
    os.killpg(torchrun.pid, signal.SIGCONT)


def test_the_member_keys_word_fences_at_once(
    etcd: EtcdServer, client: kvstore.KeyStore, torchrun: subprocess.Popen[bytes]
) -> None:
    c = cfg(etcd)
    reg = Registration(client, c, "10.0.0.5")
    fence = Fence(c, client, reg, lambda: torchrun.pid)
    reg.on_replaced = fence.replaced
    reg.register()
    Registration(client, cfg(etcd, "uid-new"), "10.0.0.9").register()
    reg.refresh()
    assert fence.fenced.is_set()
    assert torchrun.wait(5) == -signal.SIGKILL


class Listener:
    """The node-loss policy as loss detection tells it, answering `own_key_stale` as a
    fence that cannot tell yet whether this pod was replaced would."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def held(self) -> bool:
        return False

    def own_key_stale(self, why: str) -> bool:
        self.asked.append(why)
        return self.answer


def test_loss_detection_asks_before_any_request_when_its_key_went_stale(
    etcd: EtcdServer, client: kvstore.KeyStore, tmp_path: Path
) -> None:
    # The process was frozen for longer than the TTL: it must not write to etcd (or let
    # torchrun act) before it knows it is still the pod.
    fence = Listener(answer=False)
    detector = lossdetect.LossDetector(
        client,
        cfg(etcd),
        tmp_path / "attempts",
        listener=fence,  # type: ignore[arg-type]
    )
    detector._written = "round-1"
    detector._last_ok = time.monotonic() - 60
    etcd.stop()  # any request would fail loudly in the log; none is made
    detector.refresh_once()
    assert len(fence.asked) == 1 and "not been refreshed for 60 s" in fence.asked[0]
    assert detector.stale() is not None  # replaced or not known: it stays so
