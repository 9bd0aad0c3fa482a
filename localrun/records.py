"""The records of a run's state (state.py): a re-form, a pod, a wait in torch's exit
barrier, a rendezvous round; each turns itself into its part of the `--json` summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localrun.lines import Restore


@dataclass
class Reform:
    cause: str
    fault_at: float  # seconds since the run started
    seconds: float | None = None  # fault -> first training step of the new group
    world_size: int | None = None
    resumed_step: int | None = None
    steps_lost: int | None = None  # highest step before the fault minus the resumed step
    #: Where the new round's state came from: peer-memory when any pod's came from another
    #: pod's memory, else local-memory, else checkpoint; None when no worker said.
    state_from: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "fault_at": round(self.fault_at, 2),
            "seconds": None if self.seconds is None else round(self.seconds, 2),
            "world_size": self.world_size,
            "resumed_step": self.resumed_step,
            "steps_lost": self.steps_lost,
            "state_from": self.state_from,
        }

    def restored(self, restores: list[Restore]) -> None:
        """What the pods' workers said of the new round's state (restores after the fault)."""
        if not restores:
            return
        sources = {r.source for r in restores}
        self.state_from = next(
            s for s in ("peer-memory", "local-memory", "checkpoint") if s in sources
        )
        if self.resumed_step is None:
            self.resumed_step = restores[0].step
        lost = [r.lost for r in restores if r.lost is not None]
        if self.steps_lost is None and lost:
            self.steps_lost = max(lost)


@dataclass
class PodState:
    name: str
    phase: str = "Pending"
    node: str = ""
    ip: str = ""
    restarts: int = 0
    recreated: int = 0
    exit_code: int | None = None  # of the main container, last run
    step: int | None = None
    message: str = ""
    last_lines: list[str] = field(default_factory=list)
    nodes: list[tuple[int, str]] = field(default_factory=list)  # (incarnation, node) in order


@dataclass
class BarrierWait:
    """A pod in torch's exit barrier: its training processes exited 0, it waits for `whom`
    (None: it cannot tell), since `since` (run seconds, when it first said so)."""

    since: float
    whom: tuple[str, ...] | None
    left_after: float | None = None  # seconds in the barrier, once it left
    timed_out: bool = False  # left by the timeout, `whom` not finished

    def as_dict(self) -> dict[str, Any]:
        return {
            "waiting_for": None if self.whom is None else list(self.whom),
            "left_after_seconds": self.left_after,
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class Round:
    """A rendezvous round, from the attempt line of its group rank 0."""

    at: float
    nodes: int
    world_size: int
    restart: int
