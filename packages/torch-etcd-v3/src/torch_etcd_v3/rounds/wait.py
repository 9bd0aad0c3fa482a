"""A node waiting for the decision of the round it joined (protocol.Rendezvous.join).

Every waiter reads the decisions from its node's one watch of them (decisions.py: nothing
arrives while nothing is decided). A join that completes the round (max_nodes, or every
live node) is seen by its own node, which decides at once. What remains is the last call
and the departures, and only the newest joiner, once min_nodes have joined, watches for
them: the "holder" watches the joins and the departures as well ([d, m0)), so that it sees
a later join (and hands the last call to that node) or a departure (after which every live
node may have joined). Its watch starts at the moment it is made, followed by one count:
from the join's own revision it would replay every join since, O(n) events at a bring-up
of n nodes. Any waiter checks the rule itself every FALLBACK s, and decides at the last
call if no node joined after it (the holder died holding it). A waiter that sees the rule
hold writes the decision (Rendezvous.decide); the others see it on their watch.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from ..watch import DELETE, PUT, Event, Watch, WatchEnded
from . import rule
from .state import Closed, RosterMissing, Round, Seen, TimedOut

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
    def __init__(self, rdzv: Rendezvous, node: str, my_rev: int, seen: Seen) -> None:
        self.rdzv = rdzv
        self.node = node
        self.my_rev = my_rev
        self.seen = seen
        self.last_join = time.monotonic()
        self.check_at = 0.0  # evaluate `seen` first
        self.fresh = True  # `seen` was read just now (not due to a timer)
        self.holder: Watch | None = None
        if seen.counts.joined >= rdzv.settings.min_nodes:
            self._hold()

    def __enter__(self) -> Waiter:
        self.rdzv.membership.on_lost = self._wake
        return self

    def __exit__(self, *exc: object) -> None:
        self.rdzv.membership.on_lost = None
        self._step_down()

    def _wake(self) -> None:
        self.rdzv.decisions.wake()
        if self.holder is not None:
            self.holder.wake()

    def _hold(self) -> None:
        """Watch the joins and departures from now on, then count what came before."""
        keys = self.rdzv.keys
        self.holder = Watch(self.rdzv.client, keys.decision, keys.changes_end)
        if self.holder.revision > self.my_rev:
            self._recheck()

    def _step_down(self) -> None:
        """A later node joined: it holds the last call now."""
        if self.holder is not None:
            self.holder.close()
        self.holder = None

    def _recheck(self) -> None:
        self.seen, self.check_at, self.fresh = self.rdzv.check(), 0.0, True

    def run(self, deadline: float) -> Round | None:
        """The round that decided on this node (or not: then a spare), or None: join
        again. Raises TimedOut at `deadline`, Closed."""
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise TimedOut
            if self.rdzv.membership.node() != self.node:
                return None  # its lease lapsed (cut off longer than its TTL): join anew
            if self.check_at <= now:
                timer = not self.fresh  # the last call's or the fallback's
                if timer:
                    self.seen = self.rdzv.check()
                self.fresh = False
                decided = self._evaluate(now, fallback=timer and self.holder is None)
                if decided is not None:
                    return decided if isinstance(decided, Round) else None
            outcome = self._events(self._next(min(self.check_at, deadline)))
            if outcome == CLOSED:
                raise Closed
            if outcome == RECHECK:
                self._recheck()
            elif outcome is not None:
                if outcome == GONE:
                    self.rdzv.saw(None)
                return outcome if isinstance(outcome, Round) else None

    def _next(self, until: float) -> list[Event]:
        timeout = until - time.monotonic()
        if self.holder is None:
            events = self.rdzv.decisions.next(timeout)
            if self.rdzv.decisions.gap:
                self.rdzv.decisions.gap = False
                self._recheck()
            return events
        try:
            return self.holder.next(timeout)
        except WatchEnded:
            self._step_down()
            self._hold()
            return []

    def _evaluate(self, now: float, fallback: bool = False) -> Round | str | None:
        """Act on `seen`: the decision if one came after this node joined (or GONE),
        else decide when the rule holds and this node is the one to; sets the next
        check's time. `fallback`: a waiter's own check, FALLBACK s after the last."""
        seen, rdzv = self.seen, self.rdzv
        if seen.decision is not None and seen.decision.mod_revision > self.my_rev:
            try:
                return rdzv.read_round()  # counted before its event came
            except (WatchEnded, RosterMissing):
                return GONE  # gone again already: join afresh
        if seen.closed:
            raise Closed
        if seen.decision is None and rdzv.last_decision() is not None:
            rdzv.saw(None)
            return GONE
        newest = seen.newest <= self.my_rev  # no join after this node's (that lives)
        if self.holder is not None and not newest:
            self._step_down()
        self.check_at = now + FALLBACK * random.uniform(0.5, 1.5)
        settings = rdzv.settings
        if rule.now(seen.counts, settings.min_nodes, settings.max_nodes):
            rdzv.decide()
        elif newest and rule.at_last_call(seen.counts, settings.min_nodes):
            left = settings.last_call - (now - self.last_join)
            if left <= 0 or fallback:
                rdzv.decide()
            elif self.holder is not None:
                self.check_at = min(self.check_at, now + left)
        return None

    def _events(self, events: list[Event]) -> Round | str | None:
        """The first outcome that ends the wait (a Round, GONE, CLOSED), else RECHECK
        when one of `events` asks for it."""
        recheck = False
        base = self.rdzv.open_round()
        for event in events:
            meaning = self._meaning(event, base)
            if meaning is None:
                continue
            if meaning == NEWER:
                self.last_join = time.monotonic()
                self._step_down()
                break  # the rest of the batch: the holder's, no more
            if meaning == RECHECK:
                recheck = True
            else:
                return meaning
        return RECHECK if recheck else None

    def _meaning(self, event: Event, base: int) -> Round | str | None:
        keys, kv = self.rdzv.keys, event.kv
        if kv.key == keys.decision:
            if kv.mod_revision <= self.my_rev:
                return None  # a decision this node knew when it joined
            if event.kind == PUT:
                self.rdzv.saw(kv)
                try:
                    return Round.of(kv, self.rdzv.round, self.rdzv.roster)
                except RosterMissing:
                    return GONE  # join again, under the decision now seen
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
