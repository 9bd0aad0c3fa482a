"""The project's recovery and rendezvous figures, beside torch's defaults, in one run.

    scripts/bench                 # 3 repeats, up to 256 agents, the silent loss: over an hour
    scripts/bench --quick         # one run of each, fewer agents, no silent loss: ~25 min
                                  # (nor the snap-* figures: scripts/bench-snapshots --quick)
    scripts/bench --only rendezvous --out out/bench

Each figure is measured for torch's defaults and for what elastic-worker runs, in the
same run, on this machine (the numbers are only comparable within one run):

  kill      SIGKILL of one node of three (torchrun --nnodes=2:3, train.py, gloo): seconds
            from the kill until every survivor trains again, and the restarts each used
            (scripts/bench-recovery does the work, profiles baseline-fixed-store and
            tuned-warm)
  sigterm   SIGTERM of one node of three (a spot reclaim): the same, and the steps lost
  scaleup   two nodes training, a third starts: seconds until all three train
  bringup   four nodes started together until all train at world size 4
  rendezvous  N agents (threads in a few processes) of each backend, etcd-v2, etcd-v3
            and etcd-lease, against one etcd: bring-up, re-form after a SIGKILL and after
            a silent loss, and what each agent asks of etcd (scripts/bench-rendezvous
            does the work: benches/rendezvous)

Through the local run of the chart (scripts/bench-churn does the work; root, namespaces):

  silent    one pod's link down for good, no reset: seconds until both survivors step at
            2, with train.py and with a script that sets no process-group timeout;
            torch's defaults are cut at 120 s ("timed out"). Slow (~10 min a repeat):
            --quick skips it, `--only silent` runs it
  goodput   one pod lost every T s, back after R s (T=120, R=60, 3 losses; --quick 40,
            20, 2): kept samples per wall second, elastic-job (2:3) beside a fixed-size
            job (3:3) that waits for the pod and resumes from its checkpoint

What a loss costs with snapshots in memory (packages/elastic-snapshot) beside today's
checkpoint-only path (scripts/bench-snapshots does the work):

  snap-loss      one node of three lost (SIGKILL, frozen: a silent loss, SIGTERM), DDP and
                 FSDP2: steps lost and seconds until the survivors train again
  snap-overhead  seconds per step with and without: train.py, a 100M+ parameter model
  snap-goodput   one pod lost every T s, back R s later, a checkpoint every 100 steps:
                 kept steps per second over the no-loss rate (the local run: root)

Writes bench.json (with each figure's duration) and, when matplotlib is installed, the plots
to --out (benches/suite/plots.py; docs/benchmarks.md shows them). The durations above are on
2 cores: --quick's is the run in docs/benchmarks/bench.json (tests/docs checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benches.churn.cli import run_figures
from benches.churn.localrun import needs_root
from benches.churn.report import FIGURES as CHURN_FIGURES
from benches.churn.report import SLOW
from benches.env import ROOT
from benches.rendezvous.figure import run_once as rendezvous_once
from benches.rendezvous.profiles import LABELS as RDZV_LABELS
from benches.rendezvous.report import summarize as rdzv_summarize
from benches.snapshots.cli import run_figures as run_snapshot_figures
from benches.snapshots.report import FIGURES as SNAPSHOT_FIGURES
from benches.stats import summary
from benches.suite.figures import FIGURES, PROFILES, RUNS, run_once
from benches.suite.plots import draw_all
from benches.suite.table import print_table

QUICK_SIZES = "3,32"
FULL_SIZES = "3,32,256,1024"


@dataclass(frozen=True)
class Options:
    figures: list[str]
    quick: bool
    repeat: int
    sizes: list[int]
    out: Path
    replot: Path | None


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one repeat, up to 32 agents, goodput's short variant, silent skipped (and the "
        "snap-* figures: scripts/bench-snapshots --quick runs them)",
    )
    parser.add_argument("--repeat", type=int, help="repeats per figure (default 3, quick 1)")
    parser.add_argument("--only", action="append", choices=FIGURES, default=[])
    parser.add_argument("--agents", help="rendezvous sizes, comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="BENCH_JSON",
        help="run nothing: the table and the plots again from a bench.json, into --out",
    )
    args = parser.parse_args(argv)
    sizes = args.agents or (QUICK_SIZES if args.quick else FULL_SIZES)
    if not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", sizes):
        parser.error(f"--agents {sizes}: give agent counts, comma-separated, e.g. 8,32")
    if args.replot is not None and not args.replot.is_file():
        parser.error(f"--replot {args.replot}: no such file (a bench.json of an earlier run)")
    return Options(
        figures=[] if args.replot else select_figures(parser, args.only, args.quick),
        quick=args.quick,
        repeat=args.repeat or (1 if args.quick else 3),
        sizes=[int(n) for n in sizes.split(",")],
        out=args.out,
        replot=args.replot,
    )


def select_figures(parser: argparse.ArgumentParser, only: list[str], quick: bool) -> list[str]:
    """--only's figures, else all but --quick's slow ones; the local run's figures need
    root: refused when asked for by name, else skipped with a line saying why."""
    figures = only or [f for f in FIGURES if not (quick and f in (*SLOW, *SNAPSHOT_FIGURES))]
    churn = [f for f in figures if f in (*CHURN_FIGURES, "snap-goodput")]
    why = needs_root() if churn else ""
    if why and only:
        parser.error(f"--only {','.join(churn)}: {why}")
    if why:
        print(f"bench: skipping {', '.join(churn)}: {why}", flush=True)
    return [f for f in figures if not why or f not in churn]


def say(text: str) -> None:
    print(text, flush=True)


def workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))


def run_figure(figure: str, repeat: int) -> dict[str, Any]:
    """A figure of bench-recovery's runs: each victim, each profile, `repeat` times."""
    rows = []
    for _ in range(repeat):
        for victim in RUNS[figure][2]:
            for label in PROFILES:
                wd = workdir(figure)
                rows.append(run_once(figure, label, victim, wd))
                if rows[-1].get("error") or rows[-1].get("restarts", [1]) != [1]:
                    rows[-1]["logs"] = str(wd)  # kept: a failure, or not one restart each
                else:
                    shutil.rmtree(wd, ignore_errors=True)
                say(json.dumps(rows[-1]))
    return {
        "rows": rows,
        "summary": {lb: summary([r for r in rows if r["label"] == lb]) for lb in PROFILES},
    }


def run_rendezvous(sizes: list[int], repeat: int) -> dict[str, Any]:
    rows = []
    for agents in sizes:
        for _ in range(repeat):
            for label in RDZV_LABELS:
                wd = workdir("rdzv")
                rows.append({**rendezvous_once(label, agents, wd), "load": os.getloadavg()[0]})
                say(json.dumps(rows[-1]))
                shutil.rmtree(wd, ignore_errors=True)
    return {"rows": rows, "summary": rdzv_summarize(rows)}


def timed(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A figure's results with the wall seconds it took (`duration_s`)."""
    start = time.monotonic()
    out = run()
    return {**out, "duration_s": round(time.monotonic() - start)}


def run(opts: Options) -> dict[str, Any]:
    """Every figure asked for, in order, into one results dict (bench.json)."""
    start = time.monotonic()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": __import__("torch").__version__,
            "load_average": round(os.getloadavg()[0], 1),  # at the start: how quiet it was
        },
        "command": " ".join(["scripts/bench", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for figure in [f for f in RUNS if f in opts.figures]:
        results[figure] = timed(partial(run_figure, figure, opts.repeat))
    if "rendezvous" in opts.figures:
        results["rendezvous"] = timed(lambda: run_rendezvous(opts.sizes, opts.repeat))
    for figure in [f for f in CHURN_FIGURES if f in opts.figures]:
        churn = timed(partial(run_figures, [figure], opts.quick, opts.repeat, say))
        results[figure] = {**churn[figure], "duration_s": churn["duration_s"]}
    for figure in [f for f in SNAPSHOT_FIGURES if f in opts.figures]:
        results.update(run_snapshot_figures([figure], opts.quick, opts.repeat, say))
    results["duration_s"] = round(time.monotonic() - start)
    return results


def wrote(paths: list[Path]) -> str:
    """`wrote A`, `wrote A and B`, `wrote A, B and C`."""
    names = [str(p) for p in paths]
    if len(names) < 2:
        return f"wrote {''.join(names) or 'nothing'}"
    return f"wrote {', '.join(names[:-1])} and {names[-1]}"


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    results = json.loads(opts.replot.read_text()) if opts.replot is not None else run(opts)
    print_table(results)
    written = []
    if opts.replot is None:
        (opts.out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
        written.append(opts.out / "bench.json")
    drawn = draw_all(results, opts.out)
    print(f"\n{wrote(written + drawn)}")
    if not drawn:
        print("(no plot: matplotlib is not installed in .venv)")
    return 0
