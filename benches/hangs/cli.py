"""What a hung rank costs a job: the seconds from the hang until it trains again, with
hang detection on (the chart's hangDetection.*) beside torch's defaults.

    scripts/bench-hangs                          # both hangs, 3 repeats, a 120 s cap
    scripts/bench-hangs --how outside --repeat 1
    scripts/bench-hangs --floor 5                # hangDetection.floorSeconds=5 (default 30)

  outside           rank 1 of 3 blocks forever outside any collective (a read that never
                    returns) while the others wait for it in DDP's all-reduce
  side-collective   rank 1 of 3 blocks in an all-reduce on a group whose other member
                    never calls it, while the others wait in DDP's all-reduce

The script (tests/e2e/user_script/stalls.py) sets no process-group timeout: with torch's
defaults the job waits gloo's 1800 s, or forever outside a collective, so those runs stop
at the cap (`--cap`). Figures are comparable only within one run. Writes --json (default
out/bench/hangs.json) and prints the table; each run is printed as it ends.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benches.env import ROOT, report
from benches.hangs.measure import HOWS, STEP_SECONDS, VARIANTS, hang_once
from benches.stats import summary_cut

#: torch's bound on a collective that never completes, with gloo and no timeout set.
GLOO_DEFAULT_TIMEOUT = 1800


def table_lines(results: dict[str, Any]) -> list[str]:
    cap = results["cap_s"]
    out = [
        f"\nseconds from a hang (rank 1 of 3) until the job trains again "
        f"(steps of {STEP_SECONDS:g} s; {results['bound']})",
        f"{'hang':<18} {'torch defaults':>44} {'elastic-job':>26}  named after",
    ]
    for how, by_label in results["summary"].items():
        base, ours = by_label["torch defaults"], by_label["elastic-job"]
        if base["median"] is None and base.get("timed_out"):
            b = f"not recovered within {cap:g} s (n={base['runs']})"
        else:
            b = _figure(base)
        named = ours.get("named_s", {}).get("median")
        named_text = f"{named:.1f} s" if named is not None else "-"
        out.append(f"{how:<18} {b:>44} {_figure(ours):>26}  {named_text}")
    out.append(
        f"torch's default bound: gloo's {GLOO_DEFAULT_TIMEOUT} s inside a collective; "
        "none outside one (forever)"
    )
    return out


def _figure(s: dict[str, Any]) -> str:
    if s["median"] is None:
        return f"failed (n={s['runs']})"
    return f"{s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f}), n={s['runs']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--how", action="append", choices=HOWS, default=[])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cap", type=float, default=120.0, help="seconds to wait without it")
    parser.add_argument("--floor", type=float, help="hangDetection.floorSeconds (default 30)")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "bench" / "hangs.json")
    args = parser.parse_args(argv)
    env = {} if args.floor is None else {"ELASTIC_HANG_FLOOR": f"{args.floor:g}"}
    floor = "the default floor" if args.floor is None else f"floor {args.floor:g} s"
    started = time.monotonic()
    rows = []
    for _ in range(args.repeat):
        for how in args.how or list(HOWS):
            for label in VARIANTS:  # alternating: a loaded machine weighs on both
                workdir = Path(tempfile.mkdtemp(prefix="bench-hangs-"))
                rows.append(hang_once(how, label, workdir, args.cap, env))
                print(rows[-1], flush=True)
    results: dict[str, Any] = {
        "command": " ".join(["scripts/bench-hangs", *(argv or [])]),
        "cap_s": args.cap,
        "bound": f"hang detection's bound: 20 x the step time, {floor}",
        "rows": rows,
        "summary": {
            how: {
                label: {
                    **summary_cut(
                        [r for r in rows if (r["how"], r["label"]) == (how, label)], "seconds"
                    ),
                    "named_s": summary_cut(
                        [r for r in rows if (r["how"], r["label"]) == (how, label)], "named_s"
                    ),
                }
                for label in VARIANTS
            }
            for how in args.how or list(HOWS)
        },
        "duration_s": round(time.monotonic() - started),
        "load_average": round(os.getloadavg()[0], 1),
    }
    report(args.json, results, table_lines(results))
    return 0
