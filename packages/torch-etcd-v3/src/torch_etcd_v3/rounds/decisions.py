"""The decisions a node sees: one watch on the decision and the closing ([d, d0)) for the
node's whole life, opened at its first join. It carries a change a round (the decision,
once), so it costs etcd nothing in between, and a node that joins again reads from it
instead of opening a watch per join. A waiter (wait.py) reads its events while it waits, a
member (training.py) asks whether a decision newer than its round came.

When the watch must start over (etcd away, then back) it starts from where it was. Where
etcd no longer has that history (compacted: the bundled etcd keeps an hour) the decision is
read once instead, so that a long quiet round is not taken for a changed one; where etcd
lost its data (a new member on an empty disk: revisions count from 1 again) every round is
gone, and the members say so (`lost_data`).
"""

from __future__ import annotations

import logging
import threading

from ..client import EtcdClient, EtcdError, KeyValue
from ..watch import PUT, Event, Watch, WatchEnded
from .keys import Keys

log = logging.getLogger(__name__)


class Decisions:
    def __init__(self, client: EtcdClient, keys: Keys) -> None:
        self._client, self._keys = client, keys
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._after = 0  # the last revision delivered
        #: The watch started over without its history: a waiter reads the state afresh,
        #: for it may have missed a change (wait.py clears it).
        self.gap = False
        #: etcd lost its data since this node joined: no round of before exists any more.
        self.lost_data = False
        #: The newest decision known (with its value), None before any or once it lapsed;
        #: whether the closing came.
        self.latest: KeyValue | None = None
        self._latest_at = 0  # the revision of that knowledge (a decision's, or its delete's)
        self.closed = False

    def open(self, after: int) -> None:
        """Watch from `after` + 1 on (`after` > 0), unless watching already."""
        with self._lock:
            if self._watch is None:
                self._after = after
                self._watch = self._start()

    def _start(self) -> Watch | None:
        keys = self._keys
        try:
            try:
                start = self._after + 1 if self._after else 0
                watch = Watch(self._client, keys.decision, keys.decisions_end, start)
            except WatchEnded as exc:
                if not exc.compacted:
                    raise
                watch = self._start_over(lost=exc.lost)
        except EtcdError as exc:  # asked again at the next call
            log.debug("etcd-lease: no watch of the decisions: %s", exc)
            return None
        if not self._after:
            self._after = watch.revision
        return watch

    def _start_over(self, *, lost: bool) -> Watch:
        """The history the watch needed is gone: from now on, the decision read afresh."""
        self.gap = True
        if lost:
            self.lost_data, self.latest, self._latest_at = True, None, 0
        watch = Watch(self._client, self._keys.decision, self._keys.decisions_end)
        self._after = watch.revision
        if not lost:
            kv, at = self._client.get(self._keys.decision)
            self._saw(kv, kv.mod_revision if kv is not None else at)
        return watch

    def next(self, timeout: float) -> list[Event]:
        """The next decisions and closings, waiting up to `timeout` s ([]: none). Opens
        the watch again when it ended (from where it was)."""
        with self._lock:
            watch = self._watch = self._watch or self._start()
        if watch is None:
            return []
        try:
            events = watch.next(timeout)
        except WatchEnded as exc:
            with self._lock:
                if self._watch is watch:
                    watch.close()
                    self._watch = None
                if exc.compacted:
                    try:
                        self._watch = self._start_over(lost=exc.lost)
                    except EtcdError as again:
                        log.debug("etcd-lease: no watch of the decisions: %s", again)
            return []
        with self._lock:
            for event in events:
                self._after = max(self._after, event.kv.mod_revision)
                if event.kv.key == self._keys.decision:
                    self._saw(event.kv if event.kind == PUT else None, event.kv.mod_revision)
                elif event.kv.key == self._keys.closed:
                    self.closed = event.kind == PUT
        return events

    def saw(self, kv: KeyValue | None, revision: int) -> None:
        """The decision as read at `revision` (None: none), unless a newer one is known."""
        with self._lock:
            self._saw(kv, revision)

    def _saw(self, kv: KeyValue | None, revision: int) -> None:
        if revision >= self._latest_at:
            self.latest, self._latest_at = kv, revision

    def newer_than(self, round_id: int) -> bool:
        """A decision after round `round_id` came (or it lapsed, or etcd lost its data):
        that round is over."""
        with self._lock:
            return self.lost_data or self._latest_at > round_id

    def joined(self) -> None:
        """This node is in a round of the etcd it sees now (lost_data is history)."""
        with self._lock:
            self.lost_data = False

    def drain(self) -> None:
        """Take in what has arrived, without waiting (`latest`, `closed`)."""
        while self.next(0):
            pass

    def wake(self) -> None:
        """Make a `next` waiting now return at once (from any thread)."""
        with self._lock:
            watch = self._watch
        if watch is not None:
            watch.wake()

    def close(self) -> None:
        with self._lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
