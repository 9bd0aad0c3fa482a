"""One run of the rendezvous figure: N agents (RDZV_PROCESSES processes of threads)
joining one round against a private etcd; the seconds until the last has joined, and
what it took (etcd writes, lost compare-and-sets, evictions) per agent."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.env import VENV_PYTHON
from benches.procs import start_etcd
from benches.stats import summary
from benches.worker import rdzv_conf_default

# The rendezvous figure's profiles: (backend, --rdzv-conf for a job of `agents` nodes).
# elastic-job is the worker's default for a job of that size (its keep-alive interval
# grows with the job: elastic_worker.settings.schema.keep_alive_interval); on etcd-v3 it is the
# project's own backend (torch-etcd-v3, which backs off after a lost compare-and-set).
RDZV_PROFILES: dict[str, tuple[str, Callable[[int], str]]] = {
    "torch defaults": ("etcd-v2", lambda agents: ""),
    "elastic-job": ("etcd-v2", rdzv_conf_default),
    "elastic-job etcd-v3": ("etcd-v3", rdzv_conf_default),
}
#: Seconds a rendezvous may take before the run counts as failed: torch's protocol either
#: completes in seconds or, once heartbeats stop landing, evicts and re-admits agents
#: without end (docs/notes/2026-11-25-rendezvous-at-scale.md).
RDZV_LIMIT_S = 60.0
#: Agents per process: several threads share one interpreter, as in the brief's figure;
#: more processes (true parallelism on the same two cores) only add contention.
RDZV_PROCESSES = 8
WRITES = ("setsSuccess", "compareAndSwapSuccess", "createSuccess", "updateSuccess")


def etcd_writes(endpoint: str, backend: str) -> int:
    """Successful writes to etcd so far: the v2 store's counters, or the v3 revision (each
    v3 write, and only a write, advances it)."""
    if backend == "etcd-v3":
        request = urllib.request.Request(
            f"http://{endpoint}/v3/kv/range",
            data=json.dumps({"key": "AA=="}).encode(),  # any key: the header has the revision
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(json.load(resp)["header"]["revision"])
    with urllib.request.urlopen(f"http://{endpoint}/v2/stats/store", timeout=5) as resp:
        stats = json.load(resp)
    return sum(int(stats.get(k, 0)) for k in WRITES)


def shares(agents: int, processes: int) -> list[int]:
    """How many agents each process runs: as even as integers allow, all of them."""
    return [(agents * (i + 1)) // processes - (agents * i) // processes for i in range(processes)]


def rendezvous_once(label: str, agents: int, workdir: Path) -> dict[str, Any]:
    backend, conf = RDZV_PROFILES[label]
    etcd, endpoint = start_etcd(workdir)
    procs: list[subprocess.Popen[str]] = []
    row: dict[str, Any] = {"label": label, "agents": agents, "backend": backend}
    try:
        env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="WARNING")
        for count in shares(agents, min(RDZV_PROCESSES, agents)):
            argv = [str(VENV_PYTHON), "-m", "benches.rendezvous.agents", backend, endpoint]
            argv += [f"rdzv-{agents}", str(agents), str(count), conf(agents), str(RDZV_LIMIT_S)]
            pipe = subprocess.PIPE
            procs.append(subprocess.Popen(argv, env=env, text=True, stdin=pipe, stdout=pipe))
        for proc in procs:  # every process has imported torch and built its handlers
            assert proc.stdout is not None
            if proc.stdout.readline() != "ready\n":
                return {**row, "error": "an agent process failed"}
        writes0 = etcd_writes(endpoint, backend)
        start_at = time.time()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        stamps: list[float] = []
        counts = {"won": 0, "lost": 0, "evicted": 0}
        for proc in procs:
            assert proc.stdout is not None
            out = json.loads(proc.stdout.readline() or "{}")
            stamps += out.get("done", [])
            for key in counts:
                counts[key] += int(out.get(key, 0))
        writes = etcd_writes(endpoint, backend) - writes0
        row.update(
            processes=len(procs),
            conf=conf(agents),
            writes_per_agent=round(writes / agents, 1),
            lost_cas_per_agent=round(counts["lost"] / agents, 1),
            evictions=counts["evicted"],
        )
        if len(stamps) < agents:
            return {**row, "error": f"{len(stamps)} of {agents} joined in {RDZV_LIMIT_S:.0f} s"}
        return {**row, "seconds": round(max(stamps) - start_at, 2)}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        etcd.terminate()
        etcd.wait(10)


def rdzv_summary(rows: list[dict[str, Any]], label: str, agents: int) -> dict[str, Any]:
    """Seconds to join, and the medians of what it took: etcd writes and lost
    compare-and-sets per agent, evictions of agents that had joined."""
    runs = [r for r in rows if r["label"] == label and r["agents"] == agents]
    medians = {k: summary(runs, k)["median"] for k in ("writes_per_agent", "lost_cas_per_agent")}
    return {**summary(runs), **medians, "evictions": summary(runs, "evictions")["median"]}
