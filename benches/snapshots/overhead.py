"""The figure `snap-overhead`: what keeping the state costs per step, with and without
elastic-snapshot in turn, three nodes of one process each (torchrun, a static round on this
machine, gloo):

- train.py (DDP, SGD): seconds per step between its step lines 20 and 20 + STEPS, at no
  sleep per step. Replicated state needs nothing per step: two optimizer hooks and a lock.
- a model of 100M+ parameters (bigmodel.py, AdamW): the median seconds of a whole step,
  DDP with and without, and FSDP2 with no replica and with the ring replica every step (the
  interval that loses at most one step), with the ring's own costs (the copy and the
  exchange in its thread, the main thread's waits, bytes sent); and for DDP and FSDP2 the
  seconds to save to memory, to restore from it (one node new) and to load the same state
  from a checkpoint on disk instead; and DDP with EPOCH_UPDATES optimizer steps per
  step_done (a script whose step is an epoch): the copy of the state at each step_done."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.env import ROOT, VENV_BIN
from benches.procs import free_port
from benches.snapshots.job import node_memory
from benches.snapshots.scripts import TRAIN_PY

NODES = 3
STEPS = 200  # train.py steps timed
BIG_STEPS = 8
EPOCH_UPDATES = 3  # optimizer steps per step_done in the epoch-like row
EPOCH_STEPS = 4  # its step_done calls (each copies; the first allocates the buffer)
_STEP = re.compile(r"^\[train\] step=(\d+) ")


def torchrun_static(
    workdir: Path, argv: list[str], timeout: float
) -> list[list[tuple[float, str]]]:
    """NODES torchrun agents of one static round on 127.0.0.1, each running `argv`; every
    agent's lines, stamped when read."""
    port = str(free_port())
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
        "CHECKPOINT_DIR": str(workdir / "ckpt"),
    }
    procs, lines, readers = [], [], []
    shm = node_memory(workdir)
    for rank in range(NODES):
        env_i = {**env, "ELASTIC_SNAPSHOT_DIR": str(shm / f"node-{rank}")}
        proc = subprocess.Popen(
            [
                str(VENV_BIN / "torchrun"),
                f"--nnodes={NODES}", "--nproc-per-node=1", f"--node-rank={rank}",
                "--master-addr=127.0.0.1", f"--master-port={port}", *argv,
            ],
            cwd=ROOT, env=env_i, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        got: list[tuple[float, str]] = []

        def pump(p: subprocess.Popen[str] = proc, out: list[tuple[float, str]] = got) -> None:
            assert p.stdout is not None
            for line in p.stdout:
                out.append((time.monotonic(), line.rstrip("\n")))

        readers.append(threading.Thread(target=pump, daemon=True))
        readers[-1].start()
        procs.append(proc)
        lines.append(got)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    for reader in readers:
        reader.join(5)
    shutil.rmtree(shm, ignore_errors=True)
    return lines


def train_py_once(snapshots: bool, workdir: Path) -> dict[str, Any]:
    (workdir / "ckpt").mkdir(parents=True, exist_ok=True)
    argv = [
        str(TRAIN_PY), "--steps", str(STEPS + 30), "--checkpoint-every", "100000",
        "--step-seconds", "0", *([] if snapshots else ["--no-snapshots"]),
    ]  # fmt: skip
    lines = torchrun_static(workdir, argv, 600)
    at = {int(m[1]): t for t, line in lines[0] if (m := _STEP.match(line))}
    row: dict[str, Any] = {"figure": "snap-overhead", "what": "train.py", "snapshots": snapshots}
    if 20 not in at or 20 + STEPS not in at:
        return {**row, "error": "train.py did not run its steps: " + str(lines[0][-5:])}
    return {**row, "step_seconds": round((at[20 + STEPS] - at[20]) / STEPS, 5)}


def big_once(
    parallel: str, every: int | None, workdir: Path, *, restore: bool = False, updates: int = 1
) -> dict[str, Any]:
    """`every` None: no snapshots; 0: snapshots without a ring replica; n: one every n.
    `restore`: then the restore from memory beside the checkpoint load (bigmodel.py).
    `updates` > 1: that many optimizer steps per step_done, EPOCH_STEPS of them."""
    (workdir / "ckpt").mkdir(parents=True, exist_ok=True)
    steps = BIG_STEPS if updates == 1 else EPOCH_STEPS
    argv = [
        "-m", "benches.snapshots.bigmodel", "--parallel", parallel, "--steps", str(steps),
        "--updates-per-step", str(updates),
        *(["--no-snapshots"] if every is None else ["--replicate-every", str(every)]),
        *(["--restore"] if restore else []),
    ]  # fmt: skip
    lines = torchrun_static(workdir, argv, 1800)
    what = f"100M+ {parallel}" + (f", {updates} updates per step" if updates > 1 else "")
    row: dict[str, Any] = {"figure": "snap-overhead", "what": what, "every": every}
    found = [line for _, line in lines[0] if line.startswith("BIGMODEL ")]
    if not found:
        return {**row, "error": "no result: " + " | ".join(line for _, line in lines[0][-5:])}
    return {**row, **json.loads(found[0].split(" ", 1)[1])}


def run_overhead(
    repeat: int, workdir: Callable[[], Path], say: Callable[[str], None], big: bool = True
) -> dict[str, Any]:
    rows = []
    for _ in range(repeat):
        for snapshots in (False, True):
            rows.append(train_py_once(snapshots, workdir()))
            say(json.dumps(rows[-1]))
        if big:
            for parallel, every in (("ddp", None), ("ddp", 0), ("fsdp2", 0), ("fsdp2", 1)):
                restore = (parallel, every) in (("ddp", 0), ("fsdp2", 1))
                rows.append(big_once(parallel, every, workdir(), restore=restore))
                say(json.dumps(rows[-1]))
            rows.append(big_once("ddp", 0, workdir(), updates=EPOCH_UPDATES))
            say(json.dumps(rows[-1]))
    return {"rows": rows, "load_average_end": round(os.getloadavg()[0], 1)}
