"""torchrun launched again and again for pod.py: the signal relay to the one running, and
the loop that launches the next one when the node-loss policy says so.

    Relay        the stop flag and the running torchrun, for the signal handler (main.py)
    Torchruns    torchrun supervised in the current rendezvous generation; what follows
                 its exit (the same rendezvous again, the next generation, the end) is
                 recovery/policy.py's decision
"""

from __future__ import annotations

import logging
import shlex
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from elastic_worker import exits
from elastic_worker.completion import Completion
from elastic_worker.gate.ready import Ready
from elastic_worker.launch import argv
from elastic_worker.launch.supervisor import ExitBarrier, Hooks, Supervisor
from elastic_worker.observe import events
from elastic_worker.recovery import generations
from elastic_worker.recovery.policy import After, NodeLoss
from elastic_worker.settings.config import Config

if TYPE_CHECKING:  # imported when on (pod.py's _metrics): prometheus-client is needed only then
    from elastic_worker.observe import metrics

logger = logging.getLogger(__name__)


@dataclass
class Relay:
    """What the signal handler needs: the stop flag and the torchrun to forward to;
    `replaced`, set when a newer incarnation replaced this pod (recovery/fence.py)."""

    stop: threading.Event = field(default_factory=threading.Event)
    supervisor: Supervisor | None = None
    replaced: threading.Event = field(default_factory=threading.Event)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()
        if self.supervisor is not None:
            self.supervisor.forward(signum)

    def torchrun_pid(self) -> int | None:
        """The running torchrun's pid (the node torch knows this pod by), if any."""
        proc = self.supervisor.proc if self.supervisor is not None else None
        return proc.pid if proc is not None and proc.returncode is None else None


@dataclass
class Torchruns:
    """torchrun after torchrun, each supervised, with the node-loss policy's watch on it.
    `reports`: a directory for torchrun's (launch/torchrun.py)."""

    cfg: Config
    completion: Completion
    ready: Ready
    relay: Relay
    env: dict[str, str]
    node_loss: NodeLoss
    tracker: metrics.Tracker | None = None
    recorder: events.Recorder | None = None
    warm_socket: str | None = None
    reports: Path | None = None
    _launched: int = field(default=0, init=False)  # torchruns launched: one report file each

    def run(self) -> int:
        relay = self.relay
        generation = generations.current(self.completion.client, self.cfg)
        while True:
            if relay.stop.is_set():
                return exits.signalled(signal.SIGTERM)
            rdzv_id = generations.run_id(self.cfg, generation)
            watch = self.node_loss.watch(rdzv_id, self.ready.local_addr, self.warm_socket)
            supervisor = self._supervisor(rdzv_id, watch)
            relay.supervisor = supervisor
            if relay.stop.is_set():  # a signal between the check above and the line before:
                return exits.signalled(signal.SIGTERM)  # nobody would pass it to this torchrun
            if self.tracker is not None:
                self.tracker.torchrun_started()
            with watch.running(supervisor):
                code = supervisor.run()
            after, generation = self.node_loss.after_torchrun(code, supervisor, generation)
            if after is After.REPLACED:
                relay.stop.wait()  # out of the job until the kubelet stops the pod
                return exits.signalled(signal.SIGTERM)
            if after is After.END:
                return code

    def _supervisor(self, rdzv_id: str, hooks: Hooks) -> Supervisor:
        self._launched += 1
        report = self.reports / f"torchrun-{self._launched}" if self.reports else None
        torchrun = argv.build_argv(
            self.cfg,
            self.ready.local_addr,
            rdzv_id=rdzv_id,
            pwd=self.env.get("PWD"),
            warm_socket=self.warm_socket,
            report=str(report) if report is not None else None,
        )
        logger.info("starting: %s", shlex.join(torchrun))
        barrier = (
            None
            if report is None
            else ExitBarrier(
                report,
                self.cfg.exit_barrier_timeout,
                self.node_loss.unfinished,
                _in_exit_barrier(self.tracker, self.recorder, self.cfg.exit_barrier_timeout),
            )
        )
        return Supervisor(
            torchrun, self.env, self.cfg, self.completion, hooks=hooks, exit_barrier=barrier
        )


def _in_exit_barrier(
    tracker: metrics.Tracker | None, recorder: events.Recorder | None, timeout: float
) -> Callable[[list[str] | None], None]:
    """The metrics' state and the pod's ExitBarrier Event (once per wait), when this node
    waits in torch's exit barrier for `names` (None: it cannot tell which nodes)."""
    told: list[bool] = []

    def notify(names: list[str] | None) -> None:
        if tracker is not None:
            tracker.exit_barrier(None if names is None else len(names))
        if recorder is not None and recorder.enabled and not told:
            told.append(True)
            whom = ", ".join(names) if names else "the other nodes"
            recorder.record(
                events.EXIT_BARRIER,
                f"training processes exited 0; waiting up to {timeout:g} s for: {whom}",
            )

    return notify
