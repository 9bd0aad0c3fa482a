"""One bench job: a private etcd and the torchrun agents of a profile (each a node, one
training process of train.py), with elastic-worker's warm servers and lifelines when the
profile has them; and the loss of one node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benches.env import ROOT, VENV_BIN
from benches.procs import descendants, free_port, start_etcd
from benches.recovery.agent import Agent
from benches.recovery.profiles import PRELOAD, PROFILES, Profile
from benches.worker import rounds, warm, warm_command

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler

TRAIN = ROOT / "images" / "worker" / "examples" / "train.py"


def make_handler(backend: str, endpoint: str, nodes: int, rdzv_conf: str) -> RendezvousHandler:
    """The handler torchrun makes for the bench's rendezvous (torch's public registry)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.registry import (  # noqa: PLC0415
        get_rendezvous_handler,
    )

    extra = dict(kv.split("=", 1) for kv in rdzv_conf.split(",") if kv)
    params = RendezvousParameters(backend, endpoint, "bench", nodes - 1, nodes, **extra)
    return get_rendezvous_handler(params)


def leave_at_signal(
    proc: subprocess.Popen[str],
    *,
    addr: str,
    backend: str,
    endpoint: str,
    nodes: int,
    rdzv_conf: str,
    timeline: dict[str, float],
    lifeline_server: subprocess.Popen[bytes] | None,
) -> None:
    """What elastic-worker does when it passes a SIGTERM on to torchrun: take that node
    out of the round at once (elastic_worker/recovery/policy.py, round.py), and once
    torchrun has exited, say goodbye on its lifelines. `timeline` gets the monotonic times
    the node was out and torchrun exited."""

    def handler() -> RendezvousHandler:
        return make_handler(backend, endpoint, nodes, rdzv_conf)

    if rounds.take_out(handler, "bench", addr, proc.pid):
        timeline["left"] = time.monotonic()
    proc.wait()
    timeline["torchrun_exited"] = time.monotonic()
    if lifeline_server is not None:
        lifeline_server.terminate()


@dataclass
class Job:
    """One benchmark job: a private etcd and the torchrun agents of a profile."""

    profile: str
    workdir: Path
    nodes: int
    backend: str
    endpoint: str = ""
    etcd: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    agents: list[Agent] = field(default_factory=list)
    servers: list[warm.Handle] = field(default_factory=list)
    lifeline_port: int = 0
    lifelines: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def addr(self, i: int) -> str:
        """Agent i's --local-addr: with lifelines an address of its own, as a pod has."""
        return f"127.0.0.{10 + i}" if self.conf.lifeline else "127.0.0.1"

    @property
    def conf(self) -> Profile:
        return PROFILES[self.profile]

    def start(self) -> None:
        self.etcd, self.endpoint = start_etcd(
            self.workdir, v2=self.backend == "etcd-v2", who="bench-recovery"
        )
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", LOGLEVEL="INFO")
        env["PYTHONFAULTHANDLER"] = "1"
        env.update(self.conf.env)
        env["TRAIN_PG_TIMEOUT"] = str(self.conf.pg_timeout)
        self.env = env
        if self.conf.lifeline:
            self.start_lifelines()

    def start_agent(self, i: int) -> None:
        conf = self.conf
        program = [str(VENV_BIN / "python"), "-u"]
        if conf.warm:  # as elastic-worker runs it (job.warmStart.enabled)
            server = warm.start(program[0], PRELOAD, self.env)
            self.servers.append(server)
            warm_program = warm_command([*program, str(TRAIN)], program[0], server.socket_path)
            assert warm_program is not None
            program = warm_program[:-1]
        argv = [
            str(VENV_BIN / "torchrun"),
            f"--rdzv-backend={self.backend}",
            f"--rdzv-endpoint={self.endpoint}",
            "--rdzv-id=bench",
            f"--nnodes={self.nodes - 1}:{self.nodes}",
            "--nproc-per-node=1",
            "--max-restarts=3",
            f"--monitor-interval={conf.monitor}",
            f"--local-addr={self.addr(i)}",
        ]
        if conf.rdzv_conf:
            argv.append(f"--rdzv-conf={conf.rdzv_conf}")
        argv += [
            "--no-python",
            *program,
            str(TRAIN),
            "--steps=100000",
            "--checkpoint-every=50",
            "--step-seconds=0.1",
            f"--checkpoint-dir={self.workdir / 'ckpt'}",
        ]
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        agent = Agent(f"agent{i}", proc)
        threading.Thread(
            target=agent.pump, args=(self.workdir / f"agent{i}.log",), daemon=True
        ).start()
        self.agents.append(agent)
        if conf.lifeline:
            self.start_lifeline(i, agent)

    def start_lifelines(self) -> None:
        """Every node's lifelines, as its elastic-worker runs them, each in a process that
        dies with the node, up before the agents start (elastic-worker is, in a pod)."""
        self.lifeline_port = free_port()
        for i in range(self.nodes):
            worker = {
                "ELASTIC_JOB_ID": "bench",
                "POD_NAME": f"agent{i}",
                "ELASTIC_RDZV_ENDPOINT": self.endpoint,
                "ELASTIC_RDZV_BACKEND": self.backend,
                "ELASTIC_MIN_NODES": str(self.nodes - 1),
                "ELASTIC_MAX_NODES": str(self.nodes),
                "ELASTIC_RDZV_CONF": self.conf.rdzv_conf,
                "ELASTIC_LIFELINE_PORT": str(self.lifeline_port),
            }
            argv = [sys.executable, "-m", "benches.recovery.lifeline_node"]
            argv += [self.addr(i), str(self.workdir / f"agent{i}.attempts")]
            argv += [f"{k}={v}" for k, v in worker.items()]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.lifelines.append(proc)
        for proc in self.lifelines:
            assert proc.stdout is not None
            proc.stdout.readline()  # ready

    def start_lifeline(self, i: int, agent: Agent) -> None:
        """Agent i's torchrun to its lifelines; its attempt log gets a line when torchrun
        completes a round."""
        agent.attempt_log = self.workdir / f"agent{i}.attempts"
        stdin = self.lifelines[i].stdin
        assert stdin is not None
        warm_socket = self.servers[i].socket_path if self.servers else ""
        stdin.write(f"{agent.proc.pid} {warm_socket}\n".encode())
        stdin.flush()

    def stop(self) -> None:
        for line in self.lifelines:  # first, with a goodbye: the end is no death
            line.terminate()
        for line in self.lifelines:
            try:
                line.wait(5)
            except subprocess.TimeoutExpired:
                line.kill()
                line.wait()
        for a in self.agents:
            for pid in [a.proc.pid, *descendants(a.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            a.proc.wait()
        for server in self.servers:
            server.stop()
        if self.etcd is not None:
            self.etcd.terminate()
            self.etcd.wait(10)

    def lose(self, victim: str, sigterm: bool) -> tuple[Agent, dict[str, str], dict[str, float]]:
        """SIGKILL (or SIGTERM) one node: the victim, the group ranks before, and the
        leaver's timeline (filled in later, when the profile leaves the round)."""
        agents = self.agents
        ranks = {a.name: worker_env(a.proc.pid).get("GROUP_RANK", "?") for a in agents}
        if victim == "rank0":
            dead = next((a for a in agents if ranks[a.name] == "0"), agents[0])
        else:
            dead = next((a for a in agents if ranks[a.name] not in ("0", "?")), agents[1])
        leaving: dict[str, float] = {}
        if sigterm:  # a spot reclaim: the agent passes it on, the workers checkpoint
            os.kill(dead.proc.pid, signal.SIGTERM)
            if self.conf.leave:
                threading.Thread(
                    target=leave_at_signal,
                    args=(dead.proc,),
                    kwargs={
                        "addr": self.addr(agents.index(dead)),
                        "lifeline_server": (
                            self.lifelines[agents.index(dead)] if self.lifelines else None
                        ),
                        "backend": self.backend,
                        "endpoint": self.endpoint,
                        "nodes": self.nodes,
                        "rdzv_conf": self.conf.rdzv_conf,
                        "timeline": leaving,
                    },
                    daemon=True,
                ).start()
            return dead, ranks, leaving
        pids = [dead.proc.pid, *descendants(dead.proc.pid)]
        if self.servers:  # the lost node's warm server goes with it (its children with it)
            pids.append(self.servers[agents.index(dead)].proc.pid)
        if self.lifelines:  # and its elastic-worker's lifelines
            pids.append(self.lifelines[agents.index(dead)].pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return dead, ranks, leaving


def worker_env(agent_pid: int) -> dict[str, str]:
    """The environment of the agent's training process (GROUP_RANK among it), from /proc."""
    for pid in descendants(agent_pid):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        env = dict(
            item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
        )
        if "GROUP_RANK" in env:
            return env
    return {}
