"""The figure `snap-goodput`: the chart's three pods in the local run (root), train.py with
a checkpoint every 100 steps (0.5 s a step); one pod SIGKILLed every T s (pods 0, 1, 2 in
turn), its container back after R s; with snapshots and with the checkpoint alone, in
turn. Goodput is the job's progress: train.py's steps still standing at the end (not rolled
back) per wall second over the window, against the same run's rate before the first loss
(all three, no loss): the ratio the issue asks to keep at 0.95 or more. The samples per
second (16 per rank per step) are given too: they also fall while a node is away."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.churn.goodput import (
    CHURN_FULL,
    CHURN_QUICK,
    GOODPUT_FIRST_LOSS,
    STEADY_S,
    Churn,
    Step,
    goodput,
    kept_steps,
)
from benches.churn.localrun import LocalRun, done, pod
from benches.procs import wait_quiet
from benches.stats import summary_cut

COMMAND = [
    "python", "/opt/elastic-worker/examples/train.py", "--steps", "1000000",
    "--checkpoint-every", "100", "--step-seconds", "0.5",
]  # fmt: skip
VARIANTS = {"checkpoint only": ["--no-snapshots"], "snapshots": []}

__all__ = ["CHURN_FULL", "CHURN_QUICK", "run_goodput"]


def steps_per_second(steps: list[Step], start: float, end: float) -> float:
    return sum(1 for s in steps if start <= s.at < end) / (end - start)


def goodput_once(label: str, churn: Churn, workdir: Path) -> dict[str, Any]:
    period, down, losses = churn
    values = {"job": {"command": [*COMMAND, *VARIANTS[label]]}}
    faults = [
        f"--kill={pod(k % 3)}@{GOODPUT_FIRST_LOSS + k * period:g}:{down:g}" for k in range(losses)
    ]
    row: dict[str, Any] = {
        "figure": "snap-goodput", "label": label, "T": period, "R": down, "losses": losses,
    }  # fmt: skip
    run = LocalRun.start(workdir, values, faults, GOODPUT_FIRST_LOSS + losses * period + 120)
    try:
        while time.monotonic() < run.started + GOODPUT_FIRST_LOSS + losses * period + 1:
            if run.ended():
                return {**row, "error": f"the run ended first: {run.tail()}"}
            time.sleep(0.5)
        start = run.started + GOODPUT_FIRST_LOSS
        end = start + losses * period
        steps = kept_steps(run, end)
        before = [s for s in steps if start - STEADY_S <= s.at < start]
        if not before or {s.world for s in before} != {3}:
            return {**row, "error": "the three did not train together before the first loss"}
        rate, steady = (
            steps_per_second(steps, start, end),
            steps_per_second(steps, start - STEADY_S, start),
        )
        return {
            **row,
            "steps_per_s": round(rate, 3),
            "steady_steps_per_s": round(steady, 3),
            "ratio": round(rate / steady, 3),
            "samples_per_s": round(goodput(steps, start, end), 1),
            "steady_samples_per_s": round(goodput(steps, start - STEADY_S, start), 1),
        }
    finally:
        run.stop()


def run_goodput(repeat: int, churn: Churn, say: Callable[[str], None]) -> dict[str, Any]:
    rows = []
    for _ in range(repeat):
        for label in VARIANTS:
            wd = Path(tempfile.mkdtemp(prefix="bench-snap-goodput-"))
            idle = wait_quiet(say)
            rows.append({**goodput_once(label, churn, wd), "idle_before": idle})
            done(rows[-1], wd, say)
    period, down, losses = churn
    return {
        "T": period,
        "R": down,
        "losses": losses,
        "rows": rows,
        "summary": {
            lb: {
                key: summary_cut([r for r in rows if r["label"] == lb], key)
                for key in ("ratio", "steps_per_s", "samples_per_s")
            }
            for lb in VARIANTS
        },
    }
