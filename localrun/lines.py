"""The lines the elastic-job chart's pods print, and `parse_line`, the one parser of all
of them: the worker's attempt line (one per attempt torchrun starts, docs/contracts.md),
the reference script's optional `[train]` lines, the worker's own `elastic-worker:` lines
(its restores, the exit barrier, a training process it stopped), and other containers'
warnings and errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from elastic_worker.recovery.hangs import DETAIL_PREFIXES

from localrun.chart import WORKER

_ATTEMPT = re.compile(r"\[elastic-worker\] attempt (.*)$")
_TRAIN = re.compile(r"\[train\]\s+(?:(start|resumed|checkpoint|sigterm|done)\s+)?(step=.*)$")
_KV = re.compile(r"(\w+)=(\S+)")
WORKER_PREFIX = "elastic-worker:"
#: The worker's line for a restore its training process reported (docs/contracts.md,
#: "Progress": the `restored=` line of packages/elastic-snapshot).
_RESTORED = re.compile(
    r"elastic-worker: state restored at step (\d+) from (peer-memory|local-memory|checkpoint)"
    r" \((\d+|\?) steps? lost\)"
)
_BARRIER_WAIT = re.compile(r"exit barrier: .*waiting (?:up to \S+ s )?for: (.+)$")
_BARRIER_LEFT = re.compile(
    r"exit barrier: left after ([\d.]+) s(?:, its timeout; had not finished: (.+)|[;:] .*)$"
)
_TEARDOWN = re.compile(
    r"training process \d+ \((.+?)\) still running (\d+) s after its script returned "
    r"(-?\d+) .*: stopped it"
)


@dataclass(frozen=True)
class Attempt:
    """One attempt torchrun started (the worker's shim, LOCAL_RANK 0 only). Exactly one
    member of each rendezvous round has group_rank 0."""

    run_id: str
    restart: int
    group_rank: int
    nodes: int
    world_size: int


@dataclass(frozen=True)
class TrainEvent:
    """A `[train]` line of the reference script: step detail, when a script prints them."""

    kind: str  # step | start | resumed | checkpoint | sigterm | done
    step: int
    world_size: int | None = None
    restart: int | None = None
    loss: float | None = None


@dataclass(frozen=True)
class Restore:
    """Where the state of a pod's new round came from, as its worker says it (a script that
    keeps snapshots: packages/elastic-snapshot)."""

    step: int
    source: str  # peer-memory, local-memory or checkpoint
    lost: int | None


@dataclass(frozen=True)
class ExitBarrier:
    """The worker's word on torch's exit barrier (launch.ExitBarrier): this node's training
    processes exited 0 and it waits for `whom` (pods; empty: nobody left; None: it cannot
    tell), or it left after `left_after` s (`timed_out`: by the timeout, `whom` unfinished)."""

    whom: tuple[str, ...] | None
    left_after: float | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class TeardownStopped:
    """The warm server stopped a training process still running after its script returned."""

    process: str  # "rank 1, local rank 0"
    seconds: float
    code: int


@dataclass(frozen=True)
class WorkerMessage:
    """A line worth showing: the worker's own, or a warning or error of another container."""

    text: str
    shown: bool  # printed as an event, or only kept as one of the pod's last lines


def parse_attempt_line(line: str) -> Attempt | None:
    m = _ATTEMPT.search(line)
    if not m:
        return None
    kv = dict(_KV.findall(m.group(1)))
    try:
        return Attempt(
            run_id=kv["run_id"],
            restart=int(kv["restart"]),
            group_rank=int(kv["group_rank"]),
            nodes=int(kv["nodes"]),
            world_size=int(kv["world_size"]),
        )
    except (KeyError, ValueError):
        return None


def parse_train_line(line: str) -> TrainEvent | None:
    """One `[train] ...` line of docs/contracts.md, or None for any other line."""
    m = _TRAIN.search(line)
    if not m:
        return None
    kv = dict(_KV.findall(m.group(2)))
    kind = m.group(1) or "step"
    try:
        step = int(kv["step"])
        world = int(kv["world_size"]) if "world_size" in kv else None
        restart = int(kv["restart"]) if "restart" in kv else None
        loss = float(kv["loss"]) if "loss" in kv else None
    except (KeyError, ValueError):
        return None
    return TrainEvent(kind, step, world, restart, loss)


def parse_restore_line(line: str) -> Restore | None:
    m = _RESTORED.search(line)
    if not m:
        return None
    return Restore(int(m[1]), m[2], None if m[3] == "?" else int(m[3]))


def _whom(text: str) -> tuple[str, ...] | None:
    """The pods a waiting line names; None for `the other nodes (which: unknown ...)`."""
    if text.startswith("the other nodes"):
        return None
    return tuple(name.strip() for name in text.split(","))


def parse_worker_line(text: str) -> ExitBarrier | TeardownStopped | None:
    """The worker's lines the run keeps as facts (the end of a job), from their text."""
    if m := _BARRIER_WAIT.search(text):
        return ExitBarrier(_whom(m[1]))
    if m := _BARRIER_LEFT.search(text):
        timed_out = m[2] is not None
        return ExitBarrier(_whom(m[2]) if timed_out else (), float(m[1]), timed_out)
    if m := _TEARDOWN.search(text):
        return TeardownStopped(m[1], float(m[2]), int(m[3]))
    return None


Parsed = Attempt | TrainEvent | Restore | ExitBarrier | TeardownStopped | WorkerMessage


def parse_line(container: str, line: str) -> Parsed | None:
    """What a pod's line says, or None when it says nothing the run tracks. A worker line
    that is also a fact (ExitBarrier, TeardownStopped) is shown like the others."""
    attempt = parse_attempt_line(line)
    if attempt is not None:
        return attempt
    restore = parse_restore_line(line)
    if restore is not None:
        return restore
    train = parse_train_line(line)
    if train is not None:
        return train
    text = line.strip()
    if container == WORKER and text.startswith(WORKER_PREFIX):
        fact = parse_worker_line(text)
        if fact is not None:
            return fact
        if text[len(WORKER_PREFIX) :].lstrip().startswith(DETAIL_PREFIXES):  # a hang's detail
            return WorkerMessage(text, shown=False)
    if text.startswith(WORKER_PREFIX) or (
        container not in {WORKER, "etcd"}
        and any(w in text.lower() for w in ("warn", "error", "fail"))
    ):
        return WorkerMessage(text, shown=True)
    if container == WORKER and ("Error" in text or "error:" in text):
        return WorkerMessage(text, shown=False)
    return None
