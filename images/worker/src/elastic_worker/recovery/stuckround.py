"""A torchrun stuck between a completed round and its workers, seen at once.

Right after a round completes, torch's agents assign worker ranks through the
rendezvous's store (etcd, since elastic-worker turns torch's shared TCPStore off): the
round's group rank 0 writes the master address, every node writes its role, rank 0 reads
them all and writes each node's ranks, every node reads its own; only then do the
workers start (torch/distributed/elastic/agent/server/api.py `_rendezvous`,
`_assign_worker_ranks`; rendezvous/api.py `RendezvousStoreInfo.build`). A node that dies
or leaves after the round completed and before it wrote leaves every other node waiting
in the store's `get`, which only ends after the store's timeout: 300 s, torch's default,
which no torchrun flag or rendezvous setting changes for etcd-v2 (torch's EtcdStore).
Then each agent fails and closes the rendezvous for good, and the pods go on in the next
generation (generations.py): minutes late. Nothing else breaks the wait: the lifelines
take the dead node out of the round, but the waits are for its keys, not for the round.
Its window is up to a second per re-form (each node notices the completed round at its
next 1 s poll) and it is hit by a SIGKILL, a leave at SIGTERM or a silent loss alike.

So each pod watches its own torchrun (StuckRoundWatch): while no worker of it runs, it
reads the round (round.py's RoundOps) and decides (StuckRound):

- this torchrun's node is in a completed round its workers have not started in yet
  (the round its last attempt started in is remembered: a node waiting in torch's exit
  barrier or stopping failed workers is in the round its workers ran in), and
- a node of that round is gone: the round, as first read, held a node it no longer does,
  or its ranks have a gap (0 to n - 1 are given at completion), or this state lasted
  longer than torch's own keep-alive window plus STUCK_SLACK (a node that left before the
  first read and had the last rank leaves no trace; no exchange with every node alive
  takes that long: a node frozen that long is dropped by torch itself).

and tells the node-loss policy (policy.py), which relaunches torchrun: its node leaves the
round as at a SIGTERM and another torchrun starts in the same rendezvous. The others do
the same, and the next round forms without the lost node, within seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from elastic_worker import timings
from elastic_worker.attempt_line import Tail, parse_attempt, process_alive
from elastic_worker.torchcompat import RdzvNode, RoundView

logger = logging.getLogger(__name__)


class StuckRound:
    """The decision, from the rounds read: pure, the clock given."""

    def __init__(self, slack: float = timings.STUCK_SLACK) -> None:
        self.slack = slack
        self.ran: int | None = None  # the round this torchrun's last workers started in
        self._round: int | None = None  # the completed round being watched
        self._since = 0.0
        self._first: frozenset[RdzvNode] = frozenset()

    def started(self, round_: int) -> None:
        """This torchrun's workers started in `round_`."""
        self.ran, self._round = round_, None

    def check(self, view: RoundView, own: RdzvNode, now: float) -> str | None:
        """Why this torchrun (node `own`), whose workers do not run, waits for a node of
        `view`'s round that is gone; None when it does not (or not yet)."""
        if not view.complete or own not in view.ranks or view.round == self.ran:
            self._round = None
            return None
        if view.round != self._round:
            self._round, self._since, self._first = view.round, now, frozenset(view.ranks)
        lost = sorted(self._first - view.ranks.keys())
        if lost:
            gone = ", ".join(f"{a} (pid {p})" for a, p in lost)
            return f"{gone} left round {view.round} after it completed"
        missing = sorted(set(range(len(view.ranks))) - set(view.ranks.values()))
        if missing:
            return f"group rank {missing[0]} left round {view.round} after it completed"
        waited = now - self._since
        if waited >= view.keep_alive + self.slack:
            return (
                f"round {view.round} completed {waited:.0f} s ago and this torchrun's workers "
                f"have not started (torch drops a node silent for {view.keep_alive:g} s)"
            )
        return None


class StuckRoundWatch:
    """StuckRound for one torchrun: `own()` its node (None before it runs), `read_round()`
    the round now, `attempt_log` the attempt shim's log; `on_stuck(reason, trained)` is
    called once, from this watch's thread (`trained`: workers of this torchrun started
    before it got stuck)."""

    def __init__(
        self,
        own: Callable[[], RdzvNode | None],
        read_round: Callable[[], RoundView],
        attempt_log: Path,
        on_stuck: Callable[[str, bool], None],
        *,
        poll: float = timings.STUCK_POLL,
        decide: StuckRound | None = None,
    ) -> None:
        self.own, self.read_round, self.on_stuck = own, read_round, on_stuck
        self.poll = poll
        self.decide = decide if decide is not None else StuckRound()
        self._tail = Tail(attempt_log)
        self._tail.lines()  # earlier torchruns' attempts (another generation, a relaunch)
        self._program: int | None = None  # the pid of the last attempt's program
        self._unplaced = False  # that attempt's round is not read yet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stuck-round", daemon=True)

    def start(self) -> StuckRoundWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                if self._step():
                    return
            except Exception as exc:  # noqa: BLE001 - etcd's, torch's and the helper's: next poll
                logger.debug("stuck-round watch: could not read the round: %s", exc)

    def _step(self) -> bool:
        """One look; True once this torchrun was found stuck (and reported)."""
        for line in self._tail.lines():
            attempt = parse_attempt(line)
            if attempt is not None:
                self._program, self._unplaced = attempt.pid, True
        if self._program is not None and process_alive(self._program):
            if self._unplaced:
                # Read while the program runs, the round is the one it started in: this
                # node stays a participant of it until torchrun's next rendezvous.
                self.decide.started(self.read_round().round)
                self._unplaced = False
            return False
        if self._unplaced:
            # The program ended before its round was read (it failed at once): the round
            # read now is the one it ran in or the next; taking it as the one it ran in
            # never stops a torchrun waiting in its exit barrier.
            self.decide.started(self.read_round().round)
            self._unplaced = False
            return False
        own = self.own()
        if own is None:
            return False
        reason = self.decide.check(self.read_round(), own, time.monotonic())
        if reason is None:
            return False
        try:
            self.on_stuck(reason, self.decide.ran is not None)
        except Exception:  # said; torch's store timeout remains
            logger.exception("stuck-round watch: could not restart torchrun")
        return True
