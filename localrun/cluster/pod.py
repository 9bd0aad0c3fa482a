"""A pod of a StatefulSet and its lifecycle, as data: the phases, which phase may follow
which (kwok describes pod lifecycles the same way), and the restart back-off."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.cluster.podspec import Container
from localrun.cluster.runtime import RunningContainer

if TYPE_CHECKING:
    from localrun.cluster.statefulset import StatefulSet


class Phase(str, Enum):
    PENDING = "Pending"  # not placed yet, or waiting out `down_until`
    INIT = "Init"  # an init container runs
    RUNNING = "Running"  # the main container runs
    BACKOFF = "CrashLoopBackOff"  # a container exited; restart after the back-off
    TERMINATING = "Terminating"  # deleted: SIGTERM sent, SIGKILL after the grace period
    GONE = "Gone"  # removed; the StatefulSet makes a new incarnation


#: Which phase may follow which. The kubelet moves pods only along these edges
#: (Pod.enter refuses any other), so the lifecycle can be read here and tested.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.INIT, Phase.RUNNING, Phase.BACKOFF, Phase.GONE}),
    Phase.INIT: frozenset(
        {Phase.INIT, Phase.RUNNING, Phase.BACKOFF, Phase.TERMINATING, Phase.GONE}
    ),
    Phase.RUNNING: frozenset({Phase.BACKOFF, Phase.TERMINATING, Phase.GONE}),
    Phase.BACKOFF: frozenset({Phase.INIT, Phase.RUNNING, Phase.BACKOFF, Phase.GONE}),
    Phase.TERMINATING: frozenset({Phase.GONE}),
    Phase.GONE: frozenset(),
}


class LifecycleError(RuntimeError):
    """A phase change the lifecycle does not allow: a bug in a controller."""


@dataclass
class Backoff:
    """CrashLoopBackOff: base, 2*base, 4*base ... up to cap; reset after a long run."""

    base: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0
    failures: int = 0

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.reset_after:
            self.failures = 0
        delay = float(min(self.cap, self.base * (2.0**self.failures)))
        self.failures += 1
        return delay


@dataclass(frozen=True)
class Termination:
    exit_code: int
    started_at: float
    finished_at: float


@dataclass(frozen=True)
class Disruption:
    """Why the pod is going (the DisruptionTarget condition's reason and message)."""

    reason: str
    message: str
    at: float


#: How the local run's pod deletions look: a spot or preemptible node reclaimed, the
#: kubelet's graceful node shutdown terminating its pods (Kubernetes 1.26+ sets this).
NODE_SHUTDOWN = (
    "TerminationByKubelet",
    "Pod was terminated in response to imminent node shutdown.",
)


@dataclass
class Pod:
    name: str
    sts: StatefulSet
    ordinal: int
    incarnation: int
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    phase: Phase = Phase.PENDING
    node: str = ""
    ip: str = ""
    dir: Path | None = None
    proc: RunningContainer | None = None
    step: int = 0  # index into init containers, then len(init) for the main container
    restarts: int = 0
    last_exit: int | None = None  # of the main container
    zero_exit_at: float | None = None  # last time the main container exited 0
    failures_in_row: int = 0
    main_started: bool = False
    next_start: float = 0.0
    deleting: bool = False  # the API's deletionTimestamp is set
    killing: bool = False  # its kubelet acts on the deletion (SIGTERM sent, or nothing ran)
    grace: float | None = None  # the deletion's grace period (None: the spec's)
    kill_at: float | None = None
    down_until: float = 0.0
    message: str = ""
    env: dict[str, str] = field(default_factory=dict)  # the main container's, once started
    # Wall-clock times (time.time()) and the last run of the main container, for the pod
    # object the API server serves (podobject.py).
    created_at: float = field(default_factory=time.time)
    scheduled_at: float | None = None
    started_at: float | None = None  # the current container's start
    deleted_at: float | None = None
    last_run: Termination | None = None  # the main container's last run that ended
    disruption: Disruption | None = None  # the DisruptionTarget condition, once set
    #: As admission left them at creation (tolerations.admitted_tolerations).
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    #: Wall-clock time the node lifecycle controller set the pod's Ready condition False
    #: because its node is not Ready (its kubelet cannot report); None: it did not.
    node_not_ready_at: float | None = None

    def enter(self, phase: Phase) -> None:
        if phase is not self.phase and phase not in TRANSITIONS[self.phase]:
            raise LifecycleError(f"pod {self.name}: {self.phase.value} -> {phase.value}")
        self.phase = phase

    @property
    def labels(self) -> dict[str, str]:
        return self.sts.labels

    @property
    def current(self) -> Container:
        init = self.sts.init_containers
        return init[self.step] if self.step < len(init) else self.sts.containers[0]

    @property
    def in_init(self) -> bool:
        return self.step < len(self.sts.init_containers)
