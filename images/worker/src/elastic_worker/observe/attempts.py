"""Follow what torchrun does through our own components, for the metrics and the log.

The attempt shim (launch.ATTEMPT_LINE) appends each attempt line, with the PID of the
program it then execs, to ELASTIC_ATTEMPT_LOG; the training script may append
`step=<n>` lines to ELASTIC_PROGRESS_FILE, and a script that keeps snapshots its
`restored=` and `saved=` lines (docs/contracts.md, snapshots.py), which are logged and kept
for the loss detection (`saves`). Both files live in a private temporary directory of this
process. Without metrics (no tracker) only the snapshot lines are read. A thread reads
what was appended every `interval` seconds and watches the current attempt's process: its
end is when this node left the round (a failure seen, or torchrun stopping it for a
re-form). Nothing here reads torchrun's log lines or torch's etcd keys.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from elastic_worker import timings
from elastic_worker.attempt_line import ATTEMPT_LOG_ENV, Tail, parse_attempt, process_alive
from elastic_worker.observe import snapshots

if TYPE_CHECKING:
    from elastic_worker.observe.metrics import Tracker

logger = logging.getLogger(__name__)

PROGRESS_FILE_ENV = "ELASTIC_PROGRESS_FILE"
MEMBERS_EVERY = 10  # intervals between counts of the registered members


class AttemptFollower:
    """Reads the attempt log and progress file into `tracker` (None: metrics off) and
    `saves` from a daemon thread."""

    def __init__(
        self,
        tracker: Tracker | None,
        members: Callable[[], int] | None = None,
        interval: float = timings.ATTEMPTS_POLL,
        *,
        progress_file: Path | None = None,
    ) -> None:
        self.tracker = tracker
        self.saves = snapshots.Saves(read=self.poll)  # a silent loss awaits a save: read now
        self.members = members
        self.interval = interval
        self.dir = Path(tempfile.mkdtemp(prefix="elastic-worker-"))
        self.attempt_log = self.dir / "attempts"
        self.progress_file = progress_file or self.dir / "progress"
        self._attempts = Tail(self.attempt_log)
        self._progress = Tail(self.progress_file)
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._poll_lock = threading.Lock()

    def env(self) -> dict[str, str]:
        """The variables torchrun's environment gets (the shim and the script read them)."""
        return {ATTEMPT_LOG_ENV: str(self.attempt_log), PROGRESS_FILE_ENV: str(self.progress_file)}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.poll()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self.interval):
            try:
                self.poll()
                tracker = self.tracker
                if tracker is not None and self.members is not None and tick % MEMBERS_EVERY == 0:
                    tracker.members_registered(self.members())
            except Exception as exc:  # noqa: BLE001 - metrics must never end the worker
                logger.debug("following torchrun: %s", exc)
            tick += 1

    def poll(self) -> None:
        """One read of both files and one look at the current attempt's process (from the
        reader's thread, and from a thread awaiting a save: one at a time)."""
        with self._poll_lock:
            self._poll()

    def _poll(self) -> None:
        lines = self._progress.lines()
        for line in lines:
            event = snapshots.parse(line)
            if event is not None:
                self._snapshot(event)
        tracker = self.tracker
        if tracker is None:
            return
        from elastic_worker.observe.metrics import parse_progress  # noqa: PLC0415 - metrics on

        for line in self._attempts.lines():
            attempt = parse_attempt(line)
            if attempt is None:
                continue
            if self._pid is not None and self._pid != attempt.pid:
                tracker.attempt_ended()
            self._pid = attempt.pid
            tracker.attempt(attempt)
        # Progress before the liveness check: the last step of an attempt counts for it.
        steps = [s for s in map(parse_progress, lines) if s is not None]
        if steps:
            tracker.progress(max(steps))
        if self._pid is not None and not process_alive(self._pid):
            self._pid = None
            tracker.attempt_ended()

    def _snapshot(self, event: snapshots.Restored | snapshots.Saved) -> None:
        self.saves.heard(event)
        if isinstance(event, snapshots.Saved):
            step = "no consistent state" if event.step is None else f"step {event.step}"
            logger.info(
                "the training process saved %s to memory (%d file(s), %.2f s)",
                step,
                event.files,
                event.seconds,
            )
            return
        if self.tracker is not None:
            self.tracker.restored(event)
        if event.source != "none":
            lost = "?" if event.lost is None else event.lost
            logger.info(
                "state restored at step %d from %s (%s steps lost)", event.step, event.source, lost
            )
