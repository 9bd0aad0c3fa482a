"""A node waiting for the decision of the round it joined (protocol.Rendezvous.join).

The newest joiner is the "holder" of the last call: it alone watches the joins and the
departures (a watch on [d, m0)), so that it sees a later join (and hands the last call to
that node) or a departure (after which every live node may have joined). Its watch starts
at the moment it is made, followed by one count: a watch started at the join's own
revision would replay every join since, and at a bring-up of n nodes that is O(n) events
for each of them. Any other waiter watches the decision and the closing only ([d, d0),
from its join on: nothing while nothing is decided) and checks the rule itself every
FALLBACK s, in case the holder died holding it. A waiter that sees the rule hold writes
the decision (Rendezvous.decide); the others see it on their watch.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from ..watch import DELETE, PUT, Event, Watch, WatchEnded
from . import rule
from .state import Closed, Round, Seen, TimedOut

if TYPE_CHECKING:
    from .protocol import Rendezvous

#: Seconds between a waiter's own checks of the rule while it is not the newest joiner: a
#: holder that died while it held the last call is replaced this late (jittered by half).
FALLBACK = 5.0

# What one change means to a waiter (Waiter._meaning).
NEWER = "newer"  # a later join of the open round: the last call moves to that node
RECHECK = "recheck"  # a node left: the rule may hold now
GONE = "gone"  # the last decision lapsed (its round's members all died): join again
CLOSED = "closed"


class Waiter:
    def __init__(self, rdzv: Rendezvous, my_rev: int, seen: Seen) -> None:
        self.rdzv = rdzv
        self.my_rev = my_rev
        self.seen = seen
        self.holder = True
        self.last_join = time.monotonic()
        self.check_at = 0.0  # evaluate `seen` first
        self.after = my_rev  # the last revision this waiter's watch delivered
        self.watch = self._open()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.watch.close()

    def _open(self) -> Watch:
        """The holder's watch from now on, then a count (what came before it); anyone
        else's from the last revision seen (its span changes once a round: no backlog)."""
        keys = self.rdzv.keys
        if not self.holder:
            return Watch(self.rdzv.client, keys.decision, keys.decisions_end, self.after + 1)
        watch = Watch(self.rdzv.client, keys.decision, keys.changes_end)
        self.after = max(self.after, watch.revision)
        if watch.revision > self.my_rev:
            self.seen, self.check_at = self.rdzv.check(), 0.0
        return watch

    def _step_down(self) -> None:
        """A later node joined: it holds the last call now; watch the decision only."""
        self.holder = False
        self.watch.close()
        self.watch = self._open()

    def run(self, deadline: float) -> Round | None:
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise TimedOut
            if self.check_at <= now:
                decided = self._evaluate(now)
                if decided == GONE:
                    return None
                if isinstance(decided, Round):
                    return decided
            try:
                events = self.watch.next(min(self.check_at, deadline) - time.monotonic())
            except WatchEnded:
                self.watch.close()
                self.watch = self._open()
                self.seen, self.check_at = self.rdzv.check(), 0.0
                continue
            outcome = self._events(events)
            if outcome == CLOSED:
                raise Closed
            if outcome == GONE:
                self.rdzv.saw(None)
                return None
            if not isinstance(outcome, str) and outcome is not None:
                return outcome
            if outcome == RECHECK or self.check_at <= time.monotonic():
                self.seen, self.check_at = self.rdzv.check(), 0.0

    def _evaluate(self, now: float) -> Round | str | None:
        """Act on `seen`: the decision if one came after this node joined (or GONE),
        else decide when the rule holds and this node is the one to; sets the next
        check's time."""
        seen, rdzv = self.seen, self.rdzv
        if seen.decision is not None and seen.decision.mod_revision > self.my_rev:
            return rdzv.read_round()  # counted before its event came
        if seen.closed:
            raise Closed
        if seen.decision is None and rdzv.last_decision() is not None:
            rdzv.saw(None)
            return GONE
        if self.holder and seen.newest > self.my_rev:
            self._step_down()
        self.check_at = now + FALLBACK * random.uniform(0.5, 1.5)
        settings = rdzv.settings
        if rule.now(seen.counts, settings.min_nodes, settings.max_nodes):
            rdzv.decide()
        elif self.holder and rule.at_last_call(seen.counts, settings.min_nodes):
            left = settings.last_call - (now - self.last_join)
            if left <= 0:
                rdzv.decide()
            else:
                self.check_at = min(self.check_at, now + left)
        return None

    def _events(self, events: list[Event]) -> Round | str | None:
        """The first outcome that ends the wait (a Round, GONE, CLOSED), else RECHECK
        when one of `events` asks for it."""
        recheck = False
        base = self.rdzv.open_round()
        for event in events:
            self.after = max(self.after, event.kv.mod_revision)
            meaning = self._meaning(event, base)
            if meaning is None:
                continue
            if meaning == NEWER:
                self.last_join = time.monotonic()
                if self.holder:
                    self._step_down()
                    break  # the rest of the batch: from the new watch
            elif meaning == RECHECK:
                recheck = True
            else:
                return meaning
        return RECHECK if recheck else None

    def _meaning(self, event: Event, base: int) -> Round | str | None:
        keys, kv = self.rdzv.keys, event.kv
        if kv.key == keys.decision:
            if event.kind == PUT:
                self.rdzv.saw(kv)
                return Round.of(kv)
            return GONE
        if kv.key == keys.closed:
            return CLOSED if event.kind == PUT else None
        if keys.node_of(kv.key) is not None:
            return RECHECK if event.kind == DELETE else None
        joined = keys.join_of(kv.key)
        if joined is None or joined[0] != base:
            return None  # a join of an earlier round, deleted by its node as it rejoins
        if event.kind == DELETE:
            return RECHECK
        return NEWER if kv.mod_revision > self.my_rev else None
