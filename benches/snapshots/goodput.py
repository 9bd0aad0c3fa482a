"""The figure `snap-goodput`: the chart's three pods in the local run (root), train.py with
a checkpoint every 100 steps (0.5 s a step); one pod SIGKILLed every T s (pods 0, 1, 2 in
turn), its container back after R s; with snapshots and with the checkpoint alone, in
turn. Goodput is the job's progress: train.py's steps still standing at the end (not rolled
back) per wall second over the window, against the same run's rate before the first loss
(all three, no loss): the ratio the issue asks to keep at 0.95 or more. The samples per
second (16 per rank per step) are given too: they also fall while a node is away."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.churn.goodput import (
    CHURN_FULL,
    CHURN_QUICK,
    STEADY_S,
    Churn,
    Step,
    churn_row,
    figure_rows,
    goodput,
)
from benches.churn.localrun import LocalRun
from benches.stats import summary_cut

COMMAND = [
    "python", "/opt/elastic-worker/examples/train.py", "--steps", "1000000",
    "--checkpoint-every", "100", "--step-seconds", "0.5",
]  # fmt: skip
VARIANTS = {"checkpoint only": ["--no-snapshots"], "snapshots": []}

__all__ = ["CHURN_FULL", "CHURN_QUICK", "run_goodput"]


def steps_per_second(steps: list[Step], start: float, end: float) -> float:
    return sum(1 for s in steps if start <= s.at < end) / (end - start)


def measure(_: LocalRun, steps: list[Step], start: float, end: float) -> dict[str, Any]:
    rate, steady = (
        steps_per_second(steps, start, end),
        steps_per_second(steps, start - STEADY_S, start),
    )
    return {
        "steps_per_s": round(rate, 3),
        "steady_steps_per_s": round(steady, 3),
        "ratio": round(rate / steady, 3),
        "samples_per_s": round(goodput(steps, start, end), 1),
        "steady_samples_per_s": round(goodput(steps, start - STEADY_S, start), 1),
    }


def goodput_once(label: str, churn: Churn, workdir: Path) -> dict[str, Any]:
    values = {"job": {"command": [*COMMAND, *VARIANTS[label]]}}
    row = {"figure": "snap-goodput", "label": label}
    return churn_row(row, values, churn, workdir, measure)


def run_goodput(repeat: int, churn: Churn, say: Callable[[str], None]) -> dict[str, Any]:
    rows = figure_rows(
        repeat, VARIANTS, lambda lb, wd: goodput_once(lb, churn, wd), "bench-snap-goodput-", say
    )
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
