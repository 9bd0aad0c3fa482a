"""torch's rendezvous round, read and changed: who is in it, and a node taken out of it.

torch's agent, stopped by a signal, ends its workers and exits, but its node stays in the
round: `launch_agent` must not shut the rendezvous down (that would close it for every
node), and torch has no public "leave". The others can form the next round only once
torch's sanitizer drops that node, when its keep-alive has lapsed (keep_alive_interval x
keep_alive_max_attempt: 3 s with the chart's defaults) and one of them has polled. A
dead peer costs the same. The worker knows sooner (a signal, a lifeline that closed), and
takes the node out with torch's own state machine (torchcompat.take_out): the node
itself, or a peer unless its heartbeat is newer than the moment it was seen dead.

`RoundOps` is what the node-loss policy (policy.py) and its watches need of the round;
`InProcess` runs it here, with torch's rendezvous imported in this process;
lifelines/helper.py runs it in a helper forked from the warm server.

torch comes from the user's image, so anything missing or changed costs only the
speed-up: one log line, and the others wait for the keep-alive as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from elastic_worker import timings, torchcompat
from elastic_worker.recovery import rendezvous
from elastic_worker.settings.config import Config
from elastic_worker.torchcompat import RdzvNode, RoundView

if TYPE_CHECKING:  # torch is imported only when the round is read or changed
    from torch.distributed.elastic.rendezvous import RendezvousHandler

logger = logging.getLogger(__name__)


class RoundOps(Protocol):
    """What is read and changed in the round of one rendezvous."""

    def participants(self) -> list[RdzvNode]:
        """The torchruns (address, pid) in the round now."""
        ...

    def round(self) -> RoundView:
        """The round now: number, complete, each torchrun's group rank."""
        ...

    def remove(self, node: RdzvNode, since: float) -> bool:
        """Take another pod's node out, seen dead at `since` (time.time()); True when it
        was taken out by this call."""
        ...

    def leave(self, node: RdzvNode) -> bool:
        """Take this pod's own node out (it was told to stop)."""
        ...

    def close(self) -> None: ...


def preload() -> threading.Thread:
    """Import torch's rendezvous module in the background (1-2 s of CPU), so that it is
    done by the time a node must be taken out (InProcess starts it with torchrun)."""
    thread = threading.Thread(
        target=torchcompat.dynamic_rendezvous, name="round-preload", daemon=True
    )
    thread.start()
    return thread


def take_out(
    make_handler: Callable[[], RendezvousHandler],
    rdzv_id: str,
    addr: str | None,
    pid: int,
    *,
    dead_since: float | None = None,
) -> bool:
    """Take torchrun `pid`'s node (`addr` as given to --local-addr, None: this host's FQDN,
    as torch uses) out of rendezvous `rdzv_id`, through the handler torchrun made for it
    (`make_handler`: torch's registry; scripts/bench-recovery makes its own). True when it
    was in the round and is out now; False when it was not there, beat after `dead_since`
    (another pod's node, seen dead then: a new torchrun with the same address and pid), or
    this torch cannot do it (said once in the log)."""
    try:
        done = torchcompat.take_out(
            make_handler(), addr, pid, timeout=timings.TAKE_OUT_TIMEOUT, dead_since=dead_since
        )
    except torchcompat.Unsupported as exc:
        logger.info(
            "cannot take a node out of rendezvous %s with this torch (%s): the others re-form "
            "when its keep-alive lapses",
            rdzv_id,
            exc,
        )
        return False
    except Exception as exc:  # noqa: BLE001 - etcd's and torch's errors: the keep-alive remains
        logger.info("could not take %s:%d out of rendezvous %s: %s", addr, pid, rdzv_id, exc)
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


def leave(config: Config, rdzv_id: str, addr: str | None, pid: int) -> bool:
    """This pod's torchrun `pid` out of rendezvous `rdzv_id`, with torch imported here."""
    return take_out(lambda: rendezvous.handler(config, rdzv_id), rdzv_id, addr, pid)


def participants(handler: RendezvousHandler) -> list[RdzvNode]:
    """The torchruns (address, pid) in the round `handler`'s rendezvous holds now."""
    return torchcompat.participants(handler)


def read_round(handler: RendezvousHandler) -> RoundView:
    """The round `handler`'s rendezvous holds now: its number, whether it is complete and
    the group rank of each torchrun in it (stuckround.py)."""
    return torchcompat.read_round(handler)


class InProcess:
    """RoundOps here, with torch's rendezvous module imported in this process while
    torchrun starts, so that the lifelines hold from the first round's start."""

    def __init__(self, config: Config, rdzv_id: str, *, preloaded: bool = False) -> None:
        if not preloaded:
            preload()
        self._config, self._rdzv_id = config, rdzv_id
        self._handler: list[Any] = []
        # One torch handler for the lifelines', the stuck-round watch's and the leave's
        # threads: its state holder is not thread-safe.
        self._lock = threading.RLock()

    def _made(self) -> Any:
        if not self._handler:
            self._handler.append(rendezvous.handler(self._config, self._rdzv_id))
        return self._handler[0]

    def participants(self) -> list[RdzvNode]:
        with self._lock:
            return participants(self._made())

    def round(self) -> RoundView:
        with self._lock:
            return read_round(self._made())

    def remove(self, node: RdzvNode, since: float) -> bool:
        with self._lock:
            return take_out(self._made, self._rdzv_id, *node, dead_since=since)

    def leave(self, node: RdzvNode) -> bool:
        with self._lock:
            return take_out(self._made, self._rdzv_id, *node)

    def close(self) -> None:
        """Nothing to release: torch's handler lives as long as this process."""
