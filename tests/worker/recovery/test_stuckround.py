"""The stuck-round decision (recovery/stuckround.py): a torchrun whose node is in a
completed round its workers have not started in, and a node of that round is gone.
The run with real torchruns is test_rank_assignment.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from elastic_worker.recovery.lifelines import messages
from elastic_worker.recovery.stuckround import StuckRound, StuckRoundWatch
from elastic_worker.torchcompat import RdzvNode, RoundView

A, B, C = ("10.0.0.1", 11), ("10.0.0.2", 22), ("10.0.0.3", 33)
KEEP_ALIVE = 3.0


def view(round_: int, ranks: dict[RdzvNode, int], *, complete: bool = True) -> RoundView:
    return RoundView(round_, complete, ranks, KEEP_ALIVE)


def test_a_completed_round_that_loses_a_node_before_the_workers_start_is_stuck() -> None:
    decide = StuckRound()
    assert decide.check(view(4, {A: 0, B: 1, C: 2}), B, 0.0) is None
    reason = decide.check(view(4, {B: 1, C: 2}), B, 0.5)
    assert reason is not None and "10.0.0.1 (pid 11) left round 4" in reason


def test_a_gap_in_the_ranks_at_the_first_look_is_a_node_gone() -> None:
    reason = StuckRound().check(view(4, {A: 0, C: 2}), A, 0.0)
    assert reason is not None and "group rank 1 left round 4" in reason


def test_a_round_unchanged_is_stuck_only_after_torchs_keep_alive_and_the_slack() -> None:
    decide = StuckRound(slack=2.0)
    full = view(4, {A: 0, B: 1})
    assert decide.check(full, A, 10.0) is None
    assert decide.check(full, A, 10.0 + KEEP_ALIVE + 1.9) is None
    assert decide.check(full, A, 10.0 + KEEP_ALIVE + 2.0) is not None


def test_a_forming_round_a_round_without_this_node_or_the_round_it_trained_in_is_not_stuck() -> (
    None
):
    decide = StuckRound()
    assert decide.check(view(4, {A: 0}, complete=False), B, 0.0) is None  # forming
    assert decide.check(view(4, {A: 0, C: 2}), B, 0.0) is None  # waiting for the next
    decide.started(4)  # its workers ran in round 4: now in the exit barrier, or failed
    assert decide.check(view(4, {A: 0, C: 2}), A, 100.0) is None
    assert decide.check(view(5, {A: 0, C: 2}), A, 100.0) is not None


def test_the_clock_starts_again_with_each_new_completed_round() -> None:
    decide = StuckRound(slack=0.0)
    assert decide.check(view(4, {A: 0, B: 1}), A, 0.0) is None
    assert decide.check(view(5, {A: 0, B: 1}), A, KEEP_ALIVE + 0.5) is None
    assert decide.check(view(5, {A: 0, B: 1}), A, 2 * KEEP_ALIVE + 0.5) is not None


def _attempt(pid: int) -> str:
    fields = f"run_id=j restart=0 group_rank=0 nodes=2 world_size=2 pid={pid}"
    return f"[elastic-worker] attempt {fields}\n"


def test_the_watch_reports_once_and_never_while_a_worker_runs(tmp_path: Path) -> None:
    """Its workers run in round 4 (an attempt line, its program alive): the round is read
    as theirs; once the program ended and round 5 completed and lost a node, it reports."""
    log = tmp_path / "attempts"
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rounds = [view(4, {A: 0, B: 1})]
    said: list[tuple[str, bool]] = []
    done = threading.Event()

    def on_stuck(reason: str, trained: bool) -> None:
        said.append((reason, trained))
        done.set()

    watch = StuckRoundWatch(lambda: A, lambda: rounds[-1], log, on_stuck, poll=0.02)
    try:
        log.write_text(_attempt(worker.pid))
        watch.start()
        rounds.append(view(4, {A: 0}))  # B lost while A's workers run: not a stuck round
        assert not done.wait(0.3)
        worker.kill()
        worker.wait()
        rounds.append(view(5, {A: 0, B: 1}))
        assert not done.wait(0.3)  # all there: torch's exchange is under way
        rounds.append(view(5, {A: 0}))
        assert done.wait(5)
        assert not done.wait(0.2) or len(said) == 1
        assert said == [("10.0.0.2 (pid 22) left round 5 after it completed", True)]
    finally:
        watch.stop()
        worker.kill()
        worker.wait()


def test_the_round_crosses_the_helpers_pipe_unchanged() -> None:
    """The warm helper answers a `round` request with a JSON line (lifelines/messages.py)."""
    sent = view(7, {A: 0, ("host-b.svc", 22): 1}, complete=False)
    assert messages.read_request(messages.round_request()).kind == "round"
    assert messages.round_of(messages.parse_reply(messages.round_reply(sent))) == sent
