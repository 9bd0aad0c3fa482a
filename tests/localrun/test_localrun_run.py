"""When a run is over: the end condition, on the in-memory cluster."""

from __future__ import annotations

from pathlib import Path

from localrun_fakes import Harness, statefulset

from localrun import chart
from localrun.run import EXIT_FAILED, EXIT_OK, End, end_of_run

WORKERS = {"app.kubernetes.io/component": "worker", "elastic-job.pytorch.org/group": "default"}


def _running(tmp_path: Path, replicas: int = 2) -> Harness:
    h = Harness(tmp_path, statefulset(replicas=replicas, name="j-default", labels=WORKERS))
    h.tick(0)
    for n in range(replicas):
        h.runtime.running(f"j-default-{n}", "init").rc = 0
    h.tick(1)
    return h


def _end(h: Harness, completed_at: float | None, give_up_after: int = 3) -> End | None:
    sets = [s for s in h.cluster.sets.values() if chart.is_worker(s.labels)]
    pods = [p for p in h.cluster.pods() if chart.is_worker(p.labels)]
    return end_of_run(sets, pods, completed_at, give_up_after, lambda pod: f"last of {pod}")


def test_complete_when_every_worker_exited_0_after_the_marker(tmp_path: Path) -> None:
    h = _running(tmp_path)
    h.runtime.running("j-default-0", "main").rc = 0
    h.tick(10)
    assert _end(h, 10.0) is None  # pod 1 still runs
    h.runtime.running("j-default-1", "main").rc = 0
    h.tick(11)
    assert _end(h, 10.0) == End(EXIT_OK, "training complete; every worker pod exited 0")


def test_an_exit_0_before_the_marker_does_not_count(tmp_path: Path) -> None:
    """A pod that left (SIGTERM, exit 0) before completion is not a completed worker."""
    h = _running(tmp_path)
    for n in range(2):
        h.runtime.running(f"j-default-{n}", "main").rc = 0
    h.tick(5)
    assert _end(h, 6.0) is None


def test_scaled_to_zero_is_complete_only_with_the_marker(tmp_path: Path) -> None:
    """Issue 9: a script that prints nothing of ours, whose job completed and whose
    StatefulSets the worker scaled to 0, is complete; without the marker it is not."""
    h = _running(tmp_path)
    h.cluster.scale("j-default", 0)
    h.tick(20)
    h.tick(21)
    assert h.cluster.pods() == []
    assert _end(h, 19.0) == End(EXIT_OK, "training complete; every worker StatefulSet scaled to 0")
    end = _end(h, None)
    assert end is not None and end.code == EXIT_FAILED
    assert end.message == "every worker StatefulSet was scaled to 0 before training completed"


def test_gives_up_when_every_placed_worker_failed_n_times_in_a_row(tmp_path: Path) -> None:
    h = _running(tmp_path)
    t = 1.0
    for _ in range(3):
        for n in range(2):
            h.runtime.running(f"j-default-{n}", "main").rc = 3
        t += 1
        h.tick(t)
        t += 100  # past any back-off
        h.tick(t)
        assert _end(h, None, give_up_after=4) is None
    end = _end(h, None, give_up_after=3)
    assert end is not None and end.code == EXIT_FAILED
    assert end.message == (
        "every worker pod failed 3 times in a row; last: "
        "j-default-0: last of j-default-0; j-default-1: last of j-default-1"
    )
    assert _end(h, None, give_up_after=0) is None  # 0: never
