"""The readiness gate's wait: bounded, with a progress line naming what is still missing.

Each check (probes.py, members.py) returns (done, detail) or raises Fatal. Checks run in
order every poll; the first one not yet done stops the round (later ones depend on it).
A progress line is logged every `progress_every` seconds; after `timeout` seconds
GateTimeout names what was still missing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_worker import timings

logger = logging.getLogger(__name__)


class Fatal(Exception):
    """Waiting cannot help (no API for the backend, TLS refused); `exit_code` is the
    process's."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class GateTimeout(Exception):
    """The gate's time ran out; the message names what was missing."""


class Completed(Exception):
    """Waiting is over because the job finished (its rendezvous was scaled to 0)."""


class Interrupted(Exception):
    """A signal asked us to stop while waiting."""


CheckResult = tuple[bool, str]


@dataclass
class Check:
    name: str
    probe: Callable[[], CheckResult]


def wait(
    checks: Sequence[Check],
    timeout: float,
    *,
    progress_every: float = timings.GATE_PROGRESS_EVERY,
    poll_every: float = timings.GATE_POLL,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll the checks until all pass; raise GateTimeout after `timeout` seconds."""
    stop = stop or threading.Event()
    start = clock()
    next_progress = start + progress_every
    done: set[str] = set()
    while True:
        pending: list[str] = []
        for index, check in enumerate(checks):
            if check.name in done:
                continue
            ok, detail = check.probe()
            if ok:
                done.add(check.name)
                continue
            pending.append(f"{check.name} ({detail})" if detail else check.name)
            pending += [c.name for c in checks[index + 1 :] if c.name not in done]
            break
        if not pending:
            return
        now = clock()
        if now - start >= timeout:
            raise GateTimeout(
                f"readiness gate timed out after {timeout:g} s waiting for: {'; '.join(pending)}"
            )
        if now >= next_progress:
            logger.info(
                "waiting %.0f s of %g s for: %s", now - start, timeout, "; then ".join(pending)
            )
            next_progress = now + progress_every
        if stop.wait(min(poll_every, max(0.0, timeout - (now - start)))):
            raise Interrupted("interrupted while waiting in the readiness gate")


def unless_complete(
    probe: Callable[[], CheckResult],
    complete: Callable[[], bool],
    *,
    every: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], CheckResult]:
    """`probe`, but while it fails ask `complete()` (at most every `every` seconds, it
    reads the API server) and raise Completed when it says the job is done."""
    next_ask = clock()

    def check() -> CheckResult:
        nonlocal next_ask
        ok, detail = probe()
        if not ok and clock() >= next_ask:
            next_ask = clock() + every
            if complete():
                raise Completed(detail)
        return ok, detail

    return check
