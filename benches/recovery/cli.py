"""Measure how long a lost node costs an elastic torchrun job, and how many restarts.

    scripts/bench-recovery                       # torch defaults vs the project's settings
    scripts/bench-recovery --profile tuned --victim rank0 --repeat 3
    scripts/bench-recovery --profile baseline --victim other
    scripts/bench-recovery --profile tuned --backend both    # etcd-v2 and etcd-v3 side by side

Starts a private etcd (v2 API on for `--backend etcd-v2`, the default; off for etcd-v3,
torchrun then uses packages/torch-etcd-v3), three local torchrun agents (`--nnodes=2:3`, gloo, one
process each, the reference train.py), waits until the three train together, SIGKILLs
one agent and its worker (the group-rank-0 node or another one), and reports the time
from the kill to the survivors' first step in the re-formed group of two, the restarts
they used, and whether they trained on. Profiles:

  baseline  torch defaults (last_call_timeout=30, keep-alive 5 s x 3, monitor 0.1 s,
            shared agent TCPStore, process-group timeout 30 min)
  baseline-fixed-store  torch's rendezvous defaults, but without the shared agent
            TCPStore and with a 60 s process-group timeout
  design    the project's first tuning: baseline with last_call_timeout=2
  design2   its second: last_call_timeout=1, keep-alive 1 s x 2, monitor 0.1 s
  tuned-shared-store  tuned, but keeping torch's shared agent TCPStore
  tuned     the settings docs/recovery.md recommends: elastic-worker's defaults
            (elastic_worker.settings.definitions) and its TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
            train.py's 60 s process-group timeout
  tuned-warm  tuned, each training process started from a warm server that has imported
            torch (elastic-worker's default, job.warmStart.enabled), and a node stopped by
            SIGTERM leaving the round once its torchrun has exited, as elastic-worker does
            (elastic_worker/recovery/policy.py, round.py), and lifelines: each node's
            lifeline dies with it,
            and the others take its node out of the round (elastic_worker/recovery/lifelines/;
            each agent then has an address of its own, 127.0.0.10 upwards, as a pod has)
  tuned-warm-no-lifeline  tuned-warm without the lifelines
  tuned-warm-before  tuned-warm with the last call it had before it was measured down
            (last_call_timeout=2)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import cast

from benches.recovery.measure import Result, run_once
from benches.recovery.profiles import PROFILES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", default="all", help=f"all, or some of {', '.join(PROFILES)}, comma-separated"
    )
    parser.add_argument("--victim", choices=["rank0", "other", "both"], default="both")
    parser.add_argument(
        "--backend",
        choices=["etcd-v2", "etcd-v3", "etcd-lease", "both"],
        default="etcd-v2",
        help="torchrun's rendezvous backend (etcd-v3: on an etcd without the v2 API)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120, help="give up waiting after this")
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    parser.add_argument(
        "--stacks", action="store_true", help="on a hang, dump the survivors' agent stacks"
    )
    parser.add_argument(
        "--soak",
        type=float,
        metavar="MINUTES",
        help="no kill: saturate every core for MINUTES and count re-forms (false evictions)",
    )
    args = parser.parse_args(argv)
    profiles = list(PROFILES) if args.profile == "all" else args.profile.split(",")
    unknown = sorted(set(profiles) - set(PROFILES))
    if unknown:
        parser.error(
            f"--profile {','.join(unknown)}: not a profile; pick from {', '.join(PROFILES)}"
        )
    victims = ["rank0", "other"] if args.victim == "both" else [args.victim]
    backends = ["etcd-v2", "etcd-v3"] if args.backend == "both" else [args.backend]
    results: list[Result] = []
    for profile in profiles:
        for victim in victims:
            for _ in range(args.repeat):
                for backend in backends:  # side by side: the same machine load for both
                    prefix = f"bench-{profile}-{victim}-{backend}-"
                    workdir = Path(tempfile.mkdtemp(prefix=prefix))
                    result = run_once(
                        profile,
                        victim,
                        workdir,
                        args.timeout,
                        args.stacks,
                        backend=backend,
                        soak_minutes=args.soak or 0,
                    )
                    print(json.dumps(result), flush=True)
                    results.append(result)
                    if not args.keep:
                        shutil.rmtree(workdir, ignore_errors=True)
    summarize(results)
    ok = all(
        "error" not in r and not r.get("hung") and not r.get("false_evictions") for r in results
    )
    return 0 if ok else 1


def summarize(results: list[Result]) -> None:
    for line in summary_lines(results):
        print(line)


def summary_lines(results: list[Result]) -> list[str]:
    """Per soak, its counts; per profile (and backend), the survivors' time to train again
    (median, min-max) and the restarts they used."""
    out = []
    for r in results:
        if "soak_minutes" in r:
            out.append(
                f"soak {r['profile']}: {r['soak_minutes']:g} min, {r['busy_loops']} busy loops, "
                f"steps {r['steps']}, restarts {r['restarts']}: "
                f"{r['false_evictions']} false eviction(s)"
            )
    results = [r for r in results if "soak_minutes" not in r]
    if not results:
        return out
    out.append(f"\n{'profile':<22} {'runs':>4} {'median s':>9} {'min-max s':>12} {'restarts':>9}")
    for key in dict.fromkeys((str(r.get("profile")), str(r.get("backend"))) for r in results):
        profile = key[0] if key[1] == "etcd-v2" else f"{key[0]} ({key[1]})"
        times: list[float] = []
        restarts: set[int] = set()
        runs = [r for r in results if (r.get("profile"), r.get("backend")) == key]
        for r in runs:
            recovered = cast("dict[str, float]", r.get("recovered_s", {}))
            if recovered and not r.get("hung"):
                times.append(max(recovered.values()))  # the job trains when all survivors do
            restarts |= set(cast("dict[str, int]", r.get("restarts_used", {})).values())
        if not times:
            out.append(f"{profile:<22} {len(runs):>4} {'hung':>9}")
            continue
        spread = f"{min(times):.1f}-{max(times):.1f}"
        used = ",".join(str(n) for n in sorted(restarts))
        median = statistics.median(times)
        out.append(f"{profile:<22} {len(runs):>4} {median:>9.1f} {spread:>12} {used:>9}")
    return out
