"""Writing a decision, and the re-form that whoever sees a member die decides at once.

A decision is written once per round, by a transaction that holds only if `d` is still the
decision its writer read: the members (in full, or as a change to the round before:
state.Round.encode), and the full roster beside it (keys.roster), under a lease of its own
that the members keep alive (member.py).

A member lost from a round that trains (its lifeline closed and its lease was revoked, or
its lease lapsed) costs the others no join: whoever sees it first (the node that took it
out, or the first live member in rank order: training.py) decides the next round as the
live members of this one, in their order, and the nodes that joined after it (spares, a
node that came back), up to max_nodes (shrink). Every survivor's torch agent restarts its
workers (its num_nodes_waiting is 1), finds that round newer than its own and itself in
it, and returns from next_rendezvous without writing anything. A member still alive that
nobody knew was dead is in that round too; when it is found dead, the same happens again.
If the survivors are fewer than min_nodes nothing is decided, and they join as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from .. import ops
from ..client import EtcdClient, KeyValue, prefix_end
from . import rule
from .keys import Keys
from .member import ROUND_TTL
from .state import NodeInfo, Round

log = logging.getLogger(__name__)


def write(
    client: EtcdClient,
    keys: Keys,
    decision: KeyValue | None,
    base: Round | None,
    members: Sequence[str],
    *,
    master: tuple[str, int],
    bounds: tuple[int, int],
) -> bool:
    """Decide the round after `decision` (None: the first): True when this write made it,
    False when another decision came first. `base`: the round `decision` holds, when the
    writer knows it (the new one is then written as a change to it when that is small)."""
    number = decision.version if decision is not None else 0
    lease = client.lease_grant(ROUND_TTL)
    round_ = Round(number, 0, tuple(members), master[0], master[1], lease, *bounds)
    known = decision.mod_revision if decision is not None else 0
    reply = client.txn(
        compare=[ops.unchanged(keys.decision, known)],
        success=[
            ops.put(keys.decision, round_.encode(base), lease),
            ops.put(keys.roster(number), round_.roster(), lease),
        ],
        failure=[],
    )
    if not reply.get("succeeded", False):
        client.lease_revoke(lease)
        return False
    log.debug("etcd-lease: decided round %d: %d members", number, len(members))
    return True


def shrink(client: EtcdClient, keys: Keys, known: Round, gone: Collection[str]) -> bool:
    """Decide the round after `known` without `gone` (shown dead), at once: its live
    members in their order, then the nodes that joined after it, up to its max_nodes.
    False when another decision came first, or fewer than its min_nodes are left (they
    join again as usual)."""
    joined = keys.joined(known.id)
    reply = client.txn(
        compare=[ops.unchanged(keys.decision, known.id)],
        success=[
            ops.get(keys.members, keys.members_end, keys_only=True),
            ops.get(joined, prefix_end(joined), keys_only=True),
            ops.get(keys.decision, keys_only=True),
        ],
        failure=[],
    )
    if not reply.get("succeeded", False):
        return False  # decided since
    members_kvs, joins, (decision, *_) = (ops.kvs(a) for a in ops.responses(reply))
    live = {n for n in (keys.node_of(kv.key) for kv in members_kvs) if n is not None}
    dead = set(gone)
    kept = [m for m in known.members if m in live and m not in dead]
    later = [
        j[1]
        for j in (keys.join_of(kv.key) for kv in sorted(joins, key=lambda kv: kv.mod_revision))
        if j is not None and j[1] in live and j[1] not in dead
    ]
    members = rule.rank_order(kept, kept + later, known.max_nodes or len(known.members))
    if not kept or len(members) < known.min_nodes:
        return False
    master = _master(client, keys, known, members[0])
    if master is None:
        return False
    bounds = (known.min_nodes, known.max_nodes)
    return write(client, keys, decision, known, members, master=master, bounds=bounds)


def _master(client: EtcdClient, keys: Keys, known: Round, first: str) -> tuple[str, int] | None:
    """The new rank 0's address and port: the master of `known` where it stays rank 0 (a
    restart of torch's workers on the same port, as torch's static rendezvous does), else
    the port the node offered when it joined after `known`, else the one it offered with
    its membership."""
    if known.members and first == known.members[0]:
        return known.master_addr, known.master_port
    reply = client.txn(
        compare=[],
        success=[ops.get(keys.member(first)), ops.get(keys.join(known.id, first))],
        failure=[],
    )
    info_kvs, port_kvs = (ops.kvs(a) for a in ops.responses(reply))
    if not info_kvs:
        return None
    info = NodeInfo.decode(info_kvs[0].value)
    port = int(port_kvs[0].value) if port_kvs else info.port
    return (info.addr, port) if port else None
