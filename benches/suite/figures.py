"""What each figure of scripts/bench runs, and a run reduced to the row the table shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from benches.churn.report import FIGURES as CHURN_FIGURES
from benches.recovery.measure import Result
from benches.recovery.measure import run_once as recovery_run
from benches.snapshots.report import FIGURES as SNAPSHOT_FIGURES

#: What each figure compares: torch's defaults (with its shared-store hang avoided, so
#: that the baseline finishes) and elastic-worker's defaults, warm starts on.
PROFILES = {"torch defaults": "baseline-fixed-store", "elastic-job": "tuned-warm"}
#: figure -> (title, what each run does: bench-recovery's run_once arguments, victims)
RUNS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "kill": ("SIGKILL 1 of 3, re-formed", {}, ("other", "rank0")),
    "sigterm": ("SIGTERM 1 of 3, re-formed", {"sigterm": True}, ("other",)),
    "scaleup": ("scale-up 2 -> 3", {"scaleup": True}, ("none",)),
    "bringup": ("bring-up of 4", {"nodes": 4, "bringup_only": True}, ("none",)),
}
FIGURES = [*RUNS, "rendezvous", *CHURN_FIGURES, *SNAPSHOT_FIGURES]


def last_phases(result: Result) -> dict[str, float]:
    """The phases of the node that trained last (the one the figure times): after a loss
    the slowest survivor's, after a start the last agent's to step."""
    phases = cast("dict[str, dict[str, float]]", result.get("phases_s") or {})
    recovered = cast("dict[str, float]", result.get("recovered_s") or {})
    if recovered:
        slowest = max(recovered, key=lambda name: recovered[name])
        return dict(phases.get(slowest, {}))
    stepped = {name: p for name, p in phases.items() if "step" in p}
    if not stepped:
        return {}
    return dict(max(stepped.values(), key=lambda p: p["step"]))


def reduce(figure: str, label: str, victim: str, result: Result) -> dict[str, Any]:
    """A bench-recovery result as the table's row: seconds, restarts, steps lost, the
    phases of the node that trained last, or the error."""
    row: dict[str, Any] = {"figure": figure, "label": label, "victim": victim}
    if "seconds" in result:  # bring-up, scale-up
        return {**row, "seconds": result["seconds"], "phases": last_phases(result)}
    recovered = cast("dict[str, float]", result.get("recovered_s", {}))
    ok = recovered and not result.get("hung") and "error" not in result
    lost = cast("dict[str, int]", result.get("steps_lost", {}))
    return {
        **row,
        "seconds": max(recovered.values()) if ok else None,
        "restarts": sorted(set(cast("dict[str, int]", result.get("restarts_used", {})).values())),
        "steps_lost": max(lost.values()) if lost else None,
        "error": result.get("error") or ("hung" if result.get("hung") else None),
        "phases": last_phases(result),
    }


def run_once(figure: str, label: str, victim: str, workdir: Path) -> dict[str, Any]:
    """One run of bench-recovery for `figure`, reduced to what the table shows."""
    kwargs = RUNS[figure][1]
    result = recovery_run(PROFILES[label], victim, workdir, 120.0, **kwargs)
    return reduce(figure, label, victim, result)
