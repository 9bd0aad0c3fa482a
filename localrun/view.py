"""The view of a run for a person, read from the run state (state.py): on a terminal a
table redrawn in place (pods, world size, step, round), else one plain line per event;
and the summary at the end.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from localrun.state import RunState


class Progress:
    """Renders the run state: live table on a TTY, plain event lines otherwise."""

    def __init__(
        self,
        state: RunState | None = None,
        out: TextIO | None = None,
        live: bool | None = None,
        start: float = 0.0,
    ) -> None:
        self.out = out or sys.stdout
        self.live = self.out.isatty() if live is None else live
        self.start = start or time.monotonic()
        self.state = state or RunState()
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
            f"round {show(s.rendezvous_rounds or None)}   "
            f"checkpoint {show(s.checkpoint_steps[-1] if s.checkpoint_steps else None)}   "
            f"{'COMPLETE' if s.completed else ''}"
        )
        waiting = s.waiting_in_exit_barrier
        if waiting:
            whom = sorted({p for w in waiting.values() for p in (w or ("?",))})
            head = f"{head.rstrip()}   EXIT BARRIER: {len(waiting)} waiting for {', '.join(whom)}"
        width = shutil.get_terminal_size((120, 24)).columns
        rows = [
            head.rstrip(),
            f"{'POD':34} {'PHASE':16} {'NODE':16} {'IP':15} {'STEP':>4} {'RST':>3} "
            f"{'EXIT':>4}  LAST",
        ]
        for p in s.pods.values():
            last_exit = "" if p.exit_code is None else str(p.exit_code)
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


def summary_text(d: dict[str, Any], logs: Path) -> str:
    """The end of a run in a few lines, from the summary dict (RunState.as_dict)."""
    lines = [
        "",
        f"completed:    {d['completed']}",
        f"final step:   {d['final_step']}",
        f"world sizes:  {' -> '.join(str(w) for w in d['world_sizes']) or '-'}",
        f"rounds:       {d['rendezvous_rounds']} (groups formed)",
    ]
    for r in d["reforms"]:
        if r["seconds"] is None:  # nothing formed or trained after this fault
            lines.append(f"fault:        {r['cause']} at {r['fault_at']:g}s ({r['note']})")
            continue
        detail = r.get("note") or (
            f"resumed at step {r['resumed_step']}, steps lost {r['steps_lost']}"
        )
        if r.get("state_from"):
            detail += f"; state from {r['state_from']}"
        lines.append(
            f"re-form:      {r['cause']}: world size {r['world_size']} after "
            f"{r['seconds']:.1f}s ({detail})"
        )
    lines.append(f"checkpoints:  {', '.join(str(s) for s in d['checkpoint_steps']) or '-'}")
    for name, w in d.get("exit_barrier", {}).items():
        whom = "the other nodes" if w["waiting_for"] is None else ", ".join(w["waiting_for"])
        if w["left_after_seconds"] is None:
            lines.append(f"exit barrier: {name} was still waiting at the end, for {whom}")
        elif w["timed_out"]:
            lines.append(
                f"exit barrier: {name} waited {w['left_after_seconds']:g}s, its timeout, for {whom}"
            )
        else:
            lines.append(f"exit barrier: {name} waited {w['left_after_seconds']:g}s")
    for stop in d.get("stopped_in_teardown", []):
        lines.append(
            f"teardown:     {stop['pod']}: training process ({stop['process']}) stopped "
            f"{stop['seconds']:g}s after its script returned {stop['code']}"
        )
    for name, p in d["pods"].items():
        lines.append(f"pod:          {name}: exit {p['exit_code']}, restarts {p['restarts']}")
    if d["error"]:
        lines.append(f"error:        {d['error']}")
    if d.get("prometheus_url"):
        lines.append(f"prometheus:   {d['prometheus_url']} (gone with the run; --linger keeps it)")
    lines.append(f"logs:         {logs}")
    return "\n".join(lines) + "\n"
