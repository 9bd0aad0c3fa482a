"""What the rounds are made of, as the nodes read them: the settings, a node, a decided
round, one count of the open round (and the reads that make it), the errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import ops
from ..client import KeyValue, prefix_end
from . import rule
from .keys import Keys


class Closed(Exception):
    """The rendezvous is closed (set_closed, or every member of the last round shut down)."""


class TimedOut(Exception):
    """No round took this node before the join timeout."""


@dataclass(frozen=True)
class Settings:
    min_nodes: int
    max_nodes: int
    #: Seconds the open round waits for another node once min_nodes have joined.
    last_call: float
    #: Seconds next_rendezvous may take.
    join_timeout: float


@dataclass(frozen=True)
class NodeInfo:
    """A node as torch's agent names one (torchrun's address, pid and handler number), and
    the port it would serve as master on in a round it did not join anew (a re-form
    decided for it: reform.py)."""

    addr: str
    pid: int
    local_id: int = 0
    port: int = 0

    def encode(self) -> bytes:
        return json.dumps([self.addr, self.pid, self.local_id, self.port]).encode()

    @classmethod
    def decode(cls, data: bytes) -> NodeInfo:
        addr, pid, local_id, *port = json.loads(data)
        return cls(str(addr), int(pid), int(local_id), int(port[0]) if port else 0)


class RosterMissing(Exception):
    """A decision written as a change to a round this reader does not know, and that
    round's full roster is gone too (its lease lapsed): the reader joins again."""


@dataclass(frozen=True)
class Round:
    """A decided round: its number (from 0), its id (the revision of its decision), the
    member nodes in rank order, the master's address and port, its lease, and the job's
    bounds (so that whoever re-forms it knows them: reform.py)."""

    number: int
    id: int
    members: tuple[str, ...]
    master_addr: str
    master_port: int
    lease: int
    min_nodes: int = 1
    max_nodes: int = 0

    def encode(self, base: Round | None = None) -> bytes:
        """The decision's value: the members as a change to `base` when that is small
        (every member watches the decision, so its size is what a re-form sends to each;
        a member of `base` applies it), else in full (roster())."""
        data: dict[str, Any] = {
            "master": [self.master_addr, self.master_port],
            "bounds": [self.min_nodes, self.max_nodes],
        }
        if base is not None:
            kept = set(self.members)
            drop = [m for m in base.members if m not in kept]
            add = [m for m in self.members if m not in set(base.members)]
            order = [m for m in base.members if m in kept] + add
            if order == list(self.members) and len(drop) + len(add) <= len(self.members) // 2:
                data.update(base=base.id, drop=drop, add=add)
                return json.dumps(data, separators=(",", ":")).encode()
        data["members"] = list(self.members)
        return json.dumps(data, separators=(",", ":")).encode()

    def roster(self) -> bytes:
        """The members in full (keys.roster: what a node that does not know the round a
        decision changes reads)."""
        return json.dumps(list(self.members), separators=(",", ":")).encode()

    @classmethod
    def of(
        cls,
        kv: KeyValue,
        known: Round | None = None,
        roster: Callable[[int], bytes | None] | None = None,
    ) -> Round:
        """The round a decision holds: a change applied to `known` when it is the round
        changed, else the full roster read with `roster(number)`. Raises RosterMissing."""
        data = json.loads(kv.value)
        addr, port = data["master"]
        low, high = data.get("bounds", [1, 0])
        number = kv.version - 1
        if "members" in data:
            members = tuple(str(m) for m in data["members"])
        elif known is not None and known.id == int(data["base"]):
            drop = set(data["drop"])
            members = tuple([m for m in known.members if m not in drop] + list(data["add"]))
        else:
            full = roster(number) if roster is not None else None
            if full is None:
                raise RosterMissing(f"the roster of round {number} is gone")
            members = tuple(str(m) for m in json.loads(full))
        return cls(number, kv.mod_revision, members, str(addr), int(port), kv.lease, low, high)


@dataclass(frozen=True)
class Seen:
    """One read of the open round: the counts the rule needs, the newest join, the last
    decision (keys only) and whether the rendezvous is closed."""

    counts: rule.Counts
    newest: int  # revision of the newest join (0: none, or its node's lease is gone)
    decision: KeyValue | None
    closed: bool


def open_round(decision: KeyValue | None) -> int:
    return decision.mod_revision if decision is not None else 0


def count_ops(keys: Keys, decision: KeyValue | None) -> list[dict[str, Any]]:
    """The reads of `Seen` for the round after `decision` (appended to a transaction).
    Counts and single keys only: etcd answers each in a few bytes from its index, without
    reading the keys' values (a read sorted by revision would read every key)."""
    base = open_round(decision)
    joined = keys.joined(base)
    return [
        ops.get(keys.members, keys.members_end, count_only=True),
        ops.get(joined, prefix_end(joined), count_only=True),
        ops.get(keys.latest, keys_only=True),
        ops.get(keys.left(base), count_only=True),
        ops.get(keys.decision, keys_only=True),
        ops.get(keys.closed, count_only=True),
    ]


def read_seen(answers: Sequence[Any], expected: KeyValue | None) -> Seen:
    """`Seen` from the answers of count_ops(keys, expected), in order."""
    live, joined, newest, left, decision, closed = answers
    newest_kvs = ops.kvs(newest)
    decisions = ops.kvs(decision)
    return Seen(
        counts=rule.Counts(
            live=ops.count(live),
            joined=ops.count(joined),
            first=expected is None,
            broken=ops.count(left) > 0,
        ),
        newest=newest_kvs[0].mod_revision if newest_kvs else 0,
        decision=decisions[0] if decisions else None,
        closed=ops.count(closed) > 0,
    )
