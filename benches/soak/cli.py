"""Soak the round liveness (elastic_worker.recovery.lossdetect) on a saturated machine: no healthy
member may be evicted.

    scripts/soak-false-evictions                 # 10 minutes, issue 12's acceptance run
    scripts/soak-false-evictions --minutes 3     # a shorter run
    scripts/soak-false-evictions --pods 4 --busy 8

Starts a private etcd (v2 API), PODS members of one round, each the worker's own
liveness code in its own process with a "training process" (`sleep`, with torch's
MASTER_ADDR/MASTER_PORT) announced by an attempt line, and BUSY python busy loops
(default: two per core) that keep every core saturated. Then, for MINUTES, it follows
etcd's events on the round (a watch on the directory): every refresh of a member's key
(the gap between two is how late a refresh came, by etcd's clock) and every lapse. It
reports the refresh gaps (median, p99, max) beside the TTL, and fails (exit 1) when a
member's key lapsed or a training process was stopped: a false eviction.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benches.procs import busy_loops, start_etcd
from benches.soak.watch import Events
from benches.stats import percentile
from benches.worker import ATTEMPT_PREFIX, timings

JOB = "soak"
MASTER = ("10.0.0.1", "29400")


@dataclass(frozen=True)
class Options:
    minutes: float
    pods: int
    busy: int


def attempt_line(pod: int, pods: int, pid: int) -> str:
    """The attempt line elastic-worker's shim writes for a training process (what a
    member's liveness watches)."""
    return (
        f"{ATTEMPT_PREFIX}run_id={JOB} restart=0 group_rank={pod} nodes={pods} "
        f"world_size={pods} pid={pid}\n"
    )


def report(gaps: list[float], lapses: int, stopped: int) -> tuple[list[str], bool]:
    """The soak's last lines, and whether a healthy member was evicted (a key lapsed or a
    training process was stopped)."""
    ranked, ttl = sorted(gaps), timings.ROUND_KEY_TTL
    lines = [
        f"soak: refresh gaps over {len(ranked)} refreshes: median "
        f"{statistics.median(ranked):.2f} s, p99 {percentile(ranked, 0.99):.2f} s, max "
        f"{ranked[-1]:.2f} s (TTL {ttl} s: margin {ttl - ranked[-1]:.2f} s)"
    ]
    evicted = lapses + stopped > 0
    lines.append(
        f"soak: {lapses} keys lapsed, {stopped} training processes stopped: "
        + ("no false eviction" if not evicted else "FALSE EVICTIONS")
    )
    return lines, evicted


def start_members(
    endpoint: str,
    pods: int,
    tmp: Path,
    members: list[subprocess.Popen[bytes]],
    programs: list[subprocess.Popen[bytes]],
) -> None:
    """PODS members of the round, each with its "training process" announced by an
    attempt line; each appended as it starts (so that a failure half-way stops those)."""
    for n in range(pods):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "ELASTIC_JOB_ID": JOB,
            "ELASTIC_RDZV_ENDPOINT": endpoint,
            "ELASTIC_MIN_NODES": "1",
            "ELASTIC_MAX_NODES": str(pods),
            "ELASTIC_INJECT_ENV": "/nonexistent",
            "POD_NAME": f"pod-{n}",
        }
        log = tmp / f"pod-{n}.attempts"
        err = (tmp / f"pod-{n}.log").open("wb")
        argv = [sys.executable, "-m", "benches.soak.member", str(log)]
        members.append(subprocess.Popen(argv, env=env, stderr=err))
        program = subprocess.Popen(
            ["sleep", "infinity"], env={"MASTER_ADDR": MASTER[0], "MASTER_PORT": MASTER[1]}
        )
        programs.append(program)
        time.sleep(0.2)  # exec'd before its environment is read
        log.write_text(attempt_line(n, pods, program.pid))


def soak(opts: Options) -> int:
    minutes, pods, busy = opts.minutes, opts.pods, opts.busy
    tmp = Path(tempfile.mkdtemp(prefix="soak-false-evictions-"))
    procs: list[subprocess.Popen[bytes]] = []
    programs: list[subprocess.Popen[bytes]] = []
    etcd, endpoint = start_etcd(tmp, who="soak-false-evictions")
    procs.append(etcd)
    round_dir = f"/elastic-job/{JOB}/rounds/{JOB}@{MASTER[0]}:{MASTER[1]}"
    events = Events(endpoint, round_dir)
    thread = threading.Thread(target=events.run, daemon=True)
    thread.start()
    try:
        start_members(endpoint, pods, tmp, procs, programs)
        procs += busy_loops(busy)
        print(
            f"soak: {pods} members (TTL {timings.ROUND_KEY_TTL} s, refresh every "
            f"{timings.ROUND_KEY_REFRESH:g} s), "
            f"{busy} busy loops on {os.cpu_count()} cores, {minutes:g} min; logs in {tmp}",
            flush=True,
        )
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            time.sleep(min(30.0, max(0.0, end - time.monotonic())))
            ended = sum(p.poll() is not None for p in programs)
            print(
                f"soak: {end - time.monotonic():4.0f} s left, load {os.getloadavg()[0]:.1f}, "
                f"{len(events.gaps)} refreshes, max gap {max(events.gaps, default=0):.2f} s, "
                f"{len(events.lapses)} lapses, {ended} training processes stopped",
                flush=True,
            )
    finally:
        events.stop.set()
        # A training process that ended before the cleanup below was stopped by the soak's
        # liveness: the only thing that stops one.
        stopped = [n for n, p in enumerate(programs) if p.poll() is not None]
        for p in [*procs[1:], *programs]:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
    etcd.terminate()
    etcd.wait(10)
    if not events.gaps:
        print("soak: no refresh seen: nothing was measured", file=sys.stderr)
        return 1
    lines, evicted = report(events.gaps, len(events.lapses), len(stopped))
    for line in lines:
        print(line)
    if evicted:
        return 1
    shutil.rmtree(tmp, ignore_errors=True)  # kept, with the members' logs, on a failure
    return 0


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--pods", type=int, default=3, help="members of the round (default 3)")
    parser.add_argument(
        "--busy",
        type=int,
        default=2 * (os.cpu_count() or 1),
        help="python busy loops (default: two per core)",
    )
    args = parser.parse_args(argv)
    return Options(args.minutes, args.pods, args.busy)


def main(argv: list[str] | None = None) -> int:
    return soak(parse(argv))
