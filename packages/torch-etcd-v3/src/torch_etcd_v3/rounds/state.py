"""What the rounds are made of, as the nodes read them: the settings, a node, a decided
round, one count of the open round (and the reads that make it), the errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
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
    """A node as torch's agent names one: torchrun's address, pid and handler number."""

    addr: str
    pid: int
    local_id: int = 0

    def encode(self) -> bytes:
        return json.dumps([self.addr, self.pid, self.local_id]).encode()

    @classmethod
    def decode(cls, data: bytes) -> NodeInfo:
        addr, pid, local_id = json.loads(data)
        return cls(str(addr), int(pid), int(local_id))


@dataclass(frozen=True)
class Round:
    """A decided round: its number (from 0), its id (the revision of its decision), the
    member nodes in rank order, the master's address and port, and its lease."""

    number: int
    id: int
    members: tuple[str, ...]
    master_addr: str
    master_port: int
    lease: int

    def encode(self) -> bytes:
        return json.dumps(
            {"members": list(self.members), "master": [self.master_addr, self.master_port]},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def of(cls, kv: KeyValue) -> Round:
        data = json.loads(kv.value)
        addr, port = data["master"]
        return cls(
            number=kv.version - 1,
            id=kv.mod_revision,
            members=tuple(str(m) for m in data["members"]),
            master_addr=str(addr),
            master_port=int(port),
            lease=kv.lease,
        )


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
