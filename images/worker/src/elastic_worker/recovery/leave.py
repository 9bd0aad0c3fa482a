"""Leaving torch's rendezvous round at once: one place for every way a node goes.

torch's agent, stopped by a signal, ends its workers and exits, but its node stays in the
round: `launch_agent` must not shut the rendezvous down (that would close it for every
node), and torch has no public "leave". The others can form the next round only when the
sanitizer drops that node, once its keep-alive has lapsed (keep_alive_interval x
keep_alive_max_attempt, 3 s with elastic-worker's defaults) and one of them has polled
(torch polls once a second). A spot reclaim then costs as much as a SIGKILL.

elastic-worker knows more, and takes the node out with torch's own state machine
(torchcompat.take_out) in two cases:
- this pod is told to stop (`Leaving`): at the signal, while its workers still checkpoint,
  and once more after torchrun exited (a join it had in flight may have put it back);
  never at the end of the job (completion.Completion.before_leave). Through the
  lifelines' helper when one runs (torch imported there), else here.
- another pod's torchrun is gone (lifelines/, `leave_with(dead_since=...)`): unless its
  heartbeat is newer than the moment its lifeline closed.

torch comes from the user's base image, so anything missing or changed costs only the
speed-up: one log line, and the others wait for the keep-alive as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from elastic_worker import torchcompat
from elastic_worker.recovery import rendezvous
from elastic_worker.recovery.lifelines.messages import HelperError
from elastic_worker.settings.config import Config

if TYPE_CHECKING:  # torch is imported only when a node leaves
    from torch.distributed.elastic.rendezvous import RendezvousHandler

    from elastic_worker.completion import Completion

logger = logging.getLogger(__name__)

#: How long to keep trying (etcd compare-and-swap retries) before the keep-alive does it.
TIMEOUT = 5.0


def preload() -> threading.Thread:
    """Import torch's rendezvous module in the background (1-2 s of CPU), so that it is
    done by the time a node must be taken out (the lifelines start it with torchrun)."""
    thread = threading.Thread(
        target=torchcompat.dynamic_rendezvous, name="leave-preload", daemon=True
    )
    thread.start()
    return thread


def leave(config: Config, rdzv_id: str, addr: str | None, pid: int) -> bool:
    """Take torchrun's node (`addr` as given to --local-addr, else this host's FQDN as torch
    uses; `pid` torchrun's) out of rendezvous `rdzv_id`. True when it was in the round and
    is out now; False when it was not there or this torch cannot do it (logged)."""
    return leave_with(lambda: rendezvous.handler(config, rdzv_id), rdzv_id, addr, pid)


def leave_with(
    make_handler: Callable[[], RendezvousHandler],
    rdzv_id: str,
    addr: str | None,
    pid: int,
    *,
    dead_since: float | None = None,
) -> bool:
    """leave() with the handler torchrun made for `rdzv_id` (torch's registry), made by
    `make_handler` (scripts/bench-recovery makes its own, without elastic-worker's Config).

    `dead_since` (time.time()): another pod's node, seen dead then (lifelines/); it stays
    when its heartbeat is newer (a new torchrun with the same address and pid)."""
    try:
        done = torchcompat.take_out(
            make_handler(), addr, pid, timeout=TIMEOUT, dead_since=dead_since
        )
    except torchcompat.Unsupported as exc:
        logger.info(
            "cannot leave rendezvous %s at once with this torch (%s): the others re-form "
            "when this node's keep-alive lapses",
            rdzv_id,
            exc,
        )
        return False
    except Exception as exc:  # noqa: BLE001 - etcd's and torch's errors: the keep-alive remains
        logger.info("could not leave rendezvous %s at once: %s", rdzv_id, exc)
        return False
    shown = f"{done.addr}:{pid}"
    if done.beat_after_death:
        logger.info(
            "kept %s in rendezvous %s: it beat after its lifeline closed (a new torchrun)",
            shown,
            rdzv_id,
        )
    elif done.removed_from and dead_since is not None:
        logger.info(
            "took %s out of rendezvous %s (%s of round %d): the others re-form without it now",
            shown,
            rdzv_id,
            done.removed_from,
            done.round,
        )
    elif done.removed_from:
        logger.info(
            "left rendezvous %s (%s of round %d): the others re-form without this node now",
            rdzv_id,
            done.removed_from,
            done.round,
        )
    return bool(done.removed_from)


def participants(handler: RendezvousHandler) -> list[torchcompat.RdzvNode]:
    """The torchruns (address, pid) in the round `handler`'s rendezvous holds now."""
    return torchcompat.participants(handler)


def read_round(handler: RendezvousHandler) -> torchcompat.RoundView:
    """The round `handler`'s rendezvous holds now: its number, whether it is complete and
    the group rank of each torchrun in it (recovery/stuckround.py)."""
    return torchcompat.read_round(handler)


class Leaving:
    """This pod's node out of its round `rdzv_id` (torchrun's --local-addr `addr`) when the
    pod is told to stop. `via` takes it out given torchrun's pid where torch is imported
    already (the lifelines' helper, set by the pod when its watcher runs); else leave()
    here, importing torch. `enabled` False: this torch lacks what it takes (torchcompat.check)."""

    def __init__(
        self,
        config: Config,
        rdzv_id: str,
        addr: str | None,
        completion: Completion,
        *,
        enabled: bool = True,
        holding: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config, self.rdzv_id, self.addr = config, rdzv_id, addr
        self.completion = completion
        self.enabled = enabled
        #: This pod must not touch the round (it may have been replaced: recovery/fence.py).
        self.holding = holding
        self.via: Callable[[int], bool] | None = None
        self._thread: threading.Thread | None = None

    def at_signal(self, pid: int) -> None:
        """Take this node out of the round while its workers still checkpoint, not after
        torchrun exits: the survivors, whose workers fail when these exit, then find the
        round free at their first look instead of waiting a 1 s poll of torch's for this
        node to go (SIGTERM re-formed 1 s sooner in scripts/bench-recovery). Nothing
        running depends on the round's state: the workers finish their last step."""
        if not self.enabled or self._thread is not None or self.holding():
            return

        def run() -> None:
            if not self.completion.before_leave():
                self._now(pid)

        self._thread = threading.Thread(target=run, name="leave", daemon=True)
        self._thread.start()

    def after_exit(self, pid: int) -> None:
        """Again, once torchrun is gone: a join it had in flight at the signal may have put
        the node back (normally not there any more: one read)."""
        if not self.enabled or self.holding():
            return
        if self._thread is not None:
            self._thread.join(TIMEOUT)
        self._now(pid)

    def _now(self, pid: int) -> None:
        via = self.via
        if via is not None:
            with contextlib.suppress(HelperError):
                via(pid)
                return
            logger.debug("leaving through the lifelines' helper failed: here instead")
        leave(self.config, self.rdzv_id, self.addr, pid)
