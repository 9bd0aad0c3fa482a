"""The run state: what the run knows, fed by the pods' lines (lines.parse_line), the
cluster's pods, the faults and the completion marker; read by the live view (view.py)
and written as the `--json` summary.

Where each fact comes from:
- completion: the worker's marker in etcd (the runner reads it through chart.py);
- rounds and world sizes (in nodes): the worker's attempt lines, one per round from the
  member with group_rank 0; a worker without them falls back to the reference script's
  `[train] start` and step lines;
- steps, checkpoints, re-form timings: `[train]` lines, when the script prints them;
- where a re-form's state came from (another pod's memory, the pod's own, the checkpoint)
  and the steps it lost: the worker's `state restored` line, when the script keeps
  snapshots (packages/elastic-snapshot), whatever else it prints.
- the end: which pods waited in torch's exit barrier, for whom and how long, and which
  training processes were stopped in their teardown: the worker's own lines.

A re-form is counted when training starts again after a fault (a `resumed` line, or a step
at another world size, after the fault) or when the world size changes without one (a
pod joined). Its `seconds` run from the fault (or the joining pod's start) to the first
training step of the new group.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from localrun.cluster.pod import Pod
from localrun.lines import (
    Attempt,
    ExitBarrier,
    Restore,
    TeardownStopped,
    TrainEvent,
    WorkerMessage,
    parse_line,
)
from localrun.records import BarrierWait, PodState, Reform, Round

#: Seconds between the attempt lines of one round's members, at most (they start together).
ROUND_SKEW = 10.0
#: How many of a pod's last notable lines are kept (for the error of a run that gave up).
LAST_LINES = 5


class RunState:
    def __init__(self, say: Callable[[str], None] | None = None, step_lines: bool = False):
        self.say = say or (lambda text: None)
        self.step_lines = step_lines  # one event per new step (plain output)
        self.pods: dict[str, PodState] = {}
        self.prometheus_url: str | None = None  # --prometheus
        self.completed_at: float | None = None
        self.etcd_complete: bool | None = None
        #: The rendezvous StatefulSet's replicas were 0 at the end (the chart's scale-down
        #: takes it to 0 after the workers, so that nothing pins a node).
        self.rendezvous_scaled_to_zero = False
        self.rounds: list[Round] = []
        self.train_rounds = 0  # `[train] start` lines: the fallback count
        self.step: int | None = None  # highest training step seen
        self.step_world: list[int] = []  # world sizes of the step lines, in order
        self.checkpoint_steps: list[int] = []
        self.reforms: list[Reform] = []
        self.faults: list[dict[str, Any]] = []
        self.node_events: list[dict[str, Any]] = []
        #: Each pod's group rank in the last round it joined, and when it said so.
        self.ranks: dict[str, tuple[int, float]] = {}
        self.steps_went_back_past_checkpoint = False
        self.error = ""
        self.duration = 0.0
        self.exit_barrier: dict[str, BarrierWait] = {}  # the last wait of each pod
        self.stopped_in_teardown: list[dict[str, Any]] = []
        # re-form tracking (step detail)
        self._world: int | None = None
        self._pending: list[Reform] = []
        self._resuming: int | None = None  # resumed step seen since the pending faults
        self._resumed_after_fault = False
        self._started = False
        self._last_pod_start: tuple[str, float, str] | None = None
        self._done: int | None = None  # the step of the script's `done` line
        self._restores: list[tuple[float, Restore]] = []  # the workers' `state restored` lines

    # -- derived facts -------------------------------------------------------------------

    @property
    def completed(self) -> bool:
        return self.completed_at is not None

    @property
    def rendezvous_rounds(self) -> int:
        return len(self.rounds) if self.rounds else self.train_rounds

    @property
    def world_sizes(self) -> list[int]:
        """World sizes in order (consecutive repeats once)."""
        if not self.rounds:
            return list(self.step_world)
        out: list[int] = []
        for r in self.rounds:
            if not out or out[-1] != r.nodes:
                out.append(r.nodes)
        return out

    @property
    def waiting_in_exit_barrier(self) -> dict[str, tuple[str, ...] | None]:
        """Pods in the exit barrier now, and whom they wait for."""
        return {pod: w.whom for pod, w in self.exit_barrier.items() if w.left_after is None}

    @property
    def step_world_size(self) -> int | None:
        """The world size of the last training step seen (`@world=N` faults)."""
        return self._world

    @property
    def world_size(self) -> int | None:
        """The current one: the last round's, else the last step line's."""
        if self.rounds:
            return self.rounds[-1].nodes
        return self._world

    # -- inputs --------------------------------------------------------------------------

    def pod_at_rank(self, rank: int) -> str | None:
        """The pod at group rank `rank` of the newest round (its members print their
        attempt lines together: within ROUND_SKEW s of rank 0's); None: no such pod."""
        if not self.rounds:
            return None
        newest = self.rounds[-1].at
        found = [
            (t, pod) for pod, (r, t) in self.ranks.items() if r == rank and t >= newest - ROUND_SKEW
        ]
        return max(found)[1] if found else None

    def complete(self, t: float, how: str) -> None:
        """The job is complete (seen at `t`); the earliest sighting counts."""
        if self.completed_at is None or t < self.completed_at:
            if self.completed_at is None:
                self.say(f"training complete ({how})")
            self.completed_at = t

    def pod(self, name: str) -> PodState:
        return self.pods.setdefault(name, PodState(name))

    def observe(
        self,
        pods: Iterable[Pod],
        partitioned: Callable[[str], bool],
        node_down: Callable[[str], bool] = lambda node: False,
    ) -> None:
        """The cluster's pods now; pods no longer there are Deleted."""
        seen = set()
        for p in pods:
            seen.add(p.name)
            ps = self.pod(p.name)
            if p.node and node_down(p.node):
                ps.phase = "NodeDown"
            else:
                ps.phase = "Partitioned" if partitioned(p.name) else p.phase.value
            if p.node and (not ps.nodes or ps.nodes[-1] != (p.incarnation, p.node)):
                ps.nodes.append((p.incarnation, p.node))
            ps.node = p.node or ps.node
            ps.ip = p.ip
            ps.restarts = p.restarts
            ps.recreated = p.incarnation - 1
            if p.message:
                ps.message = p.message
        for name, ps in self.pods.items():
            if name not in seen:
                ps.phase = "Deleted"

    def exited(self, pod: str, rc: int | None) -> None:
        self.pod(pod).exit_code = rc

    def fault(self, t: float, cause: str) -> None:
        self.faults.append({"at": round(t, 2), "fault": cause})
        self._pending.append(Reform(cause, t))

    def node(self, t: float, node: str, what: str) -> None:
        """A node's change as the control plane saw it (NodeNotReady, NodeReady, back, deleted)."""
        self.node_events.append({"at": round(t, 2), "node": node, "event": what})
        self.say(f"node {node}: {what}")

    def pod_started(self, pod: str, t: float, what: str = "joined") -> None:
        """A worker that may join the group: its container started, or its link came back."""
        self._last_pod_start = (pod, t, what)

    def line(self, pod: str, container: str, text: str, t: float) -> None:
        """One line a pod printed: the one place lines are interpreted."""
        ev = parse_line(container, text)
        if isinstance(ev, Attempt):
            self.attempt(pod, t, ev)
        elif isinstance(ev, Restore):
            self._restores.append((t, ev))
            lost = "?" if ev.lost is None else ev.lost
            self.say(f"{pod}: state restored at step {ev.step} from {ev.source} ({lost} lost)")
            if self.reforms and not self._pending:
                # The worker reads the script's line every 0.5 s: it may come after the
                # first step of the new round, which resolved the re-form.
                last = self.reforms[-1]
                last.restored(self._restores_between(last.fault_at, t))
        elif isinstance(ev, TrainEvent):
            self.train(pod, t, ev)
        elif isinstance(ev, ExitBarrier):
            self._exit_barrier(pod, t, ev)
            self._message(pod, text.strip(), shown=True)
        elif isinstance(ev, TeardownStopped):
            self.stopped_in_teardown.append(
                {"pod": pod, "process": ev.process, "seconds": ev.seconds, "code": ev.code}
            )
            self._message(pod, text.strip(), shown=True)
        elif isinstance(ev, WorkerMessage):
            self._message(pod, ev.text, ev.shown)

    def _message(self, pod: str, text: str, shown: bool) -> None:
        ps = self.pod(pod)
        ps.last_lines = [*ps.last_lines, text][-LAST_LINES:]
        if shown:
            ps.message = text[:80]
            self.say(f"{pod}: {text}")

    def _exit_barrier(self, pod: str, t: float, ev: ExitBarrier) -> None:
        wait = self.exit_barrier.get(pod)
        if ev.left_after is None:  # waiting, or still waiting for fewer
            if wait is None or wait.left_after is not None:
                self.exit_barrier[pod] = BarrierWait(t, ev.whom)
            else:
                wait.whom = ev.whom
            return
        if wait is None:
            wait = self.exit_barrier[pod] = BarrierWait(t - ev.left_after, None)
        wait.left_after, wait.timed_out = ev.left_after, ev.timed_out
        if ev.timed_out:
            wait.whom = ev.whom

    def attempt(self, pod: str, t: float, a: Attempt) -> None:
        self.ranks[pod] = (a.group_rank, t)
        if a.group_rank != 0:
            return
        self.rounds.append(Round(t, a.nodes, a.world_size, a.restart))
        self.say(
            f"rendezvous round {len(self.rounds)}: world size {a.nodes} "
            f"({a.world_size} processes, restart {a.restart})"
        )

    def train(self, pod: str, t: float, ev: TrainEvent) -> None:
        if ev.kind == "step":
            self._step(pod, t, ev)
        elif ev.kind == "checkpoint":
            if ev.step not in self.checkpoint_steps:
                self.checkpoint_steps.append(ev.step)
                self.say(f"checkpoint at step {ev.step}")
        elif ev.kind == "done":
            if self._done is None:  # every node's rank 0 says it; once is enough
                self.say(f"the script reports training done at step {ev.step}")
            self._done = ev.step
            self.step = max(self.step or 0, ev.step)
        elif ev.kind == "start":
            if self.rounds:
                self.say(f"training from step {ev.step} at world size {ev.world_size}")
            else:
                # A worker without attempt lines: rank 0 of the reference script says it
                # once per group, after a completed round (restart or not).
                self.train_rounds += 1
                self.say(
                    f"rendezvous round {self.train_rounds}: world size {ev.world_size}, "
                    f"training from step {ev.step}"
                )
        elif ev.kind == "resumed":
            self._resumed(pod, ev)
        elif ev.kind == "sigterm":
            self.say(f"{pod}: SIGTERM handled at step {ev.step} (checkpoint taken)")

    def _resumed(self, pod: str, ev: TrainEvent) -> None:
        self.say(f"{pod}: resumed from step {ev.step}")
        last_ckpt = self.checkpoint_steps[-1] if self.checkpoint_steps else None
        if last_ckpt is not None and ev.step < last_ckpt:
            self.steps_went_back_past_checkpoint = True
        if self._started:
            self._resuming = ev.step
            self._resumed_after_fault = bool(self._pending)

    def _step(self, pod: str, t: float, ev: TrainEvent) -> None:
        self.pod(pod).step = ev.step
        world = ev.world_size
        changed = world is not None and world != self._world
        if changed and not self.rounds:
            was = "-" if self._world is None else self._world
            self.say(f"world size {was} -> {world} (step {ev.step})")
        if world is not None and (not self.step_world or self.step_world[-1] != world):
            self.step_world.append(world)
        if self._started and self._pending and (self._resumed_after_fault or changed):
            for r in self._pending:
                self._resolve(r, t, world)
            self._pending = []
            self._resumed_after_fault = False
        elif self._started and changed:
            who, since, what = self._last_pod_start or ("", t, "")
            r = Reform(
                f"world size {self._world} -> {world}" + (f" ({who} {what})" if who else ""), since
            )
            self._resolve(r, t, world)
        self._started = True
        self._world = world if world is not None else self._world
        if self.step is None or ev.step > self.step:
            self.step = ev.step
            if self.step_lines:
                self.say(
                    f"step {ev.step} world size {world} round {self.rendezvous_rounds or None}"
                )

    def _resolve(self, r: Reform, t: float, world: int | None) -> None:
        r.seconds = t - r.fault_at
        r.world_size = world
        r.resumed_step = self._resuming
        if self.step is not None and self._resuming is not None:
            r.steps_lost = max(0, self.step - self._resuming)
        r.restored(self._restores_between(r.fault_at, t))
        self.reforms.append(r)

    def _restores_between(self, start: float, end: float) -> list[Restore]:
        return [ev for t, ev in self._restores if start <= t <= end]

    # -- output --------------------------------------------------------------------------

    def _round_after(self, fault: Reform) -> dict[str, Any] | None:
        """A fault in a run without step lines: the first round formed after it (its world
        size, and the seconds to it, the only re-form facts such a script gives)."""
        if self._started:
            return None
        nxt = next((r for r in self.rounds if r.at > fault.fault_at), None)
        if nxt is None:
            return None
        reform = Reform(fault.cause, fault.fault_at, nxt.at - fault.fault_at, nxt.nodes)
        # The restores of that round: after the fault, before the round after it.
        later = next((r.at for r in self.rounds if r.at > nxt.at), float("inf"))
        reform.restored(self._restores_between(fault.fault_at, later))
        return {
            **reform.as_dict(),
            "note": "seconds to the new rendezvous round: the script prints no steps",
        }

    def as_dict(self) -> dict[str, Any]:
        reforms = [r.as_dict() for r in self.reforms]
        for r in self._pending:
            after = self._round_after(r)
            if after is not None:
                reforms.append(after)
            else:
                reforms.append({**r.as_dict(), "note": "no training step followed this fault"})
        return {
            "completed": self.completed,
            "final_step": self.step,
            "world_sizes": self.world_sizes,
            "rounds": [{"at": round(r.at, 2), "nodes": r.nodes} for r in self.rounds],
            "rendezvous_rounds": self.rendezvous_rounds,
            "reforms": reforms,
            "pods": {
                name: {
                    "exit_code": p.exit_code,
                    "restarts": p.restarts,
                    "recreated": p.recreated,
                    "node": p.node,
                    "nodes": [node for _, node in p.nodes],
                }
                for name, p in sorted(self.pods.items())
            },
            "checkpoint_steps": self.checkpoint_steps,
            "faults": self.faults,
            "node_events": self.node_events,
            "steps_went_back_past_checkpoint": self.steps_went_back_past_checkpoint,
            "etcd_complete": self.etcd_complete,
            "rendezvous_scaled_to_zero": self.rendezvous_scaled_to_zero,
            "exit_barrier": {pod: w.as_dict() for pod, w in sorted(self.exit_barrier.items())},
            "stopped_in_teardown": self.stopped_in_teardown,
            "duration_seconds": round(self.duration, 1),
            "prometheus_url": self.prometheus_url,
            "error": self.error,
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
