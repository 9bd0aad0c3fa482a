"""The silent figure: pod 1's link down for good (no reset) once the three train; seconds
until both survivors have begun a step at world size 2, or timed out at the bound."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.churn.localrun import LocalRun, done, pod
from benches.churn.profiles import SCRIPTS, SILENT_PROFILES, merged
from benches.procs import wait_quiet
from benches.stats import summary_cut
from localrun.lines import parse_attempt_line

#: Seconds after the run's start when the link goes down: the three train by then.
SILENT_CUT_AT = 50.0
#: Seconds the silent figure waits for the survivors before it calls the run timed out.
SILENT_BOUND = 120.0


def nodes_before(run: LocalRun, name: str, at: float) -> int | None:
    """The world size (nodes) of `name`'s last round begun before `at`."""
    rounds = [parse_attempt_line(line) for t, line in run.pod_lines(name) if t < at]
    sizes = [a.nodes for a in rounds if a is not None]
    return sizes[-1] if sizes else None


def first_step_at(
    run: LocalRun, name: str, since: float, nodes: int, step: re.Pattern[str]
) -> float | None:
    """When `name` began its first step after `since` in a round of `nodes` nodes."""
    current: int | None = None
    for t, line in run.pod_lines(name, since):
        attempt = parse_attempt_line(line)
        if attempt is not None:
            current = attempt.nodes
        elif current == nodes and step.search(line):
            return t
    return None


def silent_once(label: str, script: str, workdir: Path, bound: float) -> dict[str, Any]:
    """Pod 1's link down for good once the three train; seconds until pods 0 and 2 have
    both begun a step at world size 2, or None after `bound` s (timed out)."""
    command, extra, step = SCRIPTS[script]
    values = merged({"job": {"command": command}}, extra, SILENT_PROFILES[label])
    faults = [f"--partition={pod(1)}@{SILENT_CUT_AT:g}"]
    row: dict[str, Any] = {"figure": "silent", "label": label, "script": script, "bound": bound}
    run = LocalRun.start(workdir, values, faults, SILENT_CUT_AT + bound + 120)
    try:
        cut = None
        while cut is None and not run.ended():
            cut = run.event_at(f"{pod(1)}: link down")
            time.sleep(0.2)
        if cut is None:
            return {**row, "seconds": None, "error": f"the run ended first: {run.tail()}"}
        survivors = [pod(0), pod(2)]
        sizes = {nodes_before(run, p, cut) for p in survivors}
        if sizes != {3}:
            return {**row, "seconds": None, "error": f"world size at the cut: {sizes}, not 3"}
        seen: dict[str, float] = {}
        while len(seen) < len(survivors) and time.monotonic() < cut + bound:
            for p in survivors:
                at = first_step_at(run, p, cut, 2, step)
                if at is not None:
                    seen[p] = at
            time.sleep(0.2)
        if len(seen) < len(survivors):
            return {**row, "seconds": None, "timed_out": True}
        return {**row, "seconds": round(max(seen.values()) - cut, 1), "timed_out": False}
    finally:
        run.stop()


def run_silent(repeat: int, bound: float, say: Callable[[str], None] = print) -> dict[str, Any]:
    rows = []
    for _ in range(repeat):
        for script in SCRIPTS:
            for label in SILENT_PROFILES:
                wd = Path(tempfile.mkdtemp(prefix="bench-silent-"))
                idle = wait_quiet(say)
                rows.append({**silent_once(label, script, wd, bound), "idle_before": idle})
                done(rows[-1], wd, say)
    return {
        "bound": bound,
        "rows": rows,
        "summary": {
            script: {
                lb: summary_cut(
                    [r for r in rows if r["script"] == script and r["label"] == lb], "seconds"
                )
                for lb in SILENT_PROFILES
            }
            for script in SCRIPTS
        },
    }
