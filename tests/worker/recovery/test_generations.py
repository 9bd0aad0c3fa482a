"""Rendezvous epochs: a rendezvous torch closed before the job completed is replaced by a
new one (`<job>-r<N>`), agreed on through a compare-and-swap under the project's prefix."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from elastic_worker import completion, exits, torchruns
from elastic_worker.completion import Completion
from elastic_worker.gate.ready import Ready
from elastic_worker.keystore import etcdv2
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch import argv as launch
from elastic_worker.launch.supervisor import Supervisor
from elastic_worker.recovery import generations, rendezvous
from elastic_worker.recovery.policy import NodeLoss
from elastic_worker.settings import config
from testlib import EtcdServer

from worker.worker_helpers import BACKENDS, TRAIN, Agent, backend_etcd, worker_env


def _config(etcd: EtcdServer, job: str) -> config.Config:
    backend = "etcd-v2" if etcd.v2 else "etcd-v3"
    env = worker_env(etcd.endpoint, job, POD_NAME="w0", ELASTIC_RDZV_BACKEND=backend)
    return config.load(["python", "train.py"], env)


@pytest.mark.parametrize("backend", BACKENDS)
def test_epoch_starts_at_the_job_id_and_advances_once_per_closed_rendezvous(
    etcd_factory: Callable[..., EtcdServer], backend: str
) -> None:
    """Two pods that both saw epoch N closed agree on N + 1, not N + 2 (on either API)."""
    cfg = _config(backend_etcd(etcd_factory, backend), "cas")
    client = kvstore.connect(cfg)
    assert generations.current(client, cfg) == 0
    assert generations.run_id(cfg, 0) == "cas"
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(generations.advance(client, cfg, 0)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == [1, 1, 1, 1]
    assert generations.advance(client, cfg, 1) == 2
    assert generations.advance(client, cfg, 1) == 2  # a late pod with a stale view catches up
    assert generations.current(client, cfg) == 2
    assert generations.run_id(cfg, 2) == "cas-r2"


@pytest.mark.parametrize("backend", BACKENDS)
def test_rendezvous_closed_is_torchs_own_answer(
    etcd_factory: Callable[..., EtcdServer], backend: str
) -> None:
    """Pins torch's public handler API (is_closed/set_closed on the backend's handler, the
    one ELASTIC_RDZV_BACKEND names): if a torch upgrade changes it, this fails instead of
    the job looping or giving up."""
    cfg = _config(backend_etcd(etcd_factory, backend), "closed")
    assert rendezvous.handler(cfg, "closed").get_backend() == backend
    assert generations.rendezvous_closed(cfg, "closed") is False
    _close_rendezvous(cfg, "closed")
    assert generations.rendezvous_closed(cfg, "closed") is True
    assert generations.rendezvous_closed(cfg, "closed-r1") is False


def _close_rendezvous(cfg: config.Config, rdzv_id: str) -> None:
    """Close a rendezvous as torch's launch_agent does when an agent fails."""
    rendezvous.handler(cfg, rdzv_id).set_closed()


@pytest.mark.parametrize("complete", [True, False], ids=["complete", "not-complete"])
def test_sigterm_after_completion_exits_0(etcd: EtcdServer, complete: bool) -> None:
    """A pod stopped by the scale-down that follows completion exits 0; a pod stopped
    while the job still runs (spot reclaim) keeps torchrun's code."""
    cfg = _config(etcd, f"term-{complete}")
    client = etcdv2.Client(etcd.url)
    if complete:
        completion.mark_complete(client, cfg)
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor(argv, {}, cfg, Completion(client, cfg), completion_poll=60)
    timer = threading.Timer(1.0, supervisor.forward, args=(15,))
    timer.start()
    try:
        code = supervisor.run()
    finally:
        timer.cancel()
    assert code == (0 if complete else 128 + 15)


@pytest.mark.slow
def test_a_rendezvous_closed_by_a_failed_agent_does_not_end_the_job(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """torch closed the job's rendezvous (as after an etcd outage): the agents move to
    `<job>-r1` together, train to the end and exit 0."""
    job = "reopen"
    cfg = _config(etcd, job)
    _close_rendezvous(cfg, job)
    args = ["python", str(TRAIN), "--checkpoint-dir", str(tmp_path / "ckpt")]
    args += ["--steps", "6", "--checkpoint-every", "3", "--step-seconds", "0.1"]
    agents = [
        Agent.start(
            f"w{i}",
            args,
            worker_env(etcd.endpoint, job, POD_NAME=f"w{i}", ELASTIC_MAX_NODES="2"),
            tmp_path / f"w{i}.log",
        )
        for i in range(2)
    ]
    try:
        codes = [agent.wait(240) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert codes == [0, 0], [a.text()[-3000:] for a in agents]
    for agent in agents:
        assert f"joining rendezvous {job}-r1" in agent.text()
        assert agent.train_lines()[-1] == "[train] done step=6"
    assert etcdv2.Client(etcd.url).get_value(f"/elastic-job/{job}/generation") == "1"


def test_a_sigterm_just_before_torchrun_starts_starts_no_torchrun(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands after the loop's stop check but before the Supervisor is there to
    pass it on (seen in the e2e: a pod recreated at the job's end ran on unsignalled until
    its grace period ended in SIGKILL). It must end the pod, not start torchrun."""
    cfg = _config(etcd, "late-term")
    relay = torchruns.Relay(threading.Event())
    real_build_argv = launch.build_argv

    def signal_arrives(*args: object, **kwargs: object) -> list[str]:
        relay(signal.SIGTERM, None)  # the handler, run between the check and the Supervisor
        return real_build_argv(*args, **kwargs)  # type: ignore[arg-type]

    def must_not_run(self: Supervisor) -> int:
        raise AssertionError("torchrun started after the pod was told to stop")

    monkeypatch.setattr(launch, "build_argv", signal_arrives)
    monkeypatch.setattr(Supervisor, "run", must_not_run)
    ready = Ready(None, "127.0.0.1", None)
    done = Completion(kvstore.connect(cfg), cfg)
    node_loss = NodeLoss(cfg, done, torchrun_pid=relay.torchrun_pid)
    code = torchruns.Torchruns(cfg, done, ready, relay, env={}, node_loss=node_loss).run()
    assert code == exits.signalled(signal.SIGTERM)
