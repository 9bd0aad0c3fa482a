"""The reclaim of a dead node's pod (recovery/reclaim.py) against the fake API server (real
HTTPS, the pods as kube-apiserver serves them): one survivor acts for each lost peer, it
deletes the peer's pod with grace 0 only after its node has been NotReady for
ELASTIC_RECLAIM_AFTER s on end, with preconditions on the pod's UID and resourceVersion,
and never while the node reports Ready, nor a pod made again."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elastic_worker.observe.events import Recorder
from elastic_worker.recovery import reclaim
from elastic_worker.recovery.reclaim import Lost, Reclaimer, elect, node_not_ready
from elastic_worker.settings import config
from elastic_worker.settings.config import KubeApi

from localrun.cluster.apiserver import FakeApiServer

NS = "ml"
NODE = "gpu-7"


def pod(name: str, uid: str, *, ready: bool, containers_ready: bool = True) -> dict[str, Any]:
    def cond(kind: str, ok: bool) -> dict[str, str]:
        return {"type": kind, "status": "True" if ok else "False"}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": {}},
        "spec": {"nodeName": NODE, "containers": [{"name": "worker", "image": "w"}]},
        "status": {
            "phase": "Running",
            "conditions": [cond("ContainersReady", containers_ready), cond("Ready", ready)],
        },
    }


def node(ready: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer({NODE: node("True")}, workdir=tmp_path / "api", namespace=NS) as server:
        server.deleted = []  # type: ignore[attr-defined]
        server.on_delete = lambda ns, name, grace, uid: server.deleted.append((name, grace, uid))  # type: ignore[attr-defined]
        yield server


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reclaimer(api: FakeApiServer, clock: Clock, after: float = 30) -> Reclaimer:
    env = {
        "ELASTIC_JOB_ID": "j",
        "ELASTIC_RDZV_ENDPOINT": "etcd:2379",
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "3",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": "w-2",
        "POD_NAMESPACE": NS,
        "ELASTIC_RECLAIM": "true",
        "ELASTIC_RECLAIM_AFTER": str(after),
    }
    cfg = config.load(["train.py"], env)
    access = KubeApi(api.url, api.token, str(api.ca_path))
    return Reclaimer(cfg, access, clock=clock)


def test_one_survivor_acts_for_each_lost_peer_the_next_in_name_order() -> None:
    assert elect("w-1", ["w-0", "w-2", "w-3"]) == "w-2"
    assert elect("w-3", ["w-0", "w-1", "w-2"]) == "w-0"  # wrapping
    assert elect("w-1", ["w-1"]) is None


def test_only_the_node_lifecycle_controllers_mark_says_the_node_is_not_ready() -> None:
    assert node_not_ready(pod("w", "u", ready=False, containers_ready=True))
    # a container that is down (restarting) is the kubelet's report, not a lost node
    assert not node_not_ready(pod("w", "u", ready=False, containers_ready=False))
    assert not node_not_ready(pod("w", "u", ready=True))


def test_a_peer_on_a_notready_node_is_force_deleted_after_the_bound_with_preconditions(
    api: FakeApiServer,
) -> None:
    clock = Clock()
    r = reclaimer(api, clock, after=30)
    r.lost("w-1", ["w-0", "w-2"])  # w-2 is the one after w-1
    assert "w-1" in r.watching
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=True)])
    r.check_all()
    assert "w-1" in r.watching and api.deleted == []  # type: ignore[attr-defined]
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=False)])
    api.set_node(node("Unknown"))
    r.check_all()  # first seen NotReady now
    clock.now += 29
    r.check_all()
    assert api.deleted == []  # type: ignore[attr-defined]
    clock.now += 1
    r.check_all()
    assert api.deleted == [("w-1", 0, "uid-1")]  # type: ignore[attr-defined]
    assert "w-1" not in r.watching
    delete = [q for q in api.requests if q.method == "DELETE"][-1]
    assert delete.body["gracePeriodSeconds"] == 0
    assert delete.body["preconditions"]["uid"] == "uid-1"
    assert delete.body["preconditions"]["resourceVersion"]


def test_another_survivor_does_not_act() -> None:
    r = Reclaimer.__new__(Reclaimer)
    r.config = config.load(
        ["t"],
        {
            "ELASTIC_JOB_ID": "j",
            "ELASTIC_RDZV_ENDPOINT": "etcd:2379",
            "ELASTIC_MIN_NODES": "1",
            "ELASTIC_MAX_NODES": "3",
            "ELASTIC_INJECT_ENV": "/nonexistent",
            "POD_NAME": "w-0",
        },
    )
    r.watching = {}
    r.clock = Clock()
    import threading  # noqa: PLC0415

    r._lock = threading.Lock()
    r.lost("w-1", ["w-0", "w-2"])
    assert r.watching == {}


def test_nothing_is_deleted_while_the_node_reports_ready(api: FakeApiServer) -> None:
    # The pod still carries the mark, but the Node is Ready again (its kubelet is back and
    # has not posted the pod's status yet): the wait starts over.
    clock = Clock()
    r = reclaimer(api, clock, after=10)
    r.lost("w-1", None)
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=False)])
    api.set_node(node("Unknown"))
    r.check_all()
    clock.now += 8
    api.set_node(node("True"))
    r.check_all()
    clock.now += 8
    api.set_node(node("Unknown"))
    r.check_all()
    assert api.deleted == []  # type: ignore[attr-defined]
    clock.now += 10
    r.check_all()
    assert api.deleted == [("w-1", 0, "uid-1")]  # type: ignore[attr-defined]


def test_a_pod_made_again_is_left_alone(api: FakeApiServer) -> None:
    clock = Clock()
    r = reclaimer(api, clock, after=5)
    r.lost("w-1", None, uid="uid-1")
    api.publish_pods(NS, [pod("w-1", "uid-2", ready=False)])  # the new incarnation
    api.set_node(node("Unknown"))
    r.check_all()
    assert api.deleted == [] and r.watching == {}  # type: ignore[attr-defined]


def test_a_pod_that_changed_since_it_was_read_is_not_deleted(api: FakeApiServer) -> None:
    # The DELETE carries the resourceVersion read: a kubelet that reported in between
    # makes the API server answer 409, and the reclaim reads again.
    clock = Clock()
    r = reclaimer(api, clock, after=0.001)
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=False)])
    api.set_node(node("Unknown"))
    lost = Lost("uid-1", clock.now, not_ready_since=clock.now - 1)
    stale = copy.deepcopy(api.store.get("pods", NS, "w-1"))
    stale["metadata"]["resourceVersion"] = "1"
    assert not r._delete("w-1", stale, "uid-1", "1")
    assert api.deleted == []  # type: ignore[attr-defined]
    assert r.check("w-1", lost)
    assert api.deleted == [("w-1", 0, "uid-1")]  # type: ignore[attr-defined]


def test_a_peer_back_in_a_round_is_no_longer_watched(api: FakeApiServer) -> None:
    clock = Clock()
    r = reclaimer(api, clock)
    r.lost("w-1", None)
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=False, containers_ready=False)])
    r.check_all()
    assert "w-1" in r.watching  # restarting: watched
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=True)])
    r.check_all()
    assert "w-1" in r.watching  # Ready is what its kubelet said last: no proof
    r.alive({"w-0", "w-1"})  # loss detection: it renews its key in a round again
    assert r.watching == {}
    r.lost("w-3", None)
    clock.now += 901
    api.publish_pods(NS, [pod("w-3", "uid-3", ready=True)])
    r.check_all()
    assert r.watching == {}  # given up after WATCH_FOR


def test_a_pod_the_policy_holds_back_deletes_nothing(api: FakeApiServer) -> None:
    """may_act() False (recovery/policy.py: this pod held by its fence, or the job done)."""
    clock = Clock()
    r = reclaimer(api, clock, after=1)
    r.may_act = lambda: False
    r.lost("w-1", None)
    api.publish_pods(NS, [pod("w-1", "uid-1", ready=False)])
    api.set_node(node("Unknown"))
    for _ in range(3):
        r.check_all()
        clock.now += 5
    assert api.deleted == []  # type: ignore[attr-defined]


def test_loss_detections_lapsed_members_go_to_the_elected_survivor_only(
    api: FakeApiServer,
) -> None:
    r = reclaimer(api, Clock())  # this pod is w-2
    r.lapsed(["w-1", "w-3"], {"w-0", "w-2"})
    assert set(r.watching) == {"w-1"}  # w-3's elected survivor is w-0 (wrapping)


def test_reclaim_starts_only_when_on_and_this_pod_can_ask_the_api_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = {
        "ELASTIC_JOB_ID": "j",
        "ELASTIC_RDZV_ENDPOINT": "etcd:2379",
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "3",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "ELASTIC_SERVICEACCOUNT_DIR": "/nonexistent",
        "POD_NAME": "w-2",
        "POD_NAMESPACE": NS,
    }
    off = config.load(["t"], base)
    assert reclaim.start(off, lambda: True, Recorder.disabled()) is None
    no_token = config.load(["t"], {**base, "ELASTIC_RECLAIM": "true"})
    assert reclaim.start(no_token, lambda: True, Recorder.disabled()) is None
    assert "ELASTIC_RECLAIM is true but this pod has no API access" in caplog.text
