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

The etcd-lease backend keeps its round in the job's own keys (torch_etcd_v3.rounds):
`Leases` reads and changes it through that package's `Rounds`, with neither torch nor its
internals, in elastic-worker itself (standard library only: no helper process). A node
taken out is its lease revoked; the round re-forms without it at once.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from elastic_worker import timings, torchcompat
from elastic_worker.recovery import rendezvous
from elastic_worker.settings.config import Config
from elastic_worker.torchcompat import RdzvNode, RoundView

if TYPE_CHECKING:  # torch is imported only when the round is read or changed
    from torch.distributed.elastic.rendezvous import RendezvousHandler
    from torch_etcd_v3.rounds.view import Member, Rounds

logger = logging.getLogger(__name__)

#: The backend whose round is in the job's own keys (Leases), not torch's.
OWN_KEYS_BACKEND = "etcd-lease"
#: On etcd-lease, the members after this pod's in rank order that it holds lifelines to
#: (a ring): each member is watched by this many others, not by all n - 1.
LIFELINE_PEERS = 2


def in_own_keys(config: Config) -> bool:
    """The round is in the job's own keys (etcd-lease): Leases, not torch's internals."""
    return config.rdzv_backend == OWN_KEYS_BACKEND


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
        # torch's timeout has no message: its name says what happened
        logger.info(
            "could not take %s:%d out of rendezvous %s: %s",
            addr,
            pid,
            rdzv_id,
            str(exc) or repr(exc),
        )
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
    elif done.lapsed:
        logger.info(
            "left rendezvous %s (round %d; its keep-alive had lapsed, so torch's readers had "
            "dropped it): the others re-form without this node now",
            rdzv_id,
            done.round,
        )
    elif done.removed_from:
        logger.info(
            "left rendezvous %s (%s of round %d): the others re-form without this node now",
            rdzv_id,
            done.removed_from,
            done.round,
        )
    elif dead_since is not None:
        # Another survivor's take-out came first, or torch's heartbeat timeout did (a
        # loaded host): said, with how late, so that a re-form at the keep-alive's pace is
        # not a mystery in the log.
        logger.info(
            "%s was no longer in rendezvous %s when read, %.1f s after its lifeline closed "
            "(another survivor took it out, or its keep-alive lapsed): nothing to take out",
            shown,
            rdzv_id,
            time.time() - dead_since,
        )
    return bool(done.removed_from)


def leave(config: Config, rdzv_id: str, addr: str | None, pid: int) -> bool:
    """This pod's torchrun `pid` out of rendezvous `rdzv_id`, with torch imported here (on
    etcd-lease, through its keys)."""
    if in_own_keys(config):
        return Leases(config, rdzv_id).leave((addr or socket.getfqdn(), pid))
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


class Leases:
    """RoundOps on etcd-lease, through torch_etcd_v3.rounds.view.Rounds: the round is the
    last decision, its members' keys hold each torchrun's address and pid. `own`: this
    pod's torchrun (None: not running), for the lifelines' ring (LIFELINE_PEERS)."""

    def __init__(
        self, config: Config, rdzv_id: str, own: Callable[[], RdzvNode | None] | None = None
    ) -> None:
        from torch_etcd_v3.rounds.view import Rounds  # noqa: PLC0415 - etcd-lease only

        conf = dict(config.rdzv_conf)
        self._rounds: Rounds = Rounds.connect(str(config.endpoint), rdzv_id, conf)
        self._rdzv_id, self._own = rdzv_id, own
        # The same seconds as the handler's lease TTL: a silent node's key lapses then.
        self._keep_alive = float(conf["keep_alive_interval"]) * float(
            conf["keep_alive_max_attempt"]
        )
        # The node id of each torchrun last read in a round: a lifeline that closes is that
        # lease's holder, not a torchrun that joined since with the same address and pid.
        self._nodes: dict[RdzvNode, str] = {}
        self._lock = threading.Lock()

    def _members(self) -> tuple[int, list[Member]]:
        """The last round's number and its members whose keys are there, by rank."""
        now = self._rounds.current()
        if now is None:
            return -1, []
        live = [m for m in self._rounds.members(now) if m.info is not None]
        with self._lock:
            self._nodes.update({_node(m): m.node for m in live})
        return now.number, live

    def participants(self) -> list[RdzvNode]:
        """The live members of the round; with `own` among them, only the LIFELINE_PEERS
        after it in rank order (whom its lifelines watch)."""
        _, live = self._members()
        nodes = [_node(m) for m in live]
        own = self._own() if self._own is not None else None
        if own is None or own not in nodes:
            return nodes
        at = nodes.index(own)
        ring = [nodes[(at + i) % len(nodes)] for i in range(1, len(nodes))]
        return ring[:LIFELINE_PEERS]

    def round(self) -> RoundView:
        """A decided round is complete; its live members with their group ranks."""
        number, live = self._members()
        ranks = {_node(m): m.rank for m in live}
        return RoundView(number, number >= 0, ranks, self._keep_alive)

    def remove(self, node: RdzvNode, since: float) -> bool:
        # `since` needs no comparison here: a torchrun that joined after `node` was seen
        # dead holds another lease (another node id), which this call leaves alone.
        with self._lock:
            known = self._nodes.get(node)
        return self._take_out(node, known, dead=True)

    def leave(self, node: RdzvNode) -> bool:
        return self._take_out(node, None, dead=False)

    def _take_out(self, node: RdzvNode, known: str | None, *, dead: bool) -> bool:
        shown = f"{node[0]}:{node[1]}"
        try:
            found = known or self._rounds.find(*node)
            done = found is not None and self._rounds.take_out(found)
        except Exception as exc:  # noqa: BLE001 - etcd's errors: the lease lapses instead
            logger.info("could not take %s out of rendezvous %s: %s", shown, self._rdzv_id, exc)
            return False
        if done and dead:
            logger.info(
                "took %s out of rendezvous %s (its lease revoked): the others re-form without "
                "it now",
                shown,
                self._rdzv_id,
            )
        elif done:
            logger.info(
                "left rendezvous %s (its lease revoked): the others re-form without this node now",
                self._rdzv_id,
            )
        return done

    def close(self) -> None:
        self._rounds.client.close()


def _node(member: Member) -> RdzvNode:
    assert member.info is not None
    return (member.info.addr, member.info.pid)
