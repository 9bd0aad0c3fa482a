"""Where a job's rounds live in etcd: one prefix per run id, a key per node, one decision.

    <key_prefix>/rounds/<run_id>/
        m/<node>            the node is live: its address and pid, under its own lease (a
                            heartbeat is a keep-alive of the lease; a dead node's keys go
                            with it, or when whoever sees it die revokes it)
        j/<round>/<node>    the node joined the round after <round>, under the same lease;
                            its value is the port it offers as master
        l                   the newest join: rewritten by every join (no compare, so no
                            joiner ever retries), read for its revision
        d                   the last decision: the members in rank order and the master,
                            under a lease its members keep alive; its version is the round's
                            number, its mod_revision the round's id (<round> above)
        d/closed            the rendezvous is closed (the job is done)
        r/<number>          round <number>'s members in full, beside a decision written as a
                            change to the round before (state.Round.encode), for a node
                            that did not know that round
        b/<round>           a member of <round> has left it (rejoined the next)
        c/<round>/<node>    a member of <round> has shut down (torch's shutdown())

A round's joins are keys of their own so that etcd counts them (`count_only` of a prefix:
a few bytes whatever the size of the job; etcd's count ignores mod_revision filters, so
"written since the decision" cannot be counted on one prefix). The layout puts the
decision, the closing, the joins and the members in one span: a watch on [d, d0) sees the
decision and the closing only, one on [d, m0) every join and departure as well. (etcd
would find the newest join of a prefix only by reading every key of it: `l`.)
<node> is the node's lease id in hex (unique per torchrun and lease); <round> is 0 before
the first decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..client import prefix_end


@dataclass(frozen=True)
class Keys:
    base: bytes  # ends with /

    @classmethod
    def of(cls, key_prefix: str, run_id: str) -> Keys:
        """`key_prefix` as config.Config keeps it: "" (the root) or /path without a /."""
        return cls(f"{key_prefix}/rounds/{run_id}/".encode())

    def member(self, node: str) -> bytes:
        return self.base + b"m/" + node.encode()

    def node_of(self, key: bytes) -> str | None:
        """The node of a membership key; None for any other key."""
        head = self.base + b"m/"
        return key[len(head) :].decode() if key.startswith(head) else None

    @property
    def members(self) -> bytes:
        return self.base + b"m/"

    @property
    def members_end(self) -> bytes:
        return prefix_end(self.members)

    @property
    def decision(self) -> bytes:
        return self.base + b"d"

    @property
    def closed(self) -> bytes:
        return self.base + b"d/closed"

    @property
    def decisions_end(self) -> bytes:
        """End of [decision, decisions_end): the decision and the closed key."""
        return self.base + b"d0"

    @property
    def changes_end(self) -> bytes:
        """End of [decision, changes_end): the decision, the closed key, every member."""
        return self.base + b"m0"

    def joined(self, round_id: int) -> bytes:
        """The prefix of the joins of the round after `round_id`."""
        return self.base + b"j/%d/" % round_id

    def join(self, round_id: int, node: str) -> bytes:
        return self.joined(round_id) + node.encode()

    def join_of(self, key: bytes) -> tuple[int, str] | None:
        """(round, node) of a join key; None for any other key."""
        head = self.base + b"j/"
        if not key.startswith(head):
            return None
        round_text, _, node = key[len(head) :].partition(b"/")
        return int(round_text), node.decode()

    def roster(self, number: int) -> bytes:
        return self.base + b"r/%d" % number

    @property
    def latest(self) -> bytes:
        return self.base + b"l"

    def left(self, round_id: int) -> bytes:
        return self.base + b"b/%d" % round_id

    def done(self, round_id: int, node: str) -> bytes:
        return self.done_prefix(round_id) + node.encode()

    def done_prefix(self, round_id: int) -> bytes:
        return self.base + b"c/%d/" % round_id
