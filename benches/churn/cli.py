"""A silent loss and goodput under churn, through the local run of the chart.

    scripts/bench-churn --figure silent --repeat 1
    scripts/bench-churn --figure goodput --quick

scripts/bench runs the same figures (`silent` and `goodput`: run_figures). Both run
`elastic-local run` of values-examples/cpu-smoke.yaml (three pods, `--nnodes=2:3`, each
its own network namespace, elastic-worker as the entrypoint, the bundled etcd), so the
path measured is the chart's: the worker's round liveness, its gate, torchrun, gloo.
Needs root (network namespaces). Times are this process's monotonic clock: the runner's
event lines and the pods' log lines are stamped when read (every 0.2 s at most).

  silent   pod 1's link goes down for good (no reset) once the three train: seconds
           until both survivors have begun a step at world size 2 (train.py: its first
           `[train] step=` line; the user script, pytorch/examples-style multinode.py that
           sets no process-group timeout: its first `Epoch N` line, printed once DDP has
           synchronised). torch's defaults (its rendezvous waits, the round liveness off,
           cold starts) wait for the script's process-group timeout (train.py 60 s, gloo's
           default 30 min): the wait is cut at --bound seconds and reported as timed out.
  goodput  one pod SIGKILLed every T s (pods 0, 1, 2 in turn), its container back after
           R s: the elastic job (2:3) beside a fixed-size job (3:3, the same chart, which
           waits for the pod and resumes from its checkpoint). Useful work is train.py's
           samples (16 per rank per step) of the steps that were kept, i.e. not rolled back
           to a checkpoint by the end of the window, summed over ranks, over the window's
           wall seconds: from the first loss, n losses of T s each.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from benches.churn.goodput import CHURN_FULL, CHURN_QUICK, run_goodput
from benches.churn.localrun import needs_root
from benches.churn.report import table_lines
from benches.churn.silent import SILENT_BOUND, run_silent


def run_figures(
    figures: list[str], quick: bool, repeat: int, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """scripts/bench's entry: the figures of this package among `figures`. goodput runs
    once (each run averages its losses), the quick variant with --quick."""
    out: dict[str, Any] = {}
    if "silent" in figures:
        out["silent"] = run_silent(repeat, SILENT_BOUND, say)
    if "goodput" in figures:
        out["goodput"] = run_goodput(1, CHURN_QUICK if quick else CHURN_FULL, say)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--figure", choices=["silent", "goodput"], required=True)
    parser.add_argument(
        "--quick", action="store_true", help=f"goodput: T, R, losses = {CHURN_QUICK}"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--bound", type=float, default=SILENT_BOUND, help="silent: give up after this"
    )
    args = parser.parse_args(argv)
    why = needs_root()
    if why:
        parser.error(why)
    if args.figure == "silent":
        results = {"silent": run_silent(args.repeat, args.bound)}
    else:
        results = {"goodput": run_goodput(args.repeat, CHURN_QUICK if args.quick else CHURN_FULL)}
    for title, base, ours, ratio in table_lines(results):
        print(f"{title:<34} {base:>34} {ours:>30} {ratio:>6}")
    return 0
