"""What a training script that keeps snapshots (packages/elastic-snapshot) tells the worker
through the progress file (docs/contracts.md, "Progress"), local rank 0 only:

    restored=<step> source=<peer-memory|local-memory|checkpoint|none> lost=<steps|->
    saved=<step|-> files=<n> seconds=<s>

`restored` after each start of an attempt (where its state came from), `saved` after each
save (a failed step, a SIGTERM). attempts.py reads them (the log line, the metrics, the
state below); recovery/lossdetect.py asks `Saves` whether the script keeps snapshots before
it stops an attempt: such an attempt gets SIGTERM and the time to save, not SIGKILL at once.
Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastic_worker import timings

SOURCES = ("peer-memory", "local-memory", "checkpoint", "none")


@dataclass(frozen=True)
class Restored:
    step: int
    source: str
    lost: int | None  # None: unknown


@dataclass(frozen=True)
class Saved:
    step: int | None  # None: no consistent state to save
    files: int
    seconds: float


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def parse(line: str) -> Restored | Saved | None:
    """A `restored=` or `saved=` line; None for anything else (a step line, a torn one)."""
    fields = _fields(line)
    try:
        if "restored" in fields and fields.get("source") in SOURCES:
            lost = fields.get("lost", "-")
            return Restored(
                int(fields["restored"]), fields["source"], None if lost == "-" else int(lost)
            )
        if "saved" in fields:
            step = fields["saved"]
            return Saved(
                None if step == "-" else int(step),
                int(fields.get("files", "0")),
                float(fields.get("seconds", "0")),
            )
    except ValueError:
        return None
    return None


class Saves:
    """What this torchrun's training processes said of their snapshots (filled by the
    progress file's reader): whether the script keeps them, and how many saves so far.
    `read`, when given, reads the progress file now (the reader's poll): wait_saved calls it
    every SAVE_AWAIT_POLL (timings.py)."""

    def __init__(self, read: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._read = read
        self.keeps = False  # a `restored` line came: the script saves when stopped
        self.saved = 0
        self.last: Saved | None = None

    def heard(self, event: Restored | Saved) -> None:
        with self._cond:
            if isinstance(event, Restored):
                self.keeps = True
            else:
                self.saved += 1
                self.last = event
            self._cond.notify_all()

    def wait_saved(self, after: int, timeout: float) -> bool:
        """True once a save after the `after`-th was reported, within `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            if self._read is not None:
                self._read()
            with self._cond:
                left = deadline - time.monotonic()
                if self.saved > after or left <= 0:
                    return self.saved > after
                every = timings.SAVE_AWAIT_POLL if self._read is not None else left
                self._cond.wait(min(left, every))
