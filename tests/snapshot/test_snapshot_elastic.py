"""elastic_snapshot under real torchrun: elastic-worker agents on this machine (one per
"node", each on an address of its own with its lifeline, and a snapshot directory of its
own for its /dev/shm), a real etcd, gloo, and a training script that adopts the library
as a user would (snap_train.py). Each test loses nodes as a cluster does and checks that
the survivors resume at the step before the loss, with exactly the state of that step."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from testlib import EtcdServer, free_port
from worker.worker_helpers import Agent, descendants, wait_until, worker_env

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "e2e" / "user_script" / "snap_train.py"
STEP = re.compile(r"^\[snap\] step=(\d+) rank=(\d+) world=(\d+) digest=(\S+)$")
START = re.compile(
    r"^\[snap\] start step=(\d+) source=(\S+) lost=(\S+) rank=(\d+) world=(\d+) digest=(\S+)$"
)


@dataclass(frozen=True)
class Step:
    at: float
    step: int
    rank: int
    world: int
    digest: float


@dataclass(frozen=True)
class Start:
    at: float
    step: int
    source: str
    lost: str
    rank: int
    world: int
    digest: float


def steps(agent: Agent) -> list[Step]:
    out = []
    for at, line in list(agent.lines):
        if m := STEP.match(line):
            out.append(Step(at, int(m[1]), int(m[2]), int(m[3]), float(m[4])))
    return out


def starts(agent: Agent, since: float = 0.0) -> list[Start]:
    out = []
    for at, line in list(agent.lines):
        if at >= since and (m := START.match(line)):
            out.append(Start(at, int(m[1]), m[2], m[3], int(m[4]), int(m[5]), float(m[6])))
    return out


Launch = Callable[..., list[Agent]]


@pytest.fixture
def launch(etcd: EtcdServer, tmp_path: Path) -> Iterator[Launch]:
    agents: list[Agent] = []

    def start(job: str, count: int, script_args: list[str], **env: str) -> list[Agent]:
        port = str(free_port())
        for i in range(count):
            name = f"n{i}"
            args = ["python", str(SCRIPT), "--checkpoint-dir", str(tmp_path / "ckpt"), *script_args]
            node_env = worker_env(
                etcd.endpoint,
                job,
                POD_NAME=name,
                ELASTIC_LOCAL_ADDR=f"127.0.0.{21 + i}",
                ELASTIC_LIFELINE="true",
                ELASTIC_LIFELINE_PORT=port,
                ELASTIC_MAX_NODES=str(count),
                ELASTIC_SNAPSHOT_DIR=str(tmp_path / f"shm-{name}"),
                **env,
            )
            agents.append(Agent.start(name, args, node_env, tmp_path / f"{name}.log"))
        return agents[-count:]

    (tmp_path / "ckpt").mkdir()
    yield start
    for agent in agents:
        agent.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(10)


def training_together(agents: list[Agent], world: int, at_least: int) -> None:
    wait_until(
        f"{len(agents)} agents training together",
        lambda: all(len([s for s in steps(a) if s.world == world]) >= at_least for a in agents),
        timeout=150,
    )


def group_rank(agent: Agent) -> int | None:
    for pid in descendants(agent.proc.pid):
        with contextlib.suppress(OSError):
            for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if item.startswith(b"GROUP_RANK="):
                    return int(item.split(b"=", 1)[1])
    return None


def resumed(survivors: list[Agent], since: float) -> list[Start]:
    """The first start line of each survivor after `since` (they all finish the job)."""
    for agent in survivors:
        assert agent.wait(240) == 0, agent.text()[-4000:]
    found = [starts(agent, since) for agent in survivors]
    assert all(found), [agent.text()[-3000:] for agent in survivors]
    return [f[0] for f in found]


def last_common_step(agents: list[Agent], world: int) -> int:
    """The newest step every agent printed at `world`: completed by all of them."""
    return min(max(s.step for s in steps(a) if s.world == world) for a in agents)


def digest_at(agents: list[Agent], step: int, world: int) -> float:
    """The whole state's digest at `step` of a `world`-rank round: the sum over its ranks
    (each rank prints its own shard's)."""
    found = {
        s.rank: s.digest for a in agents for s in steps(a) if (s.step, s.world) == (step, world)
    }
    assert sorted(found) == list(range(world)), f"ranks that printed step {step}: {sorted(found)}"
    return sum(found.values())


# CI runs the same through the chart: test_e2e_scenarios' SIGKILL of train.py (from memory).
@pytest.mark.extended
def test_ddp_a_sigkilled_node_costs_no_step(launch: Launch) -> None:
    """DDP: the survivors' collective fails, each saves the state of its last step to its
    node's memory, and the new round loads the newest one, broadcast from one holder."""
    agents = launch("ddp-kill", 3, ["--steps", "40", "--step-seconds", "0.3"])
    training_together(agents, 3, 5)
    dead, survivors = agents[1], [agents[0], agents[2]]
    killed = time.monotonic()
    dead.kill()
    first = resumed(survivors, killed)
    done = last_common_step(survivors, 3)
    for start in first:
        assert (start.step, start.world, start.lost) == (done, 2, "0"), start
        mine = {s.digest for a in survivors for s in steps(a) if (s.step, s.world) == (done, 3)}
        assert mine == {start.digest}, (mine, start)  # the same state, to the last bit
    assert {s.source for s in first} <= {"local-memory", "peer-memory"}
    for agent in survivors:
        assert "[snap] done step=40" in agent.text()


# CI runs the same through the chart: test_e2e_snapshots (SIGKILL, FSDP2 from a peer).
@pytest.mark.extended
def test_fsdp2_a_sigkilled_nodes_shard_comes_from_its_successor_resharded(launch: Launch) -> None:
    """FSDP2 over three nodes: the dead node's shard is in the next node's memory (the ring
    replica); the two survivors load the step from the three old shards, resharded to two."""
    agents = launch("fsdp-kill", 3, ["--steps", "40", "--step-seconds", "0.3", "--fsdp"])
    training_together(agents, 3, 5)
    dead = next(a for a in agents if group_rank(a) == 1)
    survivors = [a for a in agents if a is not dead]
    killed = time.monotonic()
    dead.kill()
    first = resumed(survivors, killed)
    done = last_common_step(survivors, 3)
    (step,) = {s.step for s in first}
    assert step in (done, done - 1), (step, done)  # the replica may lag one exchange
    assert {(s.world, s.lost) for s in first} == {(2, str(done - step))}
    assert sum(s.digest for s in first) == pytest.approx(digest_at(agents, step, 3), rel=1e-12)
    assert "peer-memory" in {s.source for s in first}


def test_two_adjacent_nodes_lost_fall_back_to_the_checkpoint(launch: Launch) -> None:
    """FSDP2 over four nodes, two neighbours in the ring lost at once: a shard and its only
    replica are gone, so the survivors load the checkpoint and say why in one line."""
    agents = launch(
        "fsdp-two",
        4,
        ["--steps", "30", "--step-seconds", "0.3", "--fsdp", "--checkpoint-every", "4"],
    )
    training_together(agents, 4, 6)
    ranks = {group_rank(a): a for a in agents}
    dead = [ranks[1], ranks[2]]
    survivors = [ranks[0], ranks[3]]
    killed = time.monotonic()
    for agent in dead:
        agent.kill()
    first = resumed(survivors, killed)
    assert {s.source for s in first} == {"checkpoint"}
    assert {s.step % 4 for s in first} == {0}
    said = [line for a in survivors for line in a.text().splitlines() if "held by nobody" in line]
    assert said and "the shards of ranks 1 are held by nobody" in said[0], said


# CI runs the same through the chart: test_e2e_snapshots (a spot reclaim, SIGTERM).
@pytest.mark.extended
def test_sigterm_to_a_node_costs_no_step(launch: Launch) -> None:
    """A reclaimed node (SIGTERM to its pod): torchrun passes it on, the signal thread saves
    while the main thread trains or waits, and the survivors resume at the step before."""
    agents = launch("fsdp-term", 3, ["--steps", "40", "--step-seconds", "0.3", "--fsdp"])
    training_together(agents, 3, 5)
    leaver = next(a for a in agents if group_rank(a) == 2)
    survivors = [a for a in agents if a is not leaver]
    sent = time.monotonic()
    leaver.proc.send_signal(signal.SIGTERM)
    first = resumed(survivors, sent)
    done = last_common_step(survivors, 3)
    (step,) = {s.step for s in first}
    assert step in (done, done - 1), (step, done)
    assert sum(s.digest for s in first) == pytest.approx(digest_at(agents, step, 3), rel=1e-12)
    assert "saved step=" in leaver.text()


# CI runs the same through the chart: test_e2e_snapshots (a cut link, the worker's detection).
@pytest.mark.extended
def test_a_silent_loss_saves_from_the_signal_thread_while_the_collective_blocks(
    launch: Launch,
) -> None:
    """A node frozen (SIGSTOP: no socket closes, as a cut link or a frozen VM) leaves the
    others blocked in a collective, where their Python handlers cannot run. The worker's
    loss detection sees its key lapse and, since the script keeps snapshots (it said
    `restored=`), stops their training processes with SIGTERM: the library's thread saves,
    and the survivors resume at the step before the loss."""
    agents = launch("ddp-silent", 3, ["--steps", "40", "--step-seconds", "0.3"])
    training_together(agents, 3, 5)
    frozen, survivors = agents[2], agents[:2]
    for pid in [frozen.proc.pid, *descendants(frozen.proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    first = resumed(survivors, stopped)
    done = last_common_step(survivors, 3)
    assert {(s.step, s.world, s.lost) for s in first} == {(done, 2, "0")}
    for agent in survivors:
        text = agent.text()
        assert "silent loss:" in text and "saved step=" in text and "(signal 15)" in text
        assert "the training process saved step" in text
