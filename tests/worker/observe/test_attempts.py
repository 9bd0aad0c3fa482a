"""observe/attempts.py: the follower reads the attempt log and the progress file into the
metrics, over real processes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elastic_worker.observe import attempts as follow

from worker.observe.test_metrics import scrape, state, tracked


def test_the_follower_sees_an_attempts_process_end_and_reads_partial_lines(tmp_path: Path) -> None:
    tracker, metrics, _ = tracked()
    follower = follow.AttemptFollower(tracker)
    env = follower.env()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        with open(env["ELASTIC_ATTEMPT_LOG"], "a") as fh:
            fh.write(
                "[elastic-worker] attempt run_id=j restart=0 group_rank=0 nodes=2 "
                f"world_size=2 pid={proc.pid}\n"
            )
        with open(env["ELASTIC_PROGRESS_FILE"], "a") as fh:
            fh.write("step=1\nstep=2\nst")  # the last line is still being written
        follower.poll()
        v = scrape(metrics)
        assert state(v) == "training" and v["elastic_job_last_step"] == 2
        with open(env["ELASTIC_PROGRESS_FILE"], "a") as fh:
            fh.write("ep=3\n")
        proc.terminate()
        proc.wait()
        follower.poll()
        v = scrape(metrics)
        assert v["elastic_job_last_step"] == 3
        assert state(v) == "waiting_rendezvous"
    finally:
        proc.kill()
        follower.stop()
    assert not Path(env["ELASTIC_ATTEMPT_LOG"]).parent.exists()  # its private dir is removed


def test_a_scripts_snapshot_lines_are_counted_logged_and_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """packages/elastic-snapshot's `restored=` line: where the state came from and the steps
    lost, as metrics, a log line and an Event; a first start (`none`) counts nothing; a
    `saved=` line is logged and kept for the loss detection."""
    heard: list[tuple[str, str]] = []
    tracker, metrics, _ = tracked()
    tracker.notify = lambda reason, message: heard.append((reason.name, message))
    follower = follow.AttemptFollower(tracker)
    progress = Path(follower.env()["ELASTIC_PROGRESS_FILE"])
    try:
        with progress.open("a") as fh:
            fh.write("restored=0 source=none lost=-\nstep=1\nsaved=7 files=1 seconds=0.02\n")
            fh.write("restored=7 source=peer-memory lost=0\nrestored=40 source=checkpoint lost=9\n")
        with caplog.at_level("INFO", logger=follow.__name__):
            follower.poll()
        v = scrape(metrics)
        assert v['elastic_job_restores_total{source="peer-memory"}'] == 1
        assert v['elastic_job_restores_total{source="checkpoint"}'] == 1
        assert v['elastic_job_restores_total{source="local-memory"}'] == 0
        assert v["elastic_job_reform_steps_lost_count"] == 2
        assert v["elastic_job_reform_steps_lost_sum"] == 9
        assert v["elastic_job_restored_step"] == 40
        assert [e[0] for e in heard] == ["StateRestored", "StateRestored"]
        assert heard[0][1] == "training state restored at step 7 from peer-memory (0 steps lost)"
        said = [r.getMessage() for r in caplog.records]
        assert "state restored at step 7 from peer-memory (0 steps lost)" in said
        assert "the training process saved step 7 to memory (1 file(s), 0.02 s)" in said
        assert follower.saves.keeps and follower.saves.saved == 1
    finally:
        follower.stop()


def test_without_metrics_the_snapshot_lines_are_still_read_for_the_loss_detection() -> None:
    follower = follow.AttemptFollower(None)
    progress = Path(follower.env()["ELASTIC_PROGRESS_FILE"])
    try:
        progress.write_text("restored=3 source=local-memory lost=0\nstep=4\n")
        follower.poll()
        assert follower.saves.keeps and follower.saves.saved == 0
    finally:
        follower.stop()
