"""Hot spares under node failures: seconds from a loss until the job trains at its full
size again (`job.maxNodes`), with one spare pod and without, after a SIGKILL of a pod and
after its node goes down for good, through the local run of the chart.

    scripts/bench-spares                     # every row once, about 20 minutes, as root
    scripts/bench-spares --quick             # the durations shortened, about 8 minutes
    scripts/bench-spares --repeat 3 --json out/bench-spares.json
    scripts/bench-spares --rows kill-spare,node-down-reclaim

Each run: values-examples/cpu-smoke.yaml's workers (`--nnodes=2:3`) training train.py
(steps of 0.5 s): three, or four with a spare (the one that found the round full waits in
torch's redundancy list). At step 20 the pod at group rank 1 of the round (`rank:1`: one
that trains, never the spare) is SIGKILLed (the kubelet restarts its container after a
2 s back-off) or its node goes down for good (`--node-down`: its processes frozen and cut
off; the control plane's node-monitor-grace-period, 50 s by default). With `reclaim` the
chart's nodeLoss.reclaim is on (afterSeconds 30 by default): a survivor force-deletes the
lost pod once its node is NotReady and the StatefulSet makes it again on another node. The
baseline of each fault is the row without a spare and without reclaim: Kubernetes alone,
in the same run of the bench.

Per run: `back_at_max` seconds from the fault to the first rendezvous round at world size
3 (cut at --bound: "> bound"); `rounds_after` the rounds formed after that one until the
end of the watch (--watch seconds after it, or after the recreated pod started): 0 when
the pod made again waits as the next spare instead of re-forming the job, i.e. the spare
is not counted twice; `max_world` the largest world size seen (never above 3).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benches.churn.localrun import LocalRun, needs_root
from benches.stats import summary_cut

MAX = 3
VICTIM = "rank:1"  # the pod at group rank 1 when the fault fires: one that trains
FAULT_AT = 20  # steps: 10 s of training, by which the spare waits in the redundancy list
_ROUND = re.compile(r"^rendezvous round \d+: world size (\d+) ")


@dataclass(frozen=True)
class Row:
    name: str
    fault: str  # kill or node-down
    spare: bool
    reclaim: bool
    baseline: bool = False


ROWS = {
    r.name: r
    for r in (
        Row("kill", "kill", spare=False, reclaim=False, baseline=True),
        Row("kill-spare", "kill", spare=True, reclaim=False),
        Row("node-down", "node-down", spare=False, reclaim=False, baseline=True),
        Row("node-down-reclaim", "node-down", spare=False, reclaim=True),
        Row("node-down-spare", "node-down", spare=True, reclaim=False),
        Row("node-down-spare-reclaim", "node-down", spare=True, reclaim=True),
    )
}


@dataclass(frozen=True)
class Settings:
    bound: float  # seconds after the fault a row may take to be back at 3
    watch: float  # seconds watched after it (or after the recreated pod started)
    grace: float  # the control plane's node-monitor-grace-period
    reclaim_after: float  # nodeLoss.reclaim.afterSeconds


# --quick: as a test shortens them (tests/e2e/test_e2e_nodes.py): a node NotReady 10 s
# after its kubelet stopped, reclaimed 5 s later; the slot-back figures then stand for
# grace + afterSeconds less than a cluster's (50 + 30 s).
QUICK = Settings(bound=120.0, watch=20.0, grace=10.0, reclaim_after=5.0)


def values(row: Row, s: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {
        "job": {
            "command": [
                "python", "/opt/elastic-worker/examples/train.py", "--steps", "2000",
                "--checkpoint-every", "10", "--step-seconds", "0.5",
            ],
            "minNodes": 2,
            "maxNodes": MAX,
        },
        "workerGroups": {"default": {"replicas": MAX + 1 if row.spare else MAX}},
        "nodeLoss": {"reclaim": {"enabled": row.reclaim, "afterSeconds": s.reclaim_after}},
    }  # fmt: skip
    return out


def faults(row: Row, s: Settings) -> list[str]:
    out = [f"--node-monitor-grace-period={s.grace:g}"]
    if row.fault == "kill":
        out.append(f"--kill={VICTIM}@step={FAULT_AT}")
    else:
        out.append(f"--node-down=pod:{VICTIM}@step={FAULT_AT}")
    return out


def rounds(run: LocalRun) -> list[tuple[float, int]]:
    """(time, world size) of every rendezvous round the runner announced."""
    out = []
    for t, text in list(run.events):
        m = _ROUND.match(text)
        if m:
            out.append((t, int(m[1])))
    return out


def first_after(run: LocalRun, needle: str, since: float) -> float | None:
    """When the runner first said `needle` after `since`."""
    return next((t for t, text in list(run.events) if t > since and needle in text), None)


def measure(run: LocalRun, row: Row, s: Settings, say: Callable[[str], None]) -> dict[str, Any]:
    """Wait for the fault, then for the world size back at 3 (at most `bound` s), then watch."""
    result: dict[str, Any] = {"row": row.name}
    fault_at = None
    while fault_at is None and not run.ended():
        time.sleep(0.5)
        fault_at = run.event_at("FAULT ")
    if fault_at is None:
        return {**result, "error": "the run ended before the fault"}
    back: float | None = None
    watch_until = fault_at + s.bound
    while time.monotonic() < watch_until and not run.ended():
        time.sleep(0.5)
        if back is None:
            back = next((t for t, n in rounds(run) if t > fault_at and n == MAX), None)
            if back is not None:
                watch_until = back + s.watch
        if back is not None and row.fault == "node-down" and row.reclaim:
            # watch until the pod made again has had time to join (or to wait as a spare)
            gone = first_after(run, ": force-deleted", fault_at)
            if gone is not None:
                victim = next(e for t, e in list(run.events) if t == gone).split(":")[0]
                made = first_after(run, f"{victim}: container worker started on", gone)
                if made is not None:
                    watch_until = max(watch_until, made + s.watch)
    after = [n for t, n in rounds(run) if back is not None and t > back]
    seen = [n for _, n in rounds(run)]
    result.update(
        back_at_max=None if back is None else round(back - fault_at, 2),
        timed_out=back is None,
        rounds_after=len(after),
        max_world=max(seen) if seen else None,
    )
    if run.ended() and back is None:
        tail = run.tail().splitlines()
        result["error"] = "the run ended first: " + (tail[-1] if tail else "")
    say(json.dumps(result))
    return result


def one_run(row: Row, s: Settings, say: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-spares-") as tmp:
        run = LocalRun.start(Path(tmp), values(row, s), faults(row, s), timeout=900)
        try:
            return measure(run, row, s, say)
        finally:
            run.stop()


def table(rows: dict[str, list[dict[str, Any]]], s: Settings) -> list[str]:
    lines = [
        f"{'row':26s} {'back at 3 (s)':>22s} {'re-forms after':>15s} {'max world':>10s}",
    ]
    for name, runs in rows.items():
        st = summary_cut(runs, "back_at_max")
        if st["median"] is None:
            shown = f"> {s.bound:g}" if st.get("timed_out") else "-"
        else:
            shown = f"{st['median']:.1f} ({st['min']:.1f}-{st['max']:.1f})"
        after = max((r.get("rounds_after") or 0) for r in runs) if runs else "-"
        world = max((r.get("max_world") or 0) for r in runs) if runs else "-"
        base = " (baseline)" if ROWS[name].baseline else ""
        lines.append(f"{name + base:26s} {shown:>22s} {after!s:>15s} {world!s:>10s}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    q = QUICK
    p.add_argument("--rows", default=",".join(ROWS), help="rows to run, comma-separated")
    p.add_argument("--repeat", type=int, default=1, help="runs per row (default 1)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"the control plane's and the chart's durations shortened (grace {q.grace:g} s, "
            f"reclaim after {q.reclaim_after:g} s, bound {q.bound:g} s, watch {q.watch:g} s)"
        ),
    )
    p.add_argument("--bound", type=float, help="seconds a row may take (default 240)")
    p.add_argument("--watch", type=float, help="seconds watched after it (default 30)")
    p.add_argument("--grace", type=float, help="node-monitor-grace-period (Kubernetes: 50)")
    p.add_argument("--reclaim-after", type=float, help="nodeLoss.reclaim.afterSeconds (30)")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"--rows: no row {unknown[0]!r}; the rows are {', '.join(ROWS)}")
    if why := needs_root():
        print(f"bench-spares: {why}", file=sys.stderr)
        return 2
    base = q if args.quick else Settings(240.0, 30.0, 50.0, 30.0)
    s = Settings(
        base.bound if args.bound is None else args.bound,
        base.watch if args.watch is None else args.watch,
        base.grace if args.grace is None else args.grace,
        base.reclaim_after if args.reclaim_after is None else args.reclaim_after,
    )
    print(
        f"bench-spares: node-monitor-grace-period {s.grace:g} s, reclaim after {s.reclaim_after:g}"
        f" s, bound {s.bound:g} s, watch {s.watch:g} s",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(args.repeat):
        for name in names:
            results[name].append(one_run(ROWS[name], s, lambda t: print(t, flush=True)))
    for line in table(results, s):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    failed = [r for runs in results.values() for r in runs if r.get("error")]
    return 1 if failed else 0
