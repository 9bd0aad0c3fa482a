"""What the run did, from the training log lines and the faults: the `--json` summary.

A re-form is counted when training starts again after a fault (a `resumed` line, or a step
at another world size, after the fault) or when the world size changes without one (a
pod joined). Its `seconds` run from the fault (or the joining pod's start) to the first
training step of the new group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.progress import TrainEvent


@dataclass
class Reform:
    cause: str
    fault_at: float  # seconds since the run started
    seconds: float | None = None  # fault -> first training step of the new group
    world_size: int | None = None
    resumed_step: int | None = None
    steps_lost: int | None = None  # highest step before the fault minus the resumed step

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "fault_at": round(self.fault_at, 2),
            "seconds": None if self.seconds is None else round(self.seconds, 2),
            "world_size": self.world_size,
            "resumed_step": self.resumed_step,
            "steps_lost": self.steps_lost,
        }


@dataclass
class PodSummary:
    exit_code: int | None = None
    restarts: int = 0
    recreated: int = 0
    node: str = ""


@dataclass
class Summary:
    completed: bool = False
    final_step: int | None = None
    world_sizes: list[int] = field(default_factory=list)
    rendezvous_rounds: int = 0  # groups formed: train.py's `start` lines
    reforms: list[Reform] = field(default_factory=list)
    checkpoint_steps: list[int] = field(default_factory=list)
    pods: dict[str, PodSummary] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    steps_went_back_past_checkpoint: bool = False
    error: str = ""
    duration: float = 0.0
    etcd_complete: bool | None = None
    # working state
    _max_step: int | None = None
    _world: int | None = None
    _pending: list[Reform] = field(default_factory=list)
    _resuming: int | None = None  # resumed step seen since the pending faults
    _resumed_after_fault: bool = False
    _started: bool = False
    _last_pod_start: tuple[str, float, str] | None = None

    def fault(self, t: float, cause: str) -> None:
        self.faults.append({"at": round(t, 2), "fault": cause})
        self._pending.append(Reform(cause, t))

    def pod_started(self, pod: str, t: float, what: str = "joined") -> None:
        """A worker that may join the group: its container started, or its link came back."""
        self._last_pod_start = (pod, t, what)

    def train(self, pod: str, t: float, ev: TrainEvent) -> None:
        if ev.kind == "checkpoint":
            if ev.step not in self.checkpoint_steps:
                self.checkpoint_steps.append(ev.step)
            return
        if ev.kind == "done":
            self.completed = True
            self.final_step = max(self.final_step or 0, ev.step)
            return
        if ev.kind == "start":
            self.rendezvous_rounds += 1
            return
        if ev.kind == "resumed":
            last_ckpt = self.checkpoint_steps[-1] if self.checkpoint_steps else None
            if last_ckpt is not None and ev.step < last_ckpt:
                self.steps_went_back_past_checkpoint = True
            if self._started:
                self._resuming = ev.step
                self._resumed_after_fault = bool(self._pending)
            return
        if ev.kind != "step":
            return
        world = ev.world_size
        changed = world is not None and world != self._world
        if world is not None and (not self.world_sizes or self.world_sizes[-1] != world):
            self.world_sizes.append(world)
        if self._started and (self._pending and (self._resumed_after_fault or changed)):
            for r in self._pending:
                r.seconds = t - r.fault_at
                r.world_size = world
                r.resumed_step = self._resuming
                if self._max_step is not None and self._resuming is not None:
                    r.steps_lost = max(0, self._max_step - self._resuming)
                self.reforms.append(r)
            self._pending = []
            self._resumed_after_fault = False
        elif self._started and changed:
            who, since, what = self._last_pod_start or ("", t, "")
            r = Reform(
                f"world size {self._world} -> {world}" + (f" ({who} {what})" if who else ""), since
            )
            r.seconds = t - since
            r.world_size = world
            r.resumed_step = self._resuming
            if self._max_step is not None and self._resuming is not None:
                r.steps_lost = max(0, self._max_step - self._resuming)
            self.reforms.append(r)
        self._started = True
        self._world = world if world is not None else self._world
        self._max_step = ev.step if self._max_step is None else max(self._max_step, ev.step)
        self.final_step = max(self.final_step or 0, ev.step)

    def as_dict(self) -> dict[str, Any]:
        unresolved = [
            {**r.as_dict(), "note": "no training step followed this fault"} for r in self._pending
        ]
        return {
            "completed": self.completed,
            "final_step": self.final_step,
            "world_sizes": self.world_sizes,
            "rendezvous_rounds": self.rendezvous_rounds,
            "reforms": [r.as_dict() for r in self.reforms] + unresolved,
            "pods": {
                name: {
                    "exit_code": p.exit_code,
                    "restarts": p.restarts,
                    "recreated": p.recreated,
                    "node": p.node,
                }
                for name, p in sorted(self.pods.items())
            },
            "checkpoint_steps": self.checkpoint_steps,
            "faults": self.faults,
            "steps_went_back_past_checkpoint": self.steps_went_back_past_checkpoint,
            "etcd_complete": self.etcd_complete,
            "duration_seconds": round(self.duration, 1),
            "error": self.error,
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
