"""The reference train.py on one node (torchrun --standalone): log lines, checkpoints
written atomically, resume from the newest complete one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from worker.worker_helpers import BIN, TRAIN


def train(ckpt: Path, steps: int, every: int) -> list[str]:
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node=1",
            str(TRAIN),
            f"--steps={steps}",
            f"--checkpoint-every={every}",
            f"--checkpoint-dir={ckpt}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("[train]")]


@pytest.mark.slow
def test_lines_checkpoints_resume_and_fallback(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    lines = train(ckpt, steps=7, every=3)
    events = [line.split(" loss=")[0] for line in lines]
    assert events == [
        "[train] start step=0 world_size=1 restart=0",
        "[train] step=1 world_size=1 restart=0",
        "[train] step=2 world_size=1 restart=0",
        "[train] step=3 world_size=1 restart=0",
        "[train] checkpoint step=3",
        "[train] step=4 world_size=1 restart=0",
        "[train] step=5 world_size=1 restart=0",
        "[train] step=6 world_size=1 restart=0",
        "[train] checkpoint step=6",
        "[train] step=7 world_size=1 restart=0",
        "[train] checkpoint step=7",
        "[train] done step=7",
    ]
    assert json.loads((ckpt / "latest").read_text()) == {"step": 7}
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-6", "step-7"]

    # A save killed half-way leaves a temporary directory and the old `latest`.
    partial = ckpt / ".step-9.tmp-deadbeef"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"partial")
    lines = train(ckpt, steps=9, every=100)
    assert lines[0] == "[train] resumed step=7"
    assert lines[1] == "[train] start step=7 world_size=1 restart=0"
    assert lines[2].startswith("[train] step=8 ")
    assert lines[-1] == "[train] done step=9"
    assert not partial.exists()

    # `latest` naming a directory without DCP's .metadata: the newest complete one is used.
    (ckpt / "step-99").mkdir()
    (ckpt / "latest").write_text(json.dumps({"step": 99}))
    lines = train(ckpt, steps=10, every=100)
    assert lines[0] == "[train] resumed step=9"
    assert lines[-1] == "[train] done step=10"


def _with_teardown_that_blocks(body: str) -> subprocess.CompletedProcess[str]:
    """Runs `body` after loading train.py as `train`, with destroy_process_group and an
    atexit handler that block in native code with the GIL kept (libc sleep through
    ctypes.PyDLL), as the teardown CI saw hang did."""
    script = (
        "import atexit, ctypes, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('train', {str(TRAIN)!r})\n"
        "train = importlib.util.module_from_spec(spec); spec.loader.exec_module(train)\n"
        "def block(*args, **kwargs):\n"
        "    ctypes.PyDLL(None).sleep(3600)\n"
        "train.dist.destroy_process_group = block\n"
        "atexit.register(block)\n"
    ) + body
    return subprocess.run(
        [str(BIN / "python"), "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_teardown_that_blocks_holding_the_gil_does_not_hold_the_pod() -> None:
    """What CI saw twice: after `done`, one rank blocked in native code holding the GIL
    (a process-group destructor), so no Python-level bound could end it. train.py's end
    must run neither destroy_process_group nor interpreter teardown (atexit, finalizers):
    here both block like that, and the process still exits at once with its code."""
    done = _with_teardown_that_blocks(
        "print('[train] done step=3', flush=False)  # a buffered line is not lost\n"
        "train.leave(75)\n"
    )
    assert done.returncode == 75, done.stderr
    assert done.stdout == "[train] done step=3\n"


def test_a_failing_rank_does_not_hang_in_teardown_either() -> None:
    """An exception in main() (a collective that failed when a peer vanished) is printed
    and ends the process with 1, without the teardown that can block."""
    done = _with_teardown_that_blocks(
        "def main():\n"
        "    raise RuntimeError('Connection closed by peer')\n"
        "train.main = main\n"
        "train.run()\n"
    )
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: Connection closed by peer" in done.stderr
