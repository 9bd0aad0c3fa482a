"""What a lost node costs with elastic-snapshot, beside today's checkpoint-only path.

    scripts/bench-snapshots                         # every figure, 3 repeats
    scripts/bench-snapshots --quick                 # one repeat, goodput's short variant
    scripts/bench-snapshots --figure snap-loss --loss kill --parallel fsdp2 --repeat 1

  snap-loss      one node of three lost (SIGKILL of its processes; frozen by SIGSTOP, a
                 silent loss; SIGTERM, a spot reclaim) with DDP (train.py) and FSDP2
                 (snap_train.py --fsdp), elastic-worker agents on this machine: the steps
                 lost and the seconds until the survivors train again, with snapshots and
                 with the checkpoint alone (every 20 steps), in turn
  snap-overhead  seconds per step with and without: train.py, and a 100M+ parameter
                 model (DDP; FSDP2 with the ring replica every step; DDP with 3 optimizer
                 steps per step_done, as an epoch: the copy each step_done makes)
  snap-goodput   the chart's pods in the local run (root), one lost every T s and back
                 R s later (T=120, R=60, 3 losses; --quick 40, 20, 2), a checkpoint every
                 100 steps: kept steps per second over the no-loss rate

Figures are comparable only within one run. Writes --json (default
out/bench/snapshots.json) and prints the table; each figure's runs are printed as they end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.churn.localrun import needs_root
from benches.env import ROOT, report
from benches.snapshots.goodput import CHURN_FULL, CHURN_QUICK, run_goodput
from benches.snapshots.job import LOSSES
from benches.snapshots.losses import run_losses
from benches.snapshots.overhead import run_overhead
from benches.snapshots.report import FIGURES, table_lines
from benches.snapshots.scripts import SCRIPTS


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="bench-snap-"))


def run_figures(
    figures: list[str],
    quick: bool,
    repeat: int,
    say: Callable[[str], None],
    *,
    losses: list[str] | None = None,
    parallels: list[str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for figure in figures:
        started = time.monotonic()
        if figure == "snap-loss":
            out[figure] = run_losses(
                repeat, parallels or list(SCRIPTS), losses or list(LOSSES), workdir, say
            )
        elif figure == "snap-overhead":
            out[figure] = run_overhead(repeat, workdir, say)
        else:
            out[figure] = run_goodput(repeat, CHURN_QUICK if quick else CHURN_FULL, say)
        out[figure]["duration_s"] = round(time.monotonic() - started)
        out[figure]["load_average"] = round(os.getloadavg()[0], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--figure", action="append", choices=FIGURES, default=[])
    parser.add_argument("--loss", action="append", choices=LOSSES, default=[])
    parser.add_argument("--parallel", action="append", choices=sorted(SCRIPTS), default=[])
    parser.add_argument("--quick", action="store_true", help="one repeat, short churn")
    parser.add_argument("--repeat", type=int, help="repeats (default 3, quick 1)")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "bench" / "snapshots.json")
    args = parser.parse_args(argv)
    figures = args.figure or list(FIGURES)  # --quick: goodput's short variant (SLOW)
    why = needs_root() if "snap-goodput" in figures else ""
    if why and args.figure:
        parser.error(f"--figure snap-goodput: {why}")
    if why:
        print(f"bench-snapshots: skipping snap-goodput: {why}", flush=True)
        figures = [f for f in figures if f != "snap-goodput"]
    results = {
        "command": " ".join(["scripts/bench-snapshots", *(argv or [])]),
        "load_average_start": round(os.getloadavg()[0], 1),
        **run_figures(
            figures,
            args.quick,
            args.repeat or (1 if args.quick else 3),
            lambda text: print(text, flush=True),
            losses=args.loss,
            parallels=args.parallel,
        ),
    }
    report(args.json, results, table_lines(results))
    return 0
