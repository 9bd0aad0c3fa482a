"""The rendezvous at scale, the three backends side by side (scripts/bench-rendezvous):

    scripts/bench-rendezvous                          # N = 3, 32, 256, 1024; 3 repeats
    scripts/bench-rendezvous --agents 1024 --repeat 10 --backends etcd-lease
    scripts/bench-rendezvous --three-nodes            # the README's figures, each backend

For each N, each repeat runs every backend once, in turn (figure.py has the phases), so
that a slower stretch of the machine hits them alike. Prints the medians with each torch
backend's ratio to etcd-lease, and writes every run to --out (rendezvous.json), with the
machine's load at the start and end.
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
from pathlib import Path
from typing import Any

from benches.env import ROOT
from benches.rendezvous import three
from benches.rendezvous.figure import run_once
from benches.rendezvous.profiles import LABELS
from benches.rendezvous.report import markdown_lines, print_table, summarize

SIZES = "3,32,256,1024"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", default=SIZES, help=f"sizes, comma-separated ({SIZES})")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--backends", default=",".join(LABELS), help=f"comma-separated, of {', '.join(LABELS)}"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-rendezvous")
    parser.add_argument("--replot", type=Path, metavar="JSON", help="only the table of a run")
    parser.add_argument(
        "--markdown", action="store_true", help="the table as docs/rendezvous.md shows it"
    )
    parser.add_argument(
        "--three-nodes",
        action="store_true",
        help="instead: the README's figures at 3-4 real torchrun nodes on each backend (three.py)",
    )
    args = parser.parse_args(argv)
    if (
        not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", args.agents)
        or min(int(n) for n in args.agents.split(",")) < 3
    ):
        parser.error(f"--agents {args.agents}: give sizes of 3 or more, comma-separated")
    unknown = set(args.backends.split(",")) - set(LABELS)
    if unknown:
        parser.error(f"--backends: unknown {', '.join(sorted(unknown))}; use {', '.join(LABELS)}")
    return args


def run(sizes: list[int], repeat: int, backends: list[str], say: Any = print) -> dict[str, Any]:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "command": " ".join(["scripts/bench-rendezvous", *sys.argv[1:]]),
        "started": started,
        "rows": [],
    }
    for n in sizes:
        for _ in range(repeat):
            for label in backends:
                workdir = Path(tempfile.mkdtemp(prefix="bench-rdzv-"))
                load = round(os.getloadavg()[0], 2)
                row = {**run_once(label, n, workdir), "load": load}
                results["rows"].append(row)
                say(json.dumps(row), flush=True)
                shutil.rmtree(workdir, ignore_errors=True)
    results["machine"]["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["summary"] = summarize(results["rows"])
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.three_nodes:
        results = three.run(args.backends.split(","), args.repeat)
        (args.out / "three-nodes.json").write_text(json.dumps(results, indent=1) + "\n")
        for line in three.table_lines(results):
            print(line)
        return 0
    if args.replot is not None:
        results = json.loads(args.replot.read_text())
    else:
        sizes = [int(n) for n in args.agents.split(",")]
        results = run(sizes, args.repeat, args.backends.split(","))
        (args.out / "rendezvous.json").write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.out / 'rendezvous.json'}")
    if args.markdown:
        print("\n".join(markdown_lines(results)))
    else:
        print_table(results)
    return 0
