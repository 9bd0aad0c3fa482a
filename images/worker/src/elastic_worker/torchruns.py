"""torchrun run after run, one per rendezvous epoch, for pod.py: the signal relay to the
one running, and the epoch loop around it.

    Relay        the stop flag and the running torchrun, for the signal handler (main.py)
    Epochs       torchrun supervised in the current epoch; in the next while torch closed
                 it early (recovery/epochs.py); a lifeline watcher per torchrun; a pod
                 that was replaced (recovery/fence.py) waits for its kubelet; torchrun
                 started again in the same epoch when it was stuck (recovery/stuckround.py)
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
from elastic_worker.launch.supervisor import ExitBarrier, Supervisor, Unfinished
from elastic_worker.observe import events
from elastic_worker.recovery import epochs
from elastic_worker.recovery.fence import Fence
from elastic_worker.recovery.leave import Leaving
from elastic_worker.recovery.lifelines import client as lifelines
from elastic_worker.recovery.reclaim import Reclaimer
from elastic_worker.settings.config import Config
from elastic_worker.torchcompat import RdzvNode

if TYPE_CHECKING:  # imported when on (pod.py's _metrics): prometheus-client is needed only then
    from elastic_worker.observe import metrics

logger = logging.getLogger(__name__)


@dataclass
class Relay:
    """What the signal handler needs: the stop flag and the torchrun to forward to."""

    stop: threading.Event = field(default_factory=threading.Event)
    supervisor: Supervisor | None = None
    fence: Fence | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()
        if self.supervisor is not None:
            self.supervisor.forward(signum)

    def torchrun_pid(self) -> int | None:
        """The running torchrun's pid (the node torch knows this pod by), if any."""
        proc = self.supervisor.proc if self.supervisor is not None else None
        return proc.pid if proc is not None and proc.returncode is None else None


#: torchruns in a row stopped as stuck (recovery/stuckround.py) without training before
#: the pod leaves it to the kubelet: a decision that keeps misfiring must not loop here.
MAX_STUCK = 5


@dataclass
class Epochs:
    """torchrun in the current rendezvous epoch, and in the next while torch closed it
    early; again in the same one when it was stuck in a round that lost a node.
    `lifelines`: the attempt log, when this pod holds lifelines to its peers
    (recovery/lifelines/); `leave`: this torch lets a node leave its round at once;
    `unfinished`: who of the round has not finished (lossdetect.py), said while this node
    waits in torch's exit barrier; `reports`: a directory for torchrun's (torchrun.py)."""

    cfg: Config
    completion: Completion
    ready: Ready
    relay: Relay
    env: dict[str, str]
    tracker: metrics.Tracker | None = None
    recorder: events.Recorder | None = None
    warm_socket: str | None = None
    lifelines: Path | None = None
    leave: bool = True
    fence: Fence | None = None
    reclaimer: Reclaimer | None = None
    unfinished: Unfinished | None = None
    reports: Path | None = None
    _runs: int = field(default=0, init=False)  # torchruns started: one report file each
    #: the last torchrun stopped as stuck had trained before (StuckRoundWatch)
    _trained: bool = field(default=False, init=False)

    def run(self) -> int:
        cfg, relay, client = self.cfg, self.relay, self.completion.client
        epoch_now = epochs.current(client, cfg)
        reopen = stuck = 0
        while True:
            if relay.stop.is_set():
                return exits.signalled(signal.SIGTERM)
            rdzv_id = epochs.run_id(cfg, epoch_now)
            supervisor = self._supervisor(rdzv_id)
            relay.supervisor = supervisor
            if relay.stop.is_set():  # a signal between the check above and the line before:
                return exits.signalled(signal.SIGTERM)  # nobody would pass it to this torchrun
            if self.tracker is not None:
                self.tracker.torchrun_started()
            code = self._run(supervisor, rdzv_id)
            if self.fence is not None and self.fence.fenced.is_set():
                relay.stop.wait()  # replaced: out of the job until the kubelet stops the pod
                return exits.signalled(signal.SIGTERM)
            if code != 0 and supervisor.restarted is not None and supervisor.signalled is None:
                # Stuck in a round that lost a node (recovery/stuckround.py): the same
                # rendezvous again, unless torchruns keep getting stuck without training.
                stuck = 0 if self._trained else stuck + 1
                if stuck <= MAX_STUCK:
                    continue
                return code
            if code == 0 or supervisor.signalled is not None or reopen == epochs.MAX_REOPENS:
                return code
            if not epochs.closed_early(cfg, rdzv_id):
                return code
            reopen += 1
            epoch_now = epochs.advance(client, cfg, epoch_now)
            self._reopened(rdzv_id, epochs.run_id(cfg, epoch_now))

    def _supervisor(self, rdzv_id: str) -> Supervisor:
        local_addr = self.ready.local_addr
        self._runs += 1
        report = self.reports / f"torchrun-{self._runs}" if self.reports is not None else None
        torchrun = argv.build_argv(
            self.cfg,
            local_addr,
            rdzv_id=rdzv_id,
            pwd=self.env.get("PWD"),
            warm_socket=self.warm_socket,
            report=str(report) if report is not None else None,
        )
        logger.info("starting: %s", shlex.join(torchrun))
        leaving = Leaving(
            self.cfg,
            rdzv_id,
            local_addr,
            self.completion,
            enabled=self.leave,
            holding=self._holding,
        )
        barrier = (
            None
            if report is None
            else ExitBarrier(
                report,
                self.cfg.exit_barrier_timeout,
                self.unfinished,
                _in_exit_barrier(self.tracker, self.recorder, self.cfg.exit_barrier_timeout),
            )
        )
        return Supervisor(
            torchrun,
            self.env,
            self.cfg,
            self.completion,
            leaving=leaving,
            fence=self.fence,
            exit_barrier=barrier,
        )

    def _holding(self) -> bool:
        """This pod must not act on the job now (recovery/fence.py)."""
        return self.fence is not None and self.fence.holding

    def _run(self, supervisor: Supervisor, rdzv_id: str) -> int:
        """The torchrun, with lifelines to the other nodes of each round while it runs."""
        if self.lifelines is None:
            return supervisor.run()

        def on_stuck(reason: str, trained: bool) -> None:
            self._trained = trained
            if self._holding():  # recovery/fence.py: this pod may be the one cut off
                return
            if supervisor.restart(reason) and self.recorder is not None:
                self.recorder.record(
                    "TorchrunRestarted",
                    f"torchrun was stuck assigning worker ranks: {reason}: started it again "
                    f"in rendezvous {rdzv_id}",
                    events.WARNING,
                )

        watcher = lifelines.watch(
            self.cfg,
            rdzv_id,
            self.ready.local_addr,
            self.relay.torchrun_pid,
            self.lifelines,
            warm_socket=self.warm_socket,
            on_removed=self._peer_gone(rdzv_id),
            may_act=lambda: not self._holding(),
            on_stuck=on_stuck,
        )
        if supervisor.leaving is not None:
            supervisor.leaving.via = watcher.leave  # torch is imported there
        try:
            return supervisor.run()
        finally:
            watcher.stop()

    def _reopened(self, closed: str, joining: str) -> None:
        logger.warning(
            "rendezvous %s was closed before the job completed (an agent failed, "
            "e.g. while etcd was away): joining rendezvous %s",
            closed,
            joining,
        )
        if self.recorder is not None:
            self.recorder.record(
                "RendezvousReopened",
                f"rendezvous {closed} was closed before the job completed: joining {joining}",
                events.WARNING,
                job=True,
            )

    def _peer_gone(self, rdzv_id: str) -> Callable[[RdzvNode], None]:
        """A node this pod took out of the round through its lifeline: the PeerGone
        Event, and its pod watched for reclaim (this pod took it out: it acts for it)."""
        recorder, reclaimer = self.recorder, self.reclaimer
        registration = self.ready.registration

        def gone(node: RdzvNode) -> None:
            if recorder is not None:
                recorder.record(
                    "PeerGone",
                    f"the torchrun of {node[0]} (pid {node[1]}) is gone (its lifeline "
                    f"closed): took its node out of rendezvous {rdzv_id}",
                    events.WARNING,
                )
            if reclaimer is not None and registration is not None:
                peer = registration.member_at(node[0])
                if peer is not None:
                    reclaimer.lost(peer.name, None, peer.uid or None)

        return gone


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
                "ExitBarrier",
                f"training processes exited 0; waiting up to {timeout:g} s for: {whom}",
            )

    return notify
