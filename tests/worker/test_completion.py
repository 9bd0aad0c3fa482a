"""Completion marker, scale-down, and the supervisor's watch while torchrun runs."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from elastic_worker import completion
from elastic_worker.completion import Completion
from elastic_worker.keystore import etcdv2
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch.supervisor import Supervisor
from elastic_worker.settings import config
from testlib import EtcdServer, free_port

from localrun.cluster.apiserver import FakeApiServer
from worker.worker_helpers import TRAIN, Agent, wait_until, worker_env

BASE = {
    "ELASTIC_JOB_ID": "run42",
    "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:2379",
    "ELASTIC_MIN_NODES": "1",
    "ELASTIC_MAX_NODES": "1",
    "ELASTIC_INJECT_ENV": "/nonexistent",
    "POD_NAME": "run42-worker-1",
    "POD_NAMESPACE": "default",
    "ELASTIC_GRACE_PERIOD": "5",
}


def make_config(etcd: EtcdServer, job: str, **extra: str) -> config.Config:
    env = {**BASE, "ELASTIC_JOB_ID": job, "ELASTIC_RDZV_ENDPOINT": etcd.endpoint, **extra}
    return config.load(["train.py"], env)


def kube_api(api: FakeApiServer) -> config.KubeApi | None:
    """What config.load makes of the kubelet's variables and the mounted token."""
    env = {**api.env(), "ELASTIC_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir)}
    return config.load(["train.py"], {**BASE, **env}).kube_api


def rendezvous_env(
    api: FakeApiServer, replicas: int, endpoint: str | None = None
) -> dict[str, str]:
    """The worker's variables with scale-down on, its rendezvous StatefulSet run42-etcd
    registered in `api` at `replicas`, and its etcd at `endpoint` (BASE's unless given)."""
    api.add_statefulset("default", "run42-etcd", replicas=replicas)
    return {
        **BASE,
        "ELASTIC_RDZV_ENDPOINT": endpoint or BASE["ELASTIC_RDZV_ENDPOINT"],
        "ELASTIC_SCALE_DOWN": "true",
        "ELASTIC_RENDEZVOUS_STATEFULSET": "run42-etcd",
        "ELASTIC_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir),
        **api.env(),
    }


def test_mark_complete_sets_the_marker_once(etcd: EtcdServer) -> None:
    cfg = make_config(etcd, "done-once")
    client = etcdv2.Client(etcd.url)
    assert not completion.is_complete(client, cfg)
    completion.mark_complete(client, cfg)
    first = client.get_value("/elastic-job/done-once/complete")
    assert first is not None
    assert json.loads(first)["pod"] == "run42-worker-1"
    other = make_config(etcd, "done-once", POD_NAME="run42-worker-2")
    completion.mark_complete(client, other)
    assert client.get_value("/elastic-job/done-once/complete") == first
    assert completion.is_complete(client, cfg)


def test_no_service_account_means_no_api() -> None:
    env = {**BASE, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "ELASTIC_SERVICEACCOUNT_DIR": "/none"}
    assert config.load(["train.py"], env).kube_api is None


def sleeper(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


def test_a_waiting_node_exits_0_soon_after_the_job_completes(etcd: EtcdServer) -> None:
    """What a spare does: its torchrun waits; the marker appears; it is stopped, exit 0."""
    cfg = make_config(etcd, "spare")
    client = etcdv2.Client(etcd.url)
    sup = Supervisor(
        sleeper(120), {}, cfg, Completion(client, cfg), completion_poll=0.2, completion_grace=1.0
    )
    threading.Timer(1.0, completion.mark_complete, (client, make_config(etcd, "spare"))).start()
    start = time.monotonic()
    assert sup.run() == 0
    assert time.monotonic() - start < 15
    assert sup.proc is not None and sup.proc.returncode is not None


def test_a_failed_torchrun_exits_0_when_the_job_completed_meanwhile(etcd: EtcdServer) -> None:
    cfg = make_config(etcd, "late-failure")
    client = etcdv2.Client(etcd.url)
    sup = Supervisor(
        [sys.executable, "-c", "raise SystemExit(3)"], {}, cfg, Completion(client, cfg, 10)
    )
    threading.Timer(1.0, completion.mark_complete, (client, cfg)).start()
    assert sup.run() == 0


def test_a_failed_torchrun_keeps_its_code_when_the_job_is_not_complete(etcd: EtcdServer) -> None:
    cfg = make_config(etcd, "failure")
    client = etcdv2.Client(etcd.url)
    sup = Supervisor(
        [sys.executable, "-c", "raise SystemExit(3)"], {}, cfg, Completion(client, cfg, 1)
    )
    assert sup.run() == 3
    assert not completion.is_complete(client, cfg)


def test_success_marks_complete_and_scales_down(etcd: EtcdServer, tmp_path: Path) -> None:
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker", replicas=2)
        cfg = make_config(
            etcd,
            "success",
            ELASTIC_SCALE_DOWN="true",
            ELASTIC_STATEFULSETS_FILE=str(listing(tmp_path, "run42-worker")),
            ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir),
            **api.env(),
        )
        client = etcdv2.Client(etcd.url)
        sup = Supervisor([sys.executable, "-c", "pass"], {}, cfg, Completion(client, cfg))
        assert sup.run() == 0
        assert completion.is_complete(client, cfg)
        assert api.statefulsets[("default", "run42-worker")]["spec"]["replicas"] == 0


def listing(tmp_path: Path, *names: str) -> Path:
    """The release's StatefulSets as the chart's ConfigMap mounts them."""
    path = tmp_path / "statefulsets"
    path.write_text("".join(f"{n}\n" for n in names))
    return path


def test_success_scales_what_the_statefulsets_file_says_at_the_end(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """A group added by an upgrade after this pod started (the kubelet rewrote the mounted
    ConfigMap) is scaled to 0 too."""
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker", replicas=2)
        api.add_statefulset("default", "run42-worker-added", replicas=2)
        cfg = make_config(
            etcd,
            "success-added",
            ELASTIC_SCALE_DOWN="true",
            ELASTIC_STATEFULSETS_FILE=str(listing(tmp_path, "run42-worker")),
            ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir),
            **api.env(),
        )
        listing(tmp_path, "run42-worker", "run42-worker-added")
        client = etcdv2.Client(etcd.url)
        sup = Supervisor([sys.executable, "-c", "pass"], {}, cfg, Completion(client, cfg))
        assert sup.run() == 0
        for name in ("run42-worker", "run42-worker-added"):
            assert api.statefulsets[("default", name)]["spec"]["replicas"] == 0, name


def test_success_scales_the_workers_then_the_rendezvous(etcd: EtcdServer, tmp_path: Path) -> None:
    """The bundled etcd goes to 0 last, so its PodDisruptionBudget no longer pins a node."""
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker", replicas=2)
        api.add_statefulset("default", "run42-etcd", replicas=1)
        cfg = make_config(
            etcd,
            "success-rdzv",
            ELASTIC_SCALE_DOWN="true",
            ELASTIC_STATEFULSETS_FILE=str(listing(tmp_path, "run42-worker")),
            ELASTIC_RENDEZVOUS_STATEFULSET="run42-etcd",
            ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir),
            **api.env(),
        )
        client = etcdv2.Client(etcd.url)
        sup = Supervisor([sys.executable, "-c", "pass"], {}, cfg, Completion(client, cfg))
        assert sup.run() == 0
        patched = [r.path.rsplit("/", 2)[-2] for r in api.requests if r.method == "PATCH"]
        assert patched == ["run42-worker", "run42-etcd"]
        assert api.statefulsets[("default", "run42-etcd")]["spec"]["replicas"] == 0
        assert completion.rendezvous_scaled_to_zero(cfg)


def test_the_rendezvous_counts_as_done_only_at_zero_replicas(tmp_path: Path) -> None:
    with FakeApiServer(workdir=tmp_path / "api") as api:
        env = rendezvous_env(api, 1)
        cfg = config.load(["train.py"], env)
        assert completion.rendezvous_scaled_to_zero(cfg) is False
        api.set_fault(r"/scale$", 403)  # no access: unknown, so not done
        assert completion.rendezvous_scaled_to_zero(cfg) is None
        off = config.load(["train.py"], {**env, "ELASTIC_SCALE_DOWN": "false"})
        assert completion.rendezvous_scaled_to_zero(off) is None


def test_a_stopped_pod_keeps_asking_while_neither_etcd_nor_the_api_can_say(
    tmp_path: Path,
) -> None:
    """The end of a job: etcd is gone and the API fails for a moment. A pod told to stop
    asks again within its window and exits 0 once the API answers, not 143 at the first
    failure; with no answer at all it says why and reports 'not complete'."""
    with FakeApiServer(workdir=tmp_path / "api") as api:
        env = rendezvous_env(api, 0, f"127.0.0.1:{free_port()}")  # etcd already gone
        cfg = config.load(["train.py"], env)
        client = kvstore.connect(cfg)
        api.set_fault(r"/scale$", 503, times=3)
        started = time.monotonic()
        assert completion.complete_now(client, cfg, within=10)
        assert time.monotonic() - started < 8
        assert [r.status for r in api.requests if r.path.endswith("/scale")] == [503] * 3 + [200]
        api.set_fault(r"/scale$", 503)
        assert not completion.complete_now(client, cfg, within=1)


def test_success_after_another_pod_scaled_etcd_away_exits_0_at_once(tmp_path: Path) -> None:
    """Every node finishes at once: the first sets the marker and scales etcd to 0; the
    others, unable to reach etcd, read that scale and leave at once (not after 30 s)."""
    with FakeApiServer(workdir=tmp_path / "api") as api:
        env = rendezvous_env(api, 0, "127.0.0.1:9")  # nothing listens: etcd is gone
        cfg = config.load(["train.py"], env)
        client = etcdv2.Client(cfg.rdzv_url)
        sup = Supervisor([sys.executable, "-c", "pass"], {}, cfg, Completion(client, cfg))
        start = time.monotonic()
        assert sup.run() == 0
        assert time.monotonic() - start < 10


@pytest.mark.parametrize("complete", [True, False], ids=["complete", "not-complete"])
def test_a_pod_stopped_in_the_gate_exits_0_only_when_the_job_is_complete(
    etcd: EtcdServer, tmp_path: Path, complete: bool
) -> None:
    # The first pod to finish scales the job to 0: a pod still waiting in the peer gate
    # (two peers asked, one here) gets SIGTERM then, and must leave as a spare does.
    job = f"gate-stop-{complete}"
    env = worker_env(etcd.endpoint, job, ELASTIC_GATE_PEERS="true", ELASTIC_MIN_NODES="2")
    agent = Agent.start("a", [str(TRAIN), "--steps", "1"], env, tmp_path / "a.log")
    try:
        wait_until("the peer gate", lambda: "peers" in agent.text(), 30)
        if complete:
            etcdv2.Client(etcd.url).set(f"/elastic-job/{job}/complete", "{}")
        agent.proc.send_signal(signal.SIGTERM)
        code = agent.wait(30)
    finally:
        agent.kill()
    if complete:
        assert code == 0, agent.text()
        assert f"job {job} is complete, so exit 0 (not 143)" in agent.text()
    else:
        assert code == 143, agent.text()
