"""One run of bench-hangs: three elastic-worker agents (benches/snapshots/job.py: the
project's defaults, a private etcd, one training process each) train
tests/e2e/user_script/stalls.py, a user's DDP script with no process-group timeout; rank 1
hangs at HANG_STEP, outside any collective or inside one its peers are not in. The
figure: the seconds from the line the rank prints before it blocks until a rank of the
job's next start prints a training step (every line stamped with this process's
monotonic clock when read), and the seconds until an agent said which rank hung; or the
cap, when nothing trained by then."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benches.env import ROOT
from benches.snapshots.job import Job, wait_for

STALLS_PY = ROOT / "tests" / "e2e" / "user_script" / "stalls.py"
HOWS = ("outside", "side-collective")
STEP_SECONDS = 0.2
HANG_STEP = 23  # odd, after the checkpoint of step 20 (one every 5 steps)
#: What each variant sets in every agent's environment (the chart's hangDetection.*).
VARIANTS: dict[str, dict[str, str]] = {
    "torch defaults": {"ELASTIC_HANG_DETECTION": "false"},
    "elastic-job": {"ELASTIC_HANG_DETECTION": "true"},
}
#: The lines the figure reads: the rank's last words before it blocks, a training step,
#: an agent naming the hung rank (elastic_worker/recovery/hangs.py).
BLOCKS = {
    "outside": re.compile(rf"\[GPU(\d+)\] reading the batch of step {HANG_STEP}\b"),
    "side-collective": re.compile(r"\[GPU(\d+)\] reducing the metrics of step"),
}
STEP = re.compile(r"\[GPU\d+\] step (\d+) loss ")
START = re.compile(r"\[GPU\d+\] local rank \d+ of world size (\d+)")
NAMED = re.compile(r"rank (\d+) hung")


def command(how: str, workdir: Path) -> list[str]:
    return [
        "python", str(STALLS_PY), "1000000", "5",
        "--checkpoint-dir", str(workdir / "ckpt"), "--step-seconds", f"{STEP_SECONDS:g}",
        "--stall", how, "--stall-rank", "1", "--stall-step", str(HANG_STEP),
    ]  # fmt: skip


def hang_once(
    how: str, label: str, workdir: Path, cap: float, env: dict[str, str]
) -> dict[str, Any]:
    row: dict[str, Any] = {"how": how, "label": label, "cap_s": cap}
    job = Job.start(workdir, 3, command(how, workdir), f"hang-{how}", **VARIANTS[label], **env)
    try:
        blocked: list[tuple[float, str]] = []

        def hung() -> bool:
            blocked[:] = [(t, n.name) for n in job.nodes for t, _ in n.matches(BLOCKS[how])]
            return bool(blocked)

        error = wait_for(f"rank 1 to hang at step {HANG_STEP}", hung, 300, job.nodes)
        if error:
            return {**row, "error": error}
        hung_at, culprit = blocked[0]
        row["culprit"] = culprit

        def again() -> float | None:
            """When a rank of a new start (the job's processes after the hang) stepped."""
            steps = []
            for n in job.nodes:
                started = n.matches(START, hung_at)
                if started:
                    steps += [t for t, _ in n.matches(STEP, started[0][0])[:1]]
            return min(steps) if steps else None

        def trained() -> bool:
            return again() is not None

        error = wait_for("a training step after the hang", trained, cap, job.nodes)
        named = [t for n in job.nodes for t, _ in n.matches(NAMED, hung_at)]
        row["named_s"] = round(min(named) - hung_at, 2) if named else None
        if error.startswith("timed out"):
            return {**row, "seconds": None, "timed_out": True}
        if error:
            return {**row, "error": error}
        at = again()
        assert at is not None
        return {**row, "seconds": round(at - hung_at, 2), "timed_out": False}
    finally:
        job.stop()
