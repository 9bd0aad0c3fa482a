"""The training scripts the figures run, both with snapshots and with the checkpoint alone
(`--no-snapshots`, today's path), and what their lines say: a step completed at a world
size, the step a new round started from, where that state came from."""

from __future__ import annotations

import re
from dataclasses import dataclass

from benches.env import ROOT

TRAIN_PY = ROOT / "images" / "worker" / "examples" / "train.py"
SNAP_TRAIN = ROOT / "tests" / "e2e" / "user_script" / "snap_train.py"
#: The library's line for a restore (rank 0 of the round): where its state came from.
RESTORED = re.compile(r"\[elastic-snapshot\] restored step=(\d+) from (\S+) ")


@dataclass(frozen=True)
class Script:
    """A training script: its command, the line of a completed step (groups: step, world
    size) and the line of a round's start (group: the step it resumed from)."""

    name: str
    argv: tuple[str, ...]
    step: re.Pattern[str]
    start: re.Pattern[str]

    def command(self, *, snapshots: bool, checkpoint_every: int, step_seconds: float) -> list[str]:
        return [
            "python",
            *self.argv,
            "--steps",
            "1000000",
            "--checkpoint-every",
            str(checkpoint_every),
            "--step-seconds",
            f"{step_seconds:g}",
            *([] if snapshots else ["--no-snapshots"]),
        ]


#: DDP: the reference train.py (SGD, 16 samples per rank per step).
DDP = Script(
    "DDP (train.py)",
    (str(TRAIN_PY),),
    re.compile(r"^\[train\] step=(\d+) world_size=(\d+) "),
    re.compile(r"^\[train\] (?:resumed|start) step=(\d+)"),
)
#: FSDP2 across the nodes: a user's script with Adam (tests/e2e/user_script/snap_train.py).
FSDP2 = Script(
    "FSDP2 (snap_train.py)",
    (str(SNAP_TRAIN), "--fsdp"),
    re.compile(r"^\[snap\] step=(\d+) rank=\d+ world=(\d+) "),
    re.compile(r"^\[snap\] start step=(\d+) "),
)
SCRIPTS = {"ddp": DDP, "fsdp2": FSDP2}
