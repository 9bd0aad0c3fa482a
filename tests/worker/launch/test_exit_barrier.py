"""What elastic-worker says while its torchrun waits in torch's exit barrier (the other
nodes' training processes still running), and the bound of a warm process's teardown."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from elastic_worker.launch import torchrun
from elastic_worker.launch.supervisor import ExitBarrier, teardown_bound
from elastic_worker.settings import config


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def said() -> Iterator[list[str]]:
    """launch's lines at INFO, whatever an earlier test set the package's loggers to."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("elastic_worker.launch.supervisor")
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def test_the_exit_barrier_says_whom_it_waits_for_once_it_has_waited_then_what_changes(
    tmp_path: Path,
) -> None:
    """torchrun reported its workers' success (torchrun.py); after 2 s still in the barrier
    the node says whom it waits for, again when that changes, and how it left."""
    report, clock = tmp_path / "report", Clock()
    whom, heard = [["run42-w-1", "run42-w-2"]], []
    barrier = ExitBarrier(report, 60, lambda: whom[0], heard.append, clock=clock)
    with said() as lines:
        barrier.poll()  # nothing reported yet
        report.write_text(f"{torchrun.SUCCEEDED} 1700000000.0\n")
        barrier.poll()
        clock.t = 1.9
        barrier.poll()
        assert lines == []  # nodes that finish together pass within a second: silence
        clock.t = 2.0
        barrier.poll()
        whom[0] = ["run42-w-2"]
        clock.t = 3.0
        barrier.poll()  # asked every 2 s
        clock.t = 4.0
        barrier.poll()
        clock.t = 6.0
        barrier.poll()  # unchanged: nothing more
        clock.t = 60.5
        barrier.ended()
    assert lines == [
        "exit barrier: this node's training processes exited 0; waiting up to 60 s for: "
        "run42-w-1, run42-w-2",
        "exit barrier: still waiting for: run42-w-2",
        "exit barrier: left after 60.5 s, its timeout; had not finished: run42-w-2",
    ]
    assert heard == [["run42-w-1", "run42-w-2"], ["run42-w-2"]]


def test_the_exit_barrier_is_silent_when_every_node_finishes_together(tmp_path: Path) -> None:
    """Left within 2 s, or every other node's processes already ended (torch's barrier is
    completing through its store): nothing to say."""
    report, clock = tmp_path / "report", Clock()
    report.write_text(f"{torchrun.SUCCEEDED} 1700000000.0\n")
    for whom in (["run42-w-1"], []):
        barrier = ExitBarrier(report, 60, lambda whom=whom: whom, clock=clock)
        clock.t = 0.0
        with said() as lines:
            barrier.poll()
            clock.t = 0.4 if whom else 4.0
            barrier.poll()
            barrier.ended()
        assert lines == [], whom


def test_the_exit_barrier_says_when_it_cannot_tell_whom_it_waits_for(tmp_path: Path) -> None:
    """Without round liveness (lossDetection off) nobody names the nodes; a failed read
    is the same."""
    report, clock = tmp_path / "report", Clock()
    report.write_text(f"{torchrun.SUCCEEDED} 1700000000.0\n")

    def broken() -> list[str] | None:
        raise OSError("etcd away")

    for unfinished in (None, broken):
        barrier = ExitBarrier(report, 30, unfinished, clock=clock)
        clock.t = 0.0
        barrier.poll()
        clock.t = 2.0
        with said() as lines:
            barrier.poll()
            clock.t = 5.0
            barrier.ended()
        assert lines == [
            "exit barrier: this node's training processes exited 0; waiting up to 30 s for: "
            "the other nodes (which: unknown without rendezvous.lossDetection)",
            "exit barrier: left after 5.0 s; every node had finished",
        ]
    with said() as lines:
        barrier.ended(-15)  # stopped in it: SIGTERM, the job completed elsewhere
    assert lines == ["exit barrier: left after 5.0 s: torchrun stopped"]


def test_a_warm_teardown_is_bounded_by_half_the_exit_barrier_timeout() -> None:
    """So that a node whose process hangs in its teardown still reaches the barrier before
    the others' timeout passes."""
    env = {"ELASTIC_JOB_ID": "j", "ELASTIC_RDZV_ENDPOINT": "etcd:2379"}
    env |= {"ELASTIC_MIN_NODES": "1", "ELASTIC_MAX_NODES": "1", "ELASTIC_INJECT_ENV": "/none"}
    assert teardown_bound(config.load(["x"], env).exit_barrier_timeout) == 30
    assert teardown_bound(10) == 5
