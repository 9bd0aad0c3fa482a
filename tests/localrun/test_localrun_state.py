"""The run state fed by the pods' lines, the faults and the completion marker; the view and
the summary read it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from elastic_worker.warm import server as warm

from localrun.lines import TrainEvent
from localrun.state import RunState
from localrun.view import Progress, summary_text


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The view cuts its rows to the terminal's width: these tests read whole rows, on any
    terminal (an xdist worker's is 80 columns)."""
    monkeypatch.setenv("COLUMNS", "200")


ATTEMPT = "[elastic-worker] attempt run_id=j restart={r} group_rank={g} nodes={n} world_size={n}"


def attempt(s: RunState, t: float, nodes: int, restart: int = 0) -> None:
    """One round: every member prints its attempt line, group rank 0 among them."""
    for rank in range(nodes):
        s.line(f"p{rank}", "worker", ATTEMPT.format(r=restart, g=rank, n=nodes), t)


def test_plain_output_when_not_a_terminal() -> None:
    out = io.StringIO()
    p = Progress(out=out)
    assert p.live is False
    p.event("pod started")
    p.draw()
    assert out.getvalue().endswith("pod started\n")
    assert "\x1b[" not in out.getvalue()


def test_live_view_redraws_in_place() -> None:
    out = io.StringIO()
    p = Progress(out=out, live=True)
    attempt(p.state, 0, 3)
    p.draw(force=True)
    p.draw(force=True)
    assert "world size 3" in out.getvalue()
    assert "\x1b[" in out.getvalue()  # cursor moved back over the previous table


def _steps(s: RunState, t0: float, first: int, last: int, world: int, *, restart: int = 0) -> float:
    t = t0
    for n in range(first, last + 1):
        for pod in range(world):
            s.train(f"p{pod}", t, TrainEvent("step", n, world, restart))
        t += 1
    return t


def test_summary_counts_a_fault_reform_and_the_grow_back() -> None:
    s = RunState()
    s.train("p0", 0, TrainEvent("start", 0, 3, 0))
    t = _steps(s, 0, 1, 10, 3)
    s.train("p0", t, TrainEvent("checkpoint", 10))
    t = _steps(s, t, 11, 12, 3)
    s.fault(t, "kill p2")
    s.train("p0", t + 5, TrainEvent("resumed", 10))
    s.train("p1", t + 5, TrainEvent("resumed", 10))
    s.train("p0", t + 5, TrainEvent("start", 10, 2, 1))
    t2 = _steps(s, t + 8, 11, 14, 2, restart=1)
    s.pod_started("p2", t2)
    s.train("p0", t2 + 4, TrainEvent("resumed", 14))
    s.train("p0", t2 + 4, TrainEvent("start", 14, 3, 1))  # a node joined: no restart
    _steps(s, t2 + 6, 15, 20, 3, restart=1)
    s.train("p0", 100, TrainEvent("done", 20))
    s.complete(101, "marker")
    d = s.as_dict()
    assert d["completed"] is True
    assert d["final_step"] == 20
    assert d["world_sizes"] == [3, 2, 3]
    assert d["rendezvous_rounds"] == 3
    assert d["checkpoint_steps"] == [10]
    kill, grow = d["reforms"]
    assert kill["cause"] == "kill p2"
    assert kill["seconds"] == 8
    assert kill["world_size"] == 2
    assert kill["resumed_step"] == 10
    assert kill["steps_lost"] == 2
    assert "p2 joined" in grow["cause"]
    assert grow["world_size"] == 3
    assert grow["seconds"] == 6
    assert d["steps_went_back_past_checkpoint"] is False


def test_summary_flags_a_resume_before_the_last_checkpoint() -> None:
    s = RunState()
    _steps(s, 0, 1, 20, 2)
    s.train("p0", 20, TrainEvent("checkpoint", 20))
    s.train("p0", 30, TrainEvent("resumed", 10))
    assert s.as_dict()["steps_went_back_past_checkpoint"] is True


def test_a_fault_without_a_reform_is_reported_unresolved() -> None:
    s = RunState()
    _steps(s, 0, 1, 3, 2)
    s.fault(5, "partition p1 for 2s")
    _steps(s, 6, 4, 5, 2)
    (r,) = s.as_dict()["reforms"]
    assert r["seconds"] is None
    assert "no training step" in r["note"]


def test_a_grow_after_a_partition_names_the_link_that_came_back() -> None:
    s = RunState()
    t = _steps(s, 0, 1, 5, 3)
    s.fault(t, "partition p1 for 20s")
    s.train("p0", t + 30, TrainEvent("resumed", 5))
    t = _steps(s, t + 31, 6, 8, 2, restart=1)
    s.pod_started("p1", t, "link up")
    s.train("p0", t + 9, TrainEvent("resumed", 8))
    _steps(s, t + 10, 9, 10, 3, restart=2)
    part, grow = s.as_dict()["reforms"]
    assert part["cause"].startswith("partition p1") and part["world_size"] == 2
    assert grow["cause"] == "world size 2 -> 3 (p1 link up)"
    assert grow["seconds"] == 10


def test_rounds_and_world_sizes_come_from_the_attempt_lines() -> None:
    """A script that prints nothing of ours: the worker's attempt lines alone give the
    rounds (one per group rank 0) and their world sizes in nodes."""
    said: list[str] = []
    s = RunState(say=said.append)
    s.line("p0", "worker", "epoch 0 | loss 1.0", 1)  # the user's own lines mean nothing
    attempt(s, 2, 3)
    attempt(s, 30, 2, restart=1)
    attempt(s, 60, 3, restart=1)  # a node joined: a new round without a restart
    d = s.as_dict()
    assert d["rendezvous_rounds"] == 3
    assert d["world_sizes"] == [3, 2, 3]
    assert d["final_step"] is None
    assert s.world_size == 3
    assert "rendezvous round 2: world size 2 (2 processes, restart 1)" in said


def test_attempt_lines_win_over_the_scripts_start_lines() -> None:
    s = RunState()
    attempt(s, 0, 2)
    s.train("p0", 1, TrainEvent("start", 0, 2, 0))
    _steps(s, 2, 1, 3, 2)
    attempt(s, 10, 3)
    s.train("p0", 11, TrainEvent("start", 3, 3, 0))
    assert s.as_dict()["rendezvous_rounds"] == 2


def test_without_attempt_lines_the_scripts_start_lines_count_the_rounds() -> None:
    """A worker image without the attempt line: the reference script's lines still work."""
    s = RunState()
    s.train("p0", 0, TrainEvent("start", 0, 3, 0))
    _steps(s, 1, 1, 2, 3)
    s.train("p0", 5, TrainEvent("start", 2, 2, 1))
    _steps(s, 6, 3, 4, 2)
    d = s.as_dict()
    assert d["rendezvous_rounds"] == 2
    assert d["world_sizes"] == [3, 2]


def test_only_the_completion_marker_completes_the_run() -> None:
    s = RunState()
    _steps(s, 0, 1, 5, 2)
    s.train("p0", 6, TrainEvent("done", 5))
    assert s.as_dict()["completed"] is False  # the script's word is step detail only
    assert s.as_dict()["final_step"] == 5
    s.complete(9.0, "marker")
    s.complete(7.5, "marker")  # an earlier sighting (a pod's exit) counts
    assert s.completed_at == 7.5
    assert s.as_dict()["completed"] is True


def test_pod_lines_and_exits_reach_the_view_and_the_summary() -> None:
    out = io.StringIO()
    p = Progress(out=out, live=True)
    s = p.state
    s.line("w-0", "worker", "elastic-worker: waiting for 2 peers", 0)
    s.exited("w-0", 3)
    row = next(r for r in p.table() if r.startswith("w-0"))
    assert row.split()[1:5] == ["Pending", "0", "3", "elastic-worker:"]  # RST, EXIT, LAST
    assert s.as_dict()["pods"]["w-0"]["exit_code"] == 3
    assert s.pods["w-0"].last_lines == ["elastic-worker: waiting for 2 peers"]


def test_the_summary_text_says_what_the_run_knows() -> None:
    s = RunState()
    attempt(s, 0, 3)
    s.fault(10, "kill p1")
    attempt(s, 12, 2, restart=1)
    s.fault(15, "kill p0")
    s.complete(20, "marker")
    s.exited("p0", 0)
    text = summary_text(s.as_dict(), Path("/tmp/logs"))
    assert "completed:    True" in text
    assert "world sizes:  3 -> 2" in text
    assert "rounds:       2 (groups formed)" in text
    assert (
        "re-form:      kill p1: world size 2 after 2.0s "
        "(seconds to the new rendezvous round: the script prints no steps)"
    ) in text
    assert "fault:        kill p0 at 15s (no training step followed this fault)" in text
    assert "pod:          p0: exit 0, restarts 0" in text


def test_a_fault_in_a_run_without_steps_is_resolved_by_the_next_round() -> None:
    s = RunState()
    attempt(s, 2, 3)
    s.fault(35, "kill p1")
    attempt(s, 41.5, 2, restart=1)
    attempt(s, 50, 3, restart=1)
    s.fault(60, "kill p2")  # nothing formed after it
    kill, late = s.as_dict()["reforms"]
    assert (kill["cause"], kill["world_size"], kill["seconds"]) == ("kill p1", 2, 6.5)
    assert "new rendezvous round" in kill["note"]
    assert late["seconds"] is None and "no training step" in late["note"]


def test_the_pod_at_a_group_rank_of_the_newest_round() -> None:
    s = RunState()
    assert s.pod_at_rank(1) is None
    attempt(s, 10, 3)
    assert s.pod_at_rank(1) == "p1" and s.pod_at_rank(3) is None
    # a new round of two in which p2 has rank 1; p1 (lost) kept its old line
    s.line("p0", "worker", ATTEMPT.format(r=1, g=0, n=2), 40)
    s.line("p2", "worker", ATTEMPT.format(r=1, g=1, n=2), 40.2)
    assert s.pod_at_rank(1) == "p2"


RESTORED = "elastic-worker: state restored at step {step} from {source} ({lost} steps lost)"


def test_where_a_reforms_state_came_from_is_the_workers_restore_lines() -> None:
    """A script that keeps snapshots: each pod's worker says where its state came from; the
    re-form's is another pod's memory when any pod's was, and its step and steps lost come
    from those lines when the script prints no steps."""
    s = RunState()
    attempt(s, 2, 3)
    s.fault(35, "kill p1")
    attempt(s, 38, 2, restart=1)
    s.line("p0", "worker", RESTORED.format(step=40, source="local-memory", lost=0), 39)
    s.line("p2", "worker", RESTORED.format(step=40, source="peer-memory", lost=0), 39.1)
    attempt(s, 60, 3, restart=1)
    s.line("p1", "worker", RESTORED.format(step=70, source="peer-memory", lost="?"), 61)
    (kill,) = s.as_dict()["reforms"]
    assert (kill["resumed_step"], kill["steps_lost"], kill["state_from"]) == (40, 0, "peer-memory")


def test_a_checkpoint_restore_is_said_so_beside_the_steps_of_the_script() -> None:
    s = RunState()
    _steps(s, 0, 1, 12, 3)
    s.fault(12, "kill p1 p2")
    s.line("p0", "worker", RESTORED.format(step=10, source="checkpoint", lost=2), 14)
    s.train("p0", 14, TrainEvent("resumed", 10))
    _steps(s, 15, 11, 12, 1)
    (kill,) = s.as_dict()["reforms"]
    assert (kill["resumed_step"], kill["steps_lost"], kill["state_from"]) == (10, 2, "checkpoint")
    assert "state from checkpoint" in summary_text(s.as_dict(), Path("logs"))


def test_a_restore_line_read_after_the_new_rounds_first_step_still_counts() -> None:
    """The worker reads the script's `restored=` line every 0.5 s: its line may come after
    the first step of the new round, which resolved the re-form."""
    s = RunState()
    _steps(s, 0, 1, 8, 3)
    s.fault(8, "kill p1")
    s.train("p0", 12, TrainEvent("resumed", 8))
    _steps(s, 12, 9, 9, 2)
    s.line("p0", "worker", RESTORED.format(step=8, source="local-memory", lost=0), 12.4)
    s.line("p2", "worker", RESTORED.format(step=8, source="peer-memory", lost=0), 12.5)
    (kill,) = s.as_dict()["reforms"]
    assert (kill["resumed_step"], kill["steps_lost"], kill["state_from"]) == (8, 0, "peer-memory")


def test_pods_in_the_exit_barrier_and_whom_they_wait_for_reach_the_view_and_the_summary() -> None:
    """Two pods finished and wait in torch's exit barrier for the third, whose training
    process the warm server stops in its teardown; the view's head says who waits for whom
    while they do, the summary how long and whether by the timeout."""
    out = io.StringIO()
    p = Progress(out=out, live=True)
    s = p.state
    attempt(s, 0, 3)
    wait = (
        "elastic-worker: exit barrier: this node's training processes exited 0; "
        "waiting up to 60 s for: {}"
    )
    s.line("p0", "worker", wait.format("p1, p2"), 50)
    s.line("p2", "worker", wait.format("p1"), 50.5)
    s.line("p0", "worker", "elastic-worker: exit barrier: still waiting for: p1", 52)
    head = p.table()[0]
    assert head.endswith("EXIT BARRIER: 2 waiting for p1"), head
    assert s.waiting_in_exit_barrier == {"p0": ("p1",), "p2": ("p1",)}
    stopped = warm.teardown_stopped(77, "rank 1, local rank 0", 30, 0)
    s.line("p1", "worker", f"elastic-worker: {stopped}", 78)
    s.line(
        "p0",
        "worker",
        "elastic-worker: exit barrier: left after 30.4 s; every node had finished",
        78.5,
    )
    s.line(
        "p2",
        "worker",
        "elastic-worker: exit barrier: left after 60.1 s, its timeout; had not finished: p1",
        110,
    )
    assert "EXIT BARRIER" not in p.table()[0]
    d = s.as_dict()
    assert d["exit_barrier"] == {
        "p0": {"waiting_for": ["p1"], "left_after_seconds": 30.4, "timed_out": False},
        "p2": {"waiting_for": ["p1"], "left_after_seconds": 60.1, "timed_out": True},
    }
    assert d["stopped_in_teardown"] == [
        {"pod": "p1", "process": "rank 1, local rank 0", "seconds": 30.0, "code": 0}
    ]
    text = summary_text(d, Path("/tmp/logs"))
    assert "exit barrier: p0 waited 30.4s" in text
    assert "exit barrier: p2 waited 60.1s, its timeout, for p1" in text
    assert (
        "teardown:     p1: training process (rank 1, local rank 0) stopped 30s after its "
        "script returned 0" in text
    )
    assert s.pods["p1"].message.startswith("elastic-worker: training process 77")
