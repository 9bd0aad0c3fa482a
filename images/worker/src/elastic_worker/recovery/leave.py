"""Leave the rendezvous round at once when this pod is told to stop (SIGTERM).

torch's agent, stopped by a signal, ends its workers and exits, but its node stays in the
round: `launch_agent` must not shut the rendezvous down (that would close it for every
node), and torch has no public "leave". The others can form the next round only when the
sanitizer drops that node, once its keep-alive has lapsed (keep_alive_interval x
keep_alive_max_attempt, 3 s with elastic-worker's defaults) and one of them has polled
(torch polls once a second). A spot reclaim then costs as much as a SIGKILL.

elastic-worker knows more: torchrun has exited after the SIGTERM it forwarded, so its
node will never heartbeat again. It runs torch's own state machine for that node, as the
node itself would have: the node is taken out of the participants (or the wait list),
and if it was the last participant of a complete round, the round moves on, exactly as
torch's `_RendezvousExitOp` does at the start of every `next_rendezvous`.

This reads torch internals, the one place in the worker that does (dynamic_rendezvous:
`_NodeDesc`, `_DistributedRendezvousOpExecutor`, `_Action`, the handler's `_state_holder`
and `_settings`). torch comes from the user's base image, so anything missing or changed
costs only the speed-up: one log line, and the others wait for the keep-alive as before.
tests/worker/test_worker_leave.py pins the behaviour on the torch of requirements/dev.txt.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elastic_worker.recovery import epochs as epoch
from elastic_worker.settings.config import Config

if TYPE_CHECKING:  # torch is imported only when a node leaves
    from torch.distributed.elastic.rendezvous import RendezvousHandler

logger = logging.getLogger(__name__)

#: How long to keep trying (etcd compare-and-swap retries) before the keep-alive does it.
TIMEOUT = 5.0


def preload() -> threading.Thread:
    """Import torch's rendezvous module in the background (1-2 s of CPU): started when the
    SIGTERM comes, so that it is done by the time torchrun has stopped its workers, and by
    the lifelines when torchrun starts."""
    thread = threading.Thread(target=_import_dynamic_rendezvous, name="leave-preload", daemon=True)
    thread.start()
    return thread


def _import_dynamic_rendezvous() -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: PLC0415

    return dynamic_rendezvous


def leave(config: Config, rdzv_id: str, addr: str | None, pid: int) -> bool:
    """Take torchrun's node (`addr` as given to --local-addr, else this host's FQDN as torch
    uses; `pid` torchrun's) out of rendezvous `rdzv_id`. True when it was in the round and
    is out now; False when it was not there or this torch cannot do it (logged)."""
    return leave_with(lambda: epoch.handler(config, rdzv_id), rdzv_id, addr, pid)


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

    `dead_since` (time.time()): another pod's node, seen dead then (lifeline.py); it stays
    when its heartbeat is newer (a new torchrun with the same address and pid)."""
    try:
        dr = _import_dynamic_rendezvous()
        handler: Any = make_handler()
        # torchrun makes one handler, the first node descriptor of its process: local_id 0.
        node = dr._NodeDesc(addr or socket.getfqdn(), pid, 0)
        holder = _Recording(handler._state_holder)
        executor = dr._DistributedRendezvousOpExecutor(node, holder, handler._settings)
        op = _LeaveOp(dr._Action, holder, dead_since)
        executor.run(op, time.monotonic() + TIMEOUT)
    except (AttributeError, TypeError) as exc:  # names or signatures this torch lacks
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
    if op.beat_after_death:
        logger.info(
            "kept %s:%d in rendezvous %s: it beat after its lifeline closed (a new torchrun)",
            node.addr,
            pid,
            rdzv_id,
        )
    elif op.removed_from and dead_since is not None:
        logger.info(
            "took %s:%d out of rendezvous %s (%s of round %d): the others re-form without it now",
            node.addr,
            pid,
            rdzv_id,
            op.removed_from,
            op.round,
        )
    elif op.removed_from:
        logger.info(
            "left rendezvous %s (%s of round %d): the others re-form without this node now",
            rdzv_id,
            op.removed_from,
            op.round,
        )
    return bool(op.removed_from)


def participants(handler: RendezvousHandler) -> list[tuple[str, int]]:
    """The torchruns (address, pid) in the round `handler`'s rendezvous holds now: its
    participants, read (and sanitized) as torch's agents read them."""
    holder: Any = handler._state_holder  # type: ignore[attr-defined]
    holder.sync()
    return [(n.addr, n.pid) for n in holder.state.participants if n.local_id == 0]


class _Recording:
    """torch's state holder, remembering whether its last sync wrote our change: a removal
    another pod wrote first (two survivors of one death) is not ours to report."""

    def __init__(self, holder: Any) -> None:
        self._holder = holder
        self.has_set: bool | None = None

    @property
    def state(self) -> Any:
        return self._holder.state

    def sync(self) -> bool | None:
        self.has_set = self._holder.sync()
        return self.has_set

    def mark_dirty(self) -> None:
        self._holder.mark_dirty()


class _LeaveOp:
    """A torch rendezvous operation (a state handler for the op executor): out of the
    participants, else the wait list, else the redundancy list; then done."""

    def __init__(self, action: Any, holder: _Recording, dead_since: float | None = None) -> None:
        self._action = action
        self._holder = holder
        self._dead_since = dead_since
        self.removed_from = ""
        self.round = -1
        self.beat_after_death = False

    def __call__(self, ctx: Any, deadline: float) -> Any:
        if self.removed_from and self._holder.has_set is False:
            self.removed_from = ""  # our write lost to another: decide again on its state
        state = ctx.state
        beat = state.last_heartbeats.get(ctx.node)
        if (
            self._dead_since is not None
            and beat is not None
            and beat.timestamp() > self._dead_since
        ):
            self.beat_after_death = True
            return self._action.FINISH
        for members, action, name in (
            (state.participants, self._action.REMOVE_FROM_PARTICIPANTS, "participants"),
            (state.wait_list, self._action.REMOVE_FROM_WAIT_LIST, "wait list"),
            (state.redundancy_list, self._action.REMOVE_FROM_REDUNDANCY_LIST, "redundancy list"),
        ):
            if ctx.node in members:
                if time.monotonic() > deadline:
                    return self._action.ERROR_TIMEOUT
                self.removed_from, self.round = name, state.round
                return action
        return self._action.FINISH
