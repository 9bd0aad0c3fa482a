"""Completion marker, scale-down, and the supervisor's watch while torchrun runs."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path

import pytest
from elastic_worker import completion, config, etcdv2, launch
from testlib import EtcdServer

from localrun.cluster.apiserver import FakeApiServer


def make_config(etcd: EtcdServer, job: str, **extra: str) -> config.Config:
    env = {
        "ELASTIC_JOB_ID": job,
        "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": "run42-worker-1",
        "POD_NAMESPACE": "default",
        "ELASTIC_GRACE_PERIOD": "5",
        **extra,
    }
    return config.load(["train.py"], env)


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


def test_scale_to_zero_patches_each_statefulset(tmp_path: Path) -> None:
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker-a", replicas=3)
        api.add_statefulset("default", "run42-worker-b", replicas=2)
        kube = completion.KubeApi.in_cluster(
            {**api.env(), "ELASTIC_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir)}
        )
        assert kube is not None
        assert completion.scale_to_zero(kube, "default", ("run42-worker-a", "run42-worker-b")) == 2
        for name in ("run42-worker-a", "run42-worker-b"):
            assert api.statefulsets[("default", name)]["spec"]["replicas"] == 0
        assert {r.method for r in api.requests} == {"PATCH"}


def test_a_403_is_a_warning_not_a_failure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="elastic_worker")
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker-a", replicas=3)
        api.set_fault(r"/scale$", 403)
        kube = completion.KubeApi.in_cluster(
            {**api.env(), "ELASTIC_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir)}
        )
        assert kube is not None
        assert completion.scale_to_zero(kube, "default", ("run42-worker-a",)) == 0
        assert api.statefulsets[("default", "run42-worker-a")]["spec"]["replicas"] == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "not allowed to scale statefulset default/run42-worker-a (403)" in w for w in warnings
    )


def test_no_service_account_means_no_api() -> None:
    assert completion.KubeApi.in_cluster({"ELASTIC_SERVICEACCOUNT_DIR": "/nonexistent"}) is None


def sleeper(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


def test_a_waiting_node_exits_0_soon_after_the_job_completes(etcd: EtcdServer) -> None:
    """What a spare does: its torchrun waits; the marker appears; it is stopped, exit 0."""
    cfg = make_config(etcd, "spare")
    client = etcdv2.Client(etcd.url)
    sup = launch.Supervisor(
        sleeper(120), {}, cfg, client, completion_poll=0.2, completion_grace=1.0
    )
    threading.Timer(1.0, completion.mark_complete, (client, make_config(etcd, "spare"))).start()
    start = time.monotonic()
    assert sup.run() == 0
    assert time.monotonic() - start < 15
    assert sup.proc is not None and sup.proc.returncode is not None


def test_a_failed_torchrun_exits_0_when_the_job_completed_meanwhile(etcd: EtcdServer) -> None:
    cfg = make_config(etcd, "late-failure")
    client = etcdv2.Client(etcd.url)
    sup = launch.Supervisor(
        [sys.executable, "-c", "raise SystemExit(3)"], {}, cfg, client, completion_wait=10
    )
    threading.Timer(1.0, completion.mark_complete, (client, cfg)).start()
    assert sup.run() == 0


def test_a_failed_torchrun_keeps_its_code_when_the_job_is_not_complete(etcd: EtcdServer) -> None:
    cfg = make_config(etcd, "failure")
    client = etcdv2.Client(etcd.url)
    sup = launch.Supervisor(
        [sys.executable, "-c", "raise SystemExit(3)"], {}, cfg, client, completion_wait=1
    )
    assert sup.run() == 3
    assert not completion.is_complete(client, cfg)


def test_success_marks_complete_and_scales_down(
    etcd: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "run42-worker", replicas=2)
        for key, value in api.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("ELASTIC_SERVICEACCOUNT_DIR", str(api.serviceaccount_dir))
        cfg = make_config(
            etcd, "success", ELASTIC_SCALE_DOWN="true", ELASTIC_STATEFULSETS="run42-worker"
        )
        client = etcdv2.Client(etcd.url)
        sup = launch.Supervisor([sys.executable, "-c", "pass"], {}, cfg, client)
        assert sup.run() == 0
        assert completion.is_complete(client, cfg)
        assert api.statefulsets[("default", "run42-worker")]["spec"]["replicas"] == 0
