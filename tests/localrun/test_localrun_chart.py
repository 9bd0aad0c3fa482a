"""What the local run knows of the elastic-job chart: roles, the completion marker, and the
lines the pods print (the worker's attempt lines, the reference script's `[train]` lines)."""

from __future__ import annotations

import logging
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from elastic_worker import completion
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch import torchrun
from elastic_worker.launch.supervisor import ExitBarrier as WorkerExitBarrier
from elastic_worker.settings import config
from elastic_worker.warm import server as warm
from testlib import EtcdServer

from localrun import chart
from localrun.lines import (
    Attempt,
    ExitBarrier,
    TeardownStopped,
    TrainEvent,
    WorkerMessage,
    parse_attempt_line,
    parse_line,
)
from localrun.lines import parse_train_line as parse_train


def _labels(component: str, group: str | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/component": component}
    if group:
        labels["elastic-job.pytorch.org/group"] = group
    return labels


def test_statefulsets_are_told_apart_by_the_chart_labels() -> None:
    w = _labels("worker", "default")
    assert chart.is_worker(w) and not chart.is_rendezvous(w)
    assert chart.group("x-worker", w) == "default"
    e = _labels("rendezvous")
    assert chart.is_rendezvous(e) and not chart.is_worker(e)
    assert chart.is_worker({"elastic-job.pytorch.org/group": "gpu"})  # a group label is enough


def test_scale_target_is_a_statefulset_a_worker_group_or_a_unique_suffix() -> None:
    sets = [
        ("demo-elastic-job-default", _labels("worker", "default")),
        ("demo-elastic-job-big", _labels("worker", "big")),
        ("demo-etcd-rendezvous", _labels("rendezvous")),
    ]
    assert chart.find_statefulset(sets, "demo-etcd-rendezvous") == "demo-etcd-rendezvous"
    assert chart.find_statefulset(sets, "big") == "demo-elastic-job-big"
    assert chart.find_statefulset(sets, "job-default") == "demo-elastic-job-default"
    assert chart.find_statefulset(sets, "nothing") is None


def test_attempt_lines_of_the_contract_parse() -> None:
    line = (
        "[elastic-worker] attempt run_id=demo-default restart=2 group_rank=0 nodes=3 world_size=6"
    )
    assert parse_attempt_line(line) == Attempt("demo-default", 2, 0, 3, 6)
    assert parse_line("worker", line) == Attempt("demo-default", 2, 0, 3, 6)
    # a member that is not group rank 0 says it too; only its fields differ
    other = "[elastic-worker] attempt run_id=j restart=0 group_rank=1 nodes=2 world_size=2"
    assert parse_attempt_line(other) == Attempt("j", 0, 1, 2, 2)


def test_lines_that_are_not_attempt_lines_are_not_taken_for_one() -> None:
    for line in (
        "[elastic-worker] attempt run_id=j restart=x group_rank=0 nodes=2 world_size=2",
        "[elastic-worker] attempt run_id=j restart=0 group_rank=0 world_size=2",
        "elastic-worker: attempt run_id=j restart=0 group_rank=0 nodes=2 world_size=2",
        "[train] step=1 world_size=2 restart=0 loss=0.5",
    ):
        assert parse_attempt_line(line) is None, line


def test_parses_every_train_line_of_the_contract() -> None:
    assert parse_train("[train] step=7 world_size=3 restart=1 loss=0.25") == TrainEvent(
        "step", 7, 3, 1, 0.25
    )
    assert parse_train("[train] resumed step=10") == TrainEvent("resumed", 10)
    assert parse_train("[train] start step=10 world_size=2 restart=1") == TrainEvent(
        "start", 10, 2, 1
    )
    assert parse_train("[train] checkpoint step=20") == TrainEvent("checkpoint", 20)
    assert parse_train("[train] sigterm step=21") == TrainEvent("sigterm", 21)
    assert parse_train("[train] done step=60") == TrainEvent("done", 60)


def test_other_lines_are_not_events() -> None:
    for line in ("elastic-worker: waiting", "[train] started", "[train] step=x", "train step=1"):
        assert parse_train(line) is None


def test_worker_lines_and_other_containers_warnings_are_shown() -> None:
    assert parse_line("worker", "elastic-worker: waiting for etcd") == WorkerMessage(
        "elastic-worker: waiting for etcd", shown=True
    )
    assert parse_line("init-topology", "WARNING: 403 Forbidden") == WorkerMessage(
        "WARNING: 403 Forbidden", shown=True
    )
    # the training script's errors are kept for the give-up message, not printed
    assert parse_line("worker", "RuntimeError: boom") == WorkerMessage(
        "RuntimeError: boom", shown=False
    )
    assert parse_line("worker", "epoch 3 loss 0.1") is None
    assert parse_line("etcd", "a warning from etcd") is None


def test_a_hang_is_one_line_of_the_view_and_its_stacks_stay_in_the_log() -> None:
    """The culprit's pod says what it found and does; each rank's stack and the other
    pods' word on the culprit are kept, not printed (recovery/hangs.py's detail lines)."""
    stop = (
        "elastic-worker: hang: no rank of round r@a:1 stepped for 31 s: rank 1 hung, outside "
        "any collective while 2 rank(s) wait in one (...): stopping this pod's training process"
    )
    assert parse_line("worker", stop) == WorkerMessage(stop, shown=True)
    for detail in (
        "elastic-worker: stack of rank 1 (pid 7), no step for 31 s: waits in wait (x.py:3)",
        "elastic-worker: hang seen: no rank of round r@a:1 stepped for 31 s: rank 1 of p-1 ...",
    ):
        assert parse_line("worker", detail) == WorkerMessage(detail, shown=False)


def test_client_port_comes_from_the_rendered_container() -> None:
    spec = {"containers": [{"name": "etcd", "ports": [{"name": "client", "containerPort": 2479}]}]}
    assert chart.client_port(spec) == 2479
    assert chart.client_port({"containers": [{"name": "etcd"}]}) == 2379


def test_completion_marker_is_read_where_the_worker_writes_it(etcd: EtcdServer) -> None:
    host, port = etcd.endpoint.rsplit(":", 1)
    url = chart.completion_url(host, int(port), "run42-ns")
    assert chart.read_completion(url) is False
    # the key of docs/contracts.md, as elastic_worker.completion sets it
    put = urllib.request.Request(
        f"{etcd.url}/v2/keys/elastic-job/run42-ns/complete",
        data=urllib.parse.urlencode({"value": '{"pod": "w-0"}'}).encode(),
        method="PUT",
    )
    urllib.request.urlopen(put, timeout=5).close()
    assert chart.read_completion(url) is True
    assert chart.read_completion(chart.completion_url("127.0.0.1", 9, "x"), timeout=1) is None


def test_etcd_v3_completion_marker_is_read_over_the_v3_api(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """A worker with ELASTIC_RDZV_BACKEND=etcd-v3 writes the marker with the v3 API (on an
    etcd without v2 here); the run reads it there, where the worker's own code wrote it."""
    etcd = etcd_factory(v2=False)
    host, port = etcd.endpoint.rsplit(":", 1)
    env = {"ELASTIC_JOB_ID": "run42-ns", "ELASTIC_RDZV_BACKEND": "etcd-v3"}
    assert chart.rdzv_backend(env) == "etcd-v3"
    assert chart.rdzv_backend({}) == "etcd-v2"
    marker = chart.completion_url(host, int(port), "run42-ns", backend=chart.rdzv_backend(env))
    assert chart.read_completion(marker) is False
    cfg = config.load(
        ["train.py"],
        {
            **env,
            "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
            "ELASTIC_MIN_NODES": "1",
            "ELASTIC_MAX_NODES": "1",
            "ELASTIC_INJECT_ENV": "/nonexistent",
            "POD_NAME": "w-0",
        },
    )
    assert completion.mark_complete(kvstore.connect(cfg), cfg)
    assert chart.read_completion(marker) is True
    # The v2 reading of the same etcd finds nothing: the two stores are apart.
    assert chart.read_completion(chart.completion_url(host, int(port), "run42-ns")) is not True


def _worker_lines(emit: Callable[[], None], logger: str) -> list[str]:
    """What the worker's `logger` says during `emit`, as its pod log shows it."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda r: lines.append(f"elastic-worker: {r.getMessage()}")  # type: ignore[method-assign]
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        emit()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return lines


def test_the_workers_exit_barrier_lines_parse_as_it_says_them(tmp_path: Path) -> None:
    """Fed the lines the worker's ExitBarrier (launch/supervisor.py) writes, not copies of
    them: whom a pod waits for in torch's exit barrier, and how it left."""
    report = tmp_path / "report"
    report.write_text(f"{torchrun.SUCCEEDED} 1700000000.0\n")
    clock = [0.0]
    whom = [["demo-w-1", "demo-w-2"]]
    barrier = WorkerExitBarrier(report, 60, lambda: whom[0], clock=lambda: clock[0])

    def wait_then_time_out() -> None:
        barrier.poll()
        clock[0] = 2.0
        barrier.poll()
        whom[0] = ["demo-w-2"]
        clock[0] = 4.0
        barrier.poll()
        clock[0] = 60.5
        barrier.ended()

    waiting, fewer, left = _worker_lines(wait_then_time_out, "elastic_worker.launch.supervisor")
    assert parse_line("worker", waiting) == ExitBarrier(("demo-w-1", "demo-w-2"))
    assert parse_line("worker", fewer) == ExitBarrier(("demo-w-2",))
    assert parse_line("worker", left) == ExitBarrier(("demo-w-2",), 60.5, timed_out=True)

    unknown = WorkerExitBarrier(report, 60, None, clock=lambda: clock[0])

    def unknown_then_all_finished() -> None:
        clock[0] = 0.0
        unknown.poll()
        clock[0] = 2.0
        unknown.poll()
        clock[0] = 3.5
        unknown.ended()

    waiting, left = _worker_lines(unknown_then_all_finished, "elastic_worker.launch.supervisor")
    assert parse_line("worker", waiting) == ExitBarrier(None)
    assert parse_line("worker", left) == ExitBarrier((), 3.5, timed_out=False)
    (stopped,) = _worker_lines(lambda: unknown.ended(-15), "elastic_worker.launch.supervisor")
    assert parse_line("worker", stopped) == ExitBarrier((), 3.5, timed_out=False)


def test_the_warm_servers_teardown_line_parses() -> None:
    line = f"elastic-worker: {warm.teardown_stopped(4242, 'rank 1, local rank 0', 30.2, 0)}"
    assert parse_line("worker", line) == TeardownStopped("rank 1, local rank 0", 30, 0)
    assert not isinstance(parse_line("etcd", line), TeardownStopped)  # only the worker says it
