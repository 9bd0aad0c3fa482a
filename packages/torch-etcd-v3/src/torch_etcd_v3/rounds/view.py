"""The rounds of a job as another process sees and changes them, standard library only:
elastic-worker's view (its lifelines, its leave at SIGTERM, its stuck-round watch) and a
tool's. No torch, no torch internals: the round is in the job's own keys (keys.py).

    rounds = Rounds.connect("etcd:2379", "job-r0", conf)   # conf: the --rdzv-conf pairs
    now = rounds.current()             # the last round: number, members by rank, master
    rounds.neighbours(node, 2)         # whom a node holds lifelines to: the next 2 by rank
    rounds.find("10.0.0.7", 4242)      # the node of torchrun 4242 on that host
    rounds.take_out(node)              # a dead node out now: its lease revoked, its keys gone
    rounds.broken(node)                # why node's round cannot train any more, or None
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import config, ops
from ..client import EtcdClient, EtcdError, prefix_end
from . import reform
from .keys import Keys
from .state import NodeInfo, RosterMissing, Round


@dataclass(frozen=True)
class Member:
    node: str
    rank: int
    info: NodeInfo | None  # None: its key is gone (the node left or died)


class Rounds:
    def __init__(self, client: EtcdClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    @classmethod
    def connect(cls, endpoint: str, run_id: str, conf: Mapping[str, object]) -> Rounds:
        """For torchrun's --rdzv-endpoint, --rdzv-id and --rdzv-conf (a mapping of its
        pairs); raises config.ConfigError for a conf torchrun would refuse."""
        cfg = config.from_conf(endpoint, run_id, conf)
        return cls(EtcdClient(cfg.client), Keys.of(cfg.key_prefix, cfg.run_id))

    def current(self) -> Round | None:
        """The last decided round, or None before the first (O(n) bytes: its roster)."""
        kv, _ = self.client.get(self.keys.decision)
        if kv is None:
            return None
        try:
            return Round.of(kv, None, self._roster)
        except RosterMissing:
            return None

    def _roster(self, number: int) -> bytes | None:
        kv, _ = self.client.get(self.keys.roster(number))
        return None if kv is None else kv.value

    def members(self, round_: Round, nodes: Sequence[str] | None = None) -> list[Member]:
        """The members of `round_` (or those of `nodes` among them), with their address
        and pid while their key is there."""
        wanted = list(round_.members if nodes is None else nodes)
        found, _ = self.client.get_many([self.keys.member(n) for n in wanted])
        rank = {n: i for i, n in enumerate(round_.members)}
        out = []
        for node in wanted:
            kv = found.get(self.keys.member(node))
            info = NodeInfo.decode(kv.value) if kv is not None else None
            out.append(Member(node, rank.get(node, -1), info))
        return out

    def neighbours(self, node: str, count: int, round_: Round | None = None) -> list[Member]:
        """The `count` members after `node` in its round's rank order, wrapping around:
        whom `node` holds lifelines to, so that every member is watched by `count` others
        (a ring) instead of by all. [] when `node` is in no round."""
        round_ = round_ or self.current()
        if round_ is None or node not in round_.members:
            return []
        at, size = round_.members.index(node), len(round_.members)
        picked = [round_.members[(at + i) % size] for i in range(1, min(count, size - 1) + 1)]
        return self.members(round_, picked)

    def find(self, addr: str, pid: int) -> str | None:
        """The node of torchrun `pid` at `addr` among the live nodes (one read of every
        membership key: O(n) bytes), None when it has none."""
        reply = self.client.txn(
            compare=[],
            success=[ops.get(self.keys.members, prefix_end(self.keys.members))],
            failure=[],
        )
        for kv in ops.kvs(ops.responses(reply)[0]):
            info = NodeInfo.decode(kv.value)
            if info.addr == addr and info.pid == pid:
                return self.keys.node_of(kv.key)
        return None

    def take_out(self, node: str) -> bool:
        """Take `node` out of the job now (whoever sees it die first; the others' calls
        find it gone): its lease revoked, and with it its membership and join keys, as
        when its lease lapses; then, when it was a member of the last round, that round
        re-formed without it at once (reform.shrink: the survivors' next_rendezvous
        writes nothing). True when this call removed it. A node that was alive after all
        joins again under a new lease."""
        try:
            lease = int(node, 16)
        except ValueError:
            return False
        present, _ = self.client.get(self.keys.member(node))
        if present is None:
            return False
        try:
            self.client.lease_revoke(lease)
        except EtcdError as exc:
            if "lease not found" in str(exc):
                return False
            raise
        known = self.current()
        if known is not None and node in known.members:
            reform.shrink(self.client, self.keys, known, {node})
        return True

    def broken(self, node: str) -> str | None:
        """Why the last round, with `node` in it, cannot train any more (a member's key
        is gone), or None (it can, or `node` is in no round): elastic-worker's stuck-round
        watch restarts a torchrun that waits for such a member. One read of the round and
        its members' keys (O(n) bytes)."""
        round_ = self.current()
        if round_ is None or node not in round_.members:
            return None
        gone = [m for m in self.members(round_) if m.info is None]
        if not gone:
            return None
        return (
            f"{len(gone)} member(s) of round {round_.number} left it (rank "
            f"{', '.join(str(m.rank) for m in gone[:5])}{', ...' if len(gone) > 5 else ''})"
        )

    def is_closed(self) -> bool:
        kv, _ = self.client.get(self.keys.closed)
        return kv is not None

    def set_closed(self) -> None:
        self.client.put(self.keys.closed, b"")
