"""One run of bench-recovery: the agents brought up, then a loss timed until the
survivors train again (or a bring-up, a scale-up, a soak), reduced to a JSON row."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import cast

from benches.procs import busy_loops
from benches.recovery.agent import Agent, wait_training
from benches.recovery.job import Job
from benches.worker import rounds

Result = dict[str, object]


def rendezvous_state(endpoint: str, backend: str = "etcd-v2") -> Result:
    """Diagnostics only: torch 2.13's pickled rendezvous state, summarised (round,
    complete, participants, seconds since each node's last heartbeat). etcd-v2 keeps it
    base64-encoded in a v2 key; etcd-v3 base64-encoded as the value of a v3 key."""
    import base64  # noqa: PLC0415 - diagnostics
    import pickle  # noqa: PLC0415
    from datetime import datetime, timezone  # noqa: PLC0415

    key = "/torch/elastic/rendezvous/bench"
    try:
        if backend == "etcd-v3":
            body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
            req = urllib.request.Request(f"http://{endpoint}/v3/kv/range", body)
            with urllib.request.urlopen(req, timeout=5) as resp:
                stored = base64.b64decode(json.loads(resp.read())["kvs"][0]["value"])
                raw = base64.b64decode(stored)
        else:
            with urllib.request.urlopen(f"http://{endpoint}/v2/keys{key}", timeout=5) as resp:
                raw = base64.b64decode(json.loads(resp.read())["node"]["value"])
        state = pickle.loads(raw)  # our own etcd, torch wrote it
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        return {"error": str(exc)}
    now = datetime.now(timezone.utc)
    return {
        "round": state.round,
        "complete": state.complete,
        "participants": {str(n): r for n, r in state.participants.items()},
        "heartbeat_age_s": {
            str(n): round((now - t).total_seconds(), 1) for n, t in state.last_heartbeats.items()
        },
    }


def soak(profile: str, agents: list[Agent], minutes: float) -> Result:
    """Nobody fails: with every core saturated (two busy loops per core) for `minutes`,
    any re-form is a healthy node dropped (a keep-alive that came too late)."""
    since = time.monotonic()
    first = {a.name: a.steps()[-1][3] for a in agents}
    busy = busy_loops(2 * (os.cpu_count() or 1))
    try:
        time.sleep(minutes * 60)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    rounds = {
        a.name: sum(
            1 for stamp, line in list(a.lines) if stamp >= since and "Rendezvous complete" in line
        )
        for a in agents
    }
    restarts = {a.name: a.steps()[-1][3] - first[a.name] for a in agents}
    return {
        "profile": profile,
        "soak_minutes": minutes,
        "busy_loops": len(busy),
        "steps": {a.name: len(a.steps(since)) for a in agents},
        "new_rounds": rounds,
        "restarts": restarts,
        "false_evictions": max(restarts.values()),
    }


def watch_recovery(
    survivors: list[Agent], since: float, timeout: float, world: int, before: dict[str, int]
) -> dict[str, Result]:
    """Until every survivor has trained 3 steps at `world` (or `timeout`): per survivor, the
    seconds to its first step, restarts used, its phases and the steps lost. `before`: each
    agent's restart count at `since`, and "step" the last step any agent had printed."""
    out: dict[str, Result] = {}
    deadline = since + timeout
    while time.monotonic() < deadline and len(out) < len(survivors):
        for a in survivors:
            if a.name in out:
                continue
            if a.proc.poll() is not None:
                out[a.name] = {"seconds": float("nan"), "restarts": -1}
                continue
            trained = [s for s in a.steps(since) if s[2] == world]
            if len(trained) >= 3:
                out[a.name] = {
                    "seconds": trained[0][0] - since,
                    "restarts": trained[0][3] - before[a.name],
                    "phases": a.phases(since, world),
                    # train.py prints the step it has done: resuming at last+1 loses none
                    "lost": max(0, before["step"] + 1 - trained[0][1]),
                }
        time.sleep(0.1)
    return out


def run_once(
    profile: str,
    victim: str,
    workdir: Path,
    timeout: float,
    stacks: bool = False,
    *,
    nodes: int = 3,
    bringup_only: bool = False,
    soak_minutes: float = 0.0,
    sigterm: bool = False,
    scaleup: bool = False,
    backend: str = "etcd-v2",
) -> Result:
    """One SIGKILL (`sigterm`: SIGTERM) of `victim` in a job of `nodes` agents
    (`--nnodes=nodes-1:nodes`); with `bringup_only`, only the time from their start until
    all train together; with `scaleup`, from the last node's start, the others training."""
    job = Job(profile, workdir, nodes, backend)
    if sigterm and job.conf.leave:
        # elastic-worker leaves at the signal through the lifelines' helper, torch imported
        # there: here, imported before anything is timed, and not during the bring-up.
        rounds.preload().join()
    try:
        job.start()
        started = time.monotonic()
        for i in range(nodes - 1 if scaleup else nodes):
            job.start_agent(i)
        if scaleup:  # the last node comes when the others train
            if not wait_training(job.agents, nodes - 1, 180):
                return {"error": f"{nodes - 1} agents did not train together within 180 s"}
            started = time.monotonic()
            job.start_agent(nodes - 1)
        if not wait_training(job.agents, nodes, 180):
            return {"error": f"the {nodes} agents did not train together within 180 s"}
        if bringup_only or scaleup:  # from the (last) start until all train together
            together = max(next(s[0] for s in a.steps() if s[2] == nodes) for a in job.agents)
            return {
                "profile": profile,
                "nodes": nodes,
                "mode": "scaleup" if scaleup else "bringup",
                "seconds": round(together - started, 1),
                "phases_s": {a.name: a.phases(started, nodes) for a in job.agents},
            }
        if soak_minutes:
            return soak(profile, job.agents, soak_minutes)
        before = {a.name: a.steps()[-1][3] for a in job.agents}
        before["step"] = max(a.steps()[-1][1] for a in job.agents)
        killed_at = time.monotonic()
        dead, ranks, leaving = job.lose(victim, sigterm)
        survivors = [a for a in job.agents if a is not dead]
        seen = watch_recovery(survivors, killed_at, timeout, nodes - 1, before)
        hung = sorted({a.name for a in survivors} - set(seen))
        state = [rendezvous_state(job.endpoint, backend)]
        time.sleep(5)
        state.append(rendezvous_state(job.endpoint, backend))
        if hung and stacks:  # faulthandler (PYTHONFAULTHANDLER=1) dumps threads on SIGABRT
            for a in survivors:
                os.kill(a.proc.pid, signal.SIGABRT)
            time.sleep(2)

        def each(key: str) -> dict[str, object]:
            return {name: r[key] for name, r in seen.items() if key in r}

        return {
            "profile": profile,
            "backend": backend,
            "victim": f"{victim} (group rank {ranks[dead.name]})",
            "signal": "SIGTERM" if sigterm else "SIGKILL",
            "steps_lost": each("lost"),
            "recovered_s": {k: round(cast("float", v), 1) for k, v in each("seconds").items()},
            "restarts_used": each("restarts"),
            "phases_s": each("phases"),
            "leaver_s": {k: round(t - killed_at, 1) for k, t in leaving.items()},
            "hung": hung,
            "rdzv_state_5s_apart": state,
            "logs": str(workdir),
        }
    finally:
        job.stop()
