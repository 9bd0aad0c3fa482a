"""One run of the rendezvous figure: N agents of one backend against a private etcd, with
the chart's settings for a job of that size, through four phases:

  bring-up   every agent joins at once: seconds until every agent holds its rank
  heartbeat  HEARTBEAT_WINDOW s of training: what heartbeats and torch's polling of
             num_nodes_waiting cost, and the connections each agent holds
  kill       one agent's process SIGKILLed: its lifelines close and the worker's loss
             handling for the backend runs (figure: LOSS), every survivor joins again
             within a monitor interval (its workers failed): seconds until every survivor
             holds its rank in the next round
  silent     another agent's process SIGSTOPped (its sockets open, its heartbeats
             stopped): elastic-worker's loss detection (a key of ROUND_KEY_TTL s) sends
             every survivor still in its round to the next one when it lapses;
             etcd-lease's own members see its lease lapse first (a survivor that has
             re-formed without it is left alone, as the worker leaves it): seconds until
             every survivor holds its rank again

The agents are threads in AGENT_PROCESSES processes (agents.py); each victim is alone in
its own. min_nodes is N-2, so that the round forms again after both losses; max_nodes N.

What it leaves out: the training processes (their start, their process group), the
store's rank assignment and exit barrier after a round (torch's agent runs them after
next_rendezvous returns; etcd-lease gives the master's address in the decision), the
worker's loss-detection keys of every node but the victim's (the figure models their
timing with the victim's key alone; every pod reads the round's keys every 0.5 s in the
worker, O(n) each), and lifelines of every node to every other (torch's backends: the
worker holds n-1 per node; here the survivors hold theirs to the victims only, and the
connection figure counts the rest).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benches.env import ROOT, VENV_PYTHON
from benches.procs import start_etcd
from benches.rendezvous.profiles import Profile, profile
from benches.worker import timings

#: Agents per process at most AGENT_PROCESSES processes (and a process per victim).
AGENT_PROCESSES = 16
#: Seconds a phase may take before the run counts it as not converged.
PHASE_LIMIT_S = 60.0
#: Seconds of training measured for the heartbeat figure.
HEARTBEAT_WINDOW = 5.0
#: Seconds after a phase before the next: every agent back to training.
SETTLE_S = 2.0
#: Lifelines each etcd-lease node holds: to the next ones by rank (a ring).
LEASE_LIFELINES = 2
#: elastic-worker's loss detection, as the chart sets it (recovery/lossdetect.py):
#: a key of ROUND_KEY_TTL s refreshed every second, read every LOSS_POLL s.
LOSS_POLL = timings.ROUND_POLL
POLL = 0.25  # seconds between the driver's reports
#: Where etcd keeps its data during a run: tmpfs where there is one.
MEMORY_DIR = "/dev/shm" if Path("/dev/shm").is_dir() else None


class Proc:
    """One agents process: its pipe, the agents it runs, whether it is a victim."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str]) -> None:
        argv = [str(VENV_PYTHON), "-m", "benches.rendezvous.agents", json.dumps(spec)]
        pipe = subprocess.PIPE
        self.spec = spec
        self.proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, text=True, stdin=pipe, stdout=pipe, bufsize=1
        )
        self.ready: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.numbers = list(range(spec["first"], spec["first"] + spec["count"]))

    def start(self) -> bool:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            return False
        self.ready = json.loads(line)
        return True

    def send(self, line: str) -> None:
        with self.lock:
            self._send(line)

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def report(self) -> dict[str, Any]:
        with self.lock:  # the loss detection's thread sends too
            self._send("report")
            assert self.proc.stdout is not None
            return dict(json.loads(self.proc.stdout.readline()))

    def stop(self) -> None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                break
        self.proc.wait()


def shares(agents: int, processes: int) -> list[int]:
    """How many agents each process runs: as even as integers allow, all of them."""
    return [(agents * (i + 1)) // processes - (agents * i) // processes for i in range(processes)]


class Run:
    """One run of `prof` at `n` agents: its etcd, its processes, its phases."""

    def __init__(self, prof: Profile, n: int, workdir: Path) -> None:
        self.prof, self.n, self.workdir = prof, n, workdir
        # etcd's data in memory: the figures measure the cores, not the fsyncs of a disk
        # the machine's other users write to (a stall there stalls etcd's every write).
        self.data = Path(tempfile.mkdtemp(prefix="bench-rdzv-etcd-", dir=MEMORY_DIR))
        self.etcd, self.endpoint = start_etcd(workdir, v2=prof.backend == "etcd-v2", data=self.data)
        self.run_id = f"rdzv-{n}"
        self.loss_key = f"/bench/alive/{self.run_id}/"
        env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="WARNING")
        base = {
            "backend": prof.backend,
            "endpoint": self.endpoint,
            "run_id": self.run_id,
            "min": max(1, n - 2),
            "max": n,
            "conf": prof.conf(n),
            "monitor": prof.monitor,
        }
        survivors = n - 2
        self.procs: list[Proc] = []
        first = 0
        for count in shares(survivors, min(AGENT_PROCESSES, survivors)):
            self.procs.append(Proc({**base, "first": first, "count": count}, env))
            first += count
        self.victims = []
        for what in ("kill", "silent"):
            spec = {**base, "first": first, "count": 1, "victim": True}
            self.victims.append(Proc({**spec, "loss_key": self.loss_key + what}, env))
            first += 1
        self.all = [*self.procs, *self.victims]

    def stop(self) -> None:
        for p in self.all:
            p.stop()
        self.etcd.terminate()
        self.etcd.wait(10)
        shutil.rmtree(self.data, ignore_errors=True)

    def reports(self, procs: list[Proc]) -> list[dict[str, Any]]:
        return [p.report() for p in procs]

    def wait_ranked(
        self, procs: list[Proc], since: float, world: int
    ) -> tuple[float | None, list[dict[str, Any]]]:
        """Poll until every agent of `procs` holds a rank it got after `since` in a world
        of `world` with distinct ranks: (the seconds from `since` to the last of them, or
        None when PHASE_LIMIT_S passed first; the last reports)."""
        deadline = since + PHASE_LIMIT_S
        while True:
            reports = self.reports(procs)
            rows = [row for r in reports for row in r["agents"]]
            ranked = [r for r in rows if r[1] > since and r[3] == world and not r[4]]
            if len(ranked) == len(rows) and len({r[2] for r in ranked}) == world:
                return max(r[1] for r in ranked) - since, reports
            if time.time() > deadline:
                return None, reports
            time.sleep(POLL)


def spread(reports: list[dict[str, Any]], since: float) -> list[float]:
    """When the first, the median and the last agent got their rank, s after `since`."""
    done = sorted(row[1] - since for r in reports for row in r["agents"] if row[1] > since)
    if not done:
        return []
    return [round(done[0], 2), round(done[len(done) // 2], 2), round(done[-1], 2)]


def _failures(reports: list[dict[str, Any]]) -> int:
    """next_rendezvous calls that failed so far (each: torchrun started again)."""
    return sum(row[6] for r in reports for row in r["agents"])


def _totals(reports: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": {}, "writes": {}, "written": {}, "heartbeats": 0}
    out["slowest_beat"] = 0.0
    for r in reports:
        counts = r["counts"]
        out["heartbeats"] += counts["heartbeats"]
        out["slowest_beat"] = max(out["slowest_beat"], counts.get("slowest_beat", 0.0))
        for key in ("requests", "writes", "written"):
            for role, value in counts[key].items():
                out[key][role] = out[key].get(role, 0) + value
    return out


def _diff(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"heartbeats": after["heartbeats"] - before["heartbeats"]}
    for key in ("requests", "writes", "written"):
        out[key] = {role: after[key].get(role, 0) - before[key].get(role, 0) for role in after[key]}
    return out


def _per(
    total: dict[str, Any], agents: int, roles: tuple[str, ...] | None = None
) -> dict[str, float]:
    """Requests and bytes written per agent (of `roles`, else all)."""

    def pick(d: dict[str, int]) -> int:
        return sum(v for k, v in d.items() if roles is None or k in roles)

    return {
        "requests": round(pick(total["requests"]) / agents, 1),
        "written_bytes": round(pick(total["written"]) / agents),
    }


def lifeline_holders(
    prof: Profile,
    reports: list[dict[str, Any]],
    victim: int,
) -> list[int]:
    """Who holds a lifeline to agent `victim`: every other agent (torch's backends, as
    elastic-worker's lifelines are all-to-all), or the LEASE_LIFELINES agents before it
    in rank order (etcd-lease's ring: each node watches the next ones)."""
    rows = [row for r in reports for row in r["agents"]]
    if prof.backend != "etcd-lease":
        return [r[0] for r in rows if r[0] != victim]
    by_rank = sorted(rows, key=lambda r: r[2])
    at = next(i for i, r in enumerate(by_rank) if r[0] == victim)
    size = len(by_rank)
    return [by_rank[(at - i) % size][0] for i in range(1, min(LEASE_LIFELINES, size - 1) + 1)]


def hold_lifelines(run: Run, reports: list[dict[str, Any]], victim: Proc) -> None:
    """The lifelines to `victim`, held once every holder has connected."""
    number = victim.numbers[0]
    node = next(row[5] for r in reports for row in r["agents"] if row[0] == number)
    victim_info = {"addr": "127.0.0.1", "pid": victim.ready["pid"], "node": node}
    info = json.dumps(victim_info, separators=(",", ":"))  # one word of the command
    holders = set(lifeline_holders(run.prof, reports, number))
    held = sum(r["lifelines"] for r in reports)
    port = victim.ready["lifeline_port"]
    for p in run.all:
        mine = [n for n in p.numbers if n in holders]
        if mine:
            p.send(f"lifeline 127.0.0.1 {port} {info} {','.join(map(str, mine))}")
    deadline = time.time() + PHASE_LIMIT_S
    while time.time() < deadline:
        live = [p for p in run.all if p.proc.poll() is None]
        if sum(r["lifelines"] for r in run.reports(live)) >= held + len(holders):
            return
        time.sleep(POLL)


def _send_all(procs: list[Proc], line: str) -> None:
    for p in procs:
        p.send(line)


def loss_detected(
    run: Run, what: str, since: float, on_lapse: Callable[[], None]
) -> threading.Thread:
    """elastic-worker's loss detection, reduced to the victim's key: its lapse, seen at
    the next LOSS_POLL, sends every survivor to the next round."""
    from torch_etcd_v3.client import ClientSettings, EtcdClient  # noqa: PLC0415

    host, port = run.endpoint.rsplit(":", 1)
    client = EtcdClient(ClientSettings(host, int(port), None, 5))
    key = (run.loss_key + what).encode()

    def watch() -> None:
        while time.time() < since + PHASE_LIMIT_S:
            time.sleep(LOSS_POLL)
            if client.get(key)[0] is None:
                on_lapse()
                return

    thread = threading.Thread(target=watch, name="loss-detect", daemon=True)
    thread.start()
    return thread


def bring_up(run: Run, row: dict[str, Any]) -> str | None:
    """Every agent joins at once; None, or why the phase did not converge."""
    n = run.n
    before = _totals(run.reports(run.all))
    start = time.time()
    for p in run.all:
        p.send("join")
    seconds, reports = run.wait_ranked(run.all, start, n)
    row["join"] = _per(_diff(_totals(reports), before), n)
    row["bringup_spread"] = spread(reports, start)
    row["failed_joins"] = _failures(reports)
    if seconds is None:
        ranked = sum(1 for r in reports for a in r["agents"] if a[1] > start)
        return f"bring-up: {ranked} of {n} ranked in {PHASE_LIMIT_S:.0f} s"
    row["bringup_s"] = round(seconds, 2)
    return None


def train(run: Run, row: dict[str, Any]) -> None:
    """HEARTBEAT_WINDOW s of training: heartbeats, num_nodes_waiting, connections."""
    n = run.n
    for p in run.all:
        p.send("train")
    time.sleep(SETTLE_S)
    quiet0 = _totals(run.reports(run.all))
    time.sleep(HEARTBEAT_WINDOW)
    reports = run.reports(run.all)
    quiet = _diff(_totals(reports), quiet0)
    beats = max(quiet["heartbeats"], 1)
    row["heartbeat"] = {
        "bytes_per_beat": round(quiet["written"].get("heartbeat", 0) / beats),
        "requests_per_beat": round(quiet["requests"].get("heartbeat", 0) / beats, 2),
        "beats_per_agent_s": round(quiet["heartbeats"] / n / HEARTBEAT_WINDOW, 2),
        "monitor_requests_per_agent_s": round(
            quiet["requests"].get("monitor", 0) / n / HEARTBEAT_WINDOW, 2
        ),
    }
    row["etcd_sockets_per_agent"] = round(
        sum(r["sockets"] for r in reports[: len(run.procs)]) / (n - 2), 2
    )
    row["lifelines_per_agent"] = (
        n - 1 if run.prof.backend != "etcd-lease" else min(LEASE_LIFELINES, n - 1)
    )


def lose(
    run: Run, row: dict[str, Any], what: str, victim: Proc, survivors: list[Proc]
) -> str | None:
    """`victim` SIGKILLed ("kill") or SIGSTOPped ("silent"); None, or why the survivors
    did not re-form."""
    world = sum(len(p.numbers) for p in survivors)
    live = [p for p in run.all if p.proc.poll() is None]
    hold_lifelines(run, run.reports(live), victim)
    before = _totals(run.reports(survivors))
    at = time.time()
    if what == "kill":
        os.kill(victim.proc.pid, signal.SIGKILL)
        _send_all(survivors, "reform")  # their workers failed with the victim's sockets
    else:
        os.kill(victim.proc.pid, signal.SIGSTOP)
        # only the survivors still in the lost node's round: one re-formed without it (on
        # etcd-lease, once its lease lapsed) reads the members of its new round
        loss_detected(run, what, at, partial(_send_all, survivors, f"reform {at}"))
    seconds, reports = run.wait_ranked(survivors, at, world)
    row[what] = _per(_diff(_totals(reports), before), world)
    row[f"{what}_spread"] = spread(reports, at)
    row["failed_joins"] = _failures(reports)
    row["slowest_beat_s"] = _totals(reports)["slowest_beat"]
    if seconds is None:
        ranked = sum(1 for r in reports for a in r["agents"] if a[1] > at and a[3] == world)
        return f"{what}: {ranked} of {world} ranked in {PHASE_LIMIT_S:.0f} s"
    row[f"{what}_s"] = round(seconds, 2)
    time.sleep(SETTLE_S)
    return None


def run_once(label: str, n: int, workdir: Path) -> dict[str, Any]:
    """One run of every phase; the row: seconds and per-agent costs, or the phase that did
    not converge (`error`) and what the others had reached."""
    prof = profile(label)
    run = Run(prof, n, workdir)
    row: dict[str, Any] = {"label": label, "backend": prof.backend, "agents": n}
    row["conf"] = prof.conf(n)
    try:
        if not all(p.start() for p in run.all):
            return {**row, "error": "an agent process failed to start"}
        error = bring_up(run, row)
        if error is not None:
            return {**row, "error": error}
        train(run, row)
        kill_victim, silent_victim = run.victims
        for what, victim, survivors in (
            ("kill", kill_victim, [*run.procs, silent_victim]),
            ("silent", silent_victim, run.procs),
        ):
            error = lose(run, row, what, victim, survivors)
            if error is not None:
                return {**row, "error": error}
        return row
    finally:
        run.stop()
