"""Progress: the `[train] ...` log lines parsed, and one view of the run for a person.

On a terminal the view is a table redrawn in place (pods, world size, step, round); when
stdout is not a terminal each event is one plain line.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

_TRAIN = re.compile(r"\[train\]\s+(?:(start|resumed|checkpoint|sigterm|done)\s+)?(step=.*)$")
_KV = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class TrainEvent:
    kind: str  # step | start | resumed | checkpoint | sigterm | done
    step: int
    world_size: int | None = None
    restart: int | None = None
    loss: float | None = None


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


@dataclass
class PodRow:
    name: str
    phase: str = "Pending"
    node: str = ""
    ip: str = ""
    restarts: int = 0
    last_exit: int | None = None
    step: int | None = None
    message: str = ""


@dataclass
class ViewState:
    pods: dict[str, PodRow] = field(default_factory=dict)
    world_size: int | None = None
    step: int | None = None
    round: int | None = None  # groups formed so far: rendezvous rounds completed
    checkpoint: int | None = None
    completed: bool = False
    note: str = ""


class Progress:
    """Renders ViewState: live table on a TTY, plain event lines otherwise."""

    def __init__(
        self, out: TextIO | None = None, live: bool | None = None, start: float = 0.0
    ) -> None:
        self.out = out or sys.stdout
        self.live = self.out.isatty() if live is None else live
        self.start = start or time.monotonic()
        self.state = ViewState()
        self._drawn = 0
        self._last_draw = 0.0

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.start:6.1f}s"

    def event(self, text: str) -> None:
        """One thing that happened: a plain line, or above the live table."""
        if self.live:
            self._clear()
            self.out.write(f"[{self.elapsed()}] {text}\n")
            self.out.flush()
            self._drawn = 0
            self.draw(force=True)
        else:
            self.out.write(f"[{self.elapsed()}] {text}\n")
            self.out.flush()

    def _clear(self) -> None:
        if self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")

    def table(self) -> list[str]:
        s = self.state

        def show(v: object) -> str:
            return "-" if v is None else str(v)

        head = (
            f"{self.elapsed().strip()}   world size {show(s.world_size)}   step {show(s.step)}   "
            f"round {show(s.round)}   checkpoint {show(s.checkpoint)}   "
            f"{'COMPLETE' if s.completed else ''}  {s.note}"
        )
        width = shutil.get_terminal_size((120, 24)).columns
        rows = [
            head.rstrip(),
            f"{'POD':34} {'PHASE':16} {'NODE':16} {'IP':15} {'STEP':>4} {'RST':>3} "
            f"{'EXIT':>4}  LAST",
        ]
        for p in s.pods.values():
            last_exit = "" if p.last_exit is None else str(p.last_exit)
            step = "" if p.step is None else str(p.step)
            rows.append(
                f"{p.name[:34]:34} {p.phase[:16]:16} {p.node[:16]:16} {p.ip:15} {step:>4} "
                f"{p.restarts:>3} {last_exit:>4}  {p.message}"
            )
        return [r[:width] for r in rows]

    def draw(self, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.25:
            return
        self._last_draw = now
        self._clear()
        rows = self.table()
        self.out.write("\n".join(rows) + "\n")
        self.out.flush()
        self._drawn = len(rows)

    def finish(self) -> None:
        if self.live:
            self.draw(force=True)
