"""The figure `snap-loss`: three nodes train (one process each, `--nnodes=2:3`), one is lost
(its processes SIGKILLed; frozen, a silent loss; or SIGTERM to its entrypoint, a spot
reclaim) and the survivors re-form at two. For DDP (train.py) and FSDP2 across the nodes
(snap_train.py --fsdp), with snapshots and with the checkpoint alone (today's path), in
turn: the steps lost (the newest step the survivors completed at three minus the step the
new round started from: a checkpoint every CHECKPOINT_EVERY steps), where the state came
from, and the seconds from the loss until every survivor completed a step at two."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.snapshots.job import LOSSES, Job, Node, wait_for
from benches.snapshots.scripts import RESTORED, SCRIPTS, Script
from benches.stats import summary

CHECKPOINT_EVERY = 20
STEP_SECONDS = 0.2
#: The loss comes after CHECKPOINT_EVERY + one of these steps at three (one per repeat, in
#: turn): at different points of the checkpoint interval, whose rollback today's path pays.
OFFSETS = (7, 13, 3, 17, 10)
VARIANTS = {"checkpoint only": False, "snapshots": True}


def steps_at(script: Script, node: Node, world: int, since: float = 0.0) -> list[tuple[float, int]]:
    return [(t, int(m[1])) for t, m in node.matches(script.step, since) if int(m[2]) == world]


def loss_once(
    parallel: str, label: str, how: str, workdir: Path, offset: int = OFFSETS[0]
) -> dict[str, Any]:
    script = SCRIPTS[parallel]
    command = script.command(
        snapshots=VARIANTS[label], checkpoint_every=CHECKPOINT_EVERY, step_seconds=STEP_SECONDS
    )
    row: dict[str, Any] = {"figure": "snap-loss", "parallel": parallel, "label": label, "loss": how}
    job = Job.start(workdir, 3, command, f"snap-{parallel}-{how}")
    try:
        error = wait_for(
            "the three nodes training together",
            lambda: all(
                len(steps_at(script, n, 3)) >= CHECKPOINT_EVERY + offset for n in job.nodes
            ),
            300,
            job.nodes,
        )
        if error:
            return {**row, "error": error}
        victim = next((n for n in job.nodes if n.group_rank() == 1), job.nodes[1])
        survivors = [n for n in job.nodes if n is not victim]
        lost_at = time.monotonic()
        victim.lose(how)
        error = wait_for(
            "the survivors training at two",
            lambda: all(steps_at(script, n, 2, lost_at) for n in survivors),
            180,
            survivors,
        )
        if error:
            return {**row, "error": error}
        newest = max(s for n in survivors for _, s in steps_at(script, n, 3))
        resumed = min(int(m[1]) for n in survivors for _, m in n.matches(script.start, lost_at)[:1])
        trained = max(min(t for t, _ in steps_at(script, n, 2, lost_at)) for n in survivors)
        sources = [m[2] for n in survivors for _, m in n.matches(RESTORED, lost_at)[:1]]
        return {
            **row,
            "seconds": round(trained - lost_at, 2),
            "newest_step": newest,
            "resumed_step": resumed,
            "steps_lost": newest - resumed,
            "source": sources[0] if sources else "checkpoint",
        }
    finally:
        job.stop()


def run_losses(
    repeat: int,
    parallels: list[str],
    losses: list[str],
    workdir: Callable[[], Path],
    say: Callable[[str], None],
) -> dict[str, Any]:
    rows = []
    for n in range(repeat):
        offset = OFFSETS[n % len(OFFSETS)]
        for parallel in parallels:
            for how in losses:
                for label in VARIANTS:  # alternating: a loaded machine weighs on both
                    rows.append(loss_once(parallel, label, how, workdir(), offset))
                    say(str(rows[-1]))
    out: dict[str, Any] = {"checkpoint_every": CHECKPOINT_EVERY, "rows": rows, "summary": {}}
    for parallel in parallels:
        for how in losses:
            for label in VARIANTS:
                mine = [
                    r
                    for r in rows
                    if (r["parallel"], r["loss"], r["label"]) == (parallel, how, label)
                ]
                out["summary"][f"{parallel}/{how}/{label}"] = {
                    "seconds": summary(mine),
                    "steps_lost": summary(mine, "steps_lost"),
                    "sources": sorted({str(r.get("source")) for r in mine if "source" in r}),
                }
    return out


__all__ = ["LOSSES", "VARIANTS", "loss_once", "run_losses"]
