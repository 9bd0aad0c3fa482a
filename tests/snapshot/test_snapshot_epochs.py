"""A script whose step is an epoch (several optimizer steps between two `step_done` calls),
two ranks of DDP over gloo, a node each (its own snapshot directory): a loss halfway
through an epoch costs that epoch only. The state of the last step_done is what is saved,
exactly, on a failure and at once on SIGTERM; a script that marks every optimizer step
makes no copy (epoch_ranks.py runs the ranks)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testlib import free_port

WORLD = 2
SCRIPT = Path(__file__).with_name("epoch_ranks.py")
STEP = re.compile(r"^\[epoch\] step=(\d+) digest=(\S+)$", re.M)
RESTORED = re.compile(r"^\[epoch\] restored step=(\d+) source=(\S+) digest=(\S+)$", re.M)


def start(tmp_path: Path, *mode: str) -> list[subprocess.Popen[str]]:
    port = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "POD_NAME": f"n{rank}",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), str(tmp_path), *mode],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, outputs
    return outputs


def last_json(output: str) -> dict[str, object]:
    """The rank's JSON line (a ring replica's thread may say it stopped after it, when the
    process group goes)."""
    (line,) = [line for line in output.splitlines() if line.startswith("{")]
    row: dict[str, object] = json.loads(line)
    return row


@pytest.mark.slow
@pytest.mark.parametrize(("parallel", "copies"), [("ddp", 3), ("fsdp2", 3), ("fsdp2-ring", 0)])
def test_a_failure_halfway_through_an_epoch_saves_the_last_step_done_exactly(
    tmp_path: Path, parallel: str, copies: int
) -> None:
    """Three epochs of four optimizer steps, a failure two steps into the fourth: each node
    saved epoch 3's state (the live state was two steps past it), the restore loads it
    exactly from memory, and the restored process keeps copying from its first step: a
    failure in its first epoch finds epoch 3 again. DDP: each node's local rank 0 copies
    the state; FSDP2: each rank its shard, unless the ring replica (every step) holds it."""
    outputs = finish(start(tmp_path, "fail", parallel))
    rows = [last_json(out) for out in outputs]
    for row in rows:
        assert (row["step"], row["source"], row["data_position"]) == (
            3, "local-memory", {"epoch": 3},
        ), outputs  # fmt: skip
        assert row["exact"] is True, outputs
        assert row["again"] == [3, "local-memory", {"epoch": 3}], outputs
        assert row["again_exact"] is True, outputs
    assert [row["copies"] for row in rows] == [copies] * WORLD, outputs
    said = [line for line in outputs[0].splitlines() if "came after" in line]
    assert len(said) == 1, outputs[0]
    cost = (
        r"the ring replica's copies hold each step: nothing more"
        if parallel == "fsdp2-ring"
        else r"\d+(\.\d)? k?B of host memory, \d+\.\d ms per step_done"
    )
    assert re.fullmatch(
        r"\[elastic-snapshot\] step 1 came after 4 optimizer steps: from now on each "
        r"step_done keeps a copy of the state, so that a loss costs at most one of your "
        rf'steps \({cost}; packages/elastic-snapshot/README\.md, "Adopting it"\)',
        said[0],
    ), said


@pytest.mark.slow
def test_sigterm_halfway_through_an_epoch_saves_the_last_step_done_at_once(
    tmp_path: Path,
) -> None:
    """Epochs of 3 s, SIGTERM (torchrun stopping the processes) just after epoch 1's
    step_done: the state of epoch 1 is saved at once, without waiting for the epoch's end
    (consistent_timeout, 2 s, would not reach it), and a restore loads exactly it."""
    procs = start(tmp_path, "train")
    lines: list[str] = []
    assert procs[0].stdout is not None
    for line in procs[0].stdout:
        lines.append(line)
        if STEP.match(line.strip()):
            break
    time.sleep(0.2)  # into epoch 2: its optimizer steps have moved the live state on
    sent = time.monotonic()
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    codes = [proc.wait(30) for proc in procs]
    seconds = time.monotonic() - sent
    out = "".join(lines) + (procs[0].stdout.read() if procs[0].stdout else "")
    assert codes == [128 + signal.SIGTERM] * WORLD, out
    assert seconds < 2.0, (seconds, out)  # not consistent_timeout's wait
    steps = [(int(m[1]), m[2]) for m in STEP.finditer(out)]
    assert steps[-1][0] == 1, out
    assert "saved step=1 (signal 15)" in out, out
    restored = [RESTORED.search(o) for o in finish(start(tmp_path, "restore"))]
    assert [(m[1], m[2], m[3]) if m else None for m in restored] == [
        ("1", "local-memory", steps[-1][1])
    ] * WORLD, restored


@pytest.mark.slow
def test_a_script_that_marks_every_optimizer_step_makes_no_copy(tmp_path: Path) -> None:
    """Two optimizers stepping once each per step are one step: nothing is copied (the
    library's costs hold no copy's) and nothing is said."""
    outputs = finish(start(tmp_path, "per-step"))
    assert [last_json(out) for out in outputs] == [{"stats": ["step_done_seconds"]}] * WORLD
    assert not [out for out in outputs if "came after" in out], outputs
