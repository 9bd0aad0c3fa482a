"""The goodput figure: one pod SIGKILLed every T s (pods 0, 1, 2 in turn), its container
back after R s; useful work is train.py's samples of the steps that were kept (not rolled
back to a checkpoint by the end of the window), summed over ranks, per wall second."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benches.churn.localrun import LocalRun, Values, done, pod
from benches.churn.profiles import (
    GOODPUT_PROFILES,
    SAMPLES_PER_RANK_STEP,
    TRAIN_COMMAND,
    USEFUL_WORK,
    merged,
)
from benches.procs import wait_quiet
from benches.stats import summary_cut
from localrun.lines import parse_train_line

#: Seconds after the run's start of the first loss of the goodput figure.
GOODPUT_FIRST_LOSS = 60.0
#: (T, R, losses): one loss every T s, back after R s.
Churn = tuple[float, float, int]
CHURN_FULL: Churn = (120.0, 60.0, 3)
CHURN_QUICK: Churn = (40.0, 20.0, 2)
#: Seconds before the first loss that show the rate with all three (the row's `steady`).
STEADY_S = 20.0
#: Width of a bin of the goodput-over-time series, seconds.
SERIES_BIN_S = 5.0


@dataclass(frozen=True)
class Step:
    at: float
    step: int
    world: int


def kept_steps(run: LocalRun, until: float) -> list[Step]:
    """The steps that stand at `until`: each step once, at its last execution; a resume
    from checkpoint c drops the steps after c (they are redone, or lost)."""
    events: list[tuple[float, int, str, int, int]] = []  # (t, order, kind, step, world)
    for t, _, line in sorted(run.all_lines()):
        ev = parse_train_line(line)
        if ev is None or t > until:
            continue
        if ev.kind == "resumed":
            events.append((t, 0, "resumed", ev.step, 0))
        elif ev.kind == "step" and ev.world_size is not None:
            events.append((t, 1, "step", ev.step, ev.world_size))
    kept: list[Step] = []
    for t, _, kind, n, world in sorted(events):
        if kind == "resumed":
            while kept and kept[-1].step > n:
                kept.pop()
        elif not kept or n > kept[-1].step:  # each pod's rank 0 prints the step: once
            kept.append(Step(t, n, world))
    return kept


def goodput(steps: list[Step], start: float, end: float) -> float:
    """Kept samples per wall second, over [start, end)."""
    ranks = sum(s.world for s in steps if start <= s.at < end)
    return ranks * SAMPLES_PER_RANK_STEP / (end - start)


def series(
    steps: list[Step], start: float, end: float, origin: float, width: float = SERIES_BIN_S
) -> list[list[float]]:
    """Goodput over time: [seconds from `origin` to the bin's start, kept samples per
    second in the bin] for each bin of `width` s from `start` to `end`."""
    out = []
    at = start
    while at + width <= end + 1e-9:
        out.append([round(at - origin, 1), round(goodput(steps, at, at + width), 1)])
        at += width
    return out


#: What a churn figure reads of its run: (the run, the kept steps, the window's start and
#: end) -> the row's figures.
Measure = Callable[[LocalRun, list[Step], float, float], dict[str, Any]]


def churn_row(
    row: dict[str, Any], values: Values, churn: Churn, workdir: Path, measure: Measure
) -> dict[str, Any]:
    """One local run with one pod SIGKILLed every T s from GOODPUT_FIRST_LOSS (pods 0, 1, 2
    in turn), each back after R s: `row` with T, R, the losses and `measure` of the window
    from the first loss to the end of the last cycle, or with an error where the run ended
    first or the three did not train together before the first loss."""
    period, down, losses = churn
    faults = [
        f"--kill={pod(k % 3)}@{GOODPUT_FIRST_LOSS + k * period:g}:{down:g}" for k in range(losses)
    ]
    row = {**row, "T": period, "R": down, "losses": losses}
    run = LocalRun.start(workdir, values, faults, GOODPUT_FIRST_LOSS + losses * period + 120)
    try:
        # run.started is the runner's own start once its first line is read
        while time.monotonic() < run.started + GOODPUT_FIRST_LOSS + losses * period + 1:
            if run.ended():
                break
            time.sleep(0.5)
        start = run.started + GOODPUT_FIRST_LOSS
        end = start + losses * period
        if run.ended():
            return {**row, "error": f"the run ended first: {run.tail()}"}
        steps = kept_steps(run, end)
        before = [s for s in steps if start - STEADY_S <= s.at < start]
        if not before or {s.world for s in before} != {3}:
            return {**row, "error": "the three did not train together before the first loss"}
        return {**row, **measure(run, steps, start, end)}
    finally:
        run.stop()


def figure_rows(
    repeat: int,
    labels: Iterable[str],
    once: Callable[[str, Path], dict[str, Any]],
    prefix: str,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """`once(label, workdir)` for each label, `repeat` times, each in a new work directory
    once the machine is quiet; each row said as it comes (its logs kept where it failed)."""
    rows = []
    for _ in range(repeat):
        for label in labels:
            wd = Path(tempfile.mkdtemp(prefix=prefix))
            idle = wait_quiet(say)
            rows.append({**once(label, wd), "idle_before": idle})
            done(rows[-1], wd, say)
    return rows


def goodput_once(label: str, churn: Churn, workdir: Path) -> dict[str, Any]:
    """n losses, one every T s from GOODPUT_FIRST_LOSS, each pod back after R s."""
    period, _, losses = churn
    values = merged({"job": {"command": TRAIN_COMMAND}}, GOODPUT_PROFILES[label])

    def measure(run: LocalRun, steps: list[Step], start: float, end: float) -> dict[str, Any]:
        fired = [run.event_at(f"FAULT kill {pod(k % 3)}") for k in range(losses)]
        cycles = [
            goodput(steps, start + k * period, start + (k + 1) * period) for k in range(losses)
        ]
        return {
            "goodput": round(goodput(steps, start, end), 1),
            "per_cycle": [round(g, 1) for g in cycles],
            "steady": round(goodput(steps, start - STEADY_S, start), 1),  # all three, no loss
            "kept_steps": sum(1 for s in steps if start <= s.at < end),
            "loss_at": [None if t is None else round(t - run.started, 1) for t in fired],
            "series": series(steps, start - STEADY_S, end, start),
        }

    return churn_row({"figure": "goodput", "label": label}, values, churn, workdir, measure)


def run_goodput(repeat: int, churn: Churn, say: Callable[[str], None] = print) -> dict[str, Any]:
    rows = figure_rows(
        repeat, GOODPUT_PROFILES, lambda lb, wd: goodput_once(lb, churn, wd), "bench-goodput-", say
    )
    period, down, losses = churn
    cycles = {
        lb: [g for r in rows if r["label"] == lb for g in r.get("per_cycle", [])]
        for lb in GOODPUT_PROFILES
    }
    return {
        "T": period,
        "R": down,
        "losses": losses,
        "useful_work": USEFUL_WORK,
        "rows": rows,
        "summary": {
            lb: {
                **summary_cut([r for r in rows if r["label"] == lb], "goodput"),
                "cycles": summary_cut([{"g": g} for g in cycles[lb]], "g"),
                "steady": summary_cut([r for r in rows if r["label"] == lb], "steady")["median"],
            }
            for lb in GOODPUT_PROFILES
        },
    }
