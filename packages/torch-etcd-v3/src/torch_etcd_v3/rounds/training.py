"""What a member learns while its round trains (torch's `num_nodes_waiting`): the node's
watch of the decisions (decisions.py) and one watch on the joins and the members from the
round's decision on, read when asked. torch's agent asks every monitor interval (0.1 s
with elastic-job's chart), so an answer costs no request; the watch stops at the first
change that matters (in its reader's thread: the joins of a re-form after it are never
read), after which the round is over for this member and it joins again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..client import EtcdClient, EtcdError
from ..watch import DELETE, PUT, Event, Watch, WatchEnded
from .decisions import Decisions
from .keys import Keys
from .state import Round

log = logging.getLogger(__name__)


class Training:
    """Thread-safe: torch's agent asks from its monitor loop, the node's own join and
    leave stop it."""

    def __init__(
        self,
        client: EtcdClient,
        keys: Keys,
        max_nodes: int,
        decisions: Decisions,
        on_gone: Callable[[Round, frozenset[str]], None],
    ) -> None:
        self._client, self._keys, self._max_nodes = client, keys, max_nodes
        self._decisions = decisions
        #: Called (in `waiting`'s thread) with the round and its members seen gone.
        self._on_gone = on_gone
        self._gone: set[str] = set()
        self._joined = False
        self._lock = threading.Lock()
        self._members: frozenset[str] = frozenset()
        self._round: Round | None = None
        self._watch: Watch | None = None
        self._after = 0
        self._waiting = 0

    def start(self, round_: Round) -> None:
        """Watch `round_` from its decision on (this node just joined it)."""
        with self._lock:
            self._close()
            self._round, self._waiting, self._after = round_, 0, round_.id
            self._members = frozenset(round_.members)
            self._gone = set()
            self._joined = False
            self._watch = self._open()

    def saw_join(self) -> bool:
        """A node joined the next round while this one trained (a newcomer, or a member
        that restarts): this member's restart is a re-join, nothing to wait for."""
        with self._lock:
            return self._joined

    def gone(self) -> frozenset[str]:
        """The members of the round seen gone (taken in by `waiting`)."""
        with self._lock:
            return frozenset(self._gone)

    def stop(self) -> None:
        with self._lock:
            self._close()
            self._round = None

    def _close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self._watch = None

    def _open(self) -> Watch | None:
        keys, round_ = self._keys, self._round
        if round_ is None:
            return None
        try:
            return self._watch_from(keys, round_)
        except WatchEnded as exc:
            if exc.compacted:  # etcd lost its history (its data): this round is gone too
                self._waiting = 1
            return None
        except EtcdError as exc:  # asked again at the next call
            log.debug("etcd-lease: no watch of the round: %s", exc)
            return None

    def _watch_from(self, keys: Keys, round_: Round) -> Watch:
        """The joins and the members from the round's decision on, until a change that
        counts (in the reader's thread: the rest of a re-form is never read)."""
        return Watch(
            self._client,
            keys.base + b"j/",
            keys.changes_end,
            self._after + 1,
            until=lambda event: self._counts(round_, event) > 0,
        )

    def waiting(self) -> int:
        """torch's num_nodes_waiting for this member (protocol.Rendezvous.waiting)."""
        with self._lock:
            round_ = self._round
            if round_ is None or self._waiting:
                return self._waiting
            self._decisions.drain()
            if self._decisions.newer_than(round_.id):
                self._waiting = 1  # a newer round (or the lapse of this one's)
                self._close()
                return self._waiting
            watch = self._watch = self._watch or self._open()
            if watch is None:
                return self._waiting
            try:
                while not self._waiting:
                    events = watch.next(0)
                    if not events:
                        return 0
                    for event in events:
                        self._after = max(self._after, event.kv.mod_revision)
                        self._waiting = max(self._waiting, self._counts(round_, event))
                        self._note(round_, event)
            except WatchEnded:
                self._close()  # opened again from where it was at the next call
                return 0
            self._close()  # the round is over for this node: nothing more to learn
            gone = frozenset(self._gone)
        if gone:
            self._on_gone(round_, gone)  # outside the lock: it writes to etcd
        return self._waiting

    def _note(self, round_: Round, event: Event) -> None:
        """Why the round is over for this member: a member gone, or a join of the next."""
        node = self._keys.node_of(event.kv.key)
        if event.kind == DELETE and node is not None and node in self._members:
            self._gone.add(node)
        joined = self._keys.join_of(event.kv.key)
        if event.kind == PUT and joined is not None and joined[0] == round_.id:
            self._joined = True

    def _counts(self, round_: Round, event: Event) -> int:
        """What `event` adds to torch's `num_nodes_waiting` of `round_`'s member."""
        keys = self._keys
        key = event.kv.key
        node = keys.node_of(key)
        if node is not None:
            return int(event.kind == DELETE and node in self._members)
        joined = keys.join_of(key)
        if joined is None or event.kind != PUT or joined[0] != round_.id:
            return 0
        if joined[1] in self._members:
            return 1  # a member left this round for the next
        full = len(round_.members) >= self._max_nodes
        return 0 if full else 1
