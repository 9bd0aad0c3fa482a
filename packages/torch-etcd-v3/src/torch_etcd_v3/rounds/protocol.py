"""The rendezvous of `etcd-lease`, standard library only: a node adopts a round decided for
it since its last (a re-form: reform.py), else joins the open round, waits for its
decision and writes the decision itself when it sees the rule hold (rule.py); while its
round trains it learns from a watch who waits and who is gone (training.py).

What a node costs etcd, whatever the size of the job:
- a join: one transaction (two for a node that has not seen the last decision): its join
  key written and the open round counted in the same transaction; none when it adopts;
- waiting: its one watch of the decisions (decisions.py); the newest joiner also watches
  the joins (wait.py);
- a heartbeat: one lease keep-alive (member.py);
- while training: a watch, read when torch's agent asks `num_nodes_waiting`;
- the node that decides reads the joins and writes the decision once: O(n) bytes a round.

A decision is a transaction that writes `d` only if it is still the one its writer read,
so a round is decided once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from .. import ops
from ..client import EtcdClient, EtcdError, KeyValue, passing, prefix_end
from ..watch import WatchEnded
from . import reform, rule
from .decisions import Decisions
from .keys import Keys
from .member import Membership
from .state import (
    Closed,
    NodeInfo,
    RosterMissing,
    Round,
    Seen,
    Settings,
    TimedOut,
    count_ops,
    open_round,
    read_seen,
)
from .training import Training
from .wait import Waiter

#: Seconds a member that saw another die waits for the round re-formed without it before
#: it joins as usual (whoever re-forms it, normally at once, may have died too).
REFORM_WAIT = 1.0
#: Seconds a member of a round of more than GRACE_FROM nodes that saw nothing (its own
#: workers failed) waits for a re-form decided by whoever saw a peer die, before it joins:
#: its n-1 peers' joins would race that re-form (a second of etcd's time at 1,024 nodes).
#: A smaller round's joins cost little, and a node that restarts alone pays it once.
REFORM_GRACE = 0.5
GRACE_FROM = 64
#: The first pause before a join that etcd could not answer is tried again, and the most.
PAUSE = 0.2
PAUSE_MOST = 5.0

__all__ = ["Closed", "NodeInfo", "Rendezvous", "Round", "Seen", "Settings", "TimedOut"]

log = logging.getLogger(__name__)


class Rendezvous:
    """One node's side of the rendezvous. Not thread-safe but for `waiting()` and
    `stop_training()`, which torch's agent and elastic-worker may call from other threads
    while nothing joins."""

    def __init__(
        self,
        client: EtcdClient,
        keys: Keys,
        settings: Settings,
        membership: Membership,
        *,
        info: Callable[[], NodeInfo],
        free_port: Callable[[], int],
    ) -> None:
        self.client = client
        self.keys = keys
        self.settings = settings
        self.membership = membership
        self._info = info
        self._free_port = free_port
        #: The last round this node was a member of.
        self.round: Round | None = None
        #: The last decision this node has seen (keys only, or the round's).
        self._decision: KeyValue | None = None
        #: This node's join key, to delete when it joins the next round.
        self._join_key: bytes | None = None
        #: Excluded by the last decision it saw (beyond max_nodes): torch's redundancy list.
        self.spare = False
        #: This node's one watch of the decisions, from its first join on.
        self.decisions = Decisions(client, keys)
        self._training = Training(
            client, keys, settings.max_nodes, self.decisions, on_gone=self._member_gone
        )
        #: The lease this node's membership key was written under (rewritten only anew).
        self._member_lease = 0

    # -- joining ----------------------------------------------------------------------

    def join(self) -> tuple[Round, int]:
        """Join the open round and wait until one takes this node: the round and this
        node's rank in it. Raises Closed, TimedOut, or EtcdError. An etcd that cannot
        answer for a moment (overloaded, electing a leader, away) is asked again, with a
        growing pause, until the join timeout: a hiccup of etcd must not end every agent
        of the job (torch's agent ends on a rendezvous error)."""
        deadline = time.monotonic() + self.settings.join_timeout
        pause = PAUSE
        while True:
            try:
                return self._join(deadline)
            except EtcdError as exc:
                if not passing(exc) or time.monotonic() + pause >= deadline:
                    raise
                log.info(
                    "etcd-lease: etcd did not answer (%s); joining again in %.1f s", exc, pause
                )
                time.sleep(pause * random.uniform(0.5, 1.0))
                pause = min(pause * 2, PAUSE_MOST)

    def _join(self, deadline: float) -> tuple[Round, int]:
        # What the round's watch holds: a member seen gone is re-formed without (by this
        # node, if it is the first live one); the others wait for that, not join. A member
        # that saw nothing (its workers failed: a peer's death is the usual cause) waits a
        # moment for that re-form too, before it writes a join: at a loss of one of n
        # nodes the n-1 others would otherwise all write one, racing the re-form.
        self._training.waiting()
        lost, saw_join = bool(self._training.gone()), self._training.saw_join()
        large = self.round is not None and len(self.round.members) > GRACE_FROM
        wait = REFORM_WAIT if lost else REFORM_GRACE if large and not saw_join else 0.0
        self._training.stop()
        self.decisions.drain()
        while True:
            adopted = self._adopt(self.decisions.latest)
            if adopted is not None:
                return adopted
            if wait:
                self._await_reform(min(deadline, time.monotonic() + wait))
                wait = 0.0
                continue
            joined = self._put_join()
            if joined is None:
                continue  # a newer decision than this node knew: adopt it, or join after it
            node, my_rev, seen = joined
            decided = self._await(node, my_rev, seen, deadline)
            if decided is not None and node in decided.members:
                return self._take(decided, node)
            if decided is not None:
                self.spare = True  # the round is full: wait for the next one
                log.debug("etcd-lease: %s is a spare of round %d", node, decided.number)

    def _take(self, round_: Round, node: str) -> tuple[Round, int]:
        self.round, self.spare = round_, False
        self.decisions.joined()
        self.membership.keep_round(round_.lease)
        self._training.start(round_)
        return round_, round_.members.index(node)

    def _await_reform(self, until: float) -> None:
        """Wait until `until` for a decision newer than this node's round (the re-form of
        a round with a member gone, by whoever saw it: reform.py)."""
        last = self.round.id if self.round is not None else 0
        while time.monotonic() < until:
            latest = self.decisions.latest
            if latest is not None and latest.mod_revision > last:
                return
            self.decisions.next(until - time.monotonic())

    def _adopt(self, kv: KeyValue | None) -> tuple[Round, int] | None:
        """The round of decision `kv` when it was decided for this node since its last (a
        member died and whoever saw it re-formed the round: reform.py), taken without
        writing anything; None when it was not and this node joins."""
        node, last = self.membership.node(), self.round
        if kv is None or node is None or last is None or kv.mod_revision <= last.id:
            return None
        self._decision = kv
        try:
            newer = Round.of(kv, last, self.roster)
        except RosterMissing:
            return None
        return self._take(newer, node) if node in newer.members else None

    def is_spare(self) -> bool:
        """This node waits beyond max_nodes (torch's redundancy list): a decision left it
        out, or the last round is full without it."""
        if self.spare:
            return True
        kv, node = self.decisions.latest or self._decision, self.membership.node()
        if kv is None or not kv.value:
            return False
        try:
            last = Round.of(kv, self.round, self.roster)
        except RosterMissing:
            return False
        return node not in last.members and len(last.members) >= self.settings.max_nodes

    def roster(self, number: int) -> bytes | None:
        """Round `number`'s full roster (keys.roster), None when it is gone."""
        kv, _ = self.client.get(self.keys.roster(number))
        return None if kv is None else kv.value

    def _put_join(self) -> tuple[str, int, Seen] | None:
        """Write this node's keys for the open round; (node, the join's revision, the
        open round as counted right after it). The write is conditional on the decision
        this node last saw, so that a join never lands in a round already decided: None
        when there is a newer one (now `decisions.latest`; the caller adopts it or joins
        after it)."""
        while True:
            lease = self.membership.lease()
            node = f"{lease:x}"
            decision = self._decision
            base = open_round(decision)
            join_key = self.keys.join(base, node)
            writes = [
                ops.put(join_key, str(self._free_port()).encode(), lease),
                ops.put(self.keys.latest, node.encode(), lease),
            ]
            if lease != self._member_lease:
                writes.append(ops.put(self.keys.member(node), self._info().encode(), lease))
            if self._join_key is not None and self._join_key != join_key:
                writes.append(ops.delete(self._join_key))
            if self.round is not None and self.round.id == base:
                # This node leaves its round: the next may form without the last call.
                writes.append(ops.put(self.keys.left(base), b"", lease))
            try:
                reply = self.client.txn(
                    compare=[ops.unchanged(self.keys.decision, base), ops.absent(self.keys.closed)],
                    success=writes + count_ops(self.keys, decision),
                    failure=[
                        ops.get(self.keys.decision),
                        ops.get(self.keys.closed, count_only=True),
                    ],
                )
            except EtcdError as exc:
                if "lease not found" not in str(exc):
                    raise
                self.membership.lost(lease)  # cut off for longer than its TTL: a new node
                continue
            answers = ops.responses(reply)
            if not reply.get("succeeded", False):
                if ops.count(answers[1]):
                    raise Closed  # nothing written: a closed rendezvous takes nobody
                found = ops.kvs(answers[0])
                self._decision = found[0] if found else None
                self.decisions.saw(self._decision, ops.revision(reply))
                return None
            self._join_key, self._member_lease = join_key, lease
            self.decisions.open(ops.revision(reply))
            return node, ops.revision(reply), read_seen(answers[len(writes) :], decision)

    def _await(self, node: str, my_rev: int, seen: Seen, deadline: float) -> Round | None:
        """Wait for the decision of the round this node joined at `my_rev` (wait.py).
        None: join again (the decision this node joined after went away: its round's
        members all died; or this node's lease lapsed)."""
        with Waiter(self, node, my_rev, seen) as waiter:
            return waiter.run(deadline)

    def check(self) -> Seen:
        """The open round as etcd counts it now (one transaction)."""
        reply = self.client.txn(
            compare=[], success=count_ops(self.keys, self._decision), failure=[]
        )
        return read_seen(ops.responses(reply), self._decision)

    def saw(self, decision: KeyValue | None) -> None:
        """The last decision, as a waiter saw it (its event, or its lapse)."""
        self._decision = decision

    def last_decision(self) -> KeyValue | None:
        return self._decision

    def open_round(self) -> int:
        """The id of the round this node's joins go to: the last decision's."""
        return open_round(self._decision)

    def read_round(self) -> Round:
        """The last decision, read (a waiter saw it counted before its event came)."""
        kv, _ = self.client.get(self.keys.decision)
        if kv is None:
            raise WatchEnded("the decision went away")  # the waiter reads afresh
        self._decision = kv
        return Round.of(kv, self.round, self.roster)

    # -- deciding ---------------------------------------------------------------------

    def decide(self) -> bool:
        """Write the decision of the open round if nobody did since this node read it:
        the joined nodes in rank order (rule.rank_order), the master (the first of them,
        at the port it offered). True when this node's write made it."""
        decision = self._decision
        base = open_round(decision)
        prefix = self.keys.joined(base)
        reply = self.client.txn(
            compare=[], success=[ops.get(prefix, prefix_end(prefix), keys_only=True)], failure=[]
        )
        joins = sorted(ops.kvs(ops.responses(reply)[0]), key=lambda kv: kv.mod_revision)
        joined = [self.keys.join_of(kv.key) for kv in joins]
        nodes = [j[1] for j in joined if j is not None]
        previous = self._previous_round(decision)
        kept = previous.members if previous is not None else ()
        members = rule.rank_order(kept, nodes, self.settings.max_nodes)
        if len(members) < self.settings.min_nodes:
            return False
        master = self.client.txn(
            compare=[],
            success=[
                ops.get(self.keys.member(members[0])),
                ops.get(self.keys.join(base, members[0])),
            ],
            failure=[],
        )
        info_kvs, port_kvs = (ops.kvs(a) for a in ops.responses(master))
        if not info_kvs or not port_kvs:
            return False  # the master-to-be left since: the next check decides again
        addr = NodeInfo.decode(info_kvs[0].value).addr
        bounds = (self.settings.min_nodes, self.settings.max_nodes)
        master_at = (addr, int(port_kvs[0].value))
        return reform.write(
            self.client, self.keys, decision, previous, members, master=master_at, bounds=bounds
        )

    def _previous_round(self, decision: KeyValue | None) -> Round | None:
        """The round `decision` holds (this node's, or read), None when none or unread."""
        if decision is None:
            return None
        if self.round is not None and self.round.id == decision.mod_revision:
            return self.round
        kv, _ = self.client.get(self.keys.decision)
        if kv is None or kv.mod_revision != decision.mod_revision:
            return None
        try:
            return Round.of(kv, self.round, self.roster)
        except RosterMissing:
            return None

    def _member_gone(self, round_: Round, gone: frozenset[str]) -> None:
        """A member of this node's round is gone (training.py): the first live member in
        rank order re-forms the round at once (reform.shrink); the others only restart."""
        node = self.membership.node()
        first = next((m for m in round_.members if m not in gone), None)
        if node is None or node != first:
            return
        try:
            reform.shrink(self.client, self.keys, round_, gone)
        except EtcdError as exc:  # the survivors join as usual
            log.info("etcd-lease: could not re-form round %d at once: %s", round_.number, exc)

    # -- while the round trains ---------------------------------------------------------

    def waiting(self) -> int:
        """torch's `num_nodes_waiting`: nodes that joined the next round while this one
        trains and that it can take (0 while it is full: they are spares), and 1 when a
        member of this round is gone or has joined the next (the round is broken: torch's
        agent restarts its workers and joins again)."""
        return self._training.waiting()

    def interrupted(self) -> str | None:
        """Why this node's round cannot go on (a member gone, a newer round), None while it
        can or while it has none: the round's store stops waiting for a key then."""
        if self.round is None or not self._training.waiting():
            return None
        return f"round {self.round.number} of etcd-lease lost a member or was re-formed"

    def stop_training(self) -> None:
        self._training.stop()

    # -- leaving ----------------------------------------------------------------------

    def leave(self) -> None:
        """Leave the job now: this node's keys go with its lease, revoked."""
        self._training.stop()
        self.decisions.close()
        self.membership.revoke()
        self._join_key, self._member_lease = None, 0

    def shutdown(self) -> None:
        """torch's shutdown(): mark this member of its round done and leave; the last
        member of the round to do so closes the rendezvous (the job completed: spares end)."""
        self._training.stop()
        round_ = self.round
        if round_ is not None:
            node = self.membership.node()
            if node is not None and node in round_.members:
                done = self.keys.done_prefix(round_.id)
                try:
                    reply = self.client.txn(
                        compare=[],
                        success=[
                            ops.put(self.keys.done(round_.id, node), b"", round_.lease),
                            ops.get(done, prefix_end(done), count_only=True),
                        ],
                        failure=[],
                    )
                    if ops.count(ops.responses(reply)[1]) >= len(round_.members):
                        self.close(round_.lease)
                except EtcdError as exc:  # the round's lease is gone: so is the round
                    log.info("etcd-lease: could not mark round %d done: %s", round_.number, exc)
        self.leave()

    def close(self, lease: int = 0) -> None:
        """Close the rendezvous (every node waiting gets Closed)."""
        try:
            self.client.put(self.keys.closed, b"", lease)
        except EtcdError as exc:
            if not lease or "lease not found" not in str(exc):
                raise
            self.client.put(self.keys.closed, b"")

    def is_closed(self) -> bool:
        kv, _ = self.client.get(self.keys.closed)
        return kv is not None
