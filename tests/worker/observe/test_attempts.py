"""observe/attempts.py: the follower reads the attempt log and the progress file into the
metrics, over real processes."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
